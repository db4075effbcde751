"""``python -m rlplat.tools.plan`` (and ``trainer.dry_run=true``): the Quickstart's ledger, the training memory
estimate against the tensors a real update holds on the ~25M benchmark model, and what stops a run before
start-up (over-long prompts, a bad reward function name, a reward file that does not import)."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from rlplat.tools import plan as plan_tool
from rlplat.models.shape import ModelShape
from rlplat.planner import memory
from rlplat.trainer.main import main as run_main

# benchmarks/compare_trl.py's 25m model: 25.3M parameters
SPEC_25M = dict(hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4,
                intermediate_size=1536, max_position_embeddings=512)


def test_plan_prints_the_quickstart_ledger(capsys):
    """docs/plan.md's first command."""
    assert DOCUMENTED[0] == ["algorithm=grpo"]
    assert plan_tool.main(DOCUMENTED[0]) == 0
    out = capsys.readouterr().out
    assert "64 prompts x rollout.n=8 = 512 sequences over 1 data-parallel replica(s)" in out
    assert "4 mini-batch(es) x actor.ppo_epochs=1 = 4 optimizer step(s); 1 micro-batch(es) of 128 sequences" in out
    assert "train: 20000 prompts" in out and "none longer than data.max_prompt_length" in out
    assert "trainer.total_steps=450 = 1.44 epochs" in out
    assert "validation: 256 prompts x rollout.val_n=1 = 256 responses in 1 call(s)" in out
    assert "plan: every phase fits" in out


def test_dry_run_plans_and_trains_nothing(tmp_path, capsys):
    out_dir = tmp_path / "run"
    assert run_main(["algorithm=grpo", "trainer.dry_run=true", f"trainer.output_dir={out_dir}"]) == 0
    assert "batch ledger (per training step)" in capsys.readouterr().out
    assert not out_dir.exists()


def test_a_phase_that_does_not_fit_names_the_knob(capsys):
    assert plan_tool.main(["algorithm=grpo", "--device-memory", "20MB"]) == 1
    out = capsys.readouterr().out
    assert "update: " in out and "DOES NOT FIT: model.gradient_checkpointing=true" in out


def test_a_separate_rollout_pool_is_planned_on_its_own_devices(capsys):
    # the actor's devices no longer hold the rollout engine's KV cache; the rollout worker holds its own
    # copy of the weights (the colocated one-worker float32 engine shares the actor's)
    assert plan_tool.main(["algorithm=grpo", "rollout.mode=separate", "rollout.workers_per_node=2",
                           "trainer.async_steps=1"]) == 0
    out = capsys.readouterr().out
    assert "rollout hf on 2 worker(s) of its own, 1 step(s) ahead" in out.splitlines()[0]
    phase = out.split("  rollout, on each rollout worker's device (rollout.mode=separate): ")[1].split("\n  log-prob")[0]
    assert "rollout weights (float32)" in phase and "KV cache (256 sequences x 17 tokens)" in phase
    assert "actor" not in phase
    assert "KV cache" not in out.split("  update: ")[1]


@pytest.fixture(scope="module")
def model_25m(tmp_path_factory) -> str:
    from rlplat.models.tiny import TinyModelSpec, build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("m25") / "model", TinyModelSpec(**SPEC_25M), seed=0))


def test_a_lora_checkpoint_on_disk_is_its_adapters_and_their_moments(model_25m, capsys):
    # the 25m model's 8 layers, rank 8 on every linear layer: 8 x (q 512+512, k 512+256, v 512+256, o 512+512,
    # gate and up 512+1536, down 1536+512) = 77,824 a layer, 622,592 in all; 12 bytes each = 7.1 MiB (the full
    # model: 25.2M x 12 bytes = 0.28 GiB)
    args = ["algorithm=grpo", f"model.path={model_25m}", "data.max_prompt_length=64", "data.max_response_length=32"]
    assert plan_tool.main([*args, "model.lora.rank=8"]) == 0
    assert "disk: 7.1 MiB per checkpoint" in capsys.readouterr().out
    assert plan_tool.main(args) == 0
    assert "disk: 0.28 GiB per checkpoint" in capsys.readouterr().out


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_training_memory_estimate_is_within_20_percent_of_the_measured_tensors(model_25m, attention):
    """Weights, gradients, AdamW's moments and the tensors saved for backward of one micro-batch (8
    sequences of 96 prompt + 96 response tokens) through the FSDP engine as a run builds it, against the
    plan's estimates for the same micro-batch (SDPA, the default, and eager attention, which keeps its
    [heads, T, T] probabilities)."""
    from transformers import AutoConfig

    from rlplat.controller import InProcessWorkerGroup
    from rlplat.trainer.run import load_run_config
    from rlplat.workers.roles import ActorRolloutRefWorker

    path = model_25m
    cfg, plan = load_run_config([f"model.path={path}", "trainer.ray_address=inprocess", "trainer.device=cpu",
                                 f"model.attn_implementation={attention}"])
    group = InProcessWorkerGroup(ActorRolloutRefWorker, device="cpu", cfg=cfg, plan=plan)
    try:
        group.init_model(path, with_ref=False)
        measured = _measure(group.worker.actor)
    finally:
        group.shutdown()
    shape = ModelShape.from_config(AutoConfig.from_pretrained(path))
    lay = memory.layout(cfg, "actor", 1)
    state = memory.actor_state(shape, lay, 4, cfg, trained=True)
    acts = memory.activation_bytes(shape, cfg, lay, ROWS * (PROMPT + RESPONSE), ROWS * RESPONSE, 4, grad=True,
                                      seq=PROMPT + RESPONSE)
    estimate = {"weights": state["actor weights (fp32)"], "gradients": state["actor gradients (fp32)"],
                "adamw": state["actor AdamW moments (fp32)"],
                # what the output layer saves: the response positions' hidden states (its chunk's working set
                # is transient, not saved)
                "saved": acts["activations saved for backward"] + ROWS * RESPONSE * shape.hidden * 4}
    assert measured["weights"] > 90e6  # the 25M model, float32
    for key, value in measured.items():
        print(f"{key}: estimate {estimate[key] / 2**20:.1f} MiB, measured {value / 2**20:.1f} MiB")
        assert abs(estimate[key] - value) <= 0.2 * value, (key, estimate[key], value)


