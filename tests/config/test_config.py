import pytest
from omegaconf import OmegaConf
from omegaconf.errors import ReadonlyConfigError

from rlplat.config import ConfigError, group_options
from rlplat.trainer.run import load_run_config
from rlplat.trainer.main import main

PRESETS = group_options("algorithm")


def test_all_presets_are_there():
    expected = {"grpo", "dr_grpo", "dapo", "ppo", "rloo", "reinforce_pp", "remax", "gspo", "cispo", "gpg", "opo",
                "gdpo", "dppo_tv", "dppo_kl"}
    assert expected <= set(PRESETS)


NEEDS = {"opd": ["teacher.model_path=embedded-teacher"]}  # what a preset needs besides itself (its teacher)


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_composes_validates_and_prints(preset, capsys):
    assert main([f"algorithm={preset}", *NEEDS.get(preset, []), "--cfg", "job"]) == 0
    printed = OmegaConf.create(capsys.readouterr().out)
    cfg, plan = load_run_config([f"algorithm={preset}", *NEEDS.get(preset, [])])
    assert printed == cfg  # the printed YAML is the resolved, validated config
    assert plan.world_size == 1


def test_preset_values_and_plain_override_compose():
    cfg, plan = load_run_config(["algorithm=dapo"])
    assert (cfg.algorithm.adv_estimator, cfg.algorithm.clip_ratio_high) == ("dapo", 0.28)
    assert cfg.algorithm.dynamic_sampling.enable and not plan.needs_ref
    # a preset only sets plain keys, so a later override wins and means what it says
    cfg, _ = load_run_config(["algorithm=grpo", "algorithm.adv_estimator=rloo"])
    assert cfg.algorithm.adv_estimator == "rloo" and cfg.algorithm.use_kl_loss
    _, plan = load_run_config(["algorithm=ppo"])
    assert plan.needs_critic and plan.needs_ref


def test_derived_plan_and_single_path():
    cfg, plan = load_run_config(
        ["data.train_files=one.parquet", "trainer.workers_per_node=2", "data.train_batch_size_prompts=16",
         "actor.mini_batch_size_prompts=8", "rollout.n=4", "actor.micro_batch_size_seqs_per_worker=8",
         "critic.micro_batch_size_seqs_per_worker=8"]
    )
    assert plan.train_files == ("one.parquet",)
    assert (plan.world_size, plan.mini_batches_per_step) == (2, 2)
    assert plan.loss_scale_factor == cfg.data.max_response_length


def test_config_is_read_only_after_validation():
    cfg, _ = load_run_config([])
    with pytest.raises(ReadonlyConfigError):
        cfg.trainer.total_steps = 3


BAD = [
    (["trainer.total_step=3"],
     "unknown config key 'trainer.total_step'; did you mean 'trainer.total_steps'?"),
    (["algorithm.kl_ctrl.coeff=0.1"],
     "unknown config key 'algorithm.kl_ctrl.coeff'; did you mean 'algorithm.kl_ctrl.coef'? "
     "known keys under 'algorithm.kl_ctrl': type, coef, target, horizon"),
    (["algorithm=grpoo"], "algorithm='grpoo' is not a preset; did you mean 'grpo'?"),
    (["trainer.total_steps=ten"],
     "trainer.total_steps: Value 'ten' of type 'str' could not be converted to Integer"),
    (["algorithm.adv_estimator=grpoo"],
     "algorithm.adv_estimator='grpoo' is not registered; did you mean 'grpo'? known: "),
    (["algorithm.policy_loss=ppoo"], "algorithm.policy_loss='ppoo' is not registered; did you mean 'ppo'?"),
    (["algorithm.loss_agg_mode=token_mean"],
     "algorithm.loss_agg_mode='token_mean' is not registered; did you mean 'token-mean'?"),
    (["algorithm.kl_loss_type=k3++"], "algorithm.kl_loss_type='k3++' is not registered; did you mean 'k3+'?"),
    (["rollout.name=vlm"], "rollout.name='vlm' is not registered;"),
    (["actor.strategy=fsdp3"], "actor.strategy='fsdp3' is not registered; did you mean 'fsdp'?"),
    (["actor.mini_batch_size_prompts=24"],
     "actor.mini_batch_size_prompts=24 must divide data.train_batch_size_prompts=64"),
    (["trainer.workers_per_node=3"],
     "actor.mini_batch_size_prompts x rollout.n = 128 sequences must divide evenly over 3 workers"),
    (["actor.micro_batch_size_seqs_per_worker=48"],
     "actor.micro_batch_size_seqs_per_worker=48 must divide the 128 sequences each worker holds"),
    (["algorithm=grpo", "rollout.n=1"],
     "algorithm.adv_estimator='grpo' compares responses to the same prompt and needs rollout.n >= 2"),
    (["data.truncation=middle"], "data.truncation='middle' is not one of: error, left, right, filter"),
    (["rollout.top_p=1.5"], "rollout.top_p must be in (0, 1], got 1.5"),
    (["algorithm.clip_ratio_c=0.5"], "algorithm.clip_ratio_c must be > 1 (dual clip), got 0.5"),
    (["algorithm=grpo", "ref.enable=false"], "a KL term is enabled (algorithm.use_kl_*) but ref.enable=false"),
    (["trainer.device=cpu", "actor.fsdp.param_offload=true"],
     "actor.fsdp.param_offload needs a GPU"),
    (["algorithm.old_log_probs=stale"], "algorithm.old_log_probs='stale' is not one of: auto, recompute, rollout"),
    (["algorithm.old_log_probs=rollout", "algorithm.tis_cap=2.0"],
     "algorithm.off_policy.correction=tis (or algorithm.tis_cap) weights tokens by pi_old / pi_rollout, which is 1 "
     "with algorithm.old_log_probs=rollout"),
    (["algorithm.old_log_probs=rollout", "algorithm.adv_estimator=optimal_token_baseline"],
     "algorithm.adv_estimator='optimal_token_baseline' reads sum_pi_squared from the actor's log-prob pass"),
    (["trainer.device=cpu", "ref.fsdp.mixed_precision=bf16"],
     "ref.fsdp.mixed_precision=bf16 needs a GPU (trainer.device resolved to cpu)"),
    (["algorithm.kl_loss_type=full"], "algorithm.kl_loss_type='full' is not registered"),
    (["reward.weights=[1.0,2.0]"], "reward.weights has 2 entries but reward.functions has 1"),
    (["algorithm.policy_loss_options.dro_beta=0"],
     "algorithm.policy_loss_options.dro_beta must be > 0, got 0.0"),
    (["algorithm=gdpo", "algorithm.use_kl_in_reward=true"],
     "algorithm.adv_estimator='gdpo' normalises each reward function's term on its own"),
    (["algorithm.pf_ppo.reweight_method=best"],
     "algorithm.pf_ppo.reweight_method='best' is not one of: pow, max_min, max_random"),
    (["data.train_files=[]"], "data.train_files must be a path, a non-empty list of paths, a list of {path: ..., "
                              "weight: ...} entries"),
    (["trainer.logger=[console,tensorbord]"], "trainer.logger entry 'tensorbord' is not one of:"),
    (["algorithm=ppo", "algorithm.dynamic_sampling.enable=true"],
     "algorithm.dynamic_sampling.enable=true filters groups by score variance and needs a group estimator"),
]


