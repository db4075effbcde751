"""Hugging Face <-> Megatron-Core weights: an exact round trip at TP = 1 and 2, and the converted shards
run in Megatron-Core's own ``GPTModel`` (on CPU, gloo) give the Hugging Face model's logits."""

from __future__ import annotations

import os

import pytest
import torch
import torch.multiprocessing as mp
from transformers import AutoConfig, AutoModelForCausalLM

from rlplat.utils.net import free_port
from rlplat.engines.megatron.convert import (GPTShape, data_parallel_size, hf_from_megatron, hf_sources,
                                             hf_split_dim, megatron_from_hf, megatron_name, stage_layers, tp_slice)
from rlplat.models.tiny import TinyModelSpec, build_tiny_model


# whole-model conversions, composed of the per-rank ones the engine uses
def hf_to_megatron(hf: dict[str, torch.Tensor], shape: GPTShape, tp: int = 1) -> list[dict[str, torch.Tensor]]:
    """One Megatron state dict per tensor-parallel rank from a whole Hugging Face state dict (one stage)."""
    shape.check_tp(tp)
    names = dict.fromkeys(megatron_name(name) for name in hf if not (name == "lm_head.weight" and shape.tied_embeddings))
    return [{name: t.clone() for name, t in megatron_from_hf(
        {name: tp_slice(t, hf_split_dim(name), tp, rank) for name, t in hf.items()}, shape, tp, rank, names).items()}
        for rank in range(tp)]


def megatron_to_hf(shards: list[dict[str, torch.Tensor]], shape: GPTShape) -> dict[str, torch.Tensor]:
    """The Hugging Face state dict from every tensor-parallel rank's Megatron state dict (the inverse of
    :func:`hf_to_megatron`; vocabulary padding is dropped)."""
    pieces = [hf_from_megatron(shard, shape, len(shards), rank) for rank, shard in enumerate(shards)]
    return {name: tensor if (dim := hf_split_dim(name)) is None else torch.cat([p[name] for p in pieces], dim)
            for name, tensor in pieces[0].items()}


@pytest.fixture(scope="module", params=[True, False], ids=["tied", "untied"])
def hf_model_dir(request, tmp_path_factory):
    spec = TinyModelSpec(tie_word_embeddings=request.param)
    return str(build_tiny_model(tmp_path_factory.mktemp("hf") / "model", spec, seed=3))


def hf_state(path: str) -> dict[str, torch.Tensor]:
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    state = model.state_dict()
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)  # the same tensor as the embedding
    return state


