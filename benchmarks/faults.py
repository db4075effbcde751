"""Faults injected into short runs, each resumed where it stopped, against the same run uninterrupted.

    python benchmarks/faults.py                     # every fault of every mode below
    python benchmarks/faults.py --modes inprocess --only update checkpoint_write

Each run is 6 steps of the Quickstart's task on 8 training prompts (4 prompts x 2 responses per step, a
checkpoint every 2 steps; the HF engine, float32, a fixed seed), in one of five modes (:data:`MODES`):
colocated in one process (``trainer.ray_address=inprocess``), colocated on a local Ray cluster with 2 training
workers, asynchronous (a separate rollout worker generating one step ahead, ``trainer.async_steps=1``), streaming
(two rollout workers, calls of 2 prompt groups, the weights through Ray's object store), asynchronous on a local
cluster of two nodes (``nodes``: the training worker on one, the rollout worker on the other), or streaming on a
local cluster of three (``shrink``: the training worker on one, a rollout worker on each other). A fault
stops the run or not; a stopped run is started again with the same command (``trainer.resume_mode=auto``), and the
result is compared with the same mode's uninterrupted run:

* ``survived``: the faulted command finished (``yes``), or it stopped and the same command resumed it to the end
  (``resumed``), or neither (``no``).
* ``lost`` / ``twice``: prompt groups the final checkpoint's ledger misses against the uninterrupted run's / trained
  twice (the ledger stops a run that would train a group again, so a run that survived trained none twice).
* ``logged twice``: steps with more than one row in ``metrics.jsonl``.
* ``recover s``: from the restart to the resumed run's first step; ``+s``: a run that survived a rollout worker's
  death without a restart, its extra wall seconds over the uninterrupted run's (``-``: nothing to recover).
* ``weights``: the final Hugging Face export against the uninterrupted run's: ``bit-identical`` or the largest
  difference.

The trainer is killed with SIGKILL by a trainer subclass right after the named stage of step 3 (its state then
changed and not yet saved), or, for ``checkpoint_write``, while the checkpoint of step 4 is written (after the
actor's shards, before the rename that completes it); on Ray, the processes of the cluster the killed trainer
started are killed with it (its process group). A rollout worker kills itself (a ``trainer.imports`` plug-in,
:data:`WORKER_FAULT`) as its third generation call starts, or after the first bucket of update 3 arrived, or stops
itself (SIGSTOP: hung, alive to Ray) as its third generation call starts; the run replaces it
(``rollout.max_restarts``; a hung one once it answered no heartbeat within ``rollout.heartbeat_s``, 5 s here) and
goes on. A training worker (on Ray, colocated) kills itself as the actor's
third update starts: the run stops naming the checkpoint, and the same command resumes. In the ``nodes`` mode the
node of the rollout worker leaves the 2-node cluster after step 3's weight sync: the worker's replacement cannot be
placed, the run stops after ``rollout.node_wait_s`` (5 s here) naming the checkpoint, and the same command resumes
on a new cluster of two nodes (the node back). In the ``shrink`` mode the node of rollout worker 0 leaves the same
way, and with ``rollout.node_lost=continue`` the pool goes on with the other worker.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEPS, SAVE_FREQ, FAULT_STEP = 6, 2, 3
# the reward call (counted over the run: 16 validation prompts, then 8 responses a step) whose process is killed:
# the third of step 3's
KILLED_REWARD_CALL = 16 + 8 * (FAULT_STEP - 1) + 3
# fault -> (where it is injected, the child's overrides)
FAULTS = {
    "generate": ("trainer SIGKILL after the generation of step 3", []),
    "reward": ("trainer SIGKILL after the reward of step 3", []),
    "update": ("trainer SIGKILL after the actor's update of step 3", []),
    "checkpoint_write": ("trainer SIGKILL while the checkpoint of step 4 is written", []),
    "sync_rollout": ("trainer SIGKILL after sending step 3's weights to the rollout worker", []),
    "reward_worker": ("the reward worker process SIGKILLed in a call of step 3", []),
    "rollout_generate": ("a rollout worker SIGKILLs itself as its third generation call starts", []),
    "rollout_weight_load": ("a rollout worker SIGKILLs itself loading the weights of update 3, a bucket in", []),
    "rollout_hang": ("a rollout worker SIGSTOPs itself (hung) as its third generation call starts",
                     ["rollout.heartbeat_s=5"]),
    "training_worker": ("a training worker SIGKILLs itself in the actor's update of step 3", []),
    "node_leave": ("rollout worker 0's node leaves the cluster after step 3's weight sync", []),
    "nan_loss_stop": ("a NaN loss at step 3, trainer.nonfinite=stop", ["trainer.nonfinite=stop"]),
    # its weights differ from the uninterrupted run's by design: step 3's update is skipped, not made again
    "nan_loss_skip": ("a NaN loss at step 3, trainer.nonfinite=skip (step 3's update skipped)",
                      ["trainer.nonfinite=skip"]),
}
# mode -> (its overrides, its faults)
MODES = {
    "inprocess": (["trainer.ray_address=inprocess"], ["generate", "reward", "update", "checkpoint_write",
                                                      "reward_worker", "nan_loss_stop", "nan_loss_skip"]),
    "ray": (["trainer.workers_per_node=2"], ["generate", "reward", "update", "checkpoint_write", "training_worker"]),
    "async": (["rollout.mode=separate", "trainer.async_steps=1"],
              ["generate", "reward", "update", "sync_rollout", "checkpoint_write", "rollout_generate",
               "rollout_weight_load", "rollout_hang"]),
    # two rollout workers, calls of 2 prompt groups streamed to them, the weights through Ray's object store (on a
    # local cluster of 4 logical CPUs: RAY_CPUS)
    "stream": (["rollout.mode=separate", "trainer.async_steps=1", "rollout.workers_per_node=2",
                "rollout.stream_groups=2", "rollout.weight_transport=object_store"],
               ["rollout_generate", "rollout_weight_load", "rollout_hang"]),
    # asynchronous on a local cluster of two worker nodes of 1 CPU each (the head has none: NODES), the training
    # worker on one, the rollout worker on the other
    "nodes": (["rollout.mode=separate", "trainer.async_steps=1", "rollout.node_wait_s=5"], ["node_leave"]),
    # streaming on a local cluster of three worker nodes: the training worker on one, a rollout worker on each other
    "shrink": (["rollout.mode=separate", "trainer.async_steps=1", "rollout.nnodes=2", "rollout.stream_groups=2",
                "rollout.weight_transport=object_store", "rollout.node_wait_s=5", "rollout.node_lost=continue"],
               ["node_leave"]),
}
RAY_CPUS = {"stream": 4}  # a mode's local Ray cluster, when not the machine's cores
# the modes run on a local cluster of worker nodes of 1 CPU each (ray.cluster_utils.Cluster): how many
NODES = {"nodes": 2, "shrink": 3}
# the worker faults: a plug-in (trainer.imports) with which the first rollout worker (or training worker) to get
# there kills itself, once
WORKER_FAULT = '''import os
import signal

from rlplat.workers.roles import ActorRolloutRefWorker, RolloutWorker

MARK, WHERE, AT = {mark!r}, {where!r}, {at!r}
_wait, _load, _train = RolloutWorker._wait_for_version, RolloutWorker._load, ActorRolloutRefWorker._train


def _die(how=signal.SIGKILL):
    try:  # the first worker there, once (two may get there together)
        os.close(os.open(MARK, os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return
    os.kill(os.getpid(), how)


def waiting(self, version, *args, **kwargs):  # each training generation call starts here
    self.fault_calls = getattr(self, "fault_calls", 0) + 1
    if WHERE in ("generate", "hang") and self.fault_calls == AT:
        _die(signal.SIGSTOP if WHERE == "hang" else signal.SIGKILL)  # SIGSTOP: hung, alive to Ray
    return _wait(self, version, *args, **kwargs)


def loading(self, update, buckets):
    if WHERE == "load" and update.version == AT:
        buckets = iter(buckets)
        first = next(buckets)  # received: the rest are not
        _die()
        buckets = [first, *buckets]
    return _load(self, update, buckets)


def training(self, *args, **kwargs):  # each update of the actor (one a step) trains here
    self.fault_updates = getattr(self, "fault_updates", 0) + 1
    if WHERE == "update" and self.fault_updates == AT:
        _die()
    return _train(self, *args, **kwargs)


RolloutWorker._wait_for_version, RolloutWorker._load, ActorRolloutRefWorker._train = waiting, loading, training
'''
# every run's reward: the arithmetic task's own, whose process kills itself once at the call RLPLAT_FAULT_CALL counts to
REWARD = '''import os

from rlplat.reward.scorers import arithmetic

CALLS = {calls!r}


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    kill_at = int(os.environ.get("RLPLAT_FAULT_CALL", "0"))
    if kill_at:
        with open(CALLS, "a") as counter:
            counter.write(".")
        if os.path.getsize(CALLS) == kill_at:
            os.kill(os.getpid(), 9)
    return arithmetic(data_source, solution_str, ground_truth, extra_info)
'''
CHILD = '''
import os, signal, sys, json
from rlplat.trainer.exit_status import exit_status
from rlplat.trainer.ppo import PPOTrainer
from rlplat.trainer.run import load_run_config, run
fault, overrides = sys.argv[1], json.loads(sys.argv[2])
STAGE = {"generate": "generate", "reward": "reward_wait", "update": "update_actor", "sync_rollout": "sync_rollout"}


class Faulty(PPOTrainer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if fault in STAGE:
            name = STAGE[fault] if STAGE[fault] in self.stages else fault  # "reward" when scoring does not overlap
            stage = getattr(self, name)

            def killing(batch, metrics):
                out = stage(batch, metrics)
                if self.step == %(step)d:
                    os.kill(os.getpid(), signal.SIGKILL)
                return out
            setattr(self, name, killing)
        if fault == "checkpoint_write":
            save = self.components.actor.save_checkpoint

            def killing_save(path):
                save(path)
                if self.step == %(step)d + 1:
                    os.kill(os.getpid(), signal.SIGKILL)
            self.components.actor.save_checkpoint = killing_save
        if fault == "node_leave":
            sync = self.sync_rollout

            def leaving(batch, metrics):
                out = sync(batch, metrics)
                if self.step == %(step)d:  # the node of the rollout worker leaves
                    import ray
                    where = ray.get(self.components.rollout.actors[0].__ray_call__.remote(
                        lambda worker: ray.get_runtime_context().get_node_id()))
                    cluster.remove_node(next(node for node in nodes if node.node_id == where))
                return out
            self.sync_rollout = leaving

    def update_actor(self, batch, metrics):
        if fault.startswith("nan_loss") and self.step == %(step)d:
            batch.tensors["advantages"].fill_(float("nan"))
        return super().update_actor(batch, metrics)


cfg, plan = load_run_config(overrides)
if os.environ.get("FAULTS_RAY_CPUS"):  # logical CPUs for more single-CPU workers than cores (the stream mode)
    import ray
    ray.init(num_cpus=int(os.environ["FAULTS_RAY_CPUS"]), include_dashboard=False)
if os.environ.get("FAULTS_NODES"):  # worker nodes of 1 CPU each; the head has none
    import ray
    from ray.cluster_utils import Cluster
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    nodes = [cluster.add_node(num_cpus=1) for _ in range(int(os.environ["FAULTS_NODES"]))]
    ray.init(address=cluster.address)
sys.exit(exit_status(lambda: run(cfg, plan, Faulty) and 0))
''' % {"step": FAULT_STEP}


def common(work: Path, mode: str) -> list[str]:
    from rlplat.data import TASKS, write_parquet

    train, val, reward = work / "train.parquet", work / "val.parquet", work / "reward.py"
    if not train.exists():
        write_parquet(TASKS.get("arithmetic")(8, seed=3, split="train"), train)
        write_parquet(TASKS.get("arithmetic")(16, seed=1, split="test"), val)
        reward.write_text(REWARD.format(calls=str(work / "reward_calls")))
    return ["data.train_batch_size_prompts=4", "actor.mini_batch_size_prompts=4", "rollout.n=2", "rollout.val_n=1",
            "trainer.test_freq=0", f"data.train_files={train}", f"data.val_files={val}",
            f"trainer.total_steps={STEPS}", f"trainer.save_freq={SAVE_FREQ}", "trainer.progress=off",
            "trainer.logger=[jsonl]", f"reward.custom_fn.path={reward}", *MODES[mode][0]]


WORKER_FAULTS = {"rollout_generate": "generate", "rollout_weight_load": "load", "rollout_hang": "hang",
                 "training_worker": "update"}


def worker_fault(fault: str, out: Path) -> list[str]:
    """The overrides that import the worker fault's plug-in (written to ``out``): the first rollout worker to start
    its third generation call (the validation before step 1 is one) or to receive a bucket of update 3, or the first
    training worker to start the actor's third update, dies there."""
    out.mkdir(parents=True, exist_ok=True)
    where, at = WORKER_FAULTS[fault], FAULT_STEP
    (out / "worker_fault.py").write_text(WORKER_FAULT.format(mark=str(out / "killed"), where=where, at=at))
    return ["trainer.imports=[worker_fault]"]


