"""Run-time failures end the run with one line: rewards that fail on a whole step, ..."""

import json
import os
import random
import re
import signal
import subprocess
import sys
import time

import pytest
import torch

from rlplat.trainer.main import main
from rlplat.trainer.ppo import PPOTrainer

SMALL = ["data.train_batch_size_prompts=4", "actor.mini_batch_size_prompts=4", "rollout.n=2",
         "rollout.val_n=1", "trainer.test_freq=0", "trainer.ray_address=inprocess"]
RAY_2 = ["trainer.ray_address=null", "trainer.workers_per_node=2"]  # on the test session's Ray cluster


def test_a_step_where_every_reward_fails_stops_the_run(embedded_cache, small_val, tmp_path, capsys):
    """The training rows' rewards all fail (validation's score, and fail too where one does: a validation
    where every call fails stops the run as well, tests/reward/test_pool.py)."""
    reward = tmp_path / "reward.py"
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                      "    if extra_info['split'] == 'test':\n"
                      "        return 0.0 if solution_str.startswith('1') else None\n"
                      "    return None\n")
    out = tmp_path / "out"
    code = main([*SMALL, f"data.val_files={small_val}", f"reward.custom_fn.path={reward}", "trainer.total_steps=3",
                 f"trainer.output_dir={out}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1
    assert err[-1].startswith("rlplat: step 1: 8 of 8 reward calls failed (reward.fail_fraction_to_stop=1)")
    assert "reward function 'compute_score' on sample 0" in err[-1] and "returned None" in err[-1]
    assert not any("Traceback" in line for line in err)
    assert not (out / "checkpoints").exists()  # nothing was trained, nothing saved
    initial = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    errors = initial["val/reward_num_errors"]
    assert initial["step"] == 0 and 0 < errors < 32  # validation's errors are counted; some of its calls score


@pytest.mark.parametrize("override, message", [
    ("model.path={tmp}/nowhere", "model.path='{tmp}/nowhere': no such directory"),
    ("model.path={tmp}/model", "model.path='{tmp}/model' has no config.json; expected a Hugging Face model"),
    ("reward.model.path={tmp}/nowhere", "reward.model.path='{tmp}/nowhere': no such directory"),
    ("reward.judge.model_path={tmp}/nowhere", "reward.judge.model_path='{tmp}/nowhere': no such directory"),
    ("model.tokenizer_path={tmp}/model", "model.tokenizer_path='{tmp}/model' has no tokenizer_config.json or "
                                         "tokenizer.json"),
    ("model.chat_template={tmp}/nowhere.jinja", "model.chat_template='{tmp}/nowhere.jinja': not a named template "
                                                "(chatml, tulu, zephyr), not a file, and not a Jinja template itself"),
    ("trainer.output_dir={tmp}/afile", "trainer.output_dir='{tmp}/afile' is a file, not a directory"),
    ("trainer.output_dir={tmp}/afile/out", "trainer.output_dir='{tmp}/afile/out' is under {tmp}/afile, which is a file"),
    ("trainer.output_dir=/sys/rlplat-out", "trainer.output_dir='/sys/rlplat-out' is not writable"),
    # a tracker whose package is missing, or that fails to start: tests/test_tracking.py
])
def test_runtime_errors_are_one_line(tmp_path, capsys, override, message):
    (tmp_path / "model").mkdir()
    (tmp_path / "afile").write_text("not a directory")
    args = [override.format(tmp=tmp_path), "trainer.ray_address=inprocess"]
    if "output_dir" not in override:
        args.append(f"trainer.output_dir={tmp_path}/out")
    code = main(args)
    err = capsys.readouterr().err.strip()
    assert code == 1 and err.startswith("rlplat: " + message.format(tmp=tmp_path)) and "\n" not in err


def test_a_hub_id_without_network_is_one_line(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "rlplat.trainer.main", "model.path=someorg/no-such-model",
                           "trainer.ray_address=inprocess", f"trainer.output_dir={tmp_path}"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "rlplat: model.path='someorg/no-such-model' is not a local directory, and fetching it from the hub failed")


@pytest.mark.parametrize("ray", [False, pytest.param(True, marks=pytest.mark.slow, id="ray")], ids=["inprocess", "ray"])
def test_sampling_from_a_nan_model_is_one_line(nan_model_path, small_val, tmp_path, ray):
    """A policy whose logits are NaN (here: its weights) fails in the rollout's sampler: one line naming the
    step and the cause, from the worker itself or through Ray, not a traceback."""
    broken = nan_model_path
    small = [arg for arg in SMALL if not (ray and arg.startswith("trainer.ray_address="))]
    proc = subprocess.run([sys.executable, "-m", "rlplat.trainer.main", *small, f"model.path={broken}",
                           f"data.val_files={small_val}", f"trainer.output_dir={tmp_path}/out"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "rlplat: validation at step 0: the rollout engine (hf) found NaN/inf logits")


def _start(tmp_path, small_val, *extra, ray=False):
    small = [arg for arg in SMALL if not (ray and arg.startswith("trainer.ray_address="))]
    args = [sys.executable, "-m", "rlplat.trainer.main", *small, f"data.val_files={small_val}",
            "trainer.total_steps=200", f"trainer.output_dir={tmp_path}/out", *extra]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _wait_for_step(proc, step):
    for line in proc.stdout:
        if line.startswith(f"[step {step}]"):
            return
    err = proc.stderr.read()[-2000:] if proc.stderr else "(its stderr went to a file)"
    raise AssertionError(f"the run ended before step {step}: {err}")


@pytest.fixture
def sigterms_here():
    """The SIGTERMs this test process receives during the test (counted instead of stopping the session)."""
    received = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
    try:
        yield received
    finally:
        signal.signal(signal.SIGTERM, previous)


@pytest.mark.slow
def test_a_run_on_ray_leaves_the_callers_sigterm_handler_in_place():
    """ray.init installs a SIGTERM handler of its own in the calling process and ray.shutdown leaves it: a
    program that runs rlplat on Ray keeps its own handler afterwards (a test session kept Ray's, and a stray
    SIGTERM then raised SystemExit inside whichever test was running)."""
    import ray
    from omegaconf import OmegaConf

    from rlplat.trainer.run import ray_session

    ray.shutdown()  # a local cluster that this call starts, as a run does
    mine = signal.getsignal(signal.SIGTERM)
    cfg = OmegaConf.create({"trainer": {"ray_address": None, "verbose": False}})
    with ray_session(cfg, {}) as using_ray:
        assert using_ray and ray.is_initialized() and signal.getsignal(signal.SIGTERM) is not mine
    assert not ray.is_initialized() and signal.getsignal(signal.SIGTERM) is mine


def test_a_run_on_ray_leaves_the_callers_own_ray_session_connected(ray_cluster):
    """A program (a notebook, a test session) connected to Ray before the run: the run uses that session and
    leaves it connected, the cluster it started still up."""
    from omegaconf import OmegaConf

    from rlplat.trainer.run import ray_session

    cfg = OmegaConf.create({"trainer": {"ray_address": None, "verbose": False}})
    with ray_session(cfg, {}) as using_ray:
        assert using_ray
    assert ray_cluster.is_initialized() and ray_cluster.cluster_resources().get("CPU") == 4


# SIGINT in-process, with the step it finishes pinned: test_ctrl_c_finishes_the_step_in_flight_then_saves_it
@pytest.mark.parametrize("signum, ray", [(signal.SIGTERM, False),
                                         pytest.param(signal.SIGTERM, True, marks=pytest.mark.slow, id="SIGTERM-ray")])
def test_a_signal_finishes_the_step_saves_and_says_where_to_resume(embedded_cache, small_val, tmp_path, signum, ray,
                                                                   sigterms_here):
    """In-process and with Ray worker groups (two workers): the run stops between steps, saves, shuts its
    workers (and its Ray cluster) down and names the checkpoint to resume from. The signal and the run's
    shutting down reach no process beyond the run's own: not this one."""
    proc = _start(tmp_path, small_val, *(["trainer.workers_per_node=2"] if ray else []), ray=ray)
    _wait_for_step(proc, 2)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    time.sleep(0.5)  # a stray signal sent during the run's exit has arrived by now
    assert not sigterms_here, "a SIGTERM reached the test process"
    assert proc.returncode == 128 + signum and "Traceback" not in err
    last = err.strip().splitlines()[-1]
    step = int(re.search(r"after step (\d+);", last).group(1))
    ckpt = tmp_path / "out" / "checkpoints" / f"step_{step:06d}"
    assert last == (f"rlplat: stopped by {signal.Signals(signum).name} after step {step}; the newest checkpoint is "
                    f"{ckpt}; run the same command again to resume (trainer.resume_mode=auto), or python -m "
                    f"rlplat.tools.export {ckpt} for its model")
    from rlplat.trainer.checkpoint import verify

    assert step >= 2 and verify(ckpt) is None


HELD_REWARD = '''"""Scores a sample 1 if the answer is in the response; while {hold} exists, a call waits for it to go
(a slow reward, such as a sandbox or a judge model, that keeps the step from finishing)."""
import sys
import time
from pathlib import Path

HOLD = Path({hold!r})


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if HOLD.exists():
        print("reward: held", file=sys.stderr, flush=True)
        deadline = time.monotonic() + 600  # a run the test failed to stop ends by itself
        while HOLD.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    return float(str(ground_truth) in solution_str)
'''


def _start_held(tmp_path, small_val, *extra):
    """A run (200 steps: far more than a test waits for) whose reward calls wait while ``hold`` exists;
    its stdout goes to a file, its stderr is read line by line."""
    hold = tmp_path / "hold"
    reward = tmp_path / "held_reward.py"
    reward.write_text(HELD_REWARD.format(hold=str(hold)))
    # in-process scoring: the reward runs in a thread of the run's own process, so a hard exit ends it too
    with (tmp_path / "stdout.txt").open("w") as stdout:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rlplat.trainer.main", *SMALL, f"data.val_files={small_val}",
             "trainer.total_steps=200", f"trainer.output_dir={tmp_path}/out", f"reward.custom_fn.path={reward}",
             "reward.isolation=inprocess", *extra],
            stdout=stdout, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    return proc, hold


def _poll(proc, done, what: str, timeout_s: float = 300):
    """Wait until ``done()`` (a file the run writes); the bound only ends a test whose run went wrong."""
    deadline = time.monotonic() + timeout_s
    while not done():
        if proc.poll() is not None:
            raise AssertionError(f"the run ended (status {proc.returncode}) before {what}: {proc.stderr.read()[-2000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} after {timeout_s} s")
        time.sleep(0.1)


def _read_until(proc, text: str, seen: list[str]) -> None:
    """Read the run's stderr up to the first line containing ``text`` (kept in ``seen``)."""
    for line in proc.stderr:
        seen.append(line)
        if text in line:
            return
    raise AssertionError(f"the run ended without printing {text!r}: {''.join(seen)[-2000:]}")


def _logged_steps(out) -> list[int]:
    path = out / "metrics.jsonl"
    return [json.loads(line)["step"] for line in path.read_text().splitlines()] if path.exists() else []


def _hold_a_step(proc, hold, out, ready, what: str) -> tuple[int, list[str]]:
    """Once ``ready()``, hold the run inside a step's reward; returns that step and the stderr read so far."""
    _poll(proc, ready, what)
    hold.touch()
    seen: list[str] = []
    _read_until(proc, "reward: held", seen)
    # steps before the held one are logged (metrics are written before a step ends); the held one cannot be
    return max(_logged_steps(out)) + 1, seen


def test_ctrl_c_finishes_the_step_in_flight_then_saves_it(embedded_cache, small_val, tmp_path):
    """The signal arrives while step k is scoring: step k completes (no later step starts), the signal's
    checkpoint is step k, one line names it, exit status 130."""
    proc, hold = _start_held(tmp_path, small_val, "trainer.save_freq=0")  # only the signal saves
    out = tmp_path / "out"
    try:
        step, seen = _hold_a_step(proc, hold, out, lambda: 1 in _logged_steps(out), "step 1 in metrics.jsonl")
        proc.send_signal(signal.SIGINT)
        _read_until(proc, "SIGINT received: finishing the current step", seen)
        hold.unlink()  # the reward returns: the step goes on
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    err = "".join(seen) + err
    assert proc.returncode == 130 and "Traceback" not in err, err[-3000:]
    ckpt = out / "checkpoints" / f"step_{step:06d}"
    assert err.strip().splitlines()[-1] == (
        f"rlplat: stopped by SIGINT after step {step}; the newest checkpoint is {ckpt}; "
        f"run the same command again to resume (trainer.resume_mode=auto), or python -m rlplat.tools.export {ckpt} "
        f"for its model")
    from rlplat.trainer.checkpoint import verify

    assert _logged_steps(out)[-1] == step  # the held step finished and was logged; none after it started
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["latest", ckpt.name]
    assert (out / "checkpoints" / "latest").read_text() == ckpt.name and verify(ckpt) is None


def test_a_second_ctrl_c_exits_at_once_keeping_the_last_checkpoint(embedded_cache, small_val, tmp_path):
    """A run held inside step k (a slow reward) gets Ctrl-C; once the run said it will finish the step, a
    second Ctrl-C exits at once with 130: step k never completes, and the checkpoint of step k-1 stays the
    newest, complete one. The step cannot end while held, so the second signal cannot race the run's exit."""
    proc, hold = _start_held(tmp_path, small_val, "trainer.save_freq=1")
    out = tmp_path / "out"
    root = out / "checkpoints"
    try:
        step, seen = _hold_a_step(proc, hold, out, lambda: (root / "latest").exists(), "a first checkpoint")
        proc.send_signal(signal.SIGINT)
        _read_until(proc, "SIGINT received: finishing the current step", seen)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)  # held, the run would wait 600 s for its reward
    finally:
        proc.kill()
    err = "".join(seen) + err
    assert proc.returncode == 130 and "Traceback" not in err, err[-3000:]
    assert err.strip().splitlines()[-1] == "rlplat: second SIGINT: exiting now", err[-3000:]
    from rlplat.trainer.checkpoint import verify

    newest = root / (root / "latest").read_text()
    assert newest.name == f"step_{step - 1:06d}" and verify(newest) is None  # a real save, intact
    assert max(_logged_steps(out)) == step - 1  # the held step did not finish
    assert not any(p.name.startswith((f"step_{step:06d}", f".step_{step:06d}")) for p in root.iterdir())


def test_a_second_signal_exits_at_once(tmp_path):
    """Deterministic: the process signals itself, so both signals arrive where the script says. The first
    only asks the loop to stop; the second exits at once with 128 + signum, whatever the code is doing."""
    script = tmp_path / "twice.py"
    script.write_text(
        "import os, signal, time\n"
        "from rlplat.trainer.signals import stop_on_signals\n"
        "with stop_on_signals() as stop:\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "    print('first: stop requested =', stop.requested, flush=True)\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "    time.sleep(60)  # a long step or a checkpoint being written: never reached\n"
        "    print('still running', flush=True)\n"
    )
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 128 + signal.SIGINT
    assert proc.stdout == "first: stop requested = True\n"
    assert "SIGINT received: finishing the current step" in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == "rlplat: second SIGINT: exiting now"


class PoisonedAdvantages(PPOTrainer):
    """From step 2 on, one advantage is NaN (as a diverging estimator would produce): the real engine then
    computes a NaN loss and gradient norm."""

    def advantages(self, batch, metrics):
        batch = super().advantages(batch, metrics)
        if self.step >= 2:
            batch.tensors["advantages"][0, 0] = float("nan")
        return batch


@pytest.mark.parametrize("mode", ["stop", "skip"])
def test_a_nan_loss_stops_or_skips_naming_step_and_quantity(embedded_cache, small_val, tmp_path, capsys, mode):
    out = tmp_path / "out"
    code = main([*SMALL, f"data.val_files={small_val}", "trainer.total_steps=3", "trainer.save_freq=1",
                 f"trainer.nonfinite={mode}", f"trainer.output_dir={out}"], trainer_cls=PoisonedAdvantages)
    captured = capsys.readouterr()
    from rlplat.trainer.checkpoint import verify

    if mode == "stop":
        err = captured.err.strip().splitlines()[-1]
        assert code == 1 and re.match(r"rlplat: step 2: actor/\w*(grad_norm|loss)=nan", err), err
        assert "the last checkpoint step_000001 is intact" in err and "trainer.nonfinite=skip" in err
        assert (out / "checkpoints" / "latest").read_text() == "step_000001"
        assert verify(out / "checkpoints" / "step_000001") is None
    else:
        assert code == 0 and "[step 2] warning: actor/" in captured.out
        assert "(trainer.nonfinite=skip; 1 in a row)" in captured.out
        assert "(trainer.nonfinite=skip; 2 in a row)" in captured.out
        logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        assert [m["actor/skipped_steps"] for m in logged if "actor/skipped_steps" in m] == [0.0, 1.0, 2.0]


def test_skipped_steps_in_a_row_stop_the_run(embedded_cache, small_val, tmp_path, capsys):
    out = tmp_path / "out"
    code = main([*SMALL, f"data.val_files={small_val}", "trainer.total_steps=4", "trainer.nonfinite=skip",
                 "trainer.max_skipped_steps=2", f"trainer.output_dir={out}"], trainer_cls=PoisonedAdvantages)
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 1 and re.match(r"rlplat: step 3: actor/\w*(grad_norm|loss)=nan", err), err
    assert "2 steps in a row skipped (trainer.max_skipped_steps=2), stopping" in err


def _last_per_step(out):
    """The metric trajectory of a run, later lines (after a resume) replacing earlier ones of the same step."""
    rows = {}
    for line in (out / "metrics.jsonl").read_text().splitlines():
        m = json.loads(line)
        rows[m["step"]] = {k: v for k, v in m.items() if not k.startswith(("timing/", "perf/")) and k != "time"}
    return rows


def _weights_that_differ(one, other) -> list[str]:
    """The tensors of two runs' final Hugging Face exports that differ (bit for bit), or the names one lacks."""
    from safetensors.torch import load_file

    mine, theirs = (load_file(str(out / "hf_export" / "model.safetensors")) for out in (one, other))
    if mine.keys() != theirs.keys():
        return sorted(mine.keys() ^ theirs.keys())
    return [name for name, tensor in mine.items() if not torch.equal(theirs[name], tensor)]


MOE_R3 = ["model.path=embedded-moe", "actor.moe.router_replay=r3"]


@pytest.mark.parametrize("extra", [MOE_R3, ["model.lora.rank=8"], pytest.param(RAY_2, marks=pytest.mark.slow)],
                         ids=["moe-r3", "lora", "ray-2-workers"])
def test_kill_9_then_resume_gives_the_uninterrupted_trajectory(embedded_cache, small_val, tmp_path, extra, request):
    """The metrics of every step and the final weights bit for bit: for a mixture of experts whose training forwards
    replay the rollout's routing (in process; the full-weight dense model in process is the next test's), a LoRA run,
    whose checkpoints hold the adapters and their optimizer state only, and on Ray with two training workers (each
    holding half of the weights and of the optimizer state, each taking half of a step's rows): the killed run's
    workers die with it (they belonged to its controller) and the resumed run starts new ones."""
    from rlplat.data import TASKS, write_parquet

    ray = request.getfixturevalue("ray_cluster") if extra == RAY_2 else None  # (its environment: the auth mode)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if ray:  # the killed run joins this session's cluster (the others run in it in this process)
        env["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address
    # 8 prompts, 4 per step: every epoch is 2 steps, so each checkpoint (every 2 steps) is on an epoch boundary
    train = write_parquet(TASKS.get("arithmetic")(8, seed=3, split="train"), tmp_path / "train.parquet")
    common = [*SMALL, f"data.val_files={small_val}", f"data.train_files={train}", "trainer.total_steps=6",
              "trainer.save_freq=2", "trainer.logger=[console,tensorboard]", *extra]
    assert main([*common, f"trainer.output_dir={tmp_path}/full"]) == 0

    kill_at = random.Random(13).randint(3, 5)  # a step after the first checkpoint (step 2)
    crashed = tmp_path / "crashed"
    with (tmp_path / "crashed.err").open("w") as err:  # a file, not a pipe: Ray's log lines could fill one
        proc = subprocess.Popen([sys.executable, "-m", "rlplat.trainer.main", *common, f"trainer.output_dir={crashed}"],
                                stdout=subprocess.PIPE, stderr=err, text=True, env=env)
        _wait_for_step(proc, kill_at)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    saved = (crashed / "checkpoints" / "latest").read_text()
    assert saved in ("step_000002", "step_000004")
    assert main([*common, f"trainer.output_dir={crashed}", "trainer.resume_mode=auto"]) == 0

    full, resumed = _last_per_step(tmp_path / "full"), _last_per_step(crashed)
    assert sorted(resumed) == sorted(full) == list(range(7))
    for step in range(7):
        assert resumed[step] == full[step], (step, kill_at, saved)
    assert full[3] != full[4]  # the steps differ, so equality means something
    if extra == MOE_R3:  # the resumed steps' rollouts carried their routing, and the updates replayed it
        assert all(resumed[step]["moe/routing_mismatch_frac"] == 0 for step in range(1, 7))
    assert _weights_that_differ(tmp_path / "full", crashed) == []

    # each step once: the rows the killed run logged after its checkpoint were cut (into a side file)
    rows = [json.loads(line) for line in (crashed / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == list(range(7))
    cut_rows = (crashed / "metrics.cut.jsonl").read_text().splitlines()
    for line in cut_rows[:-1]:  # whole rows; the last may be a fragment: a kill -9 can stop a write between pages
        json.loads(line)
    cut = [int(re.match(r'\{"step": (\d+), ', line).group(1)) for line in cut_rows]
    checkpoint_step = int(saved.removeprefix("step_"))
    assert cut and all(checkpoint_step < step <= kill_at for step in cut), (cut, saved, kill_at)
    # tensorboard reads each step once, the resumed run's values (the killed run's later events purged)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(crashed / "tensorboard"))
    events.Reload()
    scalars = events.Scalars("actor/pg_loss")
    assert [e.step for e in scalars] == list(range(1, 7))
    assert [e.value for e in scalars] == pytest.approx([full[step]["actor/pg_loss"] for step in range(1, 7)])
    # the wall time counts both commands
    segments = json.loads((crashed / "segments.json").read_text())
    summary = json.loads((crashed / "summary.json").read_text())
    assert len(segments) == 2
    assert summary["wall_time_s"] == pytest.approx(sum(s["end"] - s["start"] for s in segments))
    assert summary["wall_time_s"] > segments[1]["end"] - segments[1]["start"]


# A trainer.imports plug-in: the trainer SIGKILLs itself right after the named stage of the named step, or, for
# "checkpoint_write", once the checkpoint of that step is written but not yet made the newest; each kill once
# (a file in MARKS says it happened), so the resumed run goes on to the next one.
PHASE_KILLS = '''import os
import signal

from rlplat.trainer.checkpoint import Checkpointer
from rlplat.trainer.ppo import PPOTrainer

KILLS, MARKS = KILLS_AND_MARKS


def kill_once(where, step):
    mark = os.path.join(MARKS, where)
    if KILLS.get(where) == step and not os.path.exists(mark):
        open(mark, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)


def after(where, stage):
    def wrapped(self, batch, metrics):
        out = stage(self, batch, metrics)
        kill_once(where, self.step)
        return out
    return wrapped


# the scores are added by "reward", or by "reward_wait" where scoring overlaps the stages after it
for where, names in {"generate": ["generate"], "reward": ["reward", "reward_wait"], "update": ["update_actor"]}.items():
    for name in names:
        setattr(PPOTrainer, name, after(where, getattr(PPOTrainer, name)))
write = Checkpointer._write


def writing(self, c, state, path):
    write(self, c, state, path)
    kill_once("checkpoint_write", state["step"])


Checkpointer._write = writing
'''


def test_kill_9_in_each_phase_of_a_step_then_resume_ends_as_the_uninterrupted_run(embedded_cache, small_val, tmp_path):
    """The trainer killed after the generation, the reward, the update and in the checkpoint write of successive
    steps (the steps drawn), each time resumed with the same command: every prompt group trained once (the ledger),
    each step logged once with the uninterrupted run's metrics, the final weights bit for bit the same."""
    from rlplat.data import TASKS, write_parquet

    phases = ["generate", "reward", "update", "checkpoint_write"]
    steps = sorted(random.Random(5).sample(range(1, 8), len(phases)))  # one kill a step, at most
    (tmp_path / "marks").mkdir()
    kills_and_marks = repr((dict(zip(phases, steps)), str(tmp_path / "marks")))
    (tmp_path / "phase_kills.py").write_text(PHASE_KILLS.replace("KILLS_AND_MARKS", kills_and_marks))
    train = write_parquet(TASKS.get("arithmetic")(8, seed=3, split="train"), tmp_path / "train.parquet")
    common = [*SMALL, f"data.val_files={small_val}", f"data.train_files={train}", "trainer.total_steps=8",
              "trainer.save_freq=1", "trainer.logger=[jsonl]", "trainer.progress=off"]
    assert main([*common, f"trainer.output_dir={tmp_path}/full"]) == 0
    crashed = tmp_path / "crashed"
    command = [sys.executable, "-m", "rlplat.trainer.main", *common, f"trainer.output_dir={crashed}",
               "trainer.imports=[phase_kills]"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}
    codes = [subprocess.run(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
             for _ in range(len(phases) + 1)]
    assert codes == [-signal.SIGKILL] * len(phases) + [0], (codes, steps)
    assert sorted(p.name for p in (tmp_path / "marks").iterdir()) == sorted(phases)

    full, resumed = _last_per_step(tmp_path / "full"), _last_per_step(crashed)
    assert sorted(resumed) == sorted(full) == list(range(9))
    assert [step for step in range(9) if resumed[step] != full[step]] == [], steps
    rows = [json.loads(line)["step"] for line in (crashed / "metrics.jsonl").read_text().splitlines()]
    assert rows == list(range(9))  # each step logged once
    state = json.loads((crashed / "checkpoints" / "step_000008" / "trainer.json").read_text())
    assert state["ledger"] == [[0, 32]]  # 8 steps x 4 prompt groups, each once
    assert _weights_that_differ(tmp_path / "full", crashed) == []


def test_prompt_only_rows_need_reward_functions_that_need_no_answer(tmp_path, capsys):
    """A prompt-only file (no reward_model) with the default rewards (which compare answers) stops at start-up,
    in one line naming the first row (tests/data/test_dataset.py: which functions score such rows)."""
    import pandas as pd

    data = tmp_path / "prompts.parquet"
    pd.DataFrame([{"data_source": "rlplat/arithmetic", "prompt": f"{i}+1="} for i in range(8)]).to_parquet(data)
    args = [f"data.train_files={data}", f"data.val_files={data}", "trainer.ray_address=inprocess",
            f"trainer.output_dir={tmp_path}/out", "trainer.total_steps=1", "data.train_batch_size_prompts=8",
            "actor.mini_batch_size_prompts=8"]
    code = main(args)
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and "Traceback" not in err
    assert err.startswith(f"rlplat: RewardConfigError: {data} row 0 has no reward_model.ground_truth (8 train row(s) "
                          f"have none), and reward function(s) 'auto' need one")


@pytest.mark.slow
def test_a_worker_that_dies_mid_step_stops_the_run_naming_the_checkpoint_to_resume_from(embedded_cache, small_val,
                                                                                     tmp_path, ray_cluster):
    """Colocated on Ray: the actor's worker process is killed in step 2, after step 1's checkpoint. The run stops with
    one line naming the worker, the call and the checkpoint; the same command resumes from it and trains step 2 once."""
    import ray

    from rlplat.trainer.run import load_run_config, run
    from rlplat.utils.errors import WorkerDied

    class KillsItsWorker(PPOTrainer):
        stage_order = PPOTrainer.insert_stage("kill", after="advantages")

        def kill(self, batch, metrics):
            if self.step == 2:
                ray.kill(self.components.actor.actors[0])  # as the out-of-memory killer would
            return batch

    small = [arg for arg in SMALL if not arg.startswith("trainer.ray_address=")]
    cfg, plan = load_run_config([*small, f"data.val_files={small_val}", "trainer.total_steps=2", "trainer.save_freq=1",
                                 f"trainer.output_dir={tmp_path}"])
    with pytest.raises(WorkerDied) as died:
        run(cfg, plan, KillsItsWorker)
    message = str(died.value)
    assert message.startswith("ActorRolloutRefWorker rank 0 of 1 died during update_actor()") and "\n" not in message
    assert message.endswith(f"the step under way is lost; rerun the same command to resume from "
                            f"{tmp_path}/checkpoints/step_000001 (trainer.resume_mode=auto)")
    assert run(cfg, plan)["steps"] == 2
    trained = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()
               if "actor/pg_loss" in line]
    assert trained == [1, 2]  # each step logged once: the lost step 2 left no row