@pytest.mark.parametrize("tp", [1, 2])
def test_round_trip_is_exact(hf_model_dir, tp):
    hf = hf_state(hf_model_dir)
    shape = GPTShape.from_hf_config(AutoConfig.from_pretrained(hf_model_dir))
    shards = hf_to_megatron(hf, shape, tp)
    assert len(shards) == tp and shards[0].keys() == shards[-1].keys()
    qkv = shards[0]["decoder.layers.0.self_attention.linear_qkv.weight"]
    assert qkv.shape == ((shape.num_heads + 2 * shape.num_kv_heads) * shape.head_dim // tp, shape.hidden_size)
    assert shards[0]["embedding.word_embeddings.weight"].shape[0] == shape.padded_vocab_size(tp) // tp
    back = megatron_to_hf(shards, shape)
    assert back.keys() == hf.keys()
    for name, tensor in hf.items():
        assert torch.equal(back[name], tensor), name


def stage_names(names, shape: GPTShape, pp: int, stage: int) -> list[str]:
    """The tensors Megatron-Core builds on pipeline stage ``stage``: its layers numbered from 0, the
    embedding on the first stage, the final norm and the output layer (tied or not) on the last."""
    layers = stage_layers(shape, pp, stage)
    out = [f"decoder.layers.{int(n.split('.')[2]) - layers.start}.{n.split('.', 3)[3]}" for n in names
           if n.startswith("decoder.layers.") and int(n.split(".")[2]) in layers]
    if stage == 0:
        out.append("embedding.word_embeddings.weight")
    if stage == pp - 1:
        out += ["decoder.final_layernorm.weight", "output_layer.weight"]
    return out


@pytest.mark.parametrize("tp", [1, 2])
def test_pipeline_stages_split_and_join_exactly(hf_model_dir, tp):
    """Each rank converts its own slices: stage 0 holds the embedding and layer 0, stage 1 layer 1
    (numbered 0), the final norm and the output layer (with tied embeddings: a copy of the embedding,
    dropped on the way back); the ranks' Hugging Face pieces join to the original exactly."""
    hf = hf_state(hf_model_dir)
    shape = GPTShape.from_hf_config(AutoConfig.from_pretrained(hf_model_dir))
    shards = hf_to_megatron(hf, shape, tp)
    pieces = []
    for rank, shard in enumerate(shards):
        mine = {name: tp_slice(t, hf_split_dim(name), tp, rank) for name, t in hf.items()}
        first, last = (megatron_from_hf(mine, shape, tp, rank, stage_names(shard, shape, 2, s),
                                        first_layer=stage_layers(shape, 2, s).start) for s in (0, 1))
        assert torch.equal(first["decoder.layers.0.mlp.linear_fc2.weight"], shard["decoder.layers.0.mlp.linear_fc2.weight"])
        assert torch.equal(last["decoder.layers.0.mlp.linear_fc2.weight"], shard["decoder.layers.1.mlp.linear_fc2.weight"])
        assert torch.equal(last["output_layer.weight"], shard["output_layer.weight" if not shape.tied_embeddings
                                                                else "embedding.word_embeddings.weight"])
        back = {**hf_from_megatron(first, shape, tp, rank), **hf_from_megatron(last, shape, tp, rank, first_layer=1)}
        assert back.keys() == {name for name in hf if not (shape.tied_embeddings and name == "lm_head.weight")}
        assert all(torch.equal(back[name], mine[name]) for name in back)
        pieces.append(back)
    assert all(torch.equal(torch.cat([p[name] for p in pieces], dim) if (dim := hf_split_dim(name)) is not None
                           else pieces[0][name], hf[name]) for name in pieces[0])


def test_each_megatron_tensor_names_exactly_the_weights_it_is_built_from(hf_model_dir):
    """hf_sources (what the reference's streamed blend waits for): every tensor of each of two pipeline
    stages converts from its sources alone, and from none of their proper subsets."""
    model = AutoModelForCausalLM.from_pretrained(hf_model_dir, dtype=torch.float32)
    hf = model.state_dict()  # a tied lm_head.weight listed too, as an engine's export lists it
    shape = GPTShape.from_hf_config(model.config)
    names = list(hf_to_megatron(hf_state(hf_model_dir), shape)[0])
    for stage in (0, 1):
        first_layer = stage_layers(shape, 2, stage).start
        mine = stage_names(names, shape, 2, stage)
        sources = hf_sources(mine, hf, shape, first_layer)
        assert sources.keys() == set(mine)
        for name, needed in sources.items():
            megatron_from_hf({hf_name: hf[hf_name] for hf_name in needed}, shape, 1, 0, [name], first_layer)
            for left_out in needed:
                with pytest.raises(ValueError, match=f"needs the Hugging Face weight {left_out}"):
                    megatron_from_hf({n: hf[n] for n in needed - {left_out}}, shape, 1, 0, [name], first_layer)
    output = "model.embed_tokens.weight" if shape.tied_embeddings else "lm_head.weight"
    assert sources["output_layer.weight"] == {output}
    assert sources["decoder.layers.0.self_attention.linear_qkv.weight"] == {
        f"model.layers.1.self_attn.{p}_proj.weight" for p in "qkv"}


def test_a_vocabulary_tp_does_not_divide_is_padded_and_sliced_like_a_sharded_tensor():
    """103 rows over tp = 4: Megatron's ranks hold 26 rows each (the last one 1 row of padding); the
    Hugging Face slices are 26, 26, 26 and 25 rows, torch's Shard(0) layout of a checkpoint."""
    shape = GPTShape(1, 8, 4, 4, 8, 103, tied_embeddings=True)
    embed = torch.randn(103, 8)
    slices = [tp_slice(embed, 0, 4, rank) for rank in range(4)]
    assert [len(t) for t in slices] == [26, 26, 26, 25]
    shards = [megatron_from_hf({"model.embed_tokens.weight": t}, shape, 4, rank, ["embedding.word_embeddings.weight"])
              for rank, t in enumerate(slices)]
    assert all(s["embedding.word_embeddings.weight"].shape == (26, 8) for s in shards)
    assert torch.equal(shards[3]["embedding.word_embeddings.weight"][25], torch.zeros(8))
    back = [hf_from_megatron(s, shape, 4, rank)["model.embed_tokens.weight"] for rank, s in enumerate(shards)]
    assert torch.equal(torch.cat(back), embed)


def test_tensor_parallel_size_must_divide_the_heads(hf_model_dir):
    shape = GPTShape.from_hf_config(AutoConfig.from_pretrained(hf_model_dir))
    with pytest.raises(ValueError, match="tensor parallel size 4 must divide the 4 attention heads and the 2 key/value"):
        hf_to_megatron(hf_state(hf_model_dir), shape, 4)


@pytest.mark.parametrize("world, tp, pp, problem", [
    (4, 2, 1, None), (8, 2, 2, None),
    (6, 4, 1, "tensor x pipeline parallel sizes 4 x 1 must divide the 6 workers"),
    (4, 4, 1, "tensor parallel size 4 must divide the 4 attention heads and the 2 key/value heads"),
    (3, 1, 3, "pipeline parallel size 3 must divide the 2 layers"),
])
def test_parallel_sizes_are_checked_against_the_model(hf_model_dir, world, tp, pp, problem):
    shape = GPTShape.from_hf_config(AutoConfig.from_pretrained(hf_model_dir))
    if problem is None:
        assert data_parallel_size(world, tp, pp, shape) == world // (tp * pp)
        return
    with pytest.raises(ValueError) as err:
        data_parallel_size(world, tp, pp, shape)
    assert str(err.value).startswith(problem)


def _megatron_logits(rank: int, tp: int, port: int, model_dir: str, ids: torch.Tensor, out_dir: str) -> None:
    """One tensor-parallel rank: Megatron-Core's GPTModel on CPU with this rank's converted shard."""
    import torch.distributed as dist

    # Megatron-Core names its device by CUDA index and forks a CUDA RNG around attention: on CPU, point
    # the device at the CPU and use its inference RNG tracker (no dropout here, so no RNG is drawn).
    torch.cuda.current_device = lambda: "cpu"
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import initialize_rng_tracker

    from rlplat.engines.megatron.model import build_gpt_model

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=tp)
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
    initialize_rng_tracker(inference_rng_tracker=True)
    config = AutoConfig.from_pretrained(model_dir)
    model = build_gpt_model(config, tensor_model_parallel_size=tp)
    shard = hf_to_megatron(hf_state(model_dir), GPTShape.from_hf_config(config), tp)[rank]
    missing, unexpected = model.load_state_dict(shard, strict=False)
    assert not unexpected and all(key.endswith("_extra_state") for key in missing), (missing, unexpected)
    seq = ids.shape[1]
    causal = torch.triu(torch.ones(seq, seq, dtype=torch.bool), 1)[None, None].expand(len(ids), 1, seq, seq)
    with torch.no_grad():
        local = model.eval()(ids, torch.arange(seq).expand_as(ids), causal)  # [B, S, vocab / tp]
    pieces = [torch.empty_like(local) for _ in range(tp)]
    dist.all_gather(pieces, local.contiguous())
    if rank == 0:
        torch.save(torch.cat(pieces, dim=-1), os.path.join(out_dir, "logits.pt"))
    parallel_state.destroy_model_parallel()
    dist.barrier()  # gloo aborts at exit now and then (std::terminate) when one rank tears down first
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("hf_model_dir", [False], ids=["untied"], indirect=True)
@pytest.mark.parametrize("tp", [1, 2])
def test_converted_shards_run_in_megatron_core(hf_model_dir, tp, tmp_path):
    """The untied model's shards give Hugging Face's logits in Megatron-Core at TP 1 and 2 (the tied model's: the
    Megatron engine's tests, whose log-probs equal the Hugging Face model's at TP 1 and 2)."""
    pytest.importorskip("megatron.core", reason="needs megatron-core (pip install -e '.[megatron]')")
    ids = torch.randint(5, 100, (2, 12), generator=torch.Generator().manual_seed(0))
    mp.start_processes(_megatron_logits, args=(tp, free_port(), hf_model_dir, ids, str(tmp_path)), nprocs=tp,
                       start_method="spawn")
    logits = torch.load(tmp_path / "logits.pt")
    with torch.no_grad():
        expected = AutoModelForCausalLM.from_pretrained(hf_model_dir, dtype=torch.float32)(input_ids=ids).logits
    vocab = expected.shape[-1]
    torch.testing.assert_close(logits[..., :vocab], expected, atol=2e-5, rtol=1e-5)


def test_weights_outside_the_dense_layout_are_one_clear_error(hf_model_dir):
    hf = hf_state(hf_model_dir)
    shape = GPTShape.from_hf_config(AutoConfig.from_pretrained(hf_model_dir))
    with pytest.raises(ValueError, match=r"model.layers.0.mlp.experts.0.w1.weight has no place in a Qwen2 / Qwen3 / "
                                         r"Llama model or a Qwen3-MoE"):
        megatron_name("model.layers.0.mlp.experts.0.w1.weight")
    del hf["model.layers.1.self_attn.k_proj.weight"]
    with pytest.raises(ValueError, match=r"Megatron's decoder.layers.1.self_attention.linear_qkv.weight needs the "
                                         r"Hugging Face weight model.layers.1.self_attn.k_proj.weight, which is missing"):
        hf_to_megatron(hf, shape, 1)