def child(mode: str, fault: str, overrides: list[str], path: Path | None = None) -> subprocess.CompletedProcess:
    """The run in a process group of its own: a trainer killed on Ray takes the cluster it started with it.
    ``path``: a directory for its ``PYTHONPATH`` (a fault's plug-in)."""
    kill = {"RLPLAT_FAULT_CALL": str(KILLED_REWARD_CALL)} if fault == "reward_worker" else {}
    if mode in RAY_CPUS:
        kill["FAULTS_RAY_CPUS"] = str(RAY_CPUS[mode])
    if path is not None:
        kill["PYTHONPATH"] = os.pathsep.join([str(path), *filter(None, [os.environ.get("PYTHONPATH")])])
    # the output in files, not pipes: Ray's processes may hold them open after the trainer's death. The 2-node
    # cluster's files in a directory of its own: killed, it leaves its address in ray_current_cluster there,
    # where a later plain ray.init() would otherwise find it and try to join it
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err, \
            tempfile.TemporaryDirectory(prefix="rlplat-ray-") as ray_tmp:
        if mode in NODES:
            kill.update(FAULTS_NODES=str(NODES[mode]), RAY_TMPDIR=ray_tmp)
        proc = subprocess.Popen([sys.executable, "-c", CHILD, fault, json.dumps(overrides)], stdout=out, stderr=err,
                                cwd=ROOT, start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1", **kill})
        proc.wait()
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out.seek(0), err.seek(0)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out.read(), err.read())


