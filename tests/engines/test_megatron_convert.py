"""Hugging Face <-> Megatron-Core weights: an exact round trip at TP = 1 and 2, and the converted shards
run in Megatron-Core's own ``GPTModel`` (on CPU, gloo) give the Hugging Face model's logits."""

from __future__ import annotations

import os

import pytest
import torch
import torch.multiprocessing as mp
from transformers import AutoConfig, AutoModelForCausalLM

from rlplat.engines.dist import free_port
from rlplat.engines.megatron.convert import (GPTShape, data_parallel_size, from_stages, hf_to_megatron,
                                             megatron_to_hf, to_stage)
from rlplat.models.tiny import TinyModelSpec, build_tiny_model


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


@pytest.mark.parametrize("tp", [1, 2])
def test_pipeline_stages_split_and_join_exactly(hf_model_dir, tp):
    """Stage 0 holds the embedding and layer 0, stage 1 layer 1 (renumbered 0), the final norm and the
    output layer (with tied embeddings: a copy of the embedding, dropped when the stages are joined)."""
    hf = hf_state(hf_model_dir)
    shape = GPTShape.from_hf_config(AutoConfig.from_pretrained(hf_model_dir))
    shards = hf_to_megatron(hf, shape, tp)
    for shard in shards:
        first, last = to_stage(shard, shape, 2, 0), to_stage(shard, shape, 2, 1)
        assert "embedding.word_embeddings.weight" in first and "embedding.word_embeddings.weight" not in last
        assert "decoder.final_layernorm.weight" in last and "decoder.final_layernorm.weight" not in first
        assert {n.split(".")[2] for n in first if n.startswith("decoder.layers.")} == {"0"}
        assert torch.equal(last["decoder.layers.0.mlp.linear_fc2.weight"], shard["decoder.layers.1.mlp.linear_fc2.weight"])
        assert torch.equal(last["output_layer.weight"], shard["output_layer.weight" if not shape.tied_embeddings
                                                                else "embedding.word_embeddings.weight"])
        joined = from_stages([first, last], shape)
        assert joined.keys() == shard.keys()
        assert all(torch.equal(joined[name], tensor) for name, tensor in shard.items())
    assert to_stage(shards[0], shape, 1, 0) == shards[0]
    back = megatron_to_hf([from_stages([to_stage(s, shape, 2, 0), to_stage(s, shape, 2, 1)], shape) for s in shards],
                          shape)
    assert all(torch.equal(back[name], tensor) for name, tensor in hf.items())


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
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("tp", [1, 2])
def test_converted_shards_run_in_megatron_core(hf_model_dir, tp, tmp_path):
    pytest.importorskip("megatron.core", reason="needs megatron-core (pip install -e '.[megatron]')")
    ids = torch.randint(5, 100, (2, 12), generator=torch.Generator().manual_seed(0))
    mp.start_processes(_megatron_logits, args=(tp, free_port(), hf_model_dir, ids, str(tmp_path)), nprocs=tp,
                       start_method="spawn")
    logits = torch.load(tmp_path / "logits.pt")
    with torch.no_grad():
        expected = AutoModelForCausalLM.from_pretrained(hf_model_dir, dtype=torch.float32)(input_ids=ids).logits
    vocab = expected.shape[-1]
    torch.testing.assert_close(logits[..., :vocab], expected, atol=2e-5, rtol=1e-5)
