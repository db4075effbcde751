"""``python -m rlplat.tools.migrate``: the seeds' own GRPO commands (verl's GSM8K script, open-instruct's Tulu 3
grpo_fast script, TRL's quickstart with a GRPOConfig) become rlplat commands that ``--cfg job`` accepts, with their
units converted and what needs a hand said. In-process, no training."""

import shlex

import pandas as pd
import pytest

from rlplat.config.migration import DEFAULTS, TABLES
from rlplat.config.migration.convert import CONVERSIONS
from rlplat.planner import planned_device
from rlplat.tools import migrate
from rlplat.trainer.run import load_run_config

VERL_SCRIPT = r"""set -x
MODEL=${MODEL_PATH:-Qwen/Qwen2-7B-Instruct}
gsm8k_train=TRAIN  # the data directory
python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_files="$gsm8k_train" data.val_files=$HOME/data/gsm8k/test.parquet \
    data.train_batch_size=8 data.max_prompt_length=512 data.max_response_length=1024 \
    data.filter_overlong_prompts=True data.truncation='error' \
    actor_rollout_ref.model.path=$MODEL actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.model.use_remove_padding=True actor_rollout_ref.actor.ppo_mini_batch_size=8 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=5 actor_rollout_ref.actor.use_kl_loss=True \
    actor_rollout_ref.actor.kl_loss_coef=0.001 actor_rollout_ref.actor.kl_loss_type=low_var_kl \
    actor_rollout_ref.actor.entropy_coeff=0 actor_rollout_ref.model.enable_gradient_checkpointing=True \
    actor_rollout_ref.actor.fsdp_config.param_offload=False \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=5 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=2 actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6 actor_rollout_ref.rollout.n=5 \
    actor_rollout_ref.ref.fsdp_config.param_offload=True algorithm.use_kl_in_reward=False \
    trainer.critic_warmup=0 trainer.logger='["console","wandb"]' trainer.project_name='verl_grpo_example_gsm8k' \
    trainer.n_gpus_per_node=8 trainer.nnodes=1 trainer.save_freq=20 trainer.test_freq=5 \
    trainer.total_epochs=15 $@
"""

OPEN_INSTRUCT_COMMAND = """python open_instruct/grpo_fast.py --exp_name tulu3.1_8b_grpo_fast --beta 0.01
    --num_unique_prompts_rollout 64 --num_samples_per_prompt_rollout 16 --kl_estimator 2
    --learning_rate 5e-7 --dataset_mixer_list allenai/RLVR-GSM-MATH-IF-Mixed-Constraints 1.0
    --dataset_mixer_list_splits train --max_prompt_token_length 2048 --response_length 2048 --pack_length 4096
    --model_name_or_path allenai/Llama-3.1-Tulu-3-8B-DPO --apply_verifiable_reward True
    --non_stop_penalty True --non_stop_penalty_value 0.0 --temperature 1.0 --chat_template_name tulu
    --total_episodes 2000000 --deepspeed_stage 2 --per_device_train_batch_size 1 --num_mini_batches 2
    --num_learners_per_node 6 --num_epochs 1 --vllm_tensor_parallel_size 1 --vllm_num_engines 2
    --lr_scheduler_type constant --seed 1 --local_eval_every 20 --save_freq 40 --gradient_checkpointing
    --with_tracking"""

TRL_SCRIPT = """from datasets import load_dataset
from trl import GRPOConfig, GRPOTrainer
from trl.rewards import accuracy_reward

dataset = load_dataset("trl-lib/DeepMath-103K", split="train")
args = GRPOConfig(output_dir="Qwen2.5-0.5B-GRPO", learning_rate=1e-6, per_device_train_batch_size=8,
                  gradient_accumulation_steps=4, num_generations=8, max_completion_length=256, beta=0.04,
                  epsilon_high=0.28, mask_truncated_completions=True, max_steps=500, save_steps=100, seed=42)
trainer = GRPOTrainer(model="Qwen/Qwen2.5-0.5B-Instruct", reward_funcs=accuracy_reward, args=args,
                      train_dataset=dataset)
trainer.train()
"""


def _migrated(argv, capsys) -> tuple[dict[str, str], str]:
    """The printed command's overrides (key -> value) and the comments, after checking that the command's
    config loads as ``--cfg job`` loads it (the engines' packages aside: vLLM is not installed here)."""
    assert migrate.main(argv) == 0
    out = capsys.readouterr().out
    command = "\n".join(line for line in out.splitlines() if not line.startswith("#")).replace("\\\n", " ")
    words = shlex.split(command)
    assert words[:3] == ["python", "-m", "rlplat.trainer.main"]
    overrides = words[3:]
    load_run_config(overrides, planned_device(overrides), require_installed=False)
    return dict(entry.split("=", 1) for entry in overrides), out