def rows(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def ledger(out: Path) -> set[int]:
    """The prompt groups the newest checkpoint's ledger holds."""
    newest = (out / "checkpoints" / "latest").read_text().strip()
    state = json.loads((out / "checkpoints" / newest / "trainer.json").read_text())
    return {n for start, end in state["ledger"] for n in range(start, end)}


def weights(out: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(out / "hf_export" / "model.safetensors"))


def compare(out: Path, reference: Path) -> str:
    import torch

    mine, theirs = weights(out), weights(reference)
    if mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine):
        return "bit-identical"
    return f"differ: max abs {max(float((mine[k] - theirs[k]).abs().max()) for k in mine):.2e}"


def inject(mode: str, fault: str, work: Path, reference: Path) -> dict:
    out = work / mode / fault
    overrides = [*common(work, mode), *FAULTS[fault][1], f"trainer.output_dir={out}"]
    plugin = work / mode / f"{fault}-plugin" if fault in WORKER_FAULTS else None
    if plugin is not None:
        overrides += worker_fault(fault, plugin)
    first = child(mode, fault, overrides, plugin)
    survived, recover = "yes", "-"
    if first.returncode != 0:
        restart = time.time()
        again = child(mode, "none", overrides, plugin)
        if again.returncode != 0:
            return {"mode": mode, "fault": fault, "survived": "no",
                    "why": (again.stderr.strip().splitlines() or ["?"])[-1]}
        survived = "resumed"
        hit = [row["time"] for row in rows(out) if row["step"] > 0 and row["time"] >= restart]
        recover = f"{hit[0] - restart:.1f}" if hit else "-"
    logged = [row["step"] for row in rows(out)]
    # a rollout worker replaced, or done without (in a step, or in the final validation: no step counts that one)
    restarts = sum("(replacement " in line for line in first.stdout.splitlines() if line.startswith("[rollout] "))
    if survived == "yes" and restarts:  # the run's extra seconds
        def spent(path):
            return json.loads((path / "summary.json").read_text())["wall_time_s"]
        recover = f"+{spent(out) - spent(reference):.1f}"
        survived = f"yes ({restarts:.0f} {'done without' if fault == 'node_leave' else 'replaced'})"
    expected = ledger(reference)
    got = ledger(out)
    # a second training of any group stops the run (the ledger), so a run that survived trained none twice
    return {"mode": mode, "fault": fault, "survived": survived, "lost": len(expected - got), "twice": "0 (ledger)",
            "logged_twice": len(logged) - len(set(logged)), "recover_s": recover, "weights": compare(out, reference),
            "stop": last_line(first.stderr)[:100] if first.returncode else ""}


