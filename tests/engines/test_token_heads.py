"""The output layer's heads (``<role>.fsdp.token_head``) and compiled decoder layers (``<role>.fsdp.compile``)
give what the eager chunked head and eager layers give (rlplat.engines.token_head, rlplat.engines.fsdp)."""

import importlib.util

import pytest
import torch

from rlplat.controller import InProcessWorkerGroup
from rlplat.engines import token_head
from rlplat.workers.roles import ActorRolloutRefWorker

from workers.helpers import engine_config, prompt_batch

CUDA = torch.cuda.is_available()
LIGER = CUDA and importlib.util.find_spec("liger_kernel") is not None
HEADS = ["fused", pytest.param("liger", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not LIGER, reason="liger-kernel's kernels are Triton on CUDA: they need a GPU and the liger-kernel package")])]
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason="no GPU")])]


def head_outputs(head: str, device: str, masked: bool, entropy_grad: bool):
    """Log-probs, entropy, Σπ² and the gradients of hidden states and weight from ``head``, float32, in
    chunks of 4 positions (so the last chunk is a partial one) at temperature 0.7."""
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(11, 16, generator=gen).to(device).requires_grad_()
    weight = torch.randn(40, 16, generator=gen).to(device).requires_grad_()
    targets = torch.randint(2, 40, (11,), generator=gen).to(device)
    out = token_head.token_outputs(hidden, weight, targets, 0.7, True, True,
                                   masked=torch.tensor([0, 1], device=device) if masked else None, head=head)
    coeffs = torch.randn(2, 11, generator=gen).to(device)
    loss = out.log_prob @ coeffs[0] + (out.entropy @ coeffs[1] if entropy_grad else 0.0)
    grads = torch.autograd.grad(loss, (hidden, weight))
    return [t.detach().cpu() for t in (out.log_prob, out.entropy, out.sum_pi_squared, *grads)]


@pytest.mark.parametrize("head", HEADS)
@pytest.mark.parametrize("case", ["plain", "masked-tokens", "entropy-in-loss"])
def test_every_token_head_gives_the_chunked_heads_outputs_and_gradients(monkeypatch, head, case):
    if head == "liger" and case == "masked-tokens":
        pytest.skip("the liger head refuses masked tokens (checked by the engine at start-up)")
    monkeypatch.setattr(token_head, "CHUNK_BYTES", 4 * 40 * 4)
    device = "cuda" if head == "liger" else "cpu"
    masked, entropy_grad = case == "masked-tokens", case == "entropy-in-loss"
    want = head_outputs("chunked", device, masked, entropy_grad)
    got = head_outputs(head, device, masked, entropy_grad)
    for name, g, w in zip(["log_prob", "entropy", "sum_pi_squared", "grad_hidden", "grad_weight"], got, want):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5, msg=lambda m: f"{head} {name}: {m}")


def test_an_unknown_head_is_named():
    with pytest.raises(ValueError, match="token head 'flash'.*chunked, fused, liger"):
        token_head.token_outputs(torch.zeros(1, 2), torch.zeros(3, 2), torch.zeros(1, dtype=torch.long), 1.0,
                                 head="flash")


@pytest.mark.parametrize("device", DEVICES)
def test_compiled_layers_and_fused_head_match_eager_log_probs_and_gradients(tiny_model_path, device):
    """One engine with every decoder layer compiled and the fused head, one eager with the chunked head: the
    same log-probs, entropy and parameter gradients (float32, within 1e-5) on sampled sequences of varied
    lengths, twice (the second pass runs the compiled code again, with other shapes)."""
    results = {}
    for compiled in (False, True):
        extra = ["actor.fsdp.mixed_precision=none", "rollout.dtype=float32"]
        extra += ["actor.fsdp.compile=true", "actor.fsdp.token_head=fused"] if compiled else []
        cfg, plan = engine_config(tiny_model_path, extra=extra, device=device)
        group = InProcessWorkerGroup(ActorRolloutRefWorker, device=device, cfg=cfg, plan=plan)
        try:
            group.init_model(tiny_model_path, with_ref=False)
            engine = group.worker.actor
            torch.manual_seed(0)
            batches = [group.generate_sequences(prompt_batch(tiny_model_path, n=n)) for n in (8, 5)]
            passes = []
            for batch in batches:
                mask = batch.tensors["response_mask"].bool()
                engine.model.zero_grad()
                fwd = engine.forward(batch, temperature=0.8, need_entropy=True, grad=True)
                ((fwd.log_probs + 0.1 * fwd.entropy) * mask.to(fwd.log_probs.device)).sum().backward()
                grads = {name: p.grad.clone() for name, p in engine.model.named_parameters()}
                passes.append((fwd.log_probs.detach().cpu()[mask], fwd.entropy.detach().cpu()[mask],
                               {name: g.cpu() for name, g in grads.items()}))
            results[compiled] = passes
        finally:
            group.shutdown()
    for (lp, ent, grads), (lp_c, ent_c, grads_c) in zip(results[False], results[True]):
        torch.testing.assert_close(lp_c, lp, atol=1e-5, rtol=0)
        torch.testing.assert_close(ent_c, ent, atol=1e-5, rtol=0)
        for name in grads:
            torch.testing.assert_close(grads_c[name], grads[name], atol=1e-5, rtol=1e-4, msg=lambda m: f"{name}: {m}")
