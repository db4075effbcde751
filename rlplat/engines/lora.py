"""LoRA adapters on the training engine's model (``model.lora.rank > 0``), through ``peft``.

LoRA (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models", arXiv:2106.09685) trains, beside
each frozen linear weight ``W`` [out, in], two small matrices ``A`` [r, in] and ``B`` [out, r] (``B`` starts at
zero), and the layer computes ``W x + s B A x`` with ``s = alpha / r``. The adapters are put into the loaded
Hugging Face model in place by ``peft.inject_adapter_in_model`` (the model stays the model it was: the
token head and the gated MLP of :mod:`rlplat.engines` still find their layers), under peft's names:
``<layer>.base_layer.weight`` for ``W``, ``<layer>.lora_A.default.weight`` and ``<layer>.lora_B.default.weight``.

Everything that leaves the engine under Hugging Face names (weight sync, export, the reference's blend) gets
the **merged** weight ``W + s B A`` under ``<layer>.weight`` (:func:`merged`), computed from the full tensors
in float32, so ``W`` itself never changes. :func:`adapters_disabled` runs the model without its adapters:
the base model, bit for bit (the reference policy for free).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import torch
from omegaconf import DictConfig

from rlplat.config.errors import ConfigError
from rlplat.engines.base import blend_

ADAPTER = "default"  # peft's name of the one adapter rlplat trains

WeightBucket = list[tuple[str, torch.Tensor]]


def is_adapter(name: str) -> bool:
    """Whether a parameter or state-dict entry of an adapted model is a LoRA adapter (peft's ``lora_A`` or
    ``lora_B``), not a base weight."""
    return ".lora_A." in name or ".lora_B." in name


class LoRA:
    """A training engine's LoRA adapters (``engine.lora``; the engine has none without ``model.lora.rank``).

    Built by the engine once its model holds peft's adapters (:func:`inject_lora`) and is wrapped as it trains
    (``model``: the engine's outermost module, whose state dict names the adapters). ``gather`` turns a bucket
    of this rank's (name, tensor) pieces into full tensors in a dtype (collective over the engine's ranks).
    With ``ref.sync_steps`` the reference policy keeps adapters of its own (:meth:`keep_reference`), blended
    towards the actor's (:meth:`blend_reference`); the base weights are always shared.
    """

    def __init__(self, model: torch.nn.Module, cfg: DictConfig, scalings: dict[str, float],
                 gather: Callable[[WeightBucket, torch.dtype | None], WeightBucket]):
        self.model, self.cfg, self.scalings, self._gather = model, cfg, scalings, gather
        self.reference_adapters: dict[str, torch.Tensor] | None = None  # keep_reference (ref.sync_steps)

    def adapters(self) -> dict[str, torch.nn.Parameter]:
        """The trained adapter parameters by name."""
        return {name: p for name, p in self.model.named_parameters() if is_adapter(name)}

    def export(self, dtype: torch.dtype | None, bucket_bytes: int) -> Iterator[WeightBucket]:
        """The adapters alone as full tensors under peft's names, in buckets of about ``bucket_bytes``
        (``rollout.lora_sync=adapter``). Collective, like the engine's ``export_weights``."""
        items = [(name, tensor) for name, tensor in self.model.state_dict().items() if is_adapter(name)]
        for bucket in bucketed(items, dtype, bucket_bytes):
            yield self._gather(bucket, dtype)

    def merge(self, full: WeightBucket, dtype: torch.dtype | None) -> WeightBucket:
        """A bucket of full tensors under peft's names as Hugging Face weights, each adapted layer merged
        (:func:`merged`)."""
        return merged(full, self.scalings, dtype)

    def reference(self) -> contextlib.AbstractContextManager:
        """A context in which the model is the reference policy: the base model (its adapters off), or, once
        :meth:`keep_reference` was called, the base model with the reference's own adapters."""
        if self.reference_adapters is None:
            return adapters_disabled(self.model)
        return self._reference_adapters_in()

    @contextlib.contextmanager
    def _reference_adapters_in(self):
        """The reference's adapters in the model's place inside the block, the actor's back after it."""
        adapters = self.adapters()
        with torch.no_grad():
            own = {name: p.detach().clone() for name, p in adapters.items()}
            for name, p in adapters.items():
                p.copy_(self.reference_adapters[name])
        try:
            yield
        finally:
            with torch.no_grad():
                for name, p in adapters.items():
                    p.copy_(own[name])

    def keep_reference(self) -> None:
        """Keep a copy of the adapters as the reference's. It starts as the initial adapters, whose B is zero:
        the base model exactly."""
        self.reference_adapters = {name: p.detach().clone() for name, p in self.adapters().items()}

    def blend_reference(self, alpha: float) -> None:
        """The reference's adapters <- alpha * the actor's + (1 - alpha) * the reference's, shard by shard."""
        with torch.no_grad():
            for name, p in self.adapters().items():
                blend_(self.reference_adapters[name], p.detach(), alpha)


