"""Engines of one's own, registered from ``trainer.imports=[trainer.toy_engines]`` without any edit to rlplat: the
test that what rlplat needs of an engine is what the engine declares.

* ``toy`` training engine: a plain Hugging Face model held whole by one worker, trained with rlplat's AdamW; it
  implements :class:`~rlplat.engines.TrainingEngine`'s abstract methods and declares nothing else (no config
  section, the base class's memory declarations, no Hugging Face-named checkpoints).
* ``toy`` rollout engine: samples as the HF engine does, declaring none of its abilities (no adapters, no
  weight checksums or probe, no pause for an update) and its own memory for the plan.
"""

from __future__ import annotations

import os

import torch

from rlplat.engines import TRAINING_ENGINES, ForwardOutput, ParallelLayout, TrainingEngine
from rlplat.engines.base import blend_, check_blended
from rlplat.engines.optim import Optimizer
from rlplat.rollout import ROLLOUT_ENGINES
from rlplat.rollout.base import RolloutEngine
from rlplat.rollout.hf import HFRolloutEngine
from rlplat.sequence import response_log_probs

#: what the toy rollout engine declares it holds, for the plan
TOY_CACHE = "toy sampling cache"
forwards = [0]  # the toy training engine's forward passes in this process (an in-process run's)


@TRAINING_ENGINES.register("toy")
class ToyEngine(TrainingEngine):
    def __init__(self, model_path, model_cfg, engine_cfg, ctx, optim_cfg=None, total_optimizer_steps=1,
                 value_head=False):
        from transformers import AutoModelForCausalLM

        assert engine_cfg is None and not value_head  # no section of its own; GRPO has no critic
        self.ctx = ctx
        self._model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).to(ctx.device)
        self._model.requires_grad_(optim_cfg is not None)
        self.optim = Optimizer(self._model.parameters(), optim_cfg, total_optimizer_steps) if optim_cfg else None

    @property
    def model(self):
        return self._model

    @property
    def layout(self):
        return ParallelLayout(dp_rank=0, dp_size=1)

    def all_reduce_dp(self, values, op="sum"):
        return self.ctx.all_reduce(values, op)

    def forward(self, micro, *, temperature=1.0, need_entropy=False, need_sum_pi_squared=False, grad=False):
        from rlplat.algorithms import entropy_from_logits

        forwards[0] += 1
        t = {name: tensor.to(self.ctx.device) for name, tensor in micro.tensors.items()}
        with torch.set_grad_enabled(grad):
            logits = self._model(input_ids=t["input_ids"], attention_mask=t["attention_mask"],
                                 position_ids=t["position_ids"], use_cache=False).logits
            length = t["responses"].shape[1]  # the positions that predict each response token
            log_probs, scaled = response_log_probs(logits[:, -length - 1:-1], t["responses"], temperature)
            return ForwardOutput(log_probs=log_probs, entropy=entropy_from_logits(scaled) if need_entropy else None)

    def export_weights(self, dtype=None, bucket_bytes=512 * 2**20):
        yield [(name, tensor.detach().to(dtype or tensor.dtype)) for name, tensor in self._model.state_dict().items()]

    def blend_weights(self, buckets, alpha):
        params = self._model.state_dict()
        given = set()
        with torch.no_grad():
            for bucket in buckets:
                for name, full in bucket:
                    given.add(name)
                    blend_(params[name], full.to(params[name].device), alpha)
        check_blended(given, params)

    def save_checkpoint(self, path):
        os.makedirs(path, exist_ok=True)
        torch.save({"model": self._model.state_dict(), "optim": self.optim.optimizer.state_dict() if self.optim else None},
                   f"{path}/toy.pt")

    def load_checkpoint(self, path):
        state = torch.load(f"{path}/toy.pt")
        self._model.load_state_dict(state["model"])
        if self.optim is not None:
            self.optim.optimizer.load_state_dict(state["optim"])


@ROLLOUT_ENGINES.register("toy")
class ToyRollout(HFRolloutEngine):
    @classmethod
    def declare(cls, engine_cfg, device):
        return RolloutEngine.declare(engine_cfg, device)

    @classmethod
    def memory(cls, shape, engine_cfg, key, dtype, device, sequences, length, device_memory, lent_weights):
        return {TOY_CACHE: 4 * shape.params}, f"fewer sequences for {key}"

    def __init__(self, setup, engine_cfg):
        assert engine_cfg is None  # no section of its own: the HF engine's defaults
        from rlplat.config.schema import HFRolloutConfig
        from omegaconf import OmegaConf

        super().__init__(setup, OmegaConf.structured(HFRolloutConfig))