ROWS, PROMPT, RESPONSE = 8, 96, 96


def _measure(engine) -> dict[str, int]:
    """The bytes of the weights, gradients, AdamW's moments, and the tensors one micro-batch's forward saves
    for backward (saved-tensor hooks; the weights themselves not counted)."""
    from rlplat.protocol import Batch
    from rlplat.sequence import position_ids_from_mask

    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(8, 100, (ROWS, PROMPT + RESPONSE), generator=gen)
    mask = torch.ones_like(ids)
    micro = Batch.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": position_ids_from_mask(mask),
                             "responses": ids[:, PROMPT:]})
    params = {p.untyped_storage().data_ptr() for p in engine.model.parameters()}
    saved: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in params:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = engine.forward(micro, need_entropy=True, grad=True)
    measured = {"saved": sum(saved.values())}
    (out.log_probs.sum() + 0.1 * out.entropy.sum()).backward()
    measured["weights"] = sum(p.numel() * p.element_size() for p in engine.model.parameters())
    measured["gradients"] = sum(p.grad.numel() * p.grad.element_size() for p in engine.model.parameters()
                                if p.grad is not None)
    engine.optim.step()
    measured["adamw"] = sum(t.numel() * t.element_size() for state in engine.optim.local_state.values()
                            for key, t in state.items() if key != "step")
    return measured


def _parquet(path, prompts):
    pd.DataFrame({
        "data_source": ["arithmetic"] * len(prompts),
        "prompt": [[{"role": "user", "content": p}] for p in prompts],
        "reward_model": [{"style": "rule", "ground_truth": "1"}] * len(prompts),
        "extra_info": [{"index": i} for i in range(len(prompts))],
    }).to_parquet(path)
    return str(path)


def test_over_long_prompts_with_truncation_error_stop_with_the_count_and_the_knob(tmp_path, capsys):
    prompts = ["1+1="] * 6 + ["9" * 80, "8" * 90]
    data = _parquet(tmp_path / "train.parquet", prompts)
    args = ["algorithm=grpo", f"data.train_files={data}", f"data.val_files={data}", "data.max_prompt_length=40"]
    assert plan_tool.main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "2 of 8 train prompts are longer than data.max_prompt_length=40" in err
    assert "row 6" in err and "data.truncation=filter" in err
    assert plan_tool.main([*args, "data.truncation=filter"]) == 0
    assert "2 longer than data.max_prompt_length=40 (longest 93): dropped (data.truncation=filter)" in capsys.readouterr().out


@pytest.mark.parametrize("case", ["unknown-name", "syntax-error", "missing-reward-model"])
def test_reward_problems_stop_the_plan_with_one_line(tmp_path, capsys, case):
    if case == "unknown-name":
        args, expected = ["reward.functions=[gsm8kk]"], "reward.functions[0]='gsm8kk' is not a registered reward function"
    elif case == "missing-reward-model":
        args, expected = ["reward.model.path=/models/does-not-exist"], (
            "rlplat: reward.model.path='/models/does-not-exist': no such directory")
    else:
        bad = tmp_path / "my_reward.py"
        bad.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info)\n    return 1.0\n")
        args, expected = [f"reward.custom_fn.path={bad}"], "failed to import: SyntaxError"
    # a path that is not there is a run-time error, as a missing model.path (1); a config error is 2
    assert plan_tool.main(["algorithm=grpo", *args]) == (1 if case == "missing-reward-model" else 2)
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and expected in err, err