def bucketed(items: list[tuple[str, torch.Tensor]], dtype: torch.dtype | None, bucket_bytes: int,
             group_of: Callable[[str], str | None] = lambda name: None) -> Iterator[WeightBucket]:
    """``items`` in buckets of about ``bucket_bytes`` (counted in ``dtype``, None: each tensor's own); entries
    with the same non-None ``group_of(name)`` stay in one bucket."""
    bucket, size, group = [], 0, None
    for name, tensor in items:
        nbytes = tensor.numel() * (dtype or tensor.dtype).itemsize
        part_of = group_of(name)
        if bucket and size + nbytes > bucket_bytes and (part_of is None or part_of != group):
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
        group = part_of
    if bucket:
        yield bucket


def inject_lora(module: torch.nn.Module, lora_cfg: DictConfig, seed: int = 0) -> dict[str, float]:
    """Put LoRA adapters of ``model.lora`` into ``module`` (its base weights frozen; ``A`` drawn from ``seed``, the
    same on every rank, ``B`` zero); returns each adapted layer's scaling ``s`` by the layer's name."""
    config = peft_config(lora_cfg)  # first: one line if peft is missing
    from peft import inject_adapter_in_model

    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            inject_adapter_in_model(config, module, adapter_name=ADAPTER)
    except ValueError as err:  # e.g. target modules not found in the model
        raise ConfigError(f"model.lora.target_modules={list(lora_cfg.target_modules)}: {err}") from None
    return {name: float(layer.scaling[ADAPTER]) for name, layer in lora_layers(module)}


def peft_config(lora_cfg: DictConfig, target_modules: list[str] | None = None):
    """``model.lora`` as peft's ``LoraConfig`` (``target_modules``: these layer names instead of the config's)."""
    try:
        from peft import LoraConfig
    except ImportError:
        raise ConfigError("model.lora.rank > 0 needs the peft package (pip install peft)") from None
    # peft's "all-linear": every linear layer but the output layer
    targets = target_modules or list(lora_cfg.target_modules) or "all-linear"
    return LoraConfig(r=lora_cfg.rank, lora_alpha=lora_cfg.alpha, lora_dropout=lora_cfg.dropout,
                      target_modules=targets, bias="none")


def scaling(lora_cfg: DictConfig) -> float:
    """The adapters' ``s = alpha / r`` (peft's LoRA scaling without rank stabilisation)."""
    return lora_cfg.alpha / lora_cfg.rank


def merge_adapters(base: dict[str, torch.Tensor], adapters: dict[str, torch.Tensor],
                   lora_cfg: DictConfig) -> dict[str, torch.Tensor]:
    """Hugging Face weights ``base`` with the adapters of a checkpoint (peft's names) merged into them
    (:func:`merged`, after naming each adapted layer's weight as peft does)."""
    marker = f".lora_A.{ADAPTER}."
    layers = {name.split(marker)[0] for name in adapters if marker in name}
    items = [(f"{name[:-len('.weight')]}.base_layer.weight" if name.endswith(".weight")
              and name[:-len(".weight")] in layers else name, tensor) for name, tensor in base.items()]
    return dict(merged(items + list(adapters.items()), dict.fromkeys(layers, scaling(lora_cfg))))


