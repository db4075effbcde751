"""Padding-free forward passes: packed rows score every sequence exactly as padded rows do (log-probs,
entropy, Σπ², values and gradients), the chunked output layer equals full logits, and a model whose
attention ignores restarting positions falls back to padding with one line."""

import pytest
import torch
from transformers import AutoModelForCausalLM

import rlplat.engines.token_head as token_head
from rlplat.controller import InProcessWorkerGroup
from rlplat.engines.packing import PackedBatch, first_fit_decreasing
from rlplat.workers.roles import ActorRolloutRefWorker, CriticWorker
from workers.helpers import engine_config, prompt_batch, reference_log_probs


def test_first_fit_decreasing_fills_rows_longest_first():
    assert first_fit_decreasing([5, 3, 4, 2, 1], 6) == [[0, 4], [2, 3], [1]]
    assert first_fit_decreasing([6, 6], 6) == [[0], [1]]


def test_packed_rows_hold_each_sequence_with_restarting_positions():
    prompts = torch.tensor([[0, 0, 11, 12], [13, 14, 15, 16], [0, 0, 0, 17]])
    responses = torch.tensor([[21, 22, 0], [23, 0, 0], [24, 25, 26]])
    mask = torch.cat([(prompts != 0).long(), torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1]])], dim=1)
    packed = PackedBatch.build(torch.cat([prompts, responses], 1), mask, responses)
    assert packed.input_ids.tolist() == [[13, 14, 15, 16, 23], [11, 12, 21, 22, 0], [17, 24, 25, 26, 0]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 4], [0, 1, 2, 3, 0], [0, 1, 2, 3, 0]]
    # each selected position holds the token just before the response token it predicts
    assert packed.input_ids.view(-1)[packed.flat_index].tolist() == [12, 21, 16, 17, 24, 25]
    assert packed.targets.tolist() == [21, 22, 23, 24, 25, 26]
    assert packed.scatter(packed.targets.float()).tolist() == [[21, 22, 0], [23, 0, 0], [24, 25, 26]]
    assert packed.efficiency == pytest.approx(13 / 15)
    holed = mask.clone()
    holed[0, 4] = 0  # a hole inside a sequence cannot be packed
    assert PackedBatch.build(torch.cat([prompts, responses], 1), holed, responses) is None


@pytest.mark.parametrize("temperature", [0.7, 1.0])  # 1.0: the logits are not scaled
@pytest.mark.parametrize("entropy_grad", [True, False], ids=["entropy-in-loss", "entropy-metric-only"])
def test_chunked_output_layer_equals_full_logits_with_gradients(monkeypatch, temperature, entropy_grad):
    torch.manual_seed(0)
    hidden = torch.randn(9, 6, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(13, 6, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 13, (9,))
    monkeypatch.setattr(token_head, "CHUNK_BYTES", 4 * 13 * 4)  # chunks of 4 positions
    out = token_head.token_outputs(hidden, weight, targets, temperature, True, True)
    log_prob, entropy, sum_sq = out.log_prob, out.entropy, out.sum_pi_squared
    log_p = ((hidden @ weight.T) / temperature).log_softmax(-1)
    expected = (log_p.gather(-1, targets[:, None]).squeeze(-1), -(log_p.exp() * log_p).sum(-1))
    torch.testing.assert_close(log_prob.double(), expected[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(entropy.double(), expected[1], atol=1e-5, rtol=0)
    torch.testing.assert_close(sum_sq.double(), log_p.exp().square().sum(-1), atol=1e-6, rtol=0)
    weights = torch.randn(2, 9, dtype=torch.float64)
    if not entropy_grad:  # the entropy computed, as the update's metric always is, but not in the loss
        weights[1] = 0
        entropy = entropy.detach()
    got = torch.autograd.grad(log_prob.double() @ weights[0] + entropy.double() @ weights[1], (hidden, weight))
    want = torch.autograd.grad(expected[0] @ weights[0] + expected[1] @ weights[1], (hidden, weight))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-4, rtol=0)


def test_token_output_lm_is_the_causal_lms_modules_and_scores_as_it_does(tiny_model_path):
    """The same modules, parameters and names as the causal LM it is built from (a tied output layer stays
    tied), and the log-probs and entropy of its full logits; nothing asked for, nothing returned."""
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    assert token_head.TokenOutputLM.fits(plain)
    lm = token_head.TokenOutputLM(plain)
    assert lm.model is plain.model and lm.lm_head is plain.lm_head
    assert list(lm.state_dict()) == list(plain.state_dict())
    assert lm.lm_head.weight is lm.model.embed_tokens.weight
    ids = torch.randint(0, plain.config.vocab_size, (2, 7), generator=torch.Generator().manual_seed(0))
    positions, targets = torch.tensor([3, 8, 12]), torch.tensor([5, 6, 7])
    position_ids = torch.arange(7).repeat(2, 1)
    with torch.no_grad():
        out = lm(ids, position_ids, None, positions, targets, 0.7, need_entropy=True)
        log_p = (plain(input_ids=ids).logits.reshape(14, -1)[positions] / 0.7).log_softmax(-1)
    assert isinstance(out, tuple)  # a tuple, so that FSDP2 of every supported torch hooks it for backward
    log_prob, entropy, sum_pi_squared = out
    torch.testing.assert_close(log_prob, log_p.gather(-1, targets[:, None]).squeeze(-1), atol=1e-5, rtol=0)
    torch.testing.assert_close(entropy, -(log_p.exp() * log_p).sum(-1), atol=1e-5, rtol=0)
    assert sum_pi_squared is None
    from transformers import GPT2Config, GPT2LMHeadModel

    assert not token_head.TokenOutputLM.fits(GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=30)))


