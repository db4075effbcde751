"""The Megatron engine's weight export streams: at TP = 2 x PP = 2 (four gloo processes) every rank receives
exactly the Hugging Face weights, and with 8 MB buckets the most it holds at once beside its own shard is
about one bucket and one layer, far below one copy of the model."""

from __future__ import annotations

import json
import os
import weakref

import pytest
import torch
import torch.multiprocessing as mp
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from rlplat.utils.net import free_port
from rlplat.models.tiny import TinyModelSpec, build_tiny_model

pytest.importorskip("megatron.core", reason="needs megatron-core (pip install -e '.[megatron]')")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

# 16 layers of ~3.9 MB (float32) and an untied output layer: 63 MB in all
SPEC = TinyModelSpec(hidden_size=256, num_hidden_layers=16, num_attention_heads=4, num_key_value_heads=2,
                     intermediate_size=1024, tie_word_embeddings=False)
BUCKET = 8 * 2**20


class LiveBytes(TorchDispatchMode):
    """The bytes of tensor storage allocated while active and still alive, and their peak: a storage counts
    from the operator that creates it until the last tensor on it is gone (views of existing tensors, such as
    the model's weights, cost nothing)."""

    def __init__(self):
        super().__init__()
        self.live: dict[int, list[int]] = {}  # storage address -> [bytes, tensors on it]
        self.now = self.peak = 0

    def _release(self, key: int) -> None:
        entry = self.live.get(key)
        if entry is not None:
            entry[1] -= 1
            if entry[1] == 0:
                self.now -= entry[0]
                del self.live[key]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
        for tensor in tree_flatten(out)[0]:
            if not isinstance(tensor, torch.Tensor) or tensor.untyped_storage().nbytes() == 0:
                continue
            key = tensor.untyped_storage().data_ptr()
            if key in self.live:
                self.live[key][1] += 1
            elif key in inputs:
                continue  # a view of (or written into) a tensor that existed before
            else:
                self.live[key] = [tensor.untyped_storage().nbytes(), 1]
                self.now += self.live[key][0]
                self.peak = max(self.peak, self.now)
            weakref.finalize(tensor, self._release, key)
        return out


def _export_rank(rank: int, port: int, model_dir: str, out_dir: str) -> None:
    from transformers import AutoModelForCausalLM

    from rlplat.engines.dist import init_distributed
    from rlplat.engines.megatron.engine import MegatronEngine
    from rlplat.trainer.run import load_run_config

    ctx = init_distributed(rank, 4, "127.0.0.1", port, "cpu")
    cfg, _ = load_run_config([f"model.path={model_dir}", "trainer.workers_per_node=4", "trainer.device=cpu",
                              "actor.strategy=megatron", "actor.megatron.tensor_model_parallel_size=2",
                              "actor.megatron.pipeline_model_parallel_size=2"])
    expected = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).state_dict()
    engine = MegatronEngine(model_dir, cfg.model, cfg.actor.megatron, ctx)
    shard = sum(p.numel() * p.element_size() for p in engine.model.parameters())
    names, buckets, mismatched = [], [], []
    with LiveBytes() as live:
        stream = engine.export_weights(bucket_bytes=BUCKET)
        while (bucket := next(stream, None)) is not None:
            buckets.append(sum(t.numel() * t.element_size() for _, t in bucket))
            for name, tensor in bucket:
                names.append(name)
                if not torch.equal(tensor, expected[name]):
                    mismatched.append(name)
            del bucket  # a consumer that is done with a bucket keeps none of it
    engine.close()
    torch.distributed.barrier()  # gloo aborts at exit now and then (std::terminate) when one rank tears down first
    torch.distributed.destroy_process_group()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump({"names": names, "mismatched": mismatched, "buckets": buckets, "peak": live.peak, "shard": shard}, f)


@pytest.mark.slow
def test_streamed_export_at_tp2_pp2_holds_a_bucket_not_the_model(tmp_path):
    model_dir = str(build_tiny_model(tmp_path / "model", SPEC, seed=1))
    mp.start_processes(_export_rank, args=(free_port(), model_dir, str(tmp_path)), nprocs=4, start_method="spawn")
    from transformers import AutoModelForCausalLM

    full = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).state_dict()
    model_bytes = sum(t.numel() * t.element_size() for t in full.values())
    layer_bytes = sum(t.numel() * t.element_size() for name, t in full.items() if name.startswith("model.layers.0."))
    assert model_bytes > 60 * 2**20 and layer_bytes < BUCKET / 2
    for rank in range(4):
        got = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert sorted(got["names"]) == sorted(full), f"rank {rank}: not every weight exactly once"
        assert got["mismatched"] == [], f"rank {rank}: exported tensors differ from the model's"
        assert len(got["buckets"]) > 4 and max(got["buckets"]) <= BUCKET
        # the bucket being filled, and one layer's tensor-parallel pieces with their concatenation
        assert got["peak"] <= BUCKET + 2 * layer_bytes + 2**20, (rank, got["peak"] / 2**20)
        assert got["peak"] < model_bytes / 4 and got["shard"] < model_bytes / 3, (rank, got)
