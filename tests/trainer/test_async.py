"""A separate rollout pool (rollout.mode=separate) and generation ahead of the trainer (trainer.async_steps):
the checks of the config, the weight sync's checksums, the prompt ledger, and whole runs on Ray."""

import json
import xml.etree.ElementTree as ET
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

from rlplat.config import ConfigError
from rlplat.utils.net import free_port
from rlplat.rollout.checksums import named_checksums, tensor_checksum
from rlplat.workers.weight_channel import WeightChannel
from rlplat.workers.weight_sync import WeightUpdate, probe_mismatch, probe_tolerance, weight_mismatch
from rlplat.trainer.ledger import PromptLedger
from rlplat.trainer.timeline import TRAINING_POOL_STAGES, busy_seconds, idle_fractions, read_timeline
from rlplat.trainer.ppo import PPOTrainer
from rlplat.trainer.run import load_run_config, run
from rlplat.utils.errors import RunError, WorkerDied

from .test_trainer import comparable, metrics, overrides

SEPARATE = "rollout.mode=separate"


# ------------------------------------------------------------------------------------------------ config
@pytest.mark.parametrize("extra, message", [
    (["trainer.async_steps=1"], r"trainer.async_steps=1 generates the next batches while the actor trains, which "
                                r"needs rollout workers of their own: set rollout.mode=separate"),
    ([SEPARATE, "trainer.async_steps=-1"], r"trainer.async_steps must be >= 0 \(0 = synchronous\), got -1"),
    ([SEPARATE, "trainer.ray_address=inprocess"], r"rollout.mode=separate starts a pool of rollout workers, which needs Ray"),
    (["trainer.async_steps=2", "trainer.ray_address=inprocess"], r"trainer.async_steps=2 generates while the actor trains, on rollout workers of their own, which needs Ray"),
    ([SEPARATE, "rollout.verify_weights=sometimes"], r"rollout.verify_weights='sometimes' is not one of: every, first, off"),
    ([SEPARATE, "rollout.workers_per_node=0"], r"rollout.workers_per_node must be >= 1, got 0"),
    ([SEPARATE, "rollout.weight_transport=nccl"], r"rollout.weight_transport='nccl' is not one of: distributed, object_store"),
    ([SEPARATE, "rollout.node_lost=wait"], r"rollout.node_lost='wait' is not one of: stop, continue"),
    ([SEPARATE, "rollout.node_lost=continue"], r"rollout.node_lost=continue shrinks the rollout pool, which a weight "
                                               r"channel cannot \(rollout.weight_transport=distributed: .*set "
                                               r"rollout.weight_transport=object_store$"),
    (["rollout.stream_groups=2"], r"rollout.stream_groups=2 streams generation calls to rollout workers of their "
                                  r"own: set rollout.mode=separate"),
    ([SEPARATE, "rollout.stream_groups=3", "data.train_batch_size_prompts=8"],
     r"rollout.stream_groups=3 must divide data.train_batch_size_prompts=8"),
    ([SEPARATE, "rollout.stream_groups=-1"], r"rollout.stream_groups must be >= 0 \(0 = whole batches\), got -1"),
    ([SEPARATE, "rollout.stream_groups=1", "trainer.async_steps=1", "data.train_batch_size_prompts=64",
      "actor.mini_batch_size_prompts=64"],
     r"rollout.stream_groups=1 keeps 128 generation calls in flight .*; at most 64: use calls of at least 2 groups"),
    (["rollout.partial=resume"], r"rollout.partial=resume loads weight updates into rollout workers of their own while "
                                 r"they generate: set rollout.mode=separate"),
    ([SEPARATE, "rollout.partial=sometimes"], r"rollout.partial='sometimes' is not one of: finish, resume"),
    ([SEPARATE, "rollout.partial=resume", "rollout.agent.name=tool"],
     r"rollout.partial=resume pauses single-turn generation for a weight update; rollout.agent.name=tool keeps"),
])
def test_async_settings_are_checked(extra, message):
    with pytest.raises(ConfigError, match=message):
        load_run_config(extra)