def varied_lengths(model_path: str) -> list[str]:
    """Digits end responses too (~10% of this model's samples per position), so lengths vary."""
    from transformers import AutoTokenizer

    stops = AutoTokenizer.from_pretrained(model_path).convert_tokens_to_ids(list("0123456789"))
    return ["data.max_response_length=12", f"rollout.stop_token_ids={stops}"]


@pytest.fixture
def actor(tiny_model_path):
    cfg, plan = engine_config(tiny_model_path, extra=varied_lengths(tiny_model_path))
    group = InProcessWorkerGroup(ActorRolloutRefWorker, device="cpu", cfg=cfg, plan=plan)
    group.init_model(tiny_model_path, with_ref=False)
    yield group
    group.shutdown()


def rollout_with_varied_lengths(group, model_path):
    out = group.generate_sequences(prompt_batch(model_path).repeat(4))
    lengths = out.tensors["attention_mask"].sum(-1)
    assert len(set(lengths.tolist())) > 5  # prompts and responses of many lengths: packing matters
    return out


def test_packed_forward_equals_padded_forward_and_plain_transformers(actor, tiny_model_path):
    engine = actor.worker.actor
    assert engine.pack_sequences and engine.chunked_head
    out = rollout_with_varied_lengths(actor, tiny_model_path)
    mask = out.tensors["response_mask"].bool()
    results = {}
    for packed in (True, False):
        engine.pack_sequences = packed
        engine.model.zero_grad()
        fwd = engine.forward(out, temperature=0.8, need_entropy=True, need_sum_pi_squared=True, grad=True)
        ((fwd.log_probs + 0.1 * fwd.entropy) * mask).sum().backward()
        grads = {name: p.grad.clone() for name, p in engine.model.named_parameters()}
        results[packed] = (fwd, grads)
    (packed_fwd, packed_grads), (padded_fwd, padded_grads) = results[True], results[False]
    for name in ("log_probs", "entropy", "sum_pi_squared"):
        torch.testing.assert_close(getattr(packed_fwd, name)[mask], getattr(padded_fwd, name)[mask], atol=1e-5, rtol=0)
    for name in padded_grads:
        torch.testing.assert_close(packed_grads[name], padded_grads[name], atol=1e-5, rtol=1e-4)
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    with torch.no_grad():
        expected = reference_log_probs(plain, out, 0.8)
    torch.testing.assert_close(packed_fwd.log_probs[mask].detach(), expected[mask], atol=1e-5, rtol=0)
    # the rollout's log-probs, sampled while stopped rows left the batch (and its KV cache), are the same
    with torch.no_grad():
        trained = engine.forward(out, temperature=1.0).log_probs
    torch.testing.assert_close(trained[mask], out.tensors["rollout_log_probs"][mask], atol=1e-4, rtol=0)
    # the packed rows computed fewer tokens than the padded ones did
    engine.tokens_real = engine.tokens_computed = 0
    engine.pack_sequences = True
    engine.forward(out)
    assert engine.tokens_computed < out.tensors["input_ids"].numel()
    assert engine.tokens_real == int(out.tensors["attention_mask"].sum())


def test_packed_critic_values_equal_padded_values(tiny_model_path):
    cfg, plan = engine_config(tiny_model_path, extra=["algorithm=ppo", *varied_lengths(tiny_model_path)])
    group = InProcessWorkerGroup(ActorRolloutRefWorker, device="cpu", cfg=cfg, plan=plan)
    critic = InProcessWorkerGroup(CriticWorker, device="cpu", cfg=cfg, plan=plan)
    try:
        group.init_model(tiny_model_path, with_ref=False)
        critic.init_model(tiny_model_path)
        out = rollout_with_varied_lengths(group, tiny_model_path)
        engine = critic.worker.critic
        mask = out.tensors["response_mask"].bool()
        values = {}
        for packed in (True, False):
            engine.pack_sequences = packed
            values[packed] = engine.forward(out).values
        torch.testing.assert_close(values[True][mask], values[False][mask], atol=1e-5, rtol=0)
    finally:
        group.shutdown()
        critic.shutdown()


def test_a_model_that_attends_across_packed_sequences_falls_back_to_padding(tiny_model_path, monkeypatch, capsys):
    import transformers.masking_utils as masking

    monkeypatch.setattr(masking, "find_packed_sequence_indices", lambda position_ids: None)  # no restarts seen
    cfg, plan = engine_config(tiny_model_path)
    group = InProcessWorkerGroup(ActorRolloutRefWorker, device="cpu", cfg=cfg, plan=plan)
    try:
        group.init_model(tiny_model_path, with_ref=False)
        assert not group.worker.actor.pack_sequences
        assert "running with padding" in capsys.readouterr().out
    finally:
        group.shutdown()
