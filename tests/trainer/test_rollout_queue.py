"""The rollout queue streaming by prompt group (rollout.stream_groups), driven by a scripted trainer: calls are
held back until the test releases them, so which call finishes first is the test's choice, not the machine's.
Whole runs on Ray are in test_async.py."""

import threading
import time
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

from rlplat.controller import Pending
from rlplat.protocol import Batch
from rlplat.sequence import position_ids_from_mask
from rlplat.reward.batch import TrainingScores, join_scores
from rlplat.trainer.rollout_queue import RolloutQueue
from rlplat.utils.errors import ChannelBroken, NotPlaced, RunError, WorkerDied

PAD, RESPONSE = 9, 2


class Scripted:
    """What the queue uses of its prompt source, rollout calls and components. A call generates nothing until the
    test releases it (by its first uid); its samples carry the weights pushed before it was submitted."""

    def __init__(self, ahead: int, stream: int, batch: int, steps: int, workers: int):
        self.cfg = OmegaConf.create({"trainer": {"async_steps": ahead, "total_steps": steps},
                                     "data": {"train_batch_size_prompts": batch},
                                     "rollout": {"stream_groups": stream, "max_restarts": 1, "node_wait_s": 5,
                                                 "node_lost": "stop", "heartbeat_s": 0}})
        self.components = self.weights = self
        self.timeline = SimpleNamespace(add=lambda *span: None)
        self.tokenizer = SimpleNamespace(pad_token_id=PAD)
        self.generator = SimpleNamespace(world_size=workers)
        self.step = self.seen = self.drawn = self.version = 0
        self.gates: dict[int, threading.Event] = {}  # first uid of a call -> released
        self.calls: list[tuple[list[int], int | None, int]] = []  # (uids, rank, version) as submitted
        self.checked: list[dict | None] = []  # the syncs each take() asked to be checked: rank -> newest version used

    # the prompt source
    def draw(self, count):
        self.drawn += count
        self.seen += count
        return list(range(self.drawn - count, self.drawn)), list(range(self.seen - count, self.seen))

    def batch(self, entries, uids, step):
        return Batch.from_dict(non_tensors={"uid": [f"p{u}" for u in uids], "index": list(entries)})

    # the rollout calls
    def start(self, prompts, rank):
        uids = [int(u[1:]) for u in prompts.non_tensors["uid"]]
        gate, version = self.gates.setdefault(uids[0], threading.Event()), self.version
        self.calls.append((uids, rank, version))

        def generate():
            assert gate.wait(timeout=60), f"the call of uid {uids[0]} was never released"  # no thread left hanging
            width = 3 + uids[0] % 3  # each call pads its prompts to its own longest
            rows = len(uids)
            prompt_mask = torch.zeros(rows, width, dtype=torch.long)
            prompt_mask[:, -2:] = 1
            attention = torch.cat([prompt_mask, torch.ones(rows, RESPONSE, dtype=torch.long)], dim=1)
            prompts_ids = torch.where(prompt_mask.bool(), torch.tensor(uids)[:, None], PAD)
            return prompts.union(Batch.from_dict({
                "prompts": prompts_ids, "prompt_mask": prompt_mask,
                "input_ids": torch.cat([prompts_ids, torch.ones(rows, RESPONSE, dtype=torch.long)], dim=1),
                "attention_mask": attention, "position_ids": position_ids_from_mask(attention),
                "policy_version": torch.full((rows,), version), "generated_from": torch.zeros(rows, dtype=torch.float64),
                "generated_until": torch.ones(rows, dtype=torch.float64)}))
        return Pending(generate), None

    def finish(self, prompts, started):
        return started[0].result()

    # the components, and their weight pushes
    def send(self, version):
        self.version = version

    def check(self, needed=None):
        self.checked.append(needed)

    def training_scores(self, out):
        scores = torch.tensor([float(u[1:]) for u in out.non_tensors["uid"]])
        return TrainingScores(scores, scores[:, None], torch.ones(1), {"reward/score_mean": float(scores.mean())})