def test_an_engine_that_can_neither_show_its_weights_nor_score_a_probe_needs_verification_off():
    message = (r"rollout.verify_weights=every compares .* and the sglang engine can do neither; set "
               r"rollout.verify_weights=off")
    with pytest.raises(ConfigError, match=message):
        load_run_config([SEPARATE, "rollout.name=sglang"], require_installed=False, device="cuda")
    load_run_config([SEPARATE, "rollout.name=sglang", "rollout.verify_weights=off"], require_installed=False, device="cuda")
    load_run_config([SEPARATE, "rollout.name=vllm"], require_installed=False)  # the probe only: vLLM fuses its tensors
    load_run_config([SEPARATE, "rollout.name=vllm", "rollout.partial=resume"], require_installed=False)  # between steps
    with pytest.raises(ConfigError, match=r"rollout.partial=resume loads a weight update between two tokens of a "
                                          r"generation under way, which the sglang engine cannot do"):
        load_run_config([SEPARATE, "rollout.name=sglang", "rollout.verify_weights=off", "rollout.partial=resume"],
                        require_installed=False, device="cuda")
    with pytest.raises(ConfigError, match=r"which the hf engine cannot do with these settings"):  # transformers' generate
        load_run_config([SEPARATE, "rollout.partial=resume", "rollout.hf.use_model_generation_config=true"])
    with pytest.raises(ConfigError, match=r"rollout.verify_log_prob_tol must be > 0 \(or null: by rollout.dtype\), got 0"):
        load_run_config([SEPARATE, "rollout.verify_log_prob_tol=0"])


def test_an_older_policy_sampled_so_the_update_does_not_take_pi_old_from_its_own_forward():
    # one epoch over one mini-batch: synchronously pi_old is the update's first forward; K >= 1 sampled with
    # weights up to K updates old, so pi_old is the rollout's log-probs (float32 HF: the actor's own) or recomputed
    one = [SEPARATE, "data.train_batch_size_prompts=8", "actor.mini_batch_size_prompts=8"]
    assert load_run_config(one)[1].old_policy == "update"
    assert load_run_config([*one, "trainer.async_steps=1"])[1].old_policy == "rollout"
    assert load_run_config([*one, "trainer.async_steps=1", "rollout.dtype=bfloat16"])[1].old_policy == "recompute"


# ------------------------------------------------------------------------------------- weight checksums
def test_a_checksum_sees_every_bit_and_where_it_is():
    t = torch.randn(64, 32)
    assert tensor_checksum(t) == tensor_checksum(t.clone())
    flipped = t.clone()
    flipped.view(torch.int32)[7, 3] ^= 1  # the lowest mantissa bit of one element
    assert tensor_checksum(flipped) != tensor_checksum(t)
    swapped = t.clone()
    swapped[[0, 1]] = swapped[[1, 0]]  # the same bytes in another order
    assert tensor_checksum(swapped) != tensor_checksum(t)
    assert tensor_checksum(t.to(torch.bfloat16)) != tensor_checksum(t)


def test_a_mismatch_names_the_first_tensor_and_counts_the_others():
    buckets = [[("a", torch.ones(3)), ("b", torch.zeros(2))], [("c", torch.arange(4.0))]]
    update = WeightUpdate.of(5, buckets, verify=True)
    held = dict(update.checksums)
    assert weight_mismatch(update, held) is None
    update.buckets[0][1][1][0] += 1  # "b" damaged on its way: the update's own copy, not the actor's
    assert update.buckets[0][1][1].tolist() == [1.0, 0.0] and buckets[0][1][1].tolist() == [0.0, 0.0]
    damaged = WeightUpdate.of(5, update.buckets, verify=True).checksums
    assert weight_mismatch(update, damaged) == ("after the sync of weight version 5, the rollout engine holds 'b' "
                                                "with other bits than the actor sent (1 of 3 tensors differ)")
    del held["c"]
    assert weight_mismatch(update, held) == ("after the sync of weight version 5, the rollout engine holds no "
                                             "tensor 'c' (1 of 3 tensors differ)")
    assert WeightUpdate.of(0, buckets, verify=False).checksums == {}


