"""The example scripts: every CPU script trains to completion with tiny knobs; every GPU / multi-node
script's command composes and validates (``--cfg job``)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rlplat.config.loader import group_options

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
CPU_SCRIPTS = sorted((EXAMPLES / "cpu").glob("*.sh"))
AGENT_SCRIPTS = [EXAMPLES / "cpu" / "grpo_tools.sh"]  # the multi-turn tool loop (docs/agents.md)
ASYNC_SCRIPT = EXAMPLES / "cpu" / "grpo_async.sh"  # a separate rollout pool generating ahead (docs/async.md): Ray only
LORA_SCRIPT = EXAMPLES / "cpu" / "grpo_lora.sh"  # LoRA adapters on the embedded model (docs/lora.md)
PRESET_SCRIPTS = [script for script in CPU_SCRIPTS if script not in [*AGENT_SCRIPTS, ASYNC_SCRIPT, LORA_SCRIPT]]  # one per preset
GPU_SCRIPTS = sorted((EXAMPLES / "gpu").glob("*.sh")) + sorted((EXAMPLES / "multinode").glob("*.sh"))
REWARD_SCRIPTS = sorted((EXAMPLES / "rewards").glob("*.sh"))  # model-based rewards on CPU
TINY = {  # knobs a test sets: 2 steps of 2 prompts x 2 responses, validation on a small file
    "STEPS": "2", "N": "2", "VAL_N": "1", "TRAIN_BATCH_PROMPTS": "2", "MINI_BATCH_PROMPTS": "2",
    "MICRO_BATCH_SEQS": "4", "LOG_PROB_MICRO_BATCH_SEQS": "4", "TEST_FREQ": "0",
}


def script_env(**knobs: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS",)}
    return {**env, "PYTHON": sys.executable, **knobs}


def bash(script: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(script), *args], env=env, capture_output=True, text=True, cwd=ROOT)


def test_one_cpu_script_per_preset():
    assert [p.stem for p in PRESET_SCRIPTS] == sorted(group_options("algorithm"))


RECORDER = '#!/usr/bin/env bash\nprintf "%s\\0" "$@" > "$RLPLAT_RECORD"\n'  # a PYTHON that only keeps its arguments
TRAIN_ALL = """
import contextlib, io, json, sys
from rlplat.trainer.main import main
results = {}
for name, argv in json.load(sys.stdin).items():
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else 2
    results[name] = [code, err.getvalue()]
