"""``actor.megatron.params_dtype=bf16`` on CPU (one in-process worker): bf16 weights, their gradients summed
in fp32, stepped through fp32 master copies. The weights take half the memory, the update is the fp32-weights update within
bf16's precision, the weights are always their masters rounded, and checkpoints carry the masters (a
resume reads them back exactly; a checkpoint of fp32 weights gives the masters those weights exactly)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlplat.config import ConfigError
from rlplat.controller import InProcessWorkerGroup
from rlplat.workers.roles import ActorRolloutRefWorker
from workers.helpers import engine_config, prompt_batch, with_training_fields

pytest.importorskip("megatron.core", reason="needs megatron-core (pip install -e '.[megatron]')")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@contextlib.contextmanager
def running(model_path: str, params_dtype: str, device: str = "cpu") -> Iterator[InProcessWorkerGroup]:
    extra = ["actor.strategy=megatron", f"actor.megatron.params_dtype={params_dtype}"]
    cfg, plan = engine_config(model_path, extra=extra, device=device)
    group = InProcessWorkerGroup(ActorRolloutRefWorker, device=device, cfg=cfg, plan=plan)
    try:
        group.init_model(model_path, with_ref=False)
        yield group
    finally:
        group.shutdown()


def masters(group) -> dict[str, torch.Tensor]:
    """The actor's fp32 master copies under Hugging Face names."""
    engine = group.worker.actor
    from rlplat.engines.megatron.checkpoint import masters_here

    here = masters_here(engine.model, engine.optim)
    return {name: t.detach().cpu().clone() for name, t in engine.shards.to_hf(here).items()}


def rounded_masters_are_the_weights(group) -> None:
    weights = group.actor_weights()[0]
    for name, master in masters(group).items():
        assert master.dtype == torch.float32
        assert torch.equal(weights[name], master.to(torch.bfloat16)), name


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_bf16_weights_step_through_fp32_masters(tiny_model_path, device):
    """On a GPU the fp32 weights compute in bf16 too (mixed_precision=auto), so there the comparison is the
    recipe's alone: bf16 weights with fp32 masters against fp32 weights."""
    initial = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).state_dict()
    results = {}
    for params_dtype in ("fp32", "bf16"):
        with running(tiny_model_path, params_dtype, device) as group:
            engine = group.worker.actor
            torch.manual_seed(0)
            rollout = group.generate_sequences(prompt_batch(tiny_model_path))
            log_probs = group.compute_log_probs(rollout).tensors["old_log_probs"]
            weight_bytes = sum(p.numel() * p.element_size() for p in engine.model.parameters())
            grads = []  # the dtype of the gradient the optimizer sums a weight's into, at each backward pass
            fc1 = engine.model.decoder.layers[0].mlp.linear_fc1.weight
            fc1.register_hook(lambda g: grads.append((g.dtype, engine.optim.grad(fc1))) or g)
            if params_dtype == "bf16":
                assert {p.dtype for p in engine.model.parameters()} == {torch.bfloat16}
                start = masters(group)  # from the fp32 checkpoint, not from the rounded weights
                assert all(torch.equal(start[name], initial[name]) for name in start)
            group.update_actor(with_training_fields(rollout))
            results[params_dtype] = rollout, log_probs, weight_bytes, grads, (
                masters(group) if params_dtype == "bf16" else group.actor_weights()[0])
            if params_dtype == "bf16":
                rounded_masters_are_the_weights(group)
    (rollout, fp32_lp, fp32_bytes, fp32_grads, fp32_after), (_, bf16_lp, bf16_bytes, bf16_grads, after) = \
        results["fp32"], results["bf16"]
    update = torch.cat([(fp32_after[n] - initial[n]).flatten() for n in after])
    error = torch.cat([(after[n] - fp32_after[n]).flatten() for n in after])
    mask = rollout.tensors["response_mask"].bool()
    print(f"\n[megatron params_dtype=bf16 vs fp32, {device}] weight bytes {bf16_bytes} vs {fp32_bytes}; log-probs "
          f"max apart {(bf16_lp - fp32_lp)[mask].abs().max():.2e}; updates apart {error.norm() / update.norm():.3f} "
          f"(relative L2)")
    assert bf16_bytes * 2 == fp32_bytes
    # bf16 weights get bf16 gradients from each backward pass, summed into an fp32 main gradient
    assert [dtype for dtype, _ in fp32_grads] == [torch.float32] * len(fp32_grads)
    assert [dtype for dtype, _ in bf16_grads] == [torch.bfloat16] * len(bf16_grads) != []
    assert [summed.dtype for _, summed in bf16_grads[1:]] == [torch.float32] * (len(bf16_grads) - 1)
    assert (bf16_lp - fp32_lp)[mask].abs().max() < 2e-2  # measured 3.1e-3
    # every trained weight has a master (the tied output layer is the embedding), and the masters' update is
    # the fp32 weights' update within bf16 precision (measured: 1.5% of its norm)
    assert set(after) == set(fp32_after) - {"lm_head.weight"}
    assert update.norm() > 0 and error.norm() / update.norm() < 0.1


def test_a_checkpoint_restores_the_masters_and_one_of_fp32_weights_gives_them(tiny_model_path, tmp_path):
    torch.manual_seed(0)
    with running(tiny_model_path, "bf16") as writer:
        rollout = writer.generate_sequences(prompt_batch(tiny_model_path))
        first, second = with_training_fields(rollout), with_training_fields(rollout, seed=1)
        writer.update_actor(first)
        writer.save_checkpoint(str(tmp_path / "bf16"))
        saved_masters = masters(writer)
        writer.update_actor(second)
        continued_masters = masters(writer)
    with running(tiny_model_path, "bf16") as resumed:
        resumed.load_checkpoint(str(tmp_path / "bf16"))
        assert all(torch.equal(t, saved_masters[name]) for name, t in masters(resumed).items())
        resumed.update_actor(second)  # the next update as the writer took it (to float rounding, as with fp32)
        for name, tensor in masters(resumed).items():
            torch.testing.assert_close(tensor, continued_masters[name], atol=1e-6, rtol=1e-5)
        rounded_masters_are_the_weights(resumed)

    with running(tiny_model_path, "fp32") as fp32:
        fp32.update_actor(first)
        fp32.save_checkpoint(str(tmp_path / "fp32"))
        fp32_weights = fp32.actor_weights()[0]
    with running(tiny_model_path, "bf16") as bf16:
        bf16.load_checkpoint(str(tmp_path / "fp32"))
        assert all(torch.equal(t, fp32_weights[name]) for name, t in masters(bf16).items())
        rounded_masters_are_the_weights(bf16)


@pytest.mark.parametrize("extra, message", [
    (["actor.megatron.params_dtype=fp16"], "actor.megatron.params_dtype='fp16' is not one of: fp32, bf16"),
    (["actor.megatron.params_dtype=bf16", "actor.megatron.mixed_precision=none"],
     "actor.megatron.params_dtype=bf16 computes in bf16, and actor.megatron.mixed_precision=none asks for fp32"),
    (["actor.megatron.params_dtype=bf16", "algorithm.use_kl_loss=true", "ref.sync_steps=2", "ref.sync_alpha=0.05"],
     "ref.megatron.params_dtype=bf16 with ref.sync_alpha=0.05 < 1: mixing a small share of the actor into bf16"),
])
def test_params_dtype_is_checked_in_one_line(tiny_model_path, extra, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(".", r"\.")):
        engine_config(tiny_model_path, extra=["actor.strategy=megatron", *extra])