def test_the_weight_channel_delivers_every_bucket_bit_for_bit_to_every_receiver():
    # the actor's rank 0 and two rollout workers (threads here, processes in a run) on gloo: tensors of every
    # dtype and of sizes that are no multiple of the packing's alignment, in two buckets
    buckets = [[("a", torch.randn(3, 5)), ("b", torch.randn(7).to(torch.bfloat16)), ("c", torch.arange(11))],
               [("d", torch.randn(2, 2, 3, dtype=torch.float64)), ("e", torch.tensor([True, False, True]))]]
    update = WeightUpdate.of(1, buckets, verify=False, pack_buckets=True)  # one host copy: views of packed buffers
    header = update.header()
    assert header.buckets == [] and header.packed == []  # nothing of the tensors travels through Ray
    layouts = header.layouts
    assert layouts[0][1] == ("b", "bfloat16", (7,))
    port, received = free_port(), {}

    def receive(rank):
        channel = WeightChannel("127.0.0.1", port, rank, 3, "cpu", timeout_s=60)
        received[rank] = [[(name, t.clone()) for name, t in bucket] for bucket in channel.receive(layouts)]

    receivers = [threading.Thread(target=receive, args=(rank,)) for rank in (1, 2)]
    for thread in receivers:
        thread.start()
    sender = WeightChannel("127.0.0.1", port, 0, 3, "cpu", timeout_s=60)
    sender.send(update.packed)  # returns at once: the broadcasts go on in the sender's thread
    sender.wait()
    for thread in receivers:
        thread.join(timeout=60)
    for rank in (1, 2):
        assert named_checksums(t for bucket in received[rank] for t in bucket) == \
            named_checksums(t for bucket in buckets for t in bucket)


def test_the_probe_names_the_worst_token_against_its_tolerance():
    update = WeightUpdate(3, [], probe_ids=[5, 6, 7, 8], probe_log_probs=[-1.0, -2.0, -3.0], probe_tolerance=1e-5)
    assert probe_mismatch(update, [-1.0, -2.000001, -3.0]) is None
    assert probe_mismatch(update, [-1.0, -2.0, -3.5]) == (
        "after the sync of weight version 3, the rollout engine's log-probs of the probe sequence differ from "
        "the actor's by 5.00e-01 at token 3 (tolerance 1e-05: rollout.verify_log_prob_tol)")
    assert "scored 2 tokens of the 3-token probe" in probe_mismatch(update, [-1.0, -2.0])
    assert probe_tolerance(True, None) == 1e-5 and probe_tolerance(False, None) == 0.5 and probe_tolerance(True, 0.2) == 0.2


# ----------------------------------------------------------------------------------------- prompt ledger
def test_the_ledger_keeps_ranges_and_refuses_a_group_trained_twice():
    ledger = PromptLedger()
    ledger.record(["p0", "p0", "p1"], step=1)
    ledger.record(["p4", "p3"], step=2)
    assert ledger.state() == [[0, 2], [3, 5]] and ledger.count() == 4
    ledger.record(["p2"], step=3)  # closes the gap
    assert ledger.state() == [[0, 5]]
    resumed = PromptLedger(json.loads(json.dumps(ledger.state())))
    with pytest.raises(RunError, match=r"step 4 would train prompt group p3 again \(1 groups trained on before\)"):
        resumed.record(["p5", "p3"], step=4)


# ------------------------------------------------------------------------------------------------ timeline
def test_busy_time_counts_overlapping_spans_once_and_only_inside_the_window():
    spans = [["rollout", "generate", 0.0, 2.0], ["rollout", "generate", 1.0, 3.0], ["trainer", "update_actor", 2.0, 9.0],
             ["rollout", "generate", 5.0, 12.0]]
    assert busy_seconds(spans, "rollout", 1.0, 10.0) == pytest.approx(2.0 + 5.0)
    rows = [{"step": 1, "start": 0.0, "end": 5.0, "spans": spans[:2]}, {"step": 2, "start": 5.0, "end": 10.0, "spans": spans[2:]}]
    assert idle_fractions(rows) == pytest.approx({"trainer": 1 - 7 / 10, "rollout": 1 - 8 / 10})


# ------------------------------------------------------------------------------------------ whole runs
def _train(out, steps, val, *extra):
    cfg, plan = load_run_config(overrides(out, steps, val, *extra))
    return run(cfg, plan)


def _ledger(out):
    latest = (out / "checkpoints" / "latest").read_text()
    return json.loads((out / "checkpoints" / latest / "trainer.json").read_text())["ledger"]