def test_verls_gsm8k_script_becomes_an_rlplat_command(tmp_path, monkeypatch, capsys):
    train = tmp_path / "train.parquet"
    pd.DataFrame({"data_source": ["gsm8k"] * 20}).to_parquet(train)
    script = tmp_path / "run_qwen2-7b.sh"
    script.write_text(VERL_SCRIPT.replace("TRAIN", str(train)))
    monkeypatch.setenv("MODEL_PATH", "Qwen/Qwen3-8B")
    got, out = _migrated(["--from", "verl", str(script)], capsys)
    assert got["model.path"] == "Qwen/Qwen3-8B"  # the script's variable, from the environment
    assert got["data.train_files"] == str(train)
    assert got["data.truncation"] == "filter"  # filter_overlong_prompts=True wins over truncation=error
    assert got["trainer.total_steps"] == "30"  # 15 epochs x (20 rows // 8 prompts)
    assert got["trainer.workers_per_node"] == "8" and got["rollout.n"] == "5"
    assert got["actor.optim.lr"] == "1e-06" and got["algorithm.kl_loss_type"] == "low_var_kl"
    assert got["rollout.vllm.tensor_parallel_size"] == "2" and got["trainer.logger"] == "[console,wandb]"
    assert got["actor.optim.lr_schedule"] == "constant" and got["actor.shuffle"] == "false"  # verl's defaults
    assert "#   trainer.critic_warmup=0: rlplat has no equivalent" in out
    assert "$@" not in out


def test_a_verl_epoch_count_without_the_data_file_needs_a_hand(capsys):
    got, out = _migrated(["--from", "verl", "--", "python3", "-m", "verl.trainer.main_ppo",
                          "trainer.total_epochs=3", "data.train_files=/nowhere/train.parquet",
                          "actor_rollout_ref.actor.nonsense=1"], capsys)
    assert "trainer.total_steps" not in got
    assert "trainer.total_epochs=3: steps = epochs x (training rows // prompts per step)" in out
    assert "#   actor_rollout_ref.actor.nonsense=1" in out.split("not in rlplat's verl table")[1]


def test_open_instructs_grpo_fast_command_becomes_an_rlplat_command(capsys):
    got, out = _migrated(["--from", "open-instruct", "--", *shlex.split(OPEN_INSTRUCT_COMMAND)], capsys)
    assert got["trainer.total_steps"] == "1953"  # 2,000,000 episodes / (64 prompts x 16 responses)
    assert got["data.train_batch_size_prompts"] == "64" and got["rollout.n"] == "16"
    assert got["actor.mini_batch_size_prompts"] == "32"  # 2 mini-batches
    assert got["trainer.workers_per_node"] == "4"  # 6 learners do not divide 32 x 16 sequences
    assert "which 6 per node do not divide: 4 per node" in out
    assert got["algorithm.kl_loss_coef"] == "0.01" and got["algorithm.kl_loss_type"] == "k3"
    assert got["model.chat_template"] == "tulu" and got["reward.functions"] == "[auto]"
    assert got["actor.fsdp.reshard_after_forward"] == "false"  # ZeRO-2
    assert got["actor.optim.lr_schedule"] == "constant" and got["actor.optim.warmup_steps"] == "0"
    assert got["data.train_files"] == "data/RLVR-GSM-MATH-IF-Mixed-Constraints.parquet"
    assert "write allenai/RLVR-GSM-MATH-IF-Mixed-Constraints as parquet rows" in out
    assert got["rollout"] == "vllm" and got["rollout.mode"] == "separate" and got["rollout.workers_per_node"] == "2"


def test_trls_script_with_a_grpoconfig_becomes_an_rlplat_command(tmp_path, capsys):
    script = tmp_path / "train_grpo.py"
    script.write_text(TRL_SCRIPT)
    got, out = _migrated(["--from", "trl", str(script), "--num_processes", "8"], capsys)
    # 8 processes x 8 completions x 4 accumulation steps = 256 completions = 32 prompts of 8 per optimizer step
    assert got["actor.mini_batch_size_prompts"] == "32" and got["data.train_batch_size_prompts"] == "32"
    assert got["actor.micro_batch_size_seqs_per_worker"] == "8" and got["trainer.workers_per_node"] == "8"
    assert got["trainer.total_steps"] == "500" and got["trainer.save_freq"] == "100"
    assert got["algorithm.kl_loss_coef"] == "0.04" and got["algorithm.clip_ratio_high"] == "0.28"
    assert got["algorithm.truncated_responses"] == "mask" and got["model.path"] == "Qwen/Qwen2.5-0.5B-Instruct"
    assert got["actor.optim.lr_schedule"] == "linear" and got["algorithm.loss_agg_mode"] == "token-mean"
    assert "reward_funcs=accuracy_reward: pass the reward functions to rlplat.trainer.GRPOTrainer" in out
    assert "train_dataset=dataset: write the dataset as parquet rows" in out


