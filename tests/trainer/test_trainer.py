"""The trainer end to end on the embedded model: resume, export, 2 workers, 2 nodes."""

import json
from pathlib import Path

import pytest

from rlplat.trainer.main import main
from rlplat.trainer.run import load_run_config, run
from rlplat.utils.errors import RunError


def overrides(out_dir, steps, val_file, *extra):
    return [
        f"trainer.output_dir={out_dir}", f"trainer.total_steps={steps}", "trainer.test_freq=0",
        f"data.val_files={val_file}", "data.train_batch_size_prompts=8", "actor.mini_batch_size_prompts=8",
        "rollout.n=4", "actor.micro_batch_size_seqs_per_worker=8", "critic.micro_batch_size_seqs_per_worker=8",
        "rollout.val_n=2", "rollout.val_temperature=1.0", *extra,
    ]


def metrics(out_dir):
    lines = [json.loads(line) for line in (Path(out_dir) / "metrics.jsonl").read_text().splitlines()]
    return {m["step"]: m for m in lines}


def comparable(m):
    return {k: v for k, v in m.items() if not k.startswith(("timing/", "perf/")) and k != "time"}


def train(args):
    cfg, plan = load_run_config(args)
    return run(cfg, plan)


def test_resume_gives_the_same_metrics_as_an_uninterrupted_run(embedded_cache, small_val, tmp_path):
    inproc = "trainer.ray_address=inprocess"
    full = tmp_path / "full"
    train(overrides(full, 4, small_val, inproc, "trainer.save_freq=2"))
    resumed = tmp_path / "resumed"
    train(overrides(resumed, 2, small_val, inproc))  # stops after step 2 (and saves)
    # total_steps shapes the LR schedule: extending it is refused unless allowed
    with pytest.raises(RunError, match=r"trainer.total_steps: 2 -> 4.*resume_allow_config_change=true"):
        train(overrides(resumed, 4, small_val, inproc, "trainer.resume_mode=auto"))
    summary = train(overrides(resumed, 4, small_val, inproc, "trainer.resume_mode=auto",
                              "trainer.resume_allow_config_change=true"))
    assert summary["initial_val_accuracy"] == json.loads((full / "summary.json").read_text())["initial_val_accuracy"]
    assert summary["steps"] == 4
    a, b = metrics(full), metrics(resumed)
    for step in (3, 4):
        assert comparable(b[step]) == comparable(a[step]), step
    assert comparable(a[2]) != comparable(a[3])  # the steps do differ: the comparison means something

    # the Hugging Face export loads with plain transformers and generates
    from transformers import AutoModelForCausalLM, AutoTokenizer

    export = full / "hf_export"
    model = AutoModelForCausalLM.from_pretrained(export)
    tok = AutoTokenizer.from_pretrained(export)
    ids = tok.apply_chat_template([{"role": "user", "content": "12+30="}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)
    out = model.generate(**ids, max_new_tokens=4, do_sample=False, pad_token_id=tok.pad_token_id)
    assert out.shape[1] > ids["input_ids"].shape[1]
    summary_file = json.loads((full / "summary.json").read_text())
    assert {"initial_val_accuracy", "final_val_accuracy", "steps", "wall_time_s"} <= set(summary_file)


def test_overlapped_scoring_trains_exactly_as_scoring_in_turn(embedded_cache, small_val, tmp_path):
    from rlplat.trainer.ppo import PPOTrainer

    class InTurn(PPOTrainer):  # overriding ``reward`` keeps it one stage: scores before the worker passes
        def reward(self, batch, metrics):
            return super().reward(batch, metrics)

    args = ("trainer.ray_address=inprocess", "algorithm=ppo")  # old log-probs, reference and values passes
    for name, trainer_cls in (("overlapped", PPOTrainer), ("in_turn", InTurn)):
        cfg, plan = load_run_config(overrides(tmp_path / name, 2, small_val, *args))
        run(cfg, plan, trainer_cls=trainer_cls)
    overlapped, in_turn = metrics(tmp_path / "overlapped"), metrics(tmp_path / "in_turn")
    assert "timing/reward_wait_s" in overlapped[1] and "timing/reward_s" in in_turn[1]
    for step in (1, 2):
        assert comparable(overlapped[step]) == comparable(in_turn[step]), step


def test_pi_old_from_the_hf_rollout_trains_as_the_recomputed_one(embedded_cache, small_val, tmp_path):
    """Two mini-batches a step: ``algorithm.old_log_probs=auto`` takes pi_old from the hf engine (float32,
    the actor's weights) and skips the actor's pass; the update is the recomputed one's to float error."""
    args = ("trainer.ray_address=inprocess", "algorithm=grpo", "actor.mini_batch_size_prompts=4")
    runs = {}
    for choice in ("auto", "recompute"):
        cfg, plan = load_run_config(overrides(tmp_path / choice, 1, small_val, *args, f"algorithm.old_log_probs={choice}"))
        assert plan.old_policy == {"auto": "rollout", "recompute": "recompute"}[choice]
        run(cfg, plan)
        runs[choice] = metrics(tmp_path / choice)[1]
    auto, recompute = runs["auto"], runs["recompute"]
    assert "timing/old_log_probs_s" not in auto and "timing/old_log_probs_s" in recompute
    assert recompute["rollout/log_prob_abs_diff"] < 1e-5  # the two sides agree to float error ...
    assert auto["reward/mean"] == recompute["reward/mean"]  # ... on the same samples
    for key in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "actor/approx_kl"):
        assert auto[key] == pytest.approx(recompute[key], rel=1e-4, abs=1e-6), key