json.dump(results, sys.stdout)
"""


def recorded_commands(runs: dict[str, tuple[Path, dict]], tmp: Path, *args: str) -> dict[str, tuple[list[str], str]]:
    """Each ``name -> (script, env)`` run with a PYTHON that records the command the script builds:
    name -> (the trainer's argv, the script's stderr with its traced command)."""
    recorder = tmp / "python"
    recorder.write_text(RECORDER)
    recorder.chmod(0o755)
    commands = {}
    for name, (script, env) in runs.items():
        record = tmp / f"{name}.args"
        done = bash(script, {**env, "PYTHON": str(recorder), "RLPLAT_RECORD": str(record)}, *args)
        assert done.returncode == 0, done.stderr[-3000:]
        argv = record.read_text().split("\0")[:-1]
        assert argv[:2] == ["-m", "rlplat.trainer.main"], argv
        commands[name] = (argv[2:], done.stderr)
    return commands


@pytest.fixture(scope="module")
def trained_scripts(tmp_path_factory, embedded_cache, small_val, tiny_reward_model):
    """Every CPU and reward script's command with tiny knobs, trained for real (2 steps each) by the CLI's
    ``main`` in one Python process (one interpreter start instead of one per script; ~4 s per script
    instead of ~10). The reward-model script gets the session's tiny reward model (it would build the
    same one). name -> (exit code, the run's stderr, the script's stderr, output directory)."""
    tmp = tmp_path_factory.mktemp("scripts")

    def env_for(script):
        knobs = {"RM_PATH": tiny_reward_model} if script in REWARD_SCRIPTS else {}
        return script_env(**TINY, **knobs, VAL_FILES=small_val, OUTPUT_DIR=str(tmp / script.stem),
                          RAY_ADDRESS="inprocess")

    runs = {script.stem: (script, env_for(script)) for script in [*CPU_SCRIPTS, *REWARD_SCRIPTS] if script != ASYNC_SCRIPT}
    commands = recorded_commands(runs, tmp, "trainer.seed=3")
    done = subprocess.run([sys.executable, "-c", TRAIN_ALL], capture_output=True, text=True, cwd=ROOT,
                          input=json.dumps({name: argv for name, (argv, _) in commands.items()}))
    assert done.returncode == 0, done.stderr[-3000:]
    runs = json.loads(done.stdout)
    return {name: (*runs[name], script_err, tmp / name) for name, (_, script_err) in commands.items()}


def trained_steps(out_dir: Path) -> list[dict]:
    return [m for m in (json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines())
            if "actor/pg_loss" in m]


@pytest.mark.slow
@pytest.mark.parametrize("script", PRESET_SCRIPTS, ids=lambda p: p.stem)
def test_cpu_script_runs_to_completion(script, trained_scripts):
    code, run_err, script_err, out = trained_scripts[script.stem]
    assert code == 0, run_err[-3000:]
    assert json.loads((out / "summary.json").read_text())["steps"] == 2
    assert [m["step"] for m in trained_steps(out)] == [1, 2]
    assert "algorithm=" + script.stem in script_err and "trainer.seed=3" in script_err  # the traced command


@pytest.mark.slow
@pytest.mark.parametrize("name, traced, metric", [
    # the tool-use script trains the embedded tool model with multi-turn rollouts
    ("grpo_tools", ["rollout.agent.name=tool", "model.path=embedded-tools"], "agent/tool_calls_mean"),
    # the LoRA script trains adapters, with the KL against the model with its adapters off
    ("grpo_lora", ["model.lora.rank=16", "model.lora.alpha=32"], "actor/kl_loss"),
])
def test_feature_script_runs_to_completion(name, traced, metric, trained_scripts):
    code, run_err, script_err, out = trained_scripts[name]
    assert code == 0, run_err[-3000:]
    trained = trained_steps(out)
    assert [m["step"] for m in trained] == [1, 2]
    assert all(arg in script_err for arg in traced) and metric in trained[0]
    if name == "grpo_tools":
        assert trained[0]["agent/turns_mean"] >= 1


@pytest.mark.slow
@pytest.mark.parametrize("script", REWARD_SCRIPTS, ids=lambda p: p.stem)
def test_reward_script_runs_to_completion(script, trained_scripts):
    """The reward-model and judge scripts train with a model-based reward."""
    code, run_err, _, out = trained_scripts[script.stem]
    assert code == 0, run_err[-3000:]
    trained = trained_steps(out)
    assert [m["step"] for m in trained] == [1, 2]
    assert any(key.startswith(("reward/reward_model_", "reward/judge_")) for key in trained[0])


@pytest.mark.slow
def test_cpu_script_default_runs_on_ray(embedded_cache, small_val, tmp_path):
    """Without RAY_ADDRESS the scripts start a local Ray cluster (rlplat's default), as a user gets it: the
    asynchronous script, whose actor and rollout workers are two pools on it."""
    env = script_env(**TINY, VAL_FILES=small_val, OUTPUT_DIR=str(tmp_path))
    done = bash(ASYNC_SCRIPT, env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((tmp_path / "summary.json").read_text())["steps"] == 2
    assert [m["off_policy/staleness_max"] for m in trained_steps(tmp_path)] == [0, 1]


MISSING = re.compile(r"needs the package '([\w.]+)', which is not installed")
COMPOSE = """
import contextlib, io, json, sys
from rlplat.trainer.main import main
results = {}
for name, argv in json.load(sys.stdin).items():
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else 2
    results[name] = [code, out.getvalue(), err.getvalue()]
json.dump(results, sys.stdout)
"""
# DEVICE=cpu: validation checks that trainer.device=cuda has a visible GPU, which this machine lacks;
# every other key, preset, batch-size rule and registered name is validated exactly as on a GPU.
HEADER_EXAMPLE = re.compile(r"^#.*\(e\.g\. ((?:\w+=\S+ )+)bash (\S+)\)", re.M)


def header_examples() -> dict[str, tuple[Path, dict[str, str]]]:
    """Each script's header example ``(e.g. KNOB=value ... bash examples/...)``: the script and its knobs."""
    found = {}
    for script in [*CPU_SCRIPTS, *GPU_SCRIPTS]:
        for knobs, named in HEADER_EXAMPLE.findall(script.read_text()):
            assert ROOT / named == script, f"{script.name}'s header example runs {named}"
            found[f"header_{script.stem}"] = (script, dict(k.split("=", 1) for k in knobs.split()))
    return found


VARIANTS = {  # the knobs of each composition beyond DEVICE=cpu
    **{script.stem: (script, {}) for script in GPU_SCRIPTS},
    **header_examples(),
    "knobs": (EXAMPLES / "gpu" / "qwen2.5-0.5b_gsm8k_fsdp_hf.sh",
              dict(MODEL="/models/mine", N="16", LR="2e-6", WORKERS="2", RAY_ADDRESS="",
                   LOGGER="console,tensorboard", OUTPUT_DIR="/tmp/x")),
    "bad_knob": (EXAMPLES / "gpu" / "qwen2.5-7b_gsm8k_fsdp_hf.sh", dict(MINI_BATCH_PROMPTS="100")),
}


def selected(request, names: list[str]) -> list[str]:
    """Of ``names`` (scripts or compositions), those the session's selected tests of this module need from the
    fixture ``request`` serves: a test parametrized by ``script`` needs that script's; any other test using the
    fixture needs them all. (The vLLM session's ``-k vllm`` composes and plans only the vLLM scripts.)"""
    needed = set()
    for item in request.session.items:
        if item.module is not request.module or request.fixturename not in item.fixturenames:
            continue
        script = getattr(item, "callspec", None) and item.callspec.params.get("script")
        if script is None:
            return names
        needed.add(script.stem)
    return [name for name in names if name in needed]


@pytest.fixture(scope="module")
def compositions(request, tmp_path_factory):
    """Each script's ``--cfg job`` command, composed and validated as ``python -m rlplat.trainer.main`` does
    it: each script runs with a PYTHON that records the command it builds, then one Python process runs the
    CLI's ``main`` on every recorded command (one interpreter start instead of one per script).
    name -> [exit code, stdout, stderr]."""
    tmp = tmp_path_factory.mktemp("compose")
    runs = {name: (VARIANTS[name][0], script_env(DEVICE="cpu", **VARIANTS[name][1]))
            for name in selected(request, list(VARIANTS))}
    commands = {name: argv for name, (argv, _) in recorded_commands(runs, tmp, "--cfg", "job", "trainer.seed=5").items()}
    done = subprocess.run([sys.executable, "-c", COMPOSE], input=json.dumps(commands), capture_output=True,
                          text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def composed(compositions, name: str, skip_missing) -> dict:
    code, out, err = compositions[name]
    missing = MISSING.search(err)
    if code == 2 and missing:  # the engines are checked last: everything else has passed
        skip_missing(missing.group(1))  # a failure where the package is required (the vLLM virtualenv)
    assert code == 0, err[-3000:]
    return yaml.safe_load(out)


@pytest.mark.parametrize("script", GPU_SCRIPTS, ids=lambda p: p.stem)
def test_gpu_script_composes_and_validates(script, compositions, skip_missing):
    cfg = composed(compositions, script.stem, skip_missing)
    strategy, rollout = script.stem.split("_")[-2:] if "gpu" in str(script) else ("fsdp", "hf")
    lora = strategy == "lora"  # <model>_<task>_lora_<rollout>: LoRA adapters on the FSDP engine (docs/lora.md)
    # <model>_<task>_ulysses_<rollout>: the FSDP engine splitting each sequence (docs/long_context.md)
    ulysses = strategy == "ulysses"
    strategy = "fsdp" if lora or ulysses else strategy
    assert cfg["model"]["path"].startswith(("Qwen/Qwen2.5-", "Qwen/Qwen3-"))
    assert cfg["actor"]["vision"]["freeze"]  # a vision-language model's tower stays as loaded (docs/vision.md)
    assert cfg["data"]["train_files"].endswith("/train.parquet")
    assert cfg["trainer"]["seed"] == 5 and cfg["actor"]["strategy"] == strategy and cfg["rollout"]["name"] == rollout
    assert cfg["actor"]["optim"]["lr"] == (1e-5 if lora else 1e-6)  # adapters want ~10x full fine-tuning's
    assert (cfg["model"]["lora"]["rank"] > 0) == lora
    assert (cfg["actor"]["fsdp"]["ulysses_size"] > 1) == ulysses == (cfg["ref"]["fsdp"]["ulysses_size"] > 1)
    megatron = cfg["actor"]["megatron"]  # sequence parallelism comes with tensor parallelism
    assert megatron["sequence_parallel"] == (megatron["tensor_model_parallel_size"] > 1)
    if "multinode" in str(script) or cfg["trainer"]["nnodes"] > 1:  # joins the cluster its nodes started
        assert cfg["trainer"]["nnodes"] == 2 and cfg["trainer"]["ray_address"] == "auto"
    if megatron["expert_model_parallel_size"] > 1:  # a mixture of experts (docs/moe.md)
        assert cfg["actor"]["moe"]["router_replay"] == "r2" and megatron["use_distributed_optimizer"]


def test_gpu_script_knobs_reach_the_config(compositions, skip_missing):
    cfg = composed(compositions, "knobs", skip_missing)
    assert cfg["model"]["path"] == "/models/mine" and cfg["rollout"]["n"] == 16
    assert cfg["actor"]["optim"]["lr"] == 2e-6 and cfg["trainer"]["workers_per_node"] == 2
    assert cfg["trainer"]["logger"] == ["console", "tensorboard"] and cfg["trainer"]["output_dir"] == "/tmp/x"


def test_verls_variable_names_reach_the_config_and_unknown_ones_are_reported():
    """A verl user's launch variables: the ones these scripts have a knob for are read as it (unless the knob itself
    is set), the others are reported in one line instead of silently ignored."""
    env = script_env(DEVICE="cpu", MODEL_PATH="/models/mine", ROLLOUT_N="4", TRAIN_BATCH_SIZE="64",
                     INFER_BACKEND="hf", LR="3e-6", ACTOR_LR="5e-6", TOTAL_EPOCHS="3", KL_LOSS_COEF="0.01")
    done = bash(EXAMPLES / "gpu" / "qwen2.5-0.5b_gsm8k_fsdp_hf.sh", env, "--cfg", "job")
    assert done.returncode == 0, done.stderr[-3000:]
    cfg = yaml.safe_load(done.stdout)
    assert cfg["model"]["path"] == "/models/mine" and cfg["rollout"]["n"] == 4 and cfg["rollout"]["name"] == "hf"
    assert "INFER_BACKEND -> ROLLOUT=hf" in done.stderr
    assert cfg["data"]["train_batch_size_prompts"] == 64
    assert cfg["actor"]["optim"]["lr"] == 3e-6  # LR, set too, wins over ACTOR_LR
    ignored = [line for line in done.stderr.splitlines() if line.startswith("[examples] ignored")]
    assert len(ignored) == 1 and all(name in ignored[0] for name in ("ACTOR_LR (as LR is set)", "TOTAL_EPOCHS",
                                                                     "KL_LOSS_COEF"))


def test_header_examples_run_as_written(compositions, skip_missing):
    """Every ``(e.g. KNOB=value bash ...)`` a script's header prints composes and validates."""
    names = [name for name in compositions if name.startswith("header_")]
    assert len(names) >= 6  # one per base GPU script
    for name in names:
        composed(compositions, name, skip_missing)


def test_tensor_parallel_knob_on_an_fsdp_script_is_one_line():
    """TP is Megatron's training parallelism: on an FSDP script it stops (not silently ignored) and names
    the rollout's own knob."""
    done = bash(EXAMPLES / "gpu" / "qwen2.5-7b_gsm8k_fsdp_vllm.sh", script_env(DEVICE="cpu", TP="2"), "--cfg", "job")
    assert done.returncode == 2
    assert "ROLLOUT_TP" in done.stderr.strip().splitlines()[-1]


# The public configs of the models the GPU scripts name (layer counts and sizes from their config.json)
QWEN25 = {
    "0.5B": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "1.5B": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                 num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "7B": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
               num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False),
}
# Qwen2.5-VL-7B-Instruct's config.json: the 7B language model (3-D rotary positions) and its 32-block vision encoder
QWEN3_MOE = {  # Qwen3-30B-A3B: 48 layers of 128 experts, top-8
    "30B-A3B": dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=48,
                    num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128,
                    num_experts_per_tok=8, moe_intermediate_size=768, norm_topk_prob=True,
                    max_position_embeddings=40960, rope_theta=1e6, tie_word_embeddings=False),
}
QWEN25_VL = {
    "VL-7B": dict(
        text_config=dict(QWEN25["7B"], max_position_embeddings=128000, rope_parameters={
            "rope_type": "default", "rope_theta": 1e6, "mrope_section": [16, 24, 24]}),
        vision_config=dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=3584,
                           patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=112,
                           fullatt_block_indexes=[7, 15, 23, 31], tokens_per_second=2),
        image_token_id=151655, video_token_id=151656, vision_start_token_id=151652, vision_end_token_id=151653,
        tie_word_embeddings=False),
}
PLAN = """
import contextlib, io, json, sys
from rlplat.trainer.main import main
results = {}
for name, argv in json.load(sys.stdin).items():
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    results[name] = [code, out.getvalue(), err.getvalue()]
json.dump(results, sys.stdout)
"""