@pytest.mark.slow
def test_a_separate_rollout_pool_without_generating_ahead_is_the_colocated_run(embedded_cache, small_val, tmp_path, ray_cluster):
    # the rollout worker samples from the stream a colocated worker does, with the weights of the update
    # just before: the same samples, rewards and validation, and the same losses to float error (the two
    # layouts put other processes on the cores, so a threaded reduction may round differently: alone on
    # 2 cores the runs agree bit for bit); plus where the samples came from.
    # The weights reach the rollout worker over a torch.distributed group here (the default); Ray's object store
    # carries them in the streaming test below, whose every update is checked bit for bit on both rollout workers.
    _train(tmp_path / "colocated", 2, small_val)
    _train(tmp_path / "separate", 2, small_val, SEPARATE)
    colocated, separate = metrics(tmp_path / "colocated"), metrics(tmp_path / "separate")
    for step in (0, 1, 2):
        extra = {k: v for k, v in separate[step].items() if k not in colocated[step]}
        same = {k: v for k, v in comparable(separate[step]).items() if k not in extra}
        assert same.keys() == comparable(colocated[step]).keys()
        for key, value in comparable(colocated[step]).items():
            assert same[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key
        expected = {"val/policy_version": step} if step != 1 else {}
        if step > 0:
            expected.update({"off_policy/staleness_mean": 0.0, "off_policy/staleness_max": 0.0,
                             "rollout/restarts": 0.0})
        assert {k: v for k, v in extra.items() if not k.startswith("timing/")} == expected, step
    assert _ledger(tmp_path / "separate") == [[0, 16]]


@pytest.mark.slow
def test_generating_two_steps_ahead_never_trains_on_older_samples(embedded_cache, small_val, tmp_path, ray_cluster,
                                                                  capsys):
    out = tmp_path / "ahead"
    # with on-policy distillation added: the teacher scores what the (stale) sampler drew, against the sampler's
    # own log-probs (pi_old from the rollout engine: docs/distillation.md)
    distill = ["algorithm.distill.coef=0.5", "teacher.model_path=embedded-teacher"]
    _train(out, 4, small_val, SEPARATE, "trainer.async_steps=2", "trainer.test_freq=2", *distill)
    steps = metrics(out)
    assert [steps[s]["off_policy/staleness_max"] for s in (1, 2, 3, 4)] == [0, 1, 2, 2]  # K = 2 reached, never passed
    assert all(steps[s]["distill/reverse_kl"] > 0.05 for s in (1, 2, 3, 4))
    step_lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[step 3] ")]
    assert len(step_lines) == 1 and " off_policy/staleness_max=2 " in step_lines[0]  # the console line shows it
    assert [steps[s]["val/policy_version"] for s in (0, 2, 4)] == [0, 2, 4]  # validation on the newest weights
    assert _ledger(out) == [[0, 32]]  # every drawn prompt group trained once
    # the timeline: a line per step, the rollout pool's generations in it, idle fractions in the summary
    timeline = read_timeline(out)
    assert [row["step"] for row in timeline] == [1, 2, 3, 4]
    pools = {span[0] for row in timeline for span in row["spans"]}
    assert pools == {"trainer", "rollout", "controller"}
    idle = json.loads((out / "summary.json").read_text())["idle_frac"]
    assert idle.keys() == {"trainer", "rollout"} and all(0 <= v < 1 for v in idle.values())
    for s in (1, 2, 3, 4):  # the training workers' idle part of a step: what its worker stages' timings leave
        busy = sum(steps[s].get(f"timing/{stage}_s", 0.0) for stage in TRAINING_POOL_STAGES)
        assert steps[s]["timing/trainer_idle_frac"] == pytest.approx(1 - busy / steps[s]["timing/step_s"], abs=0.02)
        assert 0 < busy < steps[s]["timing/step_s"]  # the generation (taken from the pool) is not the workers' time
    drawn = ET.parse(out / "report" / "timeline.svg").getroot()  # the report's figure of it: a bar per span
    bars = [rect for rect in drawn.iter("{http://www.w3.org/2000/svg}rect") if rect.get("class") == "span"]
    assert 0 < len(bars) <= sum(len(row["spans"]) for row in timeline)
    assert {label.text for label in drawn.iter("{http://www.w3.org/2000/svg}text")} >= pools


@pytest.mark.slow
def test_an_async_vision_language_run_keeps_each_rows_images_and_syncs_no_frozen_tower(embedded_cache, tmp_path,
                                                                                     ray_cluster):
    """model.path=embedded-vl one step ahead on a separate rollout pool, with a learning rate too small to move a
    weight: the trainer scores every token sampled a step earlier as the rollout did, so each row's images went
    with it (through the queue, to both pools); and the weight sync sends the language model's weights, not the
    frozen vision tower's (actor.vision.freeze)."""
    from rlplat.models.vision import load_generative, vision_parameters

    from .test_learning import small_val_file

    summary = _train(tmp_path, 2, small_val_file("shapes", tmp_path), SEPARATE, "trainer.async_steps=1",
                     "model.path=embedded-vl", "data.train_files=builtin:shapes", "algorithm.old_log_probs=recompute",
                     "actor.optim.lr=1e-30")
    steps = metrics(tmp_path)
    assert all(steps[step]["rollout/log_prob_abs_diff"] < 1e-5 for step in (1, 2))
    assert steps[2]["off_policy/staleness_max"] == 1
    model = load_generative(summary["hf_export"])
    tower = set(vision_parameters(model))
    sizes = {name: t.numel() * t.element_size() / 2**20 for name, t in model.state_dict().items()}
    assert steps[1]["perf/weight_sync_mb"] == pytest.approx(sum(mb for name, mb in sizes.items() if name not in tower))
    assert sum(sizes[name] for name in tower) > 0.3 * sum(sizes.values())  # the tower is a good part of the model


@pytest.mark.slow
def test_streaming_by_prompt_group_on_two_rollout_workers_trains_every_group_once(embedded_cache, small_val, tmp_path, ray_cluster):
    # calls of 2 prompt groups, each on one of 2 rollout workers, a step taking the first 8 groups scored.
    # Which groups a step gets depends on timing; what may not: staleness within K, each group trained at most
    # once, and every drawn group either trained or still in flight at the end (never skipped). The weights go
    # through Ray's object store (rollout.weight_transport=object_store), every update's tensors checked against
    # the actor's checksums on both workers (rollout.verify_weights=every, the default): a bit lost stops the run
    out = tmp_path / "stream"
    _train(out, 4, small_val, SEPARATE, "trainer.async_steps=1", "rollout.stream_groups=2", "rollout.workers_per_node=2",
           "rollout.weight_transport=object_store")
    steps = metrics(out)
    assert [steps[s]["off_policy/staleness_max"] for s in (1, 2, 3, 4)] == [0, 1, 1, 1]
    dropped = [steps[s]["rollout/dropped_groups"] for s in (1, 2, 3, 4)]
    assert dropped[0] == 0 and all(d >= 0 and d % 2 == 0 for d in dropped)  # whole calls of 2 groups, none at step 1
    state = json.loads((out / "checkpoints" / "step_000004" / "trainer.json").read_text())
    trained = [n for start, end in state["ledger"] for n in range(start, end)]
    in_flight = [n for saved in state["in_flight"] for n in saved["uids"]]
    assert len(trained) == 4 * 8
    assert sorted(trained + in_flight) == list(range(state["prompts_seen"]))


@pytest.mark.slow
def test_a_rollout_worker_killed_or_hung_with_a_generation_and_a_weight_load_in_flight_is_replaced(
        embedded_cache, small_val, tmp_path, ray_cluster, capsys):
    # the rollout worker is killed (as the out-of-memory killer would) right after step 2 sent it the weights of
    # update 2, while it generates step 3's batch or loads those weights. Step 3 or 4 finds it dead (a call or a
    # weight receipt failed: whichever Ray reports first), and over the weight channel (the default transport) the
    # pool is replaced: a new worker holds the actor's weights of that moment (checksums and probe checked) and
    # generates the lost calls' prompt groups again. After step 4 the new worker's process is stopped (SIGSTOP: hung,
    # alive to Ray): it answers no heartbeat within rollout.heartbeat_s, is killed as hung and replaced the same way.
    # Every drawn group is trained once, every step logged once.
    import ray

    class KillsTheRolloutWorker(PPOTrainer):
        stage_order = PPOTrainer.insert_stage("kill", after="sync_rollout")

        def kill(self, batch, metrics):
            actor = self.components.rollout.actors[0]
            if self.step == 2:
                ray.kill(actor)
                with pytest.raises(ray.exceptions.RayActorError):  # dead before the trainer goes on
                    ray.get(actor.parallel_layout.remote(), timeout=60)
            if self.step == 4:
                os.kill(ray.get(actor.__ray_call__.remote(lambda worker: os.getpid())), signal.SIGSTOP)
            return batch

    out = tmp_path / "replaced"
    cfg, plan = load_run_config(overrides(out, 6, small_val, SEPARATE, "trainer.async_steps=1",
                                          "rollout.heartbeat_s=2"))
    assert run(cfg, plan, KillsTheRolloutWorker)["steps"] == 6
    steps = metrics(out)
    restarts = [steps[s]["rollout/restarts"] for s in range(1, 7)]
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[rollout] ")]
    assert restarts[:4] in ([0, 0, 1, 1], [0, 0, 0, 1]) and restarts[4:] in ([2, 2], [1, 2]), (restarts, lines)
    assert all(steps[s]["off_policy/staleness_max"] <= 1 for s in range(1, 7))
    assert _ledger(out) == [[0, 48]]
    assert [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()] == list(range(7))
    assert len(lines) == 3 and lines[0].startswith("[rollout] RolloutWorker rank 0 of 1 died during "), lines
    found_at = restarts.index(1) + 1  # the step that found it dead: the actor then held the update before it
    assert (f"replaced rollout worker(s) [0] with new ones holding the weights of update {found_at - 1} (checked)"
            in lines[0])
    assert lines[1] == ("[rollout] RolloutWorker rank 0 of 1 answered no heartbeat within rollout.heartbeat_s=2 s: "
                        "killed as hung")
    # found hung by step 5's take (calls of its in flight) or by the weight sync after it (the calls done before the
    # stop): the new worker holds the weights of the update before the step that counts it
    hung_at = restarts.index(2) + 1
    assert lines[2].startswith("[rollout] RolloutWorker rank 0 of 1 answered no heartbeat within rollout.heartbeat_s=2 "
                               "s and was killed as hung; replaced rollout worker(s) [0] with new ones holding the "
                               f"weights of update {hung_at - 1} (checked)"), lines


@pytest.mark.slow
def test_a_rollout_pool_whose_nodes_leave_goes_on_with_the_workers_left_then_stops_naming_the_checkpoint(
        embedded_cache, small_val, tmp_path, capsys):
    # three worker nodes of one CPU each (the head has none): the training worker on one, a rollout worker on each
    # of the others (rollout.nnodes=2, calls streamed to both). The node of rollout worker 0 leaves after step 1's
    # weight sync; step 1's validation finds the worker dead, its replacement finds no room within
    # rollout.node_wait_s, and with rollout.node_lost=continue the pool goes on with the other worker, which
    # validates alone and generates the lost calls again. The node of that one leaves after step 3's weight sync: no
    # worker is left, and the run stops with one line naming the checkpoint to resume from, instead of waiting.
    import ray
    from ray.cluster_utils import Cluster

    ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    nodes = [cluster.add_node(num_cpus=1) for _ in range(3)]
    ray.init(address=cluster.address, log_to_driver=False)

    class RemovesARolloutNode(PPOTrainer):
        stage_order = PPOTrainer.insert_stage("leave", after="sync_rollout")

        def leave(self, batch, metrics):
            if self.step in (1, 3):
                where = ray.get(self.components.rollout.actors[0].__ray_call__.remote(
                    lambda worker: ray.get_runtime_context().get_node_id()))
                cluster.remove_node(next(node for node in nodes if node.node_id == where))
            return batch

    try:
        out = tmp_path / "left"
        cfg, plan = load_run_config(overrides(
            out, 6, small_val, SEPARATE, "trainer.async_steps=1", "trainer.save_freq=1", "trainer.test_freq=1",
            "rollout.nnodes=2", "rollout.stream_groups=4", "rollout.weight_transport=object_store",
            "rollout.node_wait_s=3", "rollout.node_lost=continue"))
        with pytest.raises(WorkerDied) as stopped:
            run(cfg, plan, RemovesARolloutNode)
        message = str(stopped.value)
        assert message.startswith("RolloutWorker rank 0 of 1 died during generate_sequences() ") and "\n" not in message
        assert "the RolloutWorker workers that replace ranks [0] did not start within 3 s" in message
        assert f"rerun the same command to resume from {out}/checkpoints/step_000002 " in message, message
        shrunk = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[rollout] ")]
        assert len(shrunk) == 1 and shrunk[0].startswith("[rollout] RolloutWorker rank 0 of 2 died during "), shrunk
        assert "did not start within 3 s (" not in shrunk[0]
        assert "the pool goes on with the 1 worker(s) left (rollout.node_lost=continue)" in shrunk[0]
        steps = metrics(out)
        assert sorted(steps) == [0, 1, 2] and [steps[s]["rollout/restarts"] for s in (1, 2)] == [0, 1]
        assert steps[2]["val/policy_version"] == 2  # validated by the worker left, with the newest weights
        state = json.loads((out / "checkpoints" / "step_000002" / "trainer.json").read_text())
        trained = [n for start, end in state["ledger"] for n in range(start, end)]
        in_flight = [n for saved in state["in_flight"] for n in saved["uids"]]
        assert len(trained) == 16 and sorted(trained + in_flight) == list(range(state["prompts_seen"]))
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.mark.slow
def test_a_rollout_pool_on_two_nodes_streams_and_syncs_across_them(embedded_cache, small_val, tmp_path):
    # rollout.nnodes=2 on a two-node Ray cluster (two raylets on this machine): one rollout worker per node, the
    # weight channel spanning the nodes, calls streamed to both
    import ray
    from ray.cluster_utils import Cluster

    ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    cluster.add_node(num_cpus=2)  # the training worker may land on either node: each keeps a CPU for a rollout worker
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        out = tmp_path / "nodes"
        _train(out, 3, small_val, SEPARATE, "trainer.async_steps=1", "rollout.nnodes=2", "rollout.stream_groups=4")
        steps = metrics(out)
        assert [steps[s]["off_policy/staleness_max"] for s in (1, 2, 3)] == [0, 1, 1]
        state = json.loads((out / "checkpoints" / "step_000003" / "trainer.json").read_text())
        trained = [n for start, end in state["ledger"] for n in range(start, end)]
        in_flight = [n for saved in state["in_flight"] for n in saved["uids"]]
        assert len(trained) == 3 * 8 and sorted(trained + in_flight) == list(range(state["prompts_seen"]))
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.mark.slow
def test_weight_updates_loaded_between_two_tokens_keep_the_bound_on_staleness(embedded_cache, small_val, tmp_path, ray_cluster):
    # rollout.partial=resume: each update reaches the rollout worker while it generates and is loaded between two
    # tokens; the samples say so (rollout/resumed_frac), their first weights stay within K, every checksum and probe
    # passes, and validation scores the newest weights. The worker is busy when the first update comes unless it
    # generated batches 2 and 3 within step 1's training: two steps ahead (with K=1 whether the one batch ahead was
    # still under way was a race), few sequences (4 prompts x 2: training time grows with them) of long responses
    # (384 tokens: generation time grows with them, one token at a time). With 8 prompts x 4 of 128 tokens and one
    # busy process beside the run, an update took 10 s of training against 0.85 s per batch generated, and no update
    # landed during a generation; with these sizes on that machine, 3.5 s against 1.7 s, and every one did.
    out = tmp_path / "resume"
    _train(out, 3, small_val, SEPARATE, "trainer.async_steps=2", "rollout.partial=resume", "rollout.ignore_eos=true",
           "data.max_response_length=384", "data.train_batch_size_prompts=4", "actor.mini_batch_size_prompts=4",
           "rollout.n=2")
    steps = metrics(out)
    staleness = [steps[s]["off_policy/staleness_max"] for s in (1, 2, 3)]
    assert staleness[0] == 0 and 1 <= max(staleness) <= 2  # which batch a resumed update lands in is timing's
    assert steps[1]["rollout/resumed_frac"] == 0  # generated before any update was sent
    assert max(steps[s]["rollout/resumed_frac"] for s in (2, 3)) > 0
    assert steps[3]["val/policy_version"] == 3 and _ledger(out) == [[0, 12]]


@pytest.mark.slow
def test_a_corrupted_weight_bucket_stops_the_run_naming_the_tensor(embedded_cache, small_val, tmp_path, ray_cluster, monkeypatch):
    # the plug-in damages model.layers.0.mlp.up_proj.weight in every update the actor's rank 0 builds; importing
    # it patches this process too, which monkeypatch undoes after the test
    monkeypatch.setattr(WeightUpdate, "of", WeightUpdate.of)
    with pytest.raises(RunError, match=r"weight sync to rollout worker 0: after the sync of weight version 0, the "
                                       r"rollout engine holds 'model.layers.0.mlp.up_proj.weight' with other bits "
                                       r"than the actor sent \(1 of \d+ tensors differ\)"):
        _train(tmp_path / "corrupt", 2, small_val, SEPARATE, "trainer.async_steps=1",
               "trainer.imports=[trainer.corrupt_weights]")


@pytest.mark.slow
def test_the_log_prob_probe_stops_a_run_whose_rollout_scores_otherwise(embedded_cache, small_val, tmp_path, ray_cluster):
    # every separate run above passed the probe at 1e-5 (HF engine, float32); the gap is float error (~5e-7),
    # which a tolerance of 1e-12 does not allow: the probe's own failure line, before any step
    with pytest.raises(RunError, match=r"weight sync to rollout worker 0: after the sync of weight version 0, the "
                                       r"rollout engine's log-probs of the probe sequence differ from the actor's by "
                                       r"(\S+) at token \d+ \(tolerance 1e-12") as raised:
        _train(tmp_path / "probe", 2, small_val, SEPARATE, "rollout.verify_log_prob_tol=1e-12")
    gap = float(re.search(r"differ from the actor's by (\S+) at", str(raised.value)).group(1))
    assert 1e-12 < gap < 1e-5  # float error, whatever this CPU's kernels round to


@pytest.mark.slow
def test_a_batch_scored_ahead_reports_its_reward_failure_in_the_step_that_needs_it(embedded_cache, small_val, tmp_path, ray_cluster):
    # the queue scores each batch in its own thread as it arrives: a failing reward is still one line, naming
    # the step the batch was for, raised when that step takes the batch (step 2: step 1's rewards are fine)
    reward = tmp_path / "reward.py"
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                      "    return None if extra_info['split'] == 'train' and extra_info['index'] >= 8 else 0.0\n")
    with pytest.raises(RunError, match=r"^step 2: 32 of 32 reward calls failed \(reward.fail_fraction_to_stop=1\)"):
        _train(tmp_path / "out", 3, small_val, SEPARATE, "trainer.async_steps=1", f"reward.custom_fn.path={reward}",
               "data.shuffle=false")
    assert [json.loads(line)["step"] for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()] == [0, 1]