def test_an_off_policy_correction_weighs_the_loss_of_a_run(embedded_cache, small_val, tmp_path):
    """The hf engine in float32 samples with the actor's own probabilities (rho = 1 to float error), so a
    sequence-level masked correction keeps every token at weight ~1: the update is the uncorrected one's,
    and its metrics say so."""
    args = ("trainer.ray_address=inprocess", "algorithm=grpo", "actor.mini_batch_size_prompts=4")
    runs = {}
    for name, extra in (("none", ["algorithm.old_log_probs=recompute"]),
                        ("mis", ["algorithm.off_policy.correction=mis", "algorithm.off_policy.level=sequence"])):
        run(*load_run_config(overrides(tmp_path / name, 1, small_val, *args, *extra)))
        runs[name] = metrics(tmp_path / name)[1]
    plain, corrected = runs["none"], runs["mis"]
    assert "off_policy/weight_mean" not in plain and plain["rollout/mismatch_kl"] == pytest.approx(0.0, abs=1e-5)
    assert corrected["off_policy/weight_mean"] == pytest.approx(1.0, abs=1e-4) and corrected["off_policy/masked_frac"] == 0
    for key in ("actor/pg_loss", "actor/grad_norm"):
        assert corrected[key] == pytest.approx(plain[key], rel=1e-4, abs=1e-6), key


@pytest.mark.slow
def test_two_workers_fsdp_over_ray(embedded_cache, small_val, tmp_path, ray_cluster):
    summary = train(overrides(tmp_path, 2, small_val, "trainer.workers_per_node=2"))
    assert summary["steps"] == 2
    m = metrics(tmp_path)
    assert m[2]["actor/grad_norm"] > 0 and "score/mean" in m[2]
    assert 1.0 <= m[2]["batch/replica_token_imbalance"] < 1.1  # balance_batch ran: replicas get ~equal tokens


@pytest.mark.slow
def test_two_workers_splitting_each_sequence_reproduce_one_worker(embedded_cache, small_val, tmp_path, ray_cluster):
    # Ulysses (actor.fsdp.ulysses_size=2): one replica of two workers, each holding half of every sequence; the
    # reference (KL loss) splits its sequences alike
    ulysses = ["trainer.workers_per_node=2", "actor.fsdp.ulysses_size=2", "ref.fsdp.ulysses_size=2"]
    train(overrides(tmp_path / "one", 3, small_val, "trainer.ray_address=inprocess"))
    train(overrides(tmp_path / "split", 3, small_val, *ulysses))
    one, split = metrics(tmp_path / "one"), metrics(tmp_path / "split")
    for step in (1, 2, 3):
        expected = comparable(one[step])
        assert comparable(split[step]).keys() == expected.keys()
        for key, value in expected.items():
            assert split[step][key] == pytest.approx(value, rel=1e-4, abs=1e-4), (step, key)
    assert comparable(one[2]) != comparable(one[3])  # the steps differ: the comparison means something


@pytest.mark.slow
def test_two_node_ray_cluster(embedded_cache, small_val, tmp_path):
    import ray
    from ray.cluster_utils import Cluster

    ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    cluster.add_node(num_cpus=1)
    try:
        ray.init(address=cluster.address, log_to_driver=False)
        summary = train(overrides(tmp_path, 2, small_val, "trainer.nnodes=2", f"trainer.ray_address={cluster.address}"))
        assert summary["steps"] == 2 and metrics(tmp_path)[2]["actor/grad_norm"] > 0
    finally:
        ray.shutdown()
        cluster.shutdown()



@pytest.mark.parametrize("bad, message", [
    ("data.train_files={tmp}/missing.parquet",
     "DataError: data.train_files: no such parquet file '{tmp}/missing.parquet'"),
    ("data.val_files={tmp}/empty.parquet", "DataError: {tmp}/empty.parquet: cannot read as parquet"),
    ("reward.custom_fn.path={tmp}/reward.py",
     "RewardConfigError: reward.custom_fn.name='compute_score' is not defined"),
])
def test_bad_input_is_one_line_and_exit_2(embedded_cache, tmp_path, capsys, bad, message):
    (tmp_path / "empty.parquet").write_bytes(b"")
    (tmp_path / "reward.py").write_text("def score(data_source, solution_str, ground_truth, extra_info):\n"
                                        "    return 0\n")
    code = main([bad.format(tmp=tmp_path), "trainer.ray_address=inprocess", f"trainer.output_dir={tmp_path}/out"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.startswith("rlplat: " + message.format(tmp=tmp_path)) and "\n" not in err
    assert not (tmp_path / "out" / "checkpoints").exists()