@pytest.fixture(scope="module")
def gpu_plans(request, tmp_path_factory):
    """Each GPU script's dry run (``trainer.dry_run=true``, planned for its GPUs on this CPU machine) with a
    config-only directory of its model (the real shapes, no weights) and prompts as long as the script
    allows (the worst case for memory); the tiny tokenizer stands in for Qwen's."""
    from transformers import Qwen2_5_VLConfig, Qwen2Config, Qwen3MoeConfig
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from rlplat.models.tiny import VISION_CHAT_TEMPLATE, VISION_TOKENS, build_tokenizer

    tmp = tmp_path_factory.mktemp("plans")
    tokenizer, vision_tokenizer = tmp / "tokenizer", tmp / "tokenizer-vl"
    build_tokenizer().save_pretrained(tokenizer)
    build_tokenizer(VISION_TOKENS, VISION_CHAT_TEMPLATE).save_pretrained(vision_tokenizer)
    for size, spec in QWEN25.items():  # with the tiny tokenizer: a distilling script's teacher is checked against it
        Qwen2Config(max_position_embeddings=32768, rope_theta=1e6, **spec).save_pretrained(tmp / size)
        build_tokenizer().save_pretrained(tmp / size)
    for size, spec in QWEN3_MOE.items():
        Qwen3MoeConfig(**spec).save_pretrained(tmp / size)
    for size, spec in QWEN25_VL.items():  # with Qwen2.5-VL's image processor (its preprocessor_config.json)
        Qwen2_5_VLConfig(**spec).save_pretrained(tmp / size)
        Qwen2VLImageProcessorPil(min_pixels=3136, max_pixels=12845056).save_pretrained(tmp / size)
    recorder = tmp / "python"
    recorder.write_text(RECORDER)
    recorder.chmod(0o755)
    commands = {}
    planned = selected(request, [script.stem for script in GPU_SCRIPTS])
    for script in (script for script in GPU_SCRIPTS if script.stem in planned):
        assert bash(script, script_env(DEVICE="cpu", PYTHON=str(recorder), RLPLAT_RECORD=str(tmp / "a")), "--cfg",
                    "job").returncode == 0
        job = (tmp / "a").read_text()
        size = re.search(r"Qwen(?:2\.5|3)-((?:VL-)?[\d.]+B(?:-A[\d.]+B)?)", job).group(1)
        teacher = re.search(r"teacher\.model_path=[^\0]*?Qwen2\.5-([\d.]+B)", job)  # on-policy distillation's
        record = tmp / f"{script.stem}.args"
        knobs = {"MODEL": str(tmp / size), **({"TEACHER": str(tmp / teacher.group(1))} if teacher else {})}
        env = {**script_env(DEVICE="cuda", **knobs), "PYTHON": str(recorder), "RLPLAT_RECORD": str(record)}
        assert bash(script, env).returncode == 0
        args = record.read_text().split("\0")[:-1][2:]
        limit = int(next(a for a in args if a.startswith("data.max_prompt_length=")).split("=")[1])
        vision = size in QWEN25_VL
        data = _image_prompts_of(tmp, limit) if vision else _prompts_of(tmp, limit - _tool_line(args))
        args = [a for a in args if not a.startswith(("data.train_files=", "data.val_files="))]
        commands[script.stem] = [*args, f"data.train_files={data}", f"data.val_files={data}",
                                 f"model.tokenizer_path={vision_tokenizer if vision else tokenizer}",
                                 "trainer.dry_run=true"]
    done = subprocess.run([sys.executable, "-c", PLAN], input=json.dumps(commands), capture_output=True, text=True,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def _tool_line(args: list[str]) -> int:
    """The tokens the tiny tokenizer's chat template adds to a prompt for the tools of ``args``'s agent loop."""
    from rlplat.models.tiny import build_tokenizer
    from rlplat.agents.setup import build_tools

    names = next((a.split("=", 1)[1].strip("[]").split(",") for a in args if a.startswith("rollout.agent.tools=")), [])
    if not names:
        return 0
    tokenizer, prompt = build_tokenizer(), [{"role": "user", "content": "x"}]
    length = lambda tools: len(tokenizer.apply_chat_template(prompt, tools=tools, tokenize=True)["input_ids"])  # noqa: E731
    return length([tool.schema() for tool in build_tools(names)]) - length(None)


def _prompts_of(tmp: Path, limit: int) -> str:
    """A parquet of 64 prompts of exactly ``limit`` tokens with the tiny tokenizer's chat template (3 tokens)."""
    import pandas as pd

    path = tmp / f"prompts-{limit}.parquet"
    if not path.exists():
        rows = 64
        pd.DataFrame({"data_source": ["openai/gsm8k"] * rows,
                      "prompt": [[{"role": "user", "content": "7" * (limit - 3)}]] * rows,
                      "reward_model": [{"style": "rule", "ground_truth": "7"}] * rows,
                      "extra_info": [{"index": i} for i in range(rows)]}).to_parquet(path)
    return str(path)


def _image_prompts_of(tmp: Path, limit: int) -> str:
    """A parquet of 64 prompts of exactly ``limit`` tokens, each a 448 x 448 image (256 image tokens with Qwen2.5-VL's
    image processor) and text, with the tiny tokenizer's vision chat template (5 tokens besides them)."""
    import io

    import pandas as pd
    from PIL import Image

    path = tmp / f"image-prompts-{limit}.parquet"
    if not path.exists():
        image = io.BytesIO()
        Image.new("RGB", (448, 448), (255, 255, 255)).save(image, format="PNG")
        rows = 64
        pd.DataFrame({"data_source": ["hiyouga/geometry3k"] * rows,
                      "prompt": [[{"role": "user", "content": "<image>" + "7" * (limit - 256 - 5)}]] * rows,
                      "images": [[{"bytes": image.getvalue(), "path": None}]] * rows,
                      "reward_model": [{"style": "rule", "ground_truth": "7"}] * rows,
                      "extra_info": [{"index": i} for i in range(rows)]}).to_parquet(path)
    return str(path)


@pytest.mark.parametrize("script", GPU_SCRIPTS, ids=lambda p: p.stem)
def test_gpu_script_plan_fits_its_gpus(script, gpu_plans):
    """Every phase of every GPU script fits an 80 GB GPU at full-length prompts, validation takes few calls,
    and nothing else would stop it at start-up."""
    code, out, err = gpu_plans[script.stem]
    assert code == 0, (out + err)[-3000:]
    assert "memory per device (estimate, docs/plan.md) against 80 GB" in out
    assert "DOES NOT FIT" not in out
    if "qwen3-30b-a3b" in script.stem:  # r2's routing, recorded by the log-prob pass (vLLM returns none)
        assert "routing: old_routed_experts [sequences, tokens, 48 layers, top-8] int16" in out
    calls = int(re.search(r"in (\d+) call\(s\)", out).group(1))
    assert calls <= 3
    if "-vl-" in script.stem:  # the plan counts the images' tokens and the vision encoder's parameters
        assert "images' tokens included" in out and re.search(r"[\d.]+M of them its vision encoder", out)
        assert re.search(r"train: 64 prompts .*?max (\d+);", out).group(1) == "1024"  # MAX_PROMPT_LEN, image too


def test_bad_knob_fails_with_one_line(compositions):
    code, _, err = compositions["bad_knob"]
    assert code == 2
    assert err.strip() == ("rlplat: config error: actor.mini_batch_size_prompts=100 must divide "
                           "data.train_batch_size_prompts=256")
