"""Validation: every validation prompt sampled ``rollout.val_n`` times at ``rollout.val_temperature``, scored
with the validation reward, summarised as ``val/*`` metrics; the first ``trainer.val_samples`` prompts'
responses go to ``val_samples.jsonl`` (and the loggers), where the report shows them as tables."""

from __future__ import annotations

import time

import numpy as np
from omegaconf import DictConfig

from rlplat.protocol import Batch
from rlplat.trainer.components import Components
from rlplat.trainer.metrics import validation_metrics
from rlplat.trainer.rollouts import Rollouts
from rlplat.trainer.samples import SampleLog, samples_of
from rlplat.utils.errors import WorkerDied
from rlplat.utils.progress import Progress
from rlplat.utils.tracking import SAMPLE_COLUMNS


class Validator:
    def __init__(self, cfg: DictConfig, components: Components):
        self.cfg, self.components = cfg, components
        self.samples = SampleLog(cfg.trainer.output_dir, "val_samples.jsonl", "val/samples", SAMPLE_COLUMNS)
        # where val accuracy's "correct" comes from: the reward's acc field, or the score >= 1 rule (summary.json)
        self.accuracy_source: str | None = None

    def run(self, step: int, progress: Progress, rollouts: Rollouts) -> dict[str, float]:
        """Generate for every validation prompt, score, log the samples; returns the ``val/*`` metrics."""
        cfg, components = self.cfg, self.components
        start = time.perf_counter()
        sources, pids, answers, scores, correct, errors, rules = [], [], [], [], [], 0, set()
        shown: list[dict] = []  # the first trainer.val_samples prompts' responses, for val_samples.jsonl
        versions: set[int] = set()
        keep = cfg.trainer.val_samples * cfg.rollout.val_n
        batches = -(-len(components.val_data) // cfg.data.val_batch_size_prompts)
        for done, prompts in enumerate(components.val_prompts(), start=1):
            pid = np.array([f"v{len(pids) + i}" for i in range(len(prompts))], dtype=object)
            prompts = prompts.union(Batch.from_dict(non_tensors={"uid": pid}))
            # weights_at_least: a separate rollout pool scores the newest weights (those of this step's update)
            prompts.meta.update(step=step, temperature=cfg.rollout.val_temperature, validation=True, weights_at_least=step)
            out = self._generate(prompts.repeat(cfg.rollout.val_n, interleave=True), step, rollouts)
            if "policy_version" in out.tensors.keys():  # a separate rollout pool: the weights it scored
                versions.update(out.tensors["policy_version"].tolist())
            result = components.score(out, validation=True)
            sources += list(out.non_tensors["data_source"])
            pids += list(out.non_tensors["uid"])
            answers += components.decode(out)
            scores += result.scores
            correct += result.correct()
            errors += result.num_errors
            rules.add(result.accuracy_source)
            if len(shown) < keep:
                shown += samples_of(out, answers[-len(out):], result.scores, correct=result.correct())
            progress.validating(done, batches)
        metrics = validation_metrics(sources, pids, answers, scores, correct)
        self.samples.write(step, shown[:keep], components.tracker)
        metrics["val/reward_num_errors"] = float(errors)
        if versions:
            metrics["val/policy_version"] = float(max(versions))
        self.accuracy_source = rules.pop() if len(rules) == 1 else "mixed"
        metrics["timing/validate_s"] = time.perf_counter() - start
        print(f"[validate step {step}] accuracy={metrics['val/accuracy']:.3f} on {len(scores)} responses", flush=True)
        return metrics

    def _generate(self, prompts: Batch, step: int, rollouts: Rollouts) -> Batch:
        """The responses to ``prompts``; a dead worker of a separate rollout pool is replaced (or, its node gone, done
        without: ``rollout.node_lost``) by ``rollouts``, holding the weights of update ``step``, and the batch is
        generated again, until ``rollout.max_restarts`` runs out."""
        while True:
            try:
                return self.components.generator.generate_sequences(prompts)
            except WorkerDied as death:
                rollouts.outlive(death, step)

    def rewind(self, keep_through: int | None) -> None:
        """Cut ``val_samples.jsonl`` back to step ``keep_through`` (as the tracker cuts ``metrics.jsonl``)."""
        self.samples.rewind(keep_through)