def last_line(stderr: str) -> str:
    """The run's own last line (a Ray worker's log forwarded after it may follow it)."""
    lines = stderr.strip().splitlines() or [""]
    return next((line for line in reversed(lines) if line.startswith("rlplat: ")), lines[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    parser.add_argument("--only", nargs="+", choices=list(FAULTS), default=list(FAULTS),
                        help="of each mode's faults, these")
    args = parser.parse_args()
    os.environ.setdefault("RLPLAT_CACHE", str(Path.home() / ".cache" / "rlplat"))
    work = Path(tempfile.mkdtemp(prefix="rlplat-faults-"))
    results = []
    for mode in args.modes:
        reference = work / mode / "uninterrupted"
        done = child(mode, "none", [*common(work, mode), f"trainer.output_dir={reference}"])
        if done.returncode:
            raise SystemExit(f"the uninterrupted {mode} run failed: {done.stderr[-2000:]}")
        results += [inject(mode, fault, work, reference) for fault in MODES[mode][1] if fault in args.only]
    print("\n| mode | fault | injected | survived | prompts lost | trained twice | steps logged twice | recover s | "
          "final weights vs uninterrupted | the faulted run's last line |")
    print("|---|---|---|---|---:|---:|---:|---:|---|---|")
    for r in results:
        if r["survived"] == "no":
            print(f"| {r['mode']} | {r['fault']} | {FAULTS[r['fault']][0]} | no | | | | | | {r['why']} |")
            continue
        print(f"| {r['mode']} | {r['fault']} | {FAULTS[r['fault']][0]} | {r['survived']} | {r['lost']} | "
              f"{r['twice']} | {r['logged_twice']} | {r['recover_s']} | {r['weights']} | {r['stop']} |")
    print(f"\n(work directory: {work})")


if __name__ == "__main__":
    main()