def test_sizes_parse_as_people_write_them():
    assert plan_tool.parse_size("80GB") == 80 * 10**9
    assert plan_tool.parse_size("24GiB") == 24 * 2**30
    assert plan_tool.parse_size("141G") == 141 * 10**9
    with pytest.raises(Exception, match="not a size"):
        plan_tool.parse_size("lots")


def test_the_model_shape_counts_qwen2_parameters_exactly(model_25m):
    from transformers import AutoConfig, AutoModelForCausalLM

    path = model_25m
    model = AutoModelForCausalLM.from_pretrained(path)
    unique = {p.data_ptr(): p.numel() for p in model.parameters()}
    assert ModelShape.from_config(AutoConfig.from_pretrained(path)).params == sum(unique.values())


def _documented_plan_commands() -> list[list[str]]:
    import shlex
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "plan.md").read_text()
    found = []
    for line in text.splitlines():
        if line.startswith("python -m rlplat.tools.plan "):
            found.append(shlex.split(line.split("#", 1)[0])[3:])
    assert len(found) == 2, "docs/plan.md prints two plan commands"
    return found


DOCUMENTED = _documented_plan_commands()


@pytest.mark.parametrize("args", DOCUMENTED[1:], ids=lambda a: " ".join(a))  # the first: the ledger test
def test_the_documented_plan_commands_run(args, capsys):
    assert plan_tool.main(args) == 0
    assert "batch ledger (per training step)" in capsys.readouterr().out


def test_the_plan_gives_each_ulysses_worker_its_slice_of_the_activations():
    """actor.fsdp.ulysses_size=2 on 2 workers: one replica, each worker holding half of every sequence's
    activations (benchmarks/ulysses.py measured 0.57 of U = 1's saved tensors at 8k tokens: docs/long_context.md)."""
    from rlplat.trainer.run import load_run_config

    from transformers import Qwen2Config

    shape = ModelShape.from_config(Qwen2Config(**SPEC_25M))
    estimates = []
    for size in (1, 2):
        cfg, _ = load_run_config(["trainer.workers_per_node=2", f"actor.fsdp.ulysses_size={size}"])
        lay = memory.layout(cfg, "actor", 2)
        assert (lay.replicas, lay.sp) == (2 // size, size)
        estimates.append(memory.activation_bytes(shape, cfg, lay, 8192, 4096, 4, grad=True, seq=8192))
    for key, value in estimates[0].items():
        assert estimates[1][key] == pytest.approx(value / 2), key


def test_the_plan_counts_megatron_bf16_weights_with_fp32_masters():
    """actor.megatron.params_dtype=bf16: the weights take half the bytes, the gradients are summed in fp32,
    and the sharded optimizer holds fp32 master copies beside the moments (1 / dp each)."""
    from transformers import Qwen2Config

    from rlplat.trainer.run import load_run_config

    shape = ModelShape.from_config(Qwen2Config(**SPEC_25M))
    parts = {}
    for dtype in ("fp32", "bf16"):
        cfg, _ = load_run_config(["trainer.workers_per_node=2", "actor.strategy=megatron",
                                  f"actor.megatron.params_dtype={dtype}"])
        parts[dtype] = memory.actor_state(shape, memory.layout(cfg, "actor", 2), 4, cfg, trained=True)
    assert parts["bf16"]["actor weights (bf16)"] == parts["fp32"]["actor weights (fp32)"] / 2 == 2 * shape.params
    assert parts["bf16"]["actor gradients (fp32)"] == parts["fp32"]["actor gradients (fp32)"]
    assert parts["bf16"]["actor fp32 master weights"] == 4 * shape.params / 2  # two replicas share the optimizer
    assert parts["bf16"]["actor AdamW moments (fp32)"] == parts["fp32"]["actor AdamW moments (fp32)"]


def test_a_gpu_run_is_planned_from_config_json_and_tokenizer_alone(tmp_path, capsys):
    """docs/plan.md: no weights, no network: a 7B-shaped Qwen2's config.json and a tokenizer's files."""
    from transformers import Qwen2Config

    from rlplat.models.tiny import build_tokenizer

    tokenizer = build_tokenizer()
    tokenizer.save_pretrained(tmp_path)
    Qwen2Config(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False,
                pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id).save_pretrained(tmp_path)
    assert not any(tmp_path.glob("*.safetensors"))
    assert plan_tool.main([f"model.path={tmp_path}", "trainer.device=cuda", "trainer.workers_per_node=8",
                           "--device-memory", "80GB"]) in (0, 1)  # fits or names the knob: planned either way
    out = capsys.readouterr().out
    assert f"model {tmp_path} (7615.6M parameters, 28 layers, hidden 3584, vocabulary 152064)" in out
    assert "on 8 worker(s) (cuda), actor fsdp (fused token head, compiled layers)" in out
    assert "batch ledger (per training step)" in out and "memory per device" in out