@pytest.mark.slow
def test_kill_9_of_an_async_run_then_resume_trains_every_prompt_once(embedded_cache, small_val, tmp_path, ray_cluster):
    # batches in flight at a checkpoint are generated again after the resume (with the resumed weights):
    # the ledger of the finished run is every drawn prompt group exactly once, each step is logged once. The killed
    # run started a Ray cluster of its own (killed with it); the same settings resume on the test session's. The
    # model is a mixture of experts whose updates replay the rollout's routing (r3): every batch, one step old or
    # generated again after the resume, came through the queue with the routing of the weights that sampled it
    out = tmp_path / "run"
    settings = overrides(out, 5, small_val, SEPARATE, "trainer.async_steps=1", "trainer.save_freq=1",
                         "model.path=embedded-moe", "actor.moe.router_replay=r3")
    command = [sys.executable, "-m", "rlplat.trainer.main", *settings]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        latest = out / "checkpoints" / "latest"
        deadline = time.monotonic() + 300
        while not latest.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(random.Random(30).uniform(0.0, 0.3))  # somewhere in the next steps (each ~0.2 s)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the controller and the Ray cluster it started
        proc.wait(timeout=60)
    killed_at = int((out / "checkpoints" / "latest").read_text().removeprefix("step_"))
    assert 1 <= killed_at < 5, killed_at
    cfg, plan = load_run_config(settings)
    assert run(cfg, plan)["steps"] == 5
    assert _ledger(out) == [[0, 40]]
    rows = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert rows == list(range(6))
    assert [row["step"] for row in read_timeline(out)] == [1, 2, 3, 4, 5]  # cut back with metrics.jsonl
    steps = metrics(out)
    assert max(steps[s]["off_policy/staleness_max"] for s in range(2, 6)) == 1
    # replayed exactly, while the trainer's own routers (a step newer than the rollout's weights) chose otherwise
    assert all(steps[s]["moe/routing_mismatch_frac"] == 0 for s in range(1, 6))
    assert max(steps[s]["moe/router_mismatch_frac"] for s in range(2, 6)) > 0