def step(trainer: Scripted, queue: RolloutQueue, release: list[int]):
    """One step: take its groups while releasing the calls starting with ``release``, one after another (each
    generated and scored before the next is released); then the weights of this update are sent. A gate opens only
    once the take has submitted its calls (after a death: the dead worker's again), so which worker each call goes to
    does not depend on how fast a released call generates."""
    trainer.step += 1
    taken, metrics = [], {}
    thread = threading.Thread(target=lambda: taken.append(queue.take(trainer.step, metrics)))
    filled = len(queue.fills)
    thread.start()
    wait_until(lambda: len(queue.fills) > filled, "the take's calls submitted")
    for first in release:
        wait_until(lambda: any(call[0][0] == first for call in trainer.calls), f"the call of uid {first} submitted")
        flight = next((f for f in list(queue.in_flight) if f.uids[0] == first), None)  # None: taken in order already
        filled = len(queue.fills)
        trainer.gates[first].set()
        if flight is not None and isinstance(flight.ready.exception(timeout=30), WorkerDied):
            wait_until(lambda: len(queue.fills) > filled, "the dead worker's calls submitted again")
    thread.join(timeout=30)
    assert taken, "take() did not return"
    queue.sync(trainer.step)  # the sync_rollout stage
    return taken[0], metrics