def save_adapter_dir(adapters: Mapping[str, torch.Tensor], lora_cfg: DictConfig, out: Path,
                     base_model: str | None = None) -> None:
    """Write ``adapters`` (the adapted model's names, e.g. ``...q_proj.lora_A.default.weight``) as a PEFT adapter
    directory in ``out``, as peft's ``save_pretrained`` does: ``adapter_config.json`` (``model.lora``, its target
    modules the adapted layers' names) and ``adapter_model.safetensors`` (``base_model.model.<layer>.lora_A.weight``
    ...), ``base_model`` its ``base_model_name_or_path``. Hugging Face's peft and vLLM's LoRA loader read it."""
    from safetensors.torch import save_file

    marker = f".lora_A.{ADAPTER}."
    targets = sorted({name.split(marker)[0].rpartition(".")[2] for name in adapters if marker in name})
    out.mkdir(parents=True, exist_ok=True)
    config = peft_config(lora_cfg, targets)
    config.base_model_name_or_path = base_model
    config.save_pretrained(str(out))
    save_file({"base_model.model." + name.replace(f".{ADAPTER}.", "."): tensor.detach().cpu().contiguous().clone()
               for name, tensor in adapters.items()}, str(out / "adapter_model.safetensors"))


def lora_layers(module: torch.nn.Module) -> Iterator[tuple[str, torch.nn.Module]]:
    """The adapted layers of ``module`` (peft's LoRA layers), by name."""
    for name, sub in module.named_modules():
        if hasattr(sub, "lora_A") and hasattr(sub, "base_layer"):
            yield name, sub


def adapted(layer: torch.nn.Module) -> bool:
    """Whether ``layer``'s forward adds its adapter now (a LoRA layer with adapters enabled and unmerged)."""
    return (hasattr(layer, "lora_A") and ADAPTER in layer.lora_A and not layer.disable_adapters
            and not layer.merged)


@contextlib.contextmanager
def adapters_disabled(module: torch.nn.Module) -> Iterator[None]:
    """Run ``module`` without its adapters (its base weights only) inside the block."""
    # peft's flag behind BaseTunerLayer.disable_adapters, set directly: its enable_adapters() also flips the
    # adapters' requires_grad, which FSDP2 reads from its parameters and the optimizer relies on
    layers = [layer for _, layer in lora_layers(module)]
    for layer in layers:
        layer._disable_adapters = True
    try:
        yield
    finally:
        for layer in layers:
            layer._disable_adapters = False


def owner(name: str) -> str | None:
    """The adapted layer a state-dict entry belongs to (its base weight, bias or adapter), else None: the
    entries of one layer must be exported together."""
    for marker in (".base_layer.", ".lora_A.", ".lora_B."):
        if marker in name:
            return name.split(marker)[0]
    return None


def merged(items: list[tuple[str, torch.Tensor]], scalings: dict[str, float],
           dtype: torch.dtype | None = None) -> list[tuple[str, torch.Tensor]]:
    """Full tensors under peft's names -> under Hugging Face names, each adapted layer's weight merged:
    ``W + s B A`` in float32, then cast to ``dtype``; the adapters themselves are not among them."""
    tensors = dict(items)
    out = []
    for name, tensor in items:
        if is_adapter(name):
            continue
        layer, base, attr = name.rpartition(".base_layer.")
        if base:
            name = f"{layer}.{attr}"
            if attr == "weight" and layer in scalings:
                a = tensors[f"{layer}.lora_A.{ADAPTER}.weight"].float()
                b = tensors[f"{layer}.lora_B.{ADAPTER}.weight"].float()
                tensor = tensor.float() + scalings[layer] * (b @ a)
        out.append((name, tensor.to(dtype) if dtype is not None else tensor))
    return out
