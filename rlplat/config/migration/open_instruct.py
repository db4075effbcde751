"""open-instruct's ``grpo_fast.py`` flags and rlplat's setting for each.

Each entry is one :class:`~rlplat.config.migration.knob.Knob`; docs/migrating.md's table is rendered from this list
(``python -m rlplat.config.migration --write``) and ``tests/config/test_migration_maps.py`` loads every rlplat setting
named here. Sources: the dataclasses grpo_fast.py's argument parser reads, the older flags of its Args class, and
its GRPO example scripts.
"""

from rlplat.config.migration.knob import Knob

OPEN_INSTRUCT = [
    # --- model ---
    Knob(("--model_name_or_path",), ("model.path",),
         "hub id or local directory in both (open-instruct requires it; rlplat's default is its embedded tiny model)"),
    Knob(("--model_revision",), (),
         "no equivalent: rlplat loads the default revision; pin one by passing a local snapshot directory as "
         "model.path"),
    Knob(("--tokenizer_name_or_path", "--tokenizer_name"), ("model.tokenizer_path",),
         "None = model path in both (--tokenizer_name is open-instruct's deprecated alias)"),
    Knob(("--tokenizer_revision",), (), "no equivalent: pass a local tokenizer directory as model.tokenizer_path"),
    Knob(("--trust_remote_code",), ("model.trust_remote_code",),
         "False in both; rlplat's key covers model and tokenizer loading"),
    Knob(("--use_fast", "--use_slow_tokenizer"), (),
         "no equivalent: rlplat loads transformers' AutoTokenizer default (the fast tokenizer where one exists)"),
    Knob(("--chat_template_name",), ("model.chat_template",),
         "tulu, chatml and zephyr by name; any other template as a Jinja file or text (default: the tokenizer's)"),
    Knob(("--add_bos",), (), "no equivalent: the chat template's rendering is tokenized as it is"),
    Knob(("--get_tokenizer_fn",), (),
         "no equivalent: rlplat loads the tokenizer as it is, without open-instruct's tulu pad/special-token edits"),
    Knob(("--tokenizer_files_hash",), (), "not needed: runtime tracking value"),
    Knob(("--attn_implementation",), ("model.attn_implementation",),
         "open-instruct's None auto-detects (flash attention when installed); rlplat's default is sdpa: eager | sdpa "
         "| flash_attention_2"),
    Knob(("--use_cache",), (), "not needed: rlplat's training forward never uses a KV cache"),
    Knob(("--model_dtype",), ("actor.fsdp.mixed_precision",),
         "bfloat16 (default) = auto or bf16 (bf16 compute, rlplat keeps fp32 master weights); float32 = none"),
    Knob(("--dtype",), (),
         "no equivalent: rlplat loads weights in fp32 and computes in bf16 on GPU per actor.fsdp.mixed_precision"),
    Knob(("--gradient_checkpointing",), ("model.gradient_checkpointing",), "off in both"),
    # any value < 1.0 means true (rlplat then recomputes every decoder layer; no memory budget); 1.0 (default)
    # means false
    Knob(("--activation_memory_budget",), ("model.gradient_checkpointing",),
         "budget < 1.0 turns checkpointing on; rlplat recomputes whole layers, there is no budget",
         convert="memory_budget_to_checkpointing"),
    Knob(("--activation_checkpointing_mode", "--activation_checkpointing_modules"), (),
         "no equivalent: model.gradient_checkpointing recomputes every decoder layer; no budget or module selection"),
    Knob(("--compile_model",), ("actor.fsdp.compile",),
         "on by default in both where it can be (rlplat: on a GPU, for a dense text model without Ulysses)"),
    # lora.rank = lora_r when use_peft is true, else 0 (rlplat's rank 0 = off)
    Knob(("--use_peft", "--lora_r"), ("model.lora.rank",),
         "rank > 0 turns LoRA on (lora_r default 16, rlplat 0 = off); FSDP engine only (docs/lora.md)",
         convert="peft_rank"),
    Knob(("--lora_alpha",), ("model.lora.alpha",), "open-instruct's default 32, rlplat's 16"),
    Knob(("--lora_dropout",), (),
         "no equivalent: rlplat trains without dropout (the update's log-probs are the rollout's); "
         "model.lora.dropout must stay 0"),
    Knob(("--lora_target_modules",), ("model.lora.target_modules",),
         "None = PEFT's per-architecture default; rlplat's [] = every linear layer of the decoder"),
    Knob(("--lora_modules_to_save",), (), "no equivalent: with LoRA only the adapters are trained"),
    Knob(("--lora_task_type",), (), "not needed: the actor is always a causal LM"),
    Knob(("--load_in_8bit", "--load_in_4bit", "--bnb_4bit_quant_type", "--use_bnb_nested_quant"), (),
         "no equivalent: rlplat loads no quantized (bitsandbytes) base model"),

    # --- data ---
    # each dataset (every other list item) becomes a parquet file of rlplat rows (data_source, prompt,
    # reward_model.ground_truth);
    # the list form carries over: [file, "1.0", file, "0.3"] (fractions) or row counts, per epoch
    Knob(("--dataset_mixer_list",), ("data.train_files",),
         "the same list form with parquet files for the HF ids (data.train_files=[a.parquet,'1.0',b.parquet,'0.3']: "
         "a fraction of each file's rows, or a row count, per epoch, interleaved at random); the RLVR dataset "
         "column -> data_source", convert="mixer_list_to_files"),
    Knob(("--dataset_mixer_eval_list",), ("data.val_files",),
         "same conversion; HEAD's default [] means no eval set, but rlplat always validates (its default is "
         "builtin:arithmetic)", convert="mixer_list_to_files"),
    Knob(("--dataset_mixer_list_splits", "--dataset_mixer_eval_list_splits"), (),
         "no equivalent: pick the split when writing the parquet file"),
    Knob(("--dataset_transform_fn",), (),
         "no equivalent: prompts are rendered with the chat template; rlvr_max_length_filter_v1 is "
         "data.truncation=filter"),
    Knob(("--dataset_cache_mode", "--dataset_local_cache_dir", "--dataset_config_hash", "--dataset_config_eval_hash",
          "--dataset_skip_cache"),
         (), "not needed: rlplat reads parquet directly, with no tokenized dataset cache to manage"),
    Knob(("--cache_dataset_only",), (),
         "no equivalent: there is no dataset cache; trainer.dry_run=true checks the data (and the plan) and exits"),
    Knob(("--max_prompt_token_length",), ("data.max_prompt_length", "data.truncation=filter"),
         "tokens after the chat template; 256 vs 512; open-instruct drops longer prompts (rlvr_max_length_filter_v1)"),
    Knob(("--max_token_length",), (),
         "no equivalent: removed from open-instruct in 2025-10 (old scripts still pass it); rlplat's bound is "
         "max_prompt_length + max_response_length"),
    Knob(("--ground_truths_key",), (),
         "no equivalent: rlplat reads reward_model.ground_truth; rename the column when converting"),
    Knob(("--sft_messages_key",), (),
         "no equivalent: rlplat reads the prompt column (a list of chat messages); rename the column when converting"),
    Knob(("--system_prompt_override_file",), (),
         "no equivalent: write the system message into each row's prompt when converting the data"),
    Knob(("--data_loader_seed",), ("data.seed",),
         "None = --seed in open-instruct; rlplat's data.seed is separate (default 1)"),
    Knob(("--shuffle_eval_dataset",), (),
         "no equivalent: (pre-refactor flag) rlplat validates on the whole validation set in order"),

    # --- batch sizes ---
    Knob(("--num_unique_prompts_rollout",), ("data.train_batch_size_prompts",), "prompts per step in both; 16 vs 64"),
    Knob(("--num_samples_per_prompt_rollout",), ("rollout.n",), "responses per prompt (group size); 4 vs 8"),
    Knob(("--total_episodes",), ("trainer.total_steps",),
         "episodes are responses: steps = total_episodes / (num_unique_prompts_rollout x "
         "num_samples_per_prompt_rollout)", convert="episodes_to_steps"),
    Knob(("--num_mini_batches",), ("actor.mini_batch_size_prompts",),
         "prompts per optimizer step = num_unique_prompts_rollout / num_mini_batches; default 1 = one step; rlplat's "
         "None = largest divisor <= 16", convert="mini_batches_to_prompts"),
    Knob(("--max_train_steps",), ("trainer.total_steps",),
         "olmo-core TrainingConfig override of the step count; training steps in both (total_episodes usually sets "
         "them)"),
    Knob(("--num_training_steps",), (),
         "not needed: RUNTIME VALUE computed from total_episodes (give trainer.total_steps)"),
    Knob(("--num_epochs",), ("actor.ppo_epochs",),
         "passes over each step's batch in grpo_fast (not dataset epochs); 1 in both"),
    Knob(("--pack_length",),
         ("actor.micro_batch_max_tokens_per_worker", "ref.log_prob_micro_batch_max_tokens_per_worker"),
         "prompt + response tokens packed per micro-batch per GPU (512); rlplat's None counts sequences instead"),
    Knob(("--per_device_train_batch_size",), (),
         "no equivalent: grpo_fast's micro-batch is one pack (keep 1); rlplat's token budget is "
         "actor.micro_batch_max_tokens_per_worker"),
    Knob(("--gradient_accumulation_steps",), (),
         "no equivalent: accumulation follows from num_mini_batches and the packs; in rlplat from the mini-batch and "
         "micro-batch keys"),
    Knob(("--max_seq_length",), (),
         "no equivalent: olmo-core TrainingConfig field; grpo_fast sequences are bounded by max_prompt_token_length + "
         "response_length"),
    Knob(("--active_sampling",), ("algorithm.dynamic_sampling.enable",),
         "refill the batch after dropping equal-score groups; rlplat gives up after "
         "algorithm.dynamic_sampling.max_gen_batches (10)"),
    Knob(("--filter_zero_std_samples",), ("algorithm.drop_zero_gradient_groups",),
         "open-instruct's default is on, rlplat's off; the kept groups are rounded up to whole mini-batches of "
         "every replica (batch/kept_groups, batch/dropped_groups)"),
    Knob(("--no_resampling_pass_rate",), (),
         "no equivalent: rlplat never retires solved prompts from the dataset order"),

    # --- algorithm / loss ---
    Knob(("--clip_lower",), ("algorithm.clip_ratio_low",), "epsilon_low; 0.2 in both"),
    Knob(("--clip_higher",), ("algorithm.clip_ratio_high",),
         "epsilon_high; open-instruct's default 0.272 (0.2 before the refactor), rlplat's 0.2 (algorithm=dapo: 0.28)"),
    # dapo -> algorithm.policy_loss=ppo, algorithm.clip_ratio_c=1e9 (open-instruct has no dual clip);
    # cispo -> algorithm.policy_loss=cispo, algorithm.clip_ratio_low=1.0 (open-instruct clips the weight from
    # above only)
    Knob(("--loss_fn",), ("algorithm.policy_loss", "algorithm.clip_ratio_c", "algorithm.clip_ratio_low"),
         "dapo (default) = ppo without rlplat's always-on dual clip (3.0); cispo = cispo with no lower bound",
         convert="loss_fn_to_policy_loss"),
    # "token" -> algorithm.loss_agg_mode=token-mean; a number D -> loss_agg_mode=seq-mean-token-sum-norm with
    # algorithm.loss_scale_factor = D / (sequences per mini-batch = actor.mini_batch_size_prompts x rollout.n)
    Knob(("--loss_denominator",), ("algorithm.loss_agg_mode", "algorithm.loss_scale_factor"),
         "token = token-mean (algorithm=grpo sets seq-mean-token-mean: override it); a constant D = sum / D while "
         "every sequence has a token in the loss (rlplat counts only those)",
         convert="loss_denominator_to_agg"),
    # standard -> algorithm.norm_adv_scale=group; centered -> algorithm.norm_adv_scale=none
    Knob(("--advantage_normalization_type",), ("algorithm.norm_adv_scale",),
         "HEAD default centered (no std; before the refactor standard), rlplat's group; std: numpy ddof 0 + 1e-8 vs "
         "unbiased + 1e-6", convert="adv_norm_type"),
    Knob(("--mask_truncated_completions",), ("algorithm.truncated_responses=mask",),
         "no loss on responses cut at the length limit; off in both"),
    # use_rho_correction false -> correction=none. Else, 0 disables each bound: clamp upper only ->
    # correction=tis, cap=upper;
    # mask bounds only -> correction=mis, low=mask lower, high=mask upper (0 -> 1e9); clamp and mask together or a
    # clamp lower bound > 0 have no equivalent (rlplat applies one correction); sequence_level -> level=geometric
    Knob(("--use_rho_correction", "--rho_clamp_lower_bound", "--rho_clamp_upper_bound", "--rho_mask_lower_bound",
          "--rho_mask_upper_bound", "--rho_mask_sequence_level"),
         ("algorithm.off_policy.correction", "algorithm.off_policy.cap", "algorithm.off_policy.low",
          "algorithm.off_policy.high", "algorithm.off_policy.level"),
         "rho = pi_old / pi_rollout in both; open-instruct's default (clamp at 2) = tis with cap 2; rlplat's default "
         "is none", convert="rho_to_off_policy"),
    Knob(("--truncated_importance_sampling_ratio_cap",), ("algorithm.tis_cap",),
         "(pre-refactor flag) token-level TIS cap; its 0 (off) = leave algorithm.tis_cap unset"),
    Knob(("--rho_mask_tv_divergence",), (),
         "no equivalent: VACO's sequence-level TV-divergence mask is not built (algorithm.policy_loss=dppo_tv is "
         "another method)"),
    Knob(("--use_vllm_logprobs",), ("algorithm.old_log_probs=rollout",),
         "when true; false (default) = recompute, which rlplat's auto already picks for vLLM"),
    Knob(("--record_entropy",), (),
         "not needed: rlplat always reports the actor's entropy from the update's forward pass"),

    # --- KL ---
    # algorithm.kl_loss_coef = beta; algorithm.use_kl_loss = (beta > 0)
    Knob(("--beta",), ("algorithm.use_kl_loss", "algorithm.kl_loss_coef"),
         "KL-loss coefficient: 0.05 vs 0.001 (algorithm=grpo); beta=0 -> use_kl_loss=false", convert="beta_to_kl_loss"),
    Knob(("--kl_estimator",), ("algorithm.kl_loss_type",),
         "0 -> k1, 1 -> k2, 2 (default) -> k3 (rlplat's too); 3 (ratio-weighted k1) has no equivalent",
         convert="kl_estimator"),
    Knob(("--load_ref_policy",), ("algorithm.use_kl_loss=false",),
         "when false: no reference and no KL (ref.enable=None then loads none); true (default) needs nothing"),
    Knob(("--ref_policy_update_freq",), ("ref.sync_steps",),
         "training steps between reference refreshes in both; None = fixed reference = rlplat's 0"),
    Knob(("--alpha",), ("ref.sync_alpha",),
         "ref = alpha x actor + (1 - alpha) x ref at each refresh in both; 0.6 vs 1.0 (copy)"),

    # --- optimizer ---
    Knob(("--learning_rate",), ("actor.optim.lr",),
         "open-instruct's default 2e-5; rlplat's 3e-4 fits only its embedded tiny model"),
    # linear, cosine -> the same name (with min_lr_ratio=0.0: HF decays to 0); constant -> constant (HF's ignores
    # warmup,
    # so also warmup_steps=0); constant_with_warmup -> constant; cosine_with_restarts, polynomial: no equivalent
    Knob(("--lr_scheduler_type",), ("actor.optim.lr_schedule", "actor.optim.min_lr_ratio=0.0"),
         "open-instruct's default linear to 0; rlplat's cosine to 0.1 x lr", convert="lr_scheduler_name"),
    # warmup_steps = round(warmup_ratio x trainer.total_steps x data.train_batch_size_prompts /
    # actor.mini_batch_size_prompts x actor.ppo_epochs)
    Knob(("--warmup_ratio",), ("actor.optim.warmup_steps",),
         "no ratio key: give optimizer steps; open-instruct's default 0.0, rlplat's 5 steps",
         convert="warmup_ratio_to_steps"),
    Knob(("--warm_up_steps",), ("actor.optim.warmup_steps",), "(pre-refactor flag) optimizer steps in both; 0 vs 5"),
    Knob(("--weight_decay",), ("actor.optim.weight_decay",), "AdamW decoupled decay; 0.0 vs 0.01"),
    Knob(("--set_weight_decay_on_bias_and_norm",), (),
         "no equivalent: rlplat decays every weight (open-instruct's default True); False cannot be reproduced"),
    Knob(("--max_grad_norm",), ("actor.optim.grad_clip",),
         "1.0 in both; open-instruct's None (no clipping) = rlplat's 0"),
    Knob(("--fused_optimizer",), (),
         "not needed: rlplat's AdamW is fused wherever the weights are float tensors on CPU or CUDA"),

    # --- generation / vLLM ---
    Knob(("--response_length",), ("data.max_response_length",),
         "tokens per response; 256 vs 8; with tools open-instruct's budget is the whole trajectory: "
         "rollout.agent.max_total_tokens"),
    Knob(("--temperature",), ("rollout.temperature",),
         "1.0 in both (open-instruct's default was 0.7 before the refactor); log-probs use it in both"),
    Knob(("--vllm_top_p",), ("rollout.top_p",), "1.0 (off) in both"),
    # each string must encode to exactly one token id; multi-token stop strings have no equivalent
    Knob(("--stop_strings",), ("rollout.stop_token_ids",),
         "rlplat stops on token ids, not strings, and keeps the stop token in the response",
         convert="stop_strings_to_token_ids"),
    Knob(("--eval_response_length",), (), "no equivalent: validation generates up to data.max_response_length too"),
    Knob(("--eval_top_p",), (), "no equivalent: validation samples with rollout.top_p (and rollout.val_temperature)"),
    Knob(("--vllm_num_engines",), ("rollout=vllm", "rollout.mode=separate", "rollout.workers_per_node"),
         "one engine per rollout worker, on its own devices; several nodes: rollout.nnodes x rollout.workers_per_node"),
    Knob(("--vllm_tensor_parallel_size",), ("rollout.vllm.tensor_parallel_size",),
         "1 in both; values above 1 are untested in rlplat (docs/rollout.md)"),
    Knob(("--vllm_gpu_memory_utilization",), ("rollout.vllm.gpu_memory_utilization",),
         "0.9 vs 0.5 (rlplat's default assumes a colocated engine; raise it for a separate pool)"),
    Knob(("--vllm_enable_prefix_caching",), ("rollout.vllm.enable_prefix_caching",),
         "open-instruct's default off, rlplat's on"),
    Knob(("--vllm_enforce_eager",), ("rollout.vllm.enforce_eager",),
         "open-instruct's default False; rlplat's None = eager on CPU only"),
    Knob(("--vllm_attention_backend",), (), "no equivalent: rlplat leaves vLLM's attention backend to vLLM"),
    Knob(("--vllm_sync_backend",), (),
         "no equivalent: rollout.weight_transport=distributed picks NCCL on GPU and gloo on CPU itself"),
    Knob(("--gather_whole_model",), ("rollout.weight_sync_bucket_mb",),
         "rlplat always sends buckets (512 MB); a bucket above the model's size is one whole-model broadcast"),
    Knob(("--single_gpu_mode",), ("rollout.mode=colocated",),
         "rlplat's default: the engine shares each training worker's device (open-instruct: debugging only)"),

    # --- rewards / verifiers ---
    Knob(("--apply_verifiable_reward",), ("reward.functions=[auto]",),
         "on in both: rlplat's auto picks gsm8k, math, code or ifeval (IFEval's checks) by data_source; no "
         "string_f1/max_length verifiers"),
    Knob(("--verification_reward",), ("reward.weights",),
         "a correct answer scores 10 in open-instruct, 1 x weight in rlplat: reward.weights=[10.0] reproduces the "
         "scale"),
    Knob(("--remap_verifier",), (),
         "no equivalent: name the function in reward.functions, or rewrite data_source when converting the data"),
    Knob(("--apply_r1_style_format_reward",), ("reward.functions=[auto,format]", "reward.weights=[1.0,1.0]"),
         "with a weight per entry; rlplat's format needs the whole response <think>..</think><answer>..</answer>; "
         "open-instruct's matches ..</think><answer>..</answer>"),
    Knob(("--r1_style_format_reward",), ("reward.weights",),
         "the format entry's weight, the second of reward.weights=[1.0,<it>] (open-instruct's default 1.0)"),
    Knob(("--additive_format_reward",), ("reward.only_when_correct=[]",),
         "true = rlplat's additive default; false (default) zeroes the answer reward without format: not "
         "only_when_correct=[format]"),
    Knob(("--non_stop_penalty",), ("algorithm.truncated_responses=penalize",),
         "a response without a stop token gets a fixed score; off in both"),
    Knob(("--non_stop_penalty_value",), ("algorithm.truncated_penalty",),
         "the score given to a truncated response; 0.0 vs -1.0"),
    Knob(("--llm_judge_model",), ("reward.judge.url", "reward.judge.model"),
         "litellm name vs an OpenAI-compatible server (or reward.judge.model_path); add judge to reward.functions",
         convert="by_hand"),
    Knob(("--llm_judge_max_tokens",), ("reward.judge.max_new_tokens",), "tokens of a judge answer; 2048 vs 256"),
    Knob(("--llm_judge_max_context_length",), ("reward.judge.max_prompt_length",),
         "8192 vs 4096; rlplat bounds the judge prompt (cut from its start)"),
    Knob(("--llm_judge_temperature",), ("reward.judge.temperature",), "1.0 vs 0.0 (greedy)"),
    Knob(("--llm_judge_timeout",), ("reward.judge.timeout_s",), "seconds per judge request; 60 in both"),
    Knob(("--code_api_url",), (),
         "no equivalent: rlplat's code reward runs the tests locally in its sandbox (reward.code.*), no remote API"),
    Knob(("--code_max_execution_time",), ("reward.code.timeout_s",), "seconds per test; 1.0 vs 5.0"),
    # threshold 0 (default) -> fraction; threshold 1.0 -> all; values in between have no equivalent
    Knob(("--code_pass_rate_reward_threshold",), ("reward.code.scoring",),
         "the pass rate below the threshold scores 0: 0 = fraction, 1.0 = all",
         convert="pass_rate_threshold_to_scoring"),
    Knob(("--code_apply_perf_penalty",), (), "no equivalent: the code reward scores passed tests only"),
    Knob(("--max_length_verifier_max_length",), (),
         "no equivalent: no max_length verifier (algorithm.overlong_buffer.* shapes lengths instead)"),
    Knob(("--apply_evolving_rubric_reward", "--max_active_rubrics", "--cache_evolving_rubric_data_dir"), (),
         "no equivalent: no evolving-rubric rewards"),
    Knob(("--reward_aggregator",), (),
         "no equivalent: reward functions score the final answer; an environment's per-turn reward terms are summed "
         "(open-instruct's sum)"),
    Knob(("--max_possible_score",), (), "not needed: computed by open-instruct, not meant to be set"),

    # --- tools / environments ---
    Knob(("--tools",), ("rollout.agent.name=tool", "rollout.agent.tools"),
         "built-ins calculator and python (local sandbox) or file.py:function; no search tool"),
    Knob(("--tool_call_names",), (), "no equivalent: a tool is called by its own name"),
    Knob(("--tool_configs",), (),
         "no equivalent: built-in tools take no config; wrap a configured function as file.py:function"),
    Knob(("--tool_parser_type",), ("rollout.agent.parser",),
         "rlplat: hermes (default) or llama3_json; open-instruct's legacy tag format has no equivalent"),
    Knob(("--max_steps", "--max_tool_calls"), ("rollout.agent.max_tool_calls", "rollout.agent.max_turns"),
         "5 vs 8 calls per trajectory; rlplat also caps assistant turns (4): set max_turns to max_steps + 1",
         convert="tool_call_limits"),
    Knob(("--per_turn_max_tokens",), ("data.max_response_length",),
         "in the tool loop data.max_response_length is one turn's budget; None = response_length in open-instruct"),
    Knob(("--mask_tool_use",), (),
         "no equivalent: rlplat always keeps tool output out of the loss (open-instruct's default True)"),
    Knob(("--pass_tools_to_chat_template",), (),
         "no equivalent: rlplat always renders the tools' schemas with the chat template (the default True)"),
    Knob(("--only_reward_good_outputs",), (),
         "no equivalent: a custom reward can read extra_info['agent']['tool_errors']"),
    Knob(("--pool_size",), (), "no equivalent: tool calls run in the rollout worker, without actor pools"),
    Knob(("--number_documents_to_search", "--search_api_endpoint"), (),
         "no equivalent: (pre-refactor flags) rlplat has no search tool"),
    Knob(("--code_tool_api_endpoint",), (),
         "no equivalent: (pre-refactor flag) rlplat's python tool runs locally in its sandbox"),

    # --- async ---
    Knob(("--async_steps",), ("trainer.async_steps", "rollout.mode=separate"),
         "steps generation runs ahead; 8 (1 before the refactor, must be > 0) vs 0 = synchronous"),
    Knob(("--inflight_updates",), ("rollout.partial=resume",),
         "weights load mid-generation (rlplat recomputes the KV cache); open-instruct's default on, rlplat's finish"),

    # --- checkpoints / eval / logging ---
    Knob(("--output_dir",), ("trainer.output_dir",),
         "'output/' vs outputs/<experiment_name>; checkpoints go to <output_dir>/checkpoints"),
    Knob(("--save_freq",), ("trainer.save_freq", "trainer.export_every_save=true"),
         "model saved every N steps (200); rlplat's one checkpoint cadence (0 = end only), hf_export/ each save"),
    Knob(("--checkpoint_state_freq",), ("trainer.save_freq",),
         "resumable state every N steps: 200 (-1 = off before the refactor); rlplat: 0 = at the end only"),
    Knob(("--checkpointing_steps",), ("trainer.save_freq",),
         "olmo-core's cadence (500); grpo_fast's are --save_freq and --checkpoint_state_freq, rlplat has one"),
    Knob(("--ephemeral_save_interval",), (),
         "no equivalent: one checkpoint cadence, the newest trainer.max_checkpoints kept"),
    Knob(("--checkpoint_state_dir",), ("trainer.output_dir",),
         "rlplat writes and auto-resumes checkpoints under <output_dir>/checkpoints (trainer.resume_mode=auto)"),
    Knob(("--keep_last_n_checkpoints",), ("trainer.max_checkpoints",),
         "3 in both; open-instruct's -1 (keep all) = rlplat's 0"),
    Knob(("--resume_from_checkpoint",), ("trainer.resume_mode",),
         "pass the checkpoint directory itself: trainer.resume_mode=PATH"),
    Knob(("--deepspeed_checkpoint_load_universal",), ("trainer.resume_allow_config_change",),
         "rlplat's checkpoints are torch.distributed.checkpoint; a changed worker count needs this key"),
    Knob(("--gs_checkpoint_state_dir",), (), "not needed: runtime value for Google Cloud Storage"),
    Knob(("--local_eval_every",), ("trainer.test_freq",),
         "100 vs 50 steps; open-instruct's -1 (never) = rlplat's 0 (only before and after training)"),
    Knob(("--eval_on_step_0",), (),
         "no equivalent: rlplat always validates before a fresh run's first step (as eval_on_step_0=True)"),
    Knob(("--eval_pass_at_k",), ("rollout.val_n",),
         "responses per validation prompt (pass@k); needs rollout.val_temperature > 0 (rlplat's default is greedy)"),
    Knob(("--exp_name",), ("trainer.experiment_name",),
         "'grpo' vs 'run'; rlplat's also names the default output directory"),
    Knob(("--run_name",), ("trainer.experiment_name",),
         "open-instruct builds it from exp_name, seed and time when unset; rlplat uses the one name"),
    Knob(("--seed",), ("trainer.seed",), "42 in both (1 before the refactor); rlplat's data order uses data.seed"),
    Knob(("--with_tracking",), ("trainer.logger=[console,jsonl,wandb]",), "add wandb to trainer.logger"),
    Knob(("--report_to",), ("trainer.logger",),
         "open-instruct's 'all' = every installed integration; rlplat lists names: console, jsonl, tensorboard, "
         "wandb, mlflow"),
    Knob(("--wandb_project", "--wandb_project_name"), ("trainer.project_name",),
         "'open_instruct_internal' vs 'rlplat' (--wandb_project_name is the pre-refactor name)"),
    Knob(("--wandb_entity",), (), "no equivalent key: wandb reads the WANDB_ENTITY environment variable"),
    Knob(("--wandb_group_name",), (), "no equivalent: runs are not grouped"),
    Knob(("--logging_steps",), (), "no equivalent: every step's metrics are logged"),
    Knob(("--save_traces", "--rollouts_save_path"), ("trainer.log_completions",),
         "the first N responses of each step (with score, advantage, reward terms) to completions.jsonl in "
         "trainer.output_dir; every response: N = the step's sequences"),
    Knob(("--verbose",), ("trainer.verbose",),
         "rlplat's shows third-party output (loading bars, warnings, Ray lines) rather than debug output"),
    Knob(("--push_to_hub", "--hf_entity", "--hf_repo_id", "--hf_repo_revision", "--hf_repo_url"), (),
         "not needed: rlplat uploads nothing (push_to_hub defaults to True there); upload hf_export/ yourself"),
    Knob(("--try_launch_beaker_eval_jobs_on_weka", "--oe_eval_tasks", "--oe_eval_max_length", "--oe_eval_beaker_image",
          "--oe_eval_gpu_multiplier", "--eval_priority", "--eval_workspace"),
         (), "not needed: Ai2 Beaker/oe-eval jobs launched after training"),
    Knob(("--try_auto_save_to_beaker",), (), "not needed: Beaker dataset upload"),
    Knob(("--gs_bucket_path",), (), "not needed: Google Cloud Storage upload"),
    Knob(("--send_slack_alerts",), (), "not needed: Slack notifications"),

    # --- infrastructure ---
    # all entries equal: trainer.workers_per_node = that entry, trainer.nnodes = len(list); unequal entries have
    # no equivalent
    Knob(("--num_learners_per_node",), ("trainer.workers_per_node", "trainer.nnodes"),
         "training devices per node (a list per node vs one number); with vLLM engines they form the training pool",
         convert="learners_per_node"),
    Knob(("--num_nodes",), ("trainer.nnodes", "rollout.nnodes"),
         "rlplat sizes its pools apart: trainer.nnodes for learners, rollout.nnodes for the rollout pool"),
    Knob(("--world_size",), (), "not needed: RUNTIME VALUE (trainer.nnodes x trainer.workers_per_node)"),
    Knob(("--backend_timeout",), (), "no equivalent: no timeout key for the training and rollout backends"),
    # deepspeed_stage: 3 -> true, 2 (or 1) -> false
    Knob(("--deepspeed_stage",), ("actor.fsdp.reshard_after_forward",),
         "FSDP2 always shards the optimizer state and gradients; true (rlplat's default) also frees the gathered "
         "weights after the forward (ZeRO-3), false keeps them for the backward (ZeRO-2)", convert="deepspeed_stage"),
    Knob(("--deepspeed_zpg",), (), "no equivalent: no ZeRO++ hierarchical partitioning"),
    Knob(("--deepspeed_offload_param", "--deepspeed_offload_optimizer"), ("actor.fsdp.param_offload",),
         "one switch offloads parameters, gradients and optimizer state; GPU only"),
    Knob(("--fsdp_shard_degree", "--fsdp_num_replicas"), (),
         "no equivalent: FSDP2 shards over all training workers (no HSDP replicas)"),
    Knob(("--sequence_parallel_size",), ("actor.fsdp.ulysses_size", "ref.fsdp.ulysses_size"),
         "Ulysses sequence parallelism in both; must divide the workers and the attention heads "
         "(docs/long_context.md)"),
    Knob(("--cp_degree",), ("actor.fsdp.ulysses_size",), "only --cp_strategy ulysses has an equivalent; None = 1"),
    Knob(("--cp_strategy",), (),
         "no equivalent: rlplat's context parallelism is Ulysses only (actor.fsdp.ulysses_size); llama3 / zig_zag "
         "ring attention are not built"),
    Knob(("--enable_queue_dashboard", "--queue_dashboard_port"), (),
         "not needed: monitoring dashboard (rlplat logs timing/* and timeline.jsonl)"),
]

# grpo_fast's defaults where rlplat's differ and the run's result depends on them (python -m rlplat.tools.migrate
# adds them unless the command sets the key): --lr_scheduler_type linear (to 0), --warmup_ratio 0.0, --beta 0.05,
# --clip_higher 0.272, --loss_fn dapo (no dual clip)
OPEN_INSTRUCT_DEFAULTS = [
    "actor.optim.lr_schedule=linear", "actor.optim.min_lr_ratio=0.0", "actor.optim.warmup_steps=0",
    "algorithm.kl_loss_coef=0.05", "algorithm.clip_ratio_high=0.272", "algorithm.clip_ratio_c=1e9",
]