@pytest.mark.parametrize("overrides, message", BAD, ids=[" ".join(o) for o, _ in BAD])
def test_bad_config_fails_with_exact_message(overrides, message):
    with pytest.raises(ConfigError) as info:
        load_run_config(overrides)  # the config's checks, then the engines' checks of their sections
    assert str(info.value).startswith(message), str(info.value)


def test_cli_reports_one_line_and_exits_2(capsys):
    assert main(["trainer.total_step=3"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rlplat: config error: unknown config key 'trainer.total_step'")
    assert err.count("\n") == 1


def test_cli_help_lists_presets(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "algorithm: cispo, dapo, dppo_kl, dppo_tv, dr_grpo" in out and "rollout: hf" in out


def test_batches_divide_over_the_data_parallel_replicas_not_the_workers():
    """Workers that split one model (tensor / pipeline parallel, Ulysses) hold the same share of a batch, so
    sizes are checked and derived per replica: 6 sequences over 4 workers in 2 replicas of tp 2 are 3 each."""
    pytest.importorskip("megatron.core", reason="needs megatron-core")
    tp2 = ["trainer.workers_per_node=4", "actor.strategy=megatron", "actor.megatron.tensor_model_parallel_size=2",
           "data.train_batch_size_prompts=3", "rollout.n=2"]
    cfg, _ = load_run_config(tp2)
    assert cfg.actor.micro_batch_size_seqs_per_worker == 3  # the replica's whole share, derived
    with pytest.raises(ConfigError, match=r"actor.micro_batch_size_seqs_per_worker=2 must divide the 3 sequences "
                                          r"each worker holds per mini-batch \(actor.mini_batch_size_prompts x "
                                          r"rollout.n / replicas\)"):
        load_run_config([*tp2, "actor.micro_batch_size_seqs_per_worker=2"])
    with pytest.raises(ConfigError, match=r"= 6 sequences must divide evenly over 4 workers \(trainer.nnodes"):
        load_run_config(["trainer.workers_per_node=4", "data.train_batch_size_prompts=3", "rollout.n=2"])
    cfg, _ = load_run_config(["trainer.workers_per_node=4", "actor.fsdp.ulysses_size=4",
                              "data.train_batch_size_prompts=3", "rollout.n=2"])
    assert cfg.actor.micro_batch_size_seqs_per_worker == 6  # one replica of four workers holds all six


def test_the_critic_micro_batch_follows_its_own_replicas():
    """A critic that does not split its model where the actor does (Ulysses on the actor only) holds a smaller
    share per worker: its derived micro-batch divides that share."""
    cfg, _ = load_run_config(["trainer.workers_per_node=4", "actor.fsdp.ulysses_size=2", "algorithm.adv_estimator=gae",
                              "data.train_batch_size_prompts=4", "rollout.n=2"])
    assert (cfg.actor.micro_batch_size_seqs_per_worker, cfg.critic.micro_batch_size_seqs_per_worker) == (4, 2)