def wait_until(condition, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"waited {timeout_s:g}s for {what}"
        time.sleep(0.005)


def uids(batch):
    return [int(u[1:]) for u in batch.non_tensors["uid"]]


def queue_of(trainer: Scripted, score_ahead: bool) -> RolloutQueue:
    """The queue, counting the fills it completed (``queue.fills``: the in-flight count each asked for)."""
    queue = RolloutQueue(trainer.cfg, trainer, trainer, trainer, trainer.timeline,
                         trainer.training_scores if score_ahead else None)
    fill, queue.fills = queue.fill, []

    def counted(count: int) -> None:
        fill(count)
        queue.fills.append(count)
    queue.fill = counted
    return queue


def end(trainer: Scripted, queue: RolloutQueue) -> None:
    """Open every gate (each call's thread ends) and close the queue."""
    for gate in trainer.gates.values():
        gate.set()
    queue.close()


def stops_when_call_dies(trainer: Scripted, queue: RolloutQueue, call: int, message: str) -> None:
    """The worker of submitted call ``call`` dies in the next step's take, which raises :class:`WorkerDied`
    matching ``message``; every gate is opened and the queue closed after."""
    trainer.dies.add(call)
    trainer.step += 1
    trainer.gates.setdefault(call, threading.Event()).set()
    try:
        with pytest.raises(WorkerDied, match=message):
            queue.take(trainer.step, {})
    finally:
        end(trainer, queue)


def test_a_step_takes_the_first_groups_ready_and_drops_calls_that_grew_too_old():
    trainer = Scripted(ahead=1, stream=2, batch=4, steps=4, workers=2)
    queue = queue_of(trainer, score_ahead=True)
    queue.start(0)
    # step 1: calls [0 1] [2 3] [4 5] [6 7] by weights 0; [2 3] and [6 7] finish first: they are the step's
    batch, metrics = step(trainer, queue, release=[2, 6])
    assert uids(batch) == [2, 3, 6, 7]
    assert [call[0] for call in trainer.calls] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert (metrics["off_policy/staleness_max"], metrics["rollout/dropped_groups"]) == (0, 0)
    assert batch.meta["scores"].scores.tolist() == [2, 3, 6, 7]  # scored as they arrived, joined in row order
    # the prompts, padded to their own longest (5 and 3 tokens), now share the widest: same tokens, positions
    assert batch.tensors["prompts"].shape == (4, 5) and batch.tensors["prompt_mask"].sum().item() == 8
    assert batch.tensors["position_ids"].tolist() == position_ids_from_mask(batch.tensors["attention_mask"]).tolist()
    assert batch.tensors["input_ids"][2].tolist() == [PAD, PAD, PAD, 6, 6, 1, 1]
    assert batch.tensors["attention_mask"][2].tolist() == [0, 0, 0, 1, 1, 1, 1]
    # step 2: [10 11] (weights 1) is ready before [4 5] (weights 0): both are taken, the older weights first
    batch, metrics = step(trainer, queue, release=[10, 4])
    assert uids(batch) == [4, 5, 10, 11]
    # before training, the syncs of the weights used are checked: rank -> newest version its taken calls used
    # (step 1: [2 3] and [6 7] on worker 1; step 2: [4 5] on worker 0, [10 11] on worker 1)
    assert trainer.checked == [{1: 0}, {0: 0, 1: 1}]
    assert batch.tensors["policy_version"].tolist() == [0, 0, 1, 1]
    assert (metrics["off_policy/staleness_max"], metrics["off_policy/staleness_mean"]) == (1, 0.5)
    # step 3 may train weights 1 and 2 only: [0 1] (weights 0, still generating) is dropped and generated again
    batch, metrics = step(trainer, queue, release=[0, 8])
    assert metrics["rollout/dropped_groups"] == 2
    assert [call for call in trainer.calls if call[0] == [0, 1]] == [([0, 1], 0, 0), ([0, 1], 0, 2)]
    assert uids(batch) == [0, 1, 8, 9] and batch.tensors["policy_version"].tolist() == [2, 2, 1, 1]
    assert metrics["off_policy/staleness_max"] == 1
    # dynamic sampling pulls one call (the groups it misses), not a batch
    queue.next_groups(1)
    batch, metrics = step(trainer, queue, release=[12])
    assert uids(batch) == [12, 13]
    # a checkpoint now keeps the call still in flight; a resumed queue generates it first, with its uids
    assert queue.state() == [{"entries": [14, 15], "uids": [14, 15]}]
    resumed = Scripted(ahead=1, stream=2, batch=4, steps=6, workers=2)
    resumed.step, resumed.seen, resumed.drawn = 4, trainer.seen, trainer.drawn
    again = queue_of(resumed, score_ahead=True)
    again.restore(queue.state())
    again.start(4)
    batch, _ = step(resumed, again, release=[14, 16])
    assert uids(batch) == [14, 15, 16, 17]
    for scripted, q in ((trainer, queue), (resumed, again)):
        for gate in scripted.gates.values():
            gate.set()
        q.close()


def test_whole_batches_are_taken_in_order():
    trainer = Scripted(ahead=2, stream=0, batch=2, steps=3, workers=2)
    queue = queue_of(trainer, score_ahead=False)
    queue.start(0)
    for expected_staleness, first in zip((0, 1, 2), (0, 2, 4)):
        queue.next_groups(1)  # dynamic sampling's missing groups: whole batches are taken all the same
        batch, metrics = step(trainer, queue, release=[first])
        assert uids(batch) == [first, first + 1] and metrics["off_policy/staleness_max"] == expected_staleness
        assert "rollout/dropped_groups" not in metrics and "scores" not in batch.meta
    assert [rank for _, rank, _ in trainer.calls] == [None, None, None]  # split over the pool
    queue.close()


def test_samples_older_than_k_updates_stop_the_run_naming_their_versions():
    # the queue drops calls before they grow too old; the check after a take is the backstop for a rollout pool that
    # reports other weights than those it was sent (a bug): here a pool that always samples with weights 0
    class Stale(Scripted):
        def send(self, version):
            pass

    trainer = Stale(ahead=1, stream=0, batch=2, steps=4, workers=1)
    queue = queue_of(trainer, score_ahead=False)
    queue.start(0)
    for first in (0, 2):  # staleness 0, then 1: within K = 1
        step(trainer, queue, release=[first])
    trainer.step += 1
    trainer.gates[4].set()  # the call of step 3, submitted at step 2 after the weights of update 1
    try:
        with pytest.raises(RunError, match=r"step 3 got samples of policy versions \[0\] for weights of update 2: "
                                           r"outside trainer.async_steps=1 \(a bug in the rollout queue; please report it\)"):
            queue.take(trainer.step, {})
    finally:  # the call submitted for step 4 is released, so its thread ends
        end(trainer, queue)


def test_scores_of_several_calls_join_as_those_of_all_their_rows():
    def part(values, errors, latency):
        scores = torch.tensor(values, dtype=torch.float32)
        mean = sum(values) / len(values)
        std = (sum((v - mean) ** 2 for v in values) / len(values)) ** 0.5
        return TrainingScores(scores, scores[:, None], torch.ones(1), {
            "reward/f_mean": mean, "reward_calls/f_std": std, "reward_calls/f_errors": errors,
            "timing/reward_calls/f_latency_max_s": latency, "reward/num_errors": errors})

    joined = join_scores([part([1.0, 0.0], 1.0, 0.2), part([1.0, 1.0, 1.0, 0.0], 2.0, 0.5)])
    assert joined.scores.tolist() == [1, 0, 1, 1, 1, 0] and joined.terms.shape == (6, 1)
    assert joined.metrics["reward/f_mean"] == pytest.approx(4 / 6)
    assert joined.metrics["reward_calls/f_std"] == pytest.approx((4 / 6 - (4 / 6) ** 2) ** 0.5)
    assert (joined.metrics["reward_calls/f_errors"], joined.metrics["reward/num_errors"]) == (3, 3)
    assert joined.metrics["timing/reward_calls/f_latency_max_s"] == 0.5


class RolloutWorker:
    """The class name a dead rollout worker's error carries."""


class Replaceable(Scripted):
    """A pool whose workers die in the calls the test names (by first uid, once each) and are replaced."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.dies: set[int] = set()
        self.replacements: list[tuple[list[int], int]] = []  # (ranks, the weights they were sent)
        self.model_path = "model"
        self.generator = SimpleNamespace(world_size=self.generator.world_size, worker_cls=RolloutWorker,
                                         replace=lambda ranks, timeout_s: None, submit_to=lambda *call: Pending(lambda: None))

    def start(self, prompts, rank):
        first = int(prompts.non_tensors["uid"][0][1:])
        sampled, _ = super().start(prompts, rank)

        def generate():
            value = sampled.result()
            if first in self.dies:
                self.dies.discard(first)
                raise WorkerDied(f"RolloutWorker rank {rank} of 2 died during generate_sequences()", "RolloutWorker",
                                 rank)
            return value
        return Pending(generate), None

    def replaceable(self, rank):
        return [rank]

    def replaced(self, ranks, version):
        self.replacements.append((ranks, version))
        return 0.0


def test_a_dead_rollout_workers_calls_are_generated_again_and_one_death_too_many_stops_the_run(capsys):
    trainer = Replaceable(ahead=1, stream=2, batch=4, steps=3, workers=2)
    queue = queue_of(trainer, score_ahead=True)
    queue.start(0)
    # step 1: calls [0 1] [4 5] on worker 0, [2 3] [6 7] on worker 1; worker 1 dies in [2 3] before anything is
    # ready: it is replaced with the weights of update 0 at once, and its two calls are submitted again first (each to
    # the worker with the fewest calls under way, worker 1: [0 1] is released after they are)
    trainer.dies.add(2)
    batch, metrics = step(trainer, queue, release=[2, 0])
    assert [call[:2] for call in trainer.calls[:4]] == [([0, 1], 0), ([2, 3], 1), ([4, 5], 0), ([6, 7], 1)]
    assert [call[:2] for call in trainer.calls[4:]] == [([2, 3], 1), ([6, 7], 1)]
    assert trainer.replacements == [([1], 0)] and metrics["rollout/restarts"] == 1
    assert uids(batch) == [0, 1, 2, 3] and batch.tensors["policy_version"].tolist() == [0, 0, 0, 0]
    replaced = "replaced rollout worker(s) [1] with new ones holding the weights of update 0 (checked)"
    assert replaced in capsys.readouterr().out
    # step 2 takes the rest; the call the dead worker had under way was never trained (no uid twice)
    batch, metrics = step(trainer, queue, release=[4, 6])
    assert uids(batch) == [4, 5, 6, 7] and metrics["rollout/restarts"] == 1
    # a second death is one more than rollout.max_restarts=1 allows: the run stops, saying so
    stops_when_call_dies(trainer, queue, 8, r"^RolloutWorker rank 0 of 2 died during generate_sequences\(\); "
                                            r"rollout.max_restarts=1 replacement\(s\) made already$")


class NodeLeft(Replaceable):
    """A pool whose dead workers' replacements find no room (their node left the cluster)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.generator.replace = self.no_room
        self.generator.remove = self.remove
        self.removed_ranks: list[list[int]] = []

    def no_room(self, ranks, timeout_s):
        raise NotPlaced(f"the RolloutWorker workers that replace ranks {ranks} did not start within {timeout_s:.0f} s",
                        ranks)

    def removed(self, ranks):  # the weight receipts of the workers gone
        self.removed_ranks.append(ranks)

    def remove(self, ranks):
        self.generator.world_size -= len(ranks)


def test_a_rollout_worker_whose_node_left_is_done_without_when_node_lost_is_continue(capsys):
    trainer = NodeLeft(ahead=1, stream=2, batch=4, steps=3, workers=2)
    trainer.cfg.rollout.node_lost, trainer.cfg.rollout.max_restarts = "continue", 2
    queue = queue_of(trainer, score_ahead=True)
    queue.start(0)
    # step 1: worker 0 dies in [0 1]; its replacement finds no room: the pool goes on with worker 1, now rank 0,
    # which generates [0 1] and [4 5] again after its own [2 3] and [6 7]
    trainer.dies.add(0)
    batch, metrics = step(trainer, queue, release=[0, 2])
    assert [call[:2] for call in trainer.calls] == [([0, 1], 0), ([2, 3], 1), ([4, 5], 0), ([6, 7], 1),
                                                    ([0, 1], 0), ([4, 5], 0)]
    assert (trainer.removed_ranks, trainer.generator.world_size, trainer.replacements) == ([[0]], 1, [])
    assert uids(batch) == [0, 1, 2, 3] and metrics["rollout/restarts"] == 1
    assert [flight.rank for flight in queue.in_flight] == [0, 0]  # [6 7] (was rank 1), [4 5]
    out = capsys.readouterr().out
    assert ("[rollout] RolloutWorker rank 0 of 2 died during generate_sequences(); the RolloutWorker workers that "
            "replace ranks [0] did not start within 5 s: the pool goes on with the 1 worker(s) left "
            "(rollout.node_lost=continue) in ") in out and "4 prompt group(s) in flight are generated again" in out
    # step 2 takes the rest, each group once; the syncs checked are those of the one worker left
    batch, metrics = step(trainer, queue, release=[4, 6])
    assert uids(batch) == [4, 5, 6, 7] and trainer.checked[-1] == {0: 0}
    assert all(rank == 0 for _, rank, _ in trainer.calls[4:])
    # the last worker's death leaves no pool: the run stops, saying why
    stops_when_call_dies(trainer, queue, 8, r"^RolloutWorker rank 0 of 2 died during generate_sequences\(\); the "
                                            r"RolloutWorker workers that replace ranks \[0\] did not start within 5 s "
                                            r"\(rollout.node_wait_s=5\)$")


def test_a_rollout_worker_whose_node_left_stops_the_run_when_node_lost_is_stop():
    trainer = NodeLeft(ahead=1, stream=2, batch=4, steps=3, workers=2)
    queue = queue_of(trainer, score_ahead=True)
    queue.start(0)
    stops_when_call_dies(trainer, queue, 2, r"^RolloutWorker rank 1 of 2 died during generate_sequences\(\); the "
                                            r"RolloutWorker workers that replace ranks \[1\] did not start within 5 s "
                                            r"\(rollout.node_wait_s=5\)$")
    assert trainer.generator.world_size == 2 and trainer.removed_ranks == []


def test_a_rollout_worker_that_answers_no_heartbeat_is_killed_and_replaced_as_hung(capsys):
    trainer = Replaceable(ahead=1, stream=2, batch=4, steps=2, workers=2)
    trainer.cfg.rollout.heartbeat_s = 0.05
    hung, killed = {1}, []

    def kill(rank):  # as Ray does: the killed worker's call fails
        killed.append(rank)
        hung.discard(rank)
        trainer.dies.add(2)
        trainer.gates.setdefault(2, threading.Event()).set()
    trainer.generator.silent = lambda method, timeout_s: sorted(hung) if method == "heartbeat" else []
    trainer.generator.kill = kill
    queue = queue_of(trainer, score_ahead=True)
    queue.start(0)
    # step 1: worker 1 hangs in [2 3] (its gate is never opened): the heartbeat kills it, and it is replaced; its
    # calls [2 3] and [6 7] are generated again by the new worker 1
    batch, metrics = step(trainer, queue, release=[0])
    assert killed == [1] and trainer.replacements == [([1], 0)] and metrics["rollout/restarts"] == 1
    assert uids(batch) == [0, 1, 2, 3]
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[rollout] ")]
    silent = "[rollout] RolloutWorker rank 1 of 2 answered no heartbeat within rollout.heartbeat_s=0.05 s"
    assert lines[0] == silent + ": killed as hung"
    assert lines[1].startswith(silent + " "
                               "and was killed as hung; replaced rollout worker(s) [1] with new ones holding the "
                               "weights of update 0 (checked)"), lines
    assert queue.heartbeat.hung == set()  # replaced: the new worker is not hung
    end(trainer, queue)


def test_a_weight_channel_that_lost_a_receiver_replaces_the_pool_and_regenerates_every_call_in_flight():
    # over rollout.weight_transport=distributed a broadcast that lost a receiver breaks the channel: the whole pool is
    # replaced, holding the update being sent, and every call in flight is generated again, first
    class Broken(Replaceable):
        def send(self, version):
            if version == 1:
                raise ChannelBroken("sending weights to the workers of the weight channel failed: Connection reset")
            super().send(version)

        def replaceable(self, rank):
            return [0, 1]

        def replaced(self, ranks, version):
            super().send(version)
            return super().replaced(ranks, version)

    trainer = Broken(ahead=1, stream=2, batch=4, steps=2, workers=2)
    queue = queue_of(trainer, score_ahead=True)
    queue.start(0)
    step(trainer, queue, release=[0, 2])  # its sync_rollout stage sends weights 1, and the channel breaks
    assert trainer.replacements == [([0, 1], 1)] and trainer.version == 1
    assert queue.state() == [{"entries": [4, 5, 6, 7], "uids": [4, 5, 6, 7]}]  # both calls of step 2, to redo
    batch, metrics = step(trainer, queue, release=[4, 6])
    assert uids(batch) == [4, 5, 6, 7] and batch.tensors["policy_version"].tolist() == [1, 1, 1, 1]
    assert metrics["rollout/restarts"] == 1
    end(trainer, queue)