def test_trl_flags_and_a_yaml_config(tmp_path, capsys):
    config = tmp_path / "grpo.yaml"
    config.write_text("learning_rate: 2.0e-6\nloss_type: dr_grpo\nnum_generations: 4\n")
    got, _ = _migrated(["--from", "trl", "--", "accelerate", "launch", "--num_processes", "2", "train.py",
                        "--config", str(config), "--use_vllm", "--vllm_mode", "colocate", "--top_k", "0"], capsys)
    assert got["actor.optim.lr"] == "2e-06" and got["rollout.n"] == "4"
    assert got["algorithm.loss_agg_mode"] == "seq-mean-token-sum-norm"  # dr_grpo's, over TRL's default's
    assert got["rollout"] == "vllm" and got["rollout.mode"] == "colocated" and got["rollout.top_k"] == "-1"
    assert got["trainer.workers_per_node"] == "2"


def test_their_defaults_can_be_left_out(capsys):
    got, _ = _migrated(["--from", "open-instruct", "--no-defaults", "--", "--learning_rate=1e-6"], capsys)
    assert got == {"algorithm": "grpo", "trainer.device": "cuda", "actor.optim.lr": "1e-06"}


def test_a_missing_file_is_one_line(capsys):
    with pytest.raises(SystemExit, match="rlplat migrate: /nowhere/run.sh: no such file"):
        migrate.main(["--from", "verl", "/nowhere/run.sh"])


def test_every_conversion_the_tables_name_exists_and_every_default_loads():
    named = {knob.convert for table in TABLES.values() for knob in table if knob.convert}
    assert named <= set(CONVERSIONS), sorted(named - set(CONVERSIONS))
    for framework, defaults in DEFAULTS.items():
        load_run_config(["algorithm=grpo", *defaults], require_installed=False)


def test_a_mode_named_by_its_value_and_a_single_value_for_a_list(capsys):
    got, out = _migrated(["--from", "verl", "--no-defaults", "--", "trainer.v1.trainer_mode=separate_async",
                          "actor_rollout_ref.model.external_lib=json", "trainer.logger=console",
                          "actor_rollout_ref.actor.veomni.router_replay.mode=none"], capsys)
    assert got["rollout.mode"] == "separate" and "trainer.async_steps" not in got  # the mode names no step count
    assert "trainer.v1.trainer_mode=separate_async: give trainer.async_steps" in out
    assert got["trainer.imports"] == "[json]" and got["trainer.logger"] == "[console]"
    assert got["actor.moe.router_replay"] == "none"  # a word, not Hydra's null
    assert got["algorithm"] == "grpo"
    ppo, _ = _migrated(["--from", "verl", "--", "algorithm.adv_estimator=gae"], capsys)
    assert ppo["algorithm"] == "ppo"  # a critic's GAE: the ppo preset


def test_a_lora_config_and_a_script_that_does_not_parse(tmp_path, capsys):
    script = tmp_path / "train_lora.py"
    script.write_text('trainer = GRPOTrainer(model="Qwen/Qwen2.5-0.5B-Instruct", reward_funcs=[f], train_dataset=ds,'
                      ' peft_config=LoraConfig(r=32, lora_alpha=64, target_modules="all-linear"))\n')
    got, _ = _migrated(["--from", "trl", str(script)], capsys)
    assert (got["model.lora.rank"], got["model.lora.alpha"], got["model.lora.target_modules"]) == ("32", "64", "[]")
    broken = tmp_path / "run.sh"
    broken.write_text('python3 -m verl.trainer.main_ppo data.train_files="unclosed\n')
    with pytest.raises(SystemExit, match="the script's launch line does not parse as shell words: No closing"):
        migrate.main(["--from", "verl", str(broken)])


def test_the_documented_conversion_prints_what_the_page_shows(capsys):
    """docs/migrating.md's example: its command, run as written, prints the lines the page shows under it."""
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "migrating.md").read_text(encoding="utf-8")
    block = page.split("$ python -m rlplat.tools.migrate ", 1)[1].split("```", 1)[0]
    command, shown = block.split("\n# from ", 1)
    assert migrate.main(shlex.split(command.replace("\\\n", " "))) == 0
    assert capsys.readouterr().out == "# from " + shown
