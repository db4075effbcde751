"""TRL's ``GRPOConfig`` fields (with the ``transformers.TrainingArguments`` it extends and ``GRPOTrainer``'s
arguments) and rlplat's setting for each.

Each entry is one :class:`~rlplat.config.migration.knob.Knob`; docs/migrating.md's table is rendered from this list
(``python -m rlplat.config.migration --write``) and ``tests/config/test_migration_maps.py`` loads every rlplat setting
named here. Sources: TRL's grpo_config.py and its GRPO trainer docs.
"""

from rlplat.config.migration.knob import Knob

TRL = [
    # --- model ---
    Knob(("model",), ("model.path",), "GRPOTrainer's argument: hub id or local directory"),
    Knob(("model_init_kwargs",), ("model.attn_implementation", "model.trust_remote_code"),
         "the other from_pretrained arguments (dtype, device_map, ...) have no equivalent", convert="init_kwargs"),
    Knob(("trust_remote_code",), ("model.trust_remote_code",), "off in both; also the tokenizer's"),
    Knob(("gradient_checkpointing",), ("model.gradient_checkpointing",), "TRL's default is on, rlplat's off"),
    Knob(("bf16",), ("actor.fsdp.mixed_precision",),
         "True (TRL's default) = auto: bf16 compute with fp32 weights on GPU; False = none"),
    Knob(("disable_dropout",), (),
         "no equivalent: rlplat always trains without dropout (= disable_dropout=True), adapters' included"),
    Knob(("cast_lm_head_to_fp32",), (), "no equivalent: the LM head runs in the compute dtype"),
    Knob(("router_aux_loss_coef",), ("actor.moe.aux_loss_coef",),
         "MoE load-balancing loss weight; TRL's default 0.001, rlplat's null = the model config's (docs/moe.md)"),
    Knob(("use_liger_kernel",), ("actor.fsdp.token_head=liger",),
         "liger-kernel's fused linear cross-entropy for the output layer (a GPU); TRL also patches norms and MLPs. "
         "The default on a GPU, rlplat's fused head with compiled layers, measured faster (docs/gpu.md)"),
    Knob(("torch_compile",), ("actor.fsdp.compile",),
         "each decoder layer compiled (regional compilation): on by default on a GPU, off on CPU"),
    # lora_config_fields: a peft LoraConfig's r, lora_alpha and target_modules become the three model.lora.* keys
    Knob(("peft_config",), ("model.lora.rank", "model.lora.alpha", "model.lora.target_modules"),
         "GRPOTrainer's argument: LoRA on the actor (docs/lora.md); its lora_dropout has no equivalent",
         convert="lora_config_fields"),
    Knob(("use_peft",), ("model.lora.rank",), "TRL script flag: LoRA is on when model.lora.rank > 0 (give lora_r)"),
    Knob(("lora_r",), ("model.lora.rank",), "TRL's default 16 (with use_peft), rlplat's 0 = off"),
    Knob(("lora_alpha",), ("model.lora.alpha",), "TRL's default 32, rlplat's 16"),
    Knob(("lora_dropout",), (),
         "no equivalent: rlplat trains without dropout (the update's log-probs are the rollout's); "
         "model.lora.dropout must stay 0"),
    Knob(("lora_target_modules",), ("model.lora.target_modules",),
         "TRL's None = peft's per-architecture default; rlplat's [] = every linear layer of the decoder"),

    # --- optimizer and schedule ---
    Knob(("learning_rate",), ("actor.optim.lr",),
         "TRL's default 1e-6; rlplat's 3e-4 fits only the embedded tiny model"),
    Knob(("lr_scheduler_type",), ("actor.optim.lr_schedule",),
         "constant, linear, cosine (value rows below); TRL decays to 0, rlplat to min_lr_ratio (0.1)"),
    Knob(("lr_scheduler_type=linear",), ("actor.optim.lr_schedule=linear", "actor.optim.min_lr_ratio=0.0"),
         "TRL's default: linear decay to 0"),
    Knob(("lr_scheduler_type=cosine",), ("actor.optim.lr_schedule=cosine", "actor.optim.min_lr_ratio=0.0"),
         "cosine decay to 0"),
    Knob(("lr_scheduler_type=cosine_with_min_lr",), ("actor.optim.lr_schedule=cosine", "actor.optim.min_lr_ratio"),
         "min_lr_ratio = lr_scheduler_kwargs' min_lr_rate", convert="by_hand"),
    Knob(("lr_scheduler_type=constant",), ("actor.optim.lr_schedule=constant", "actor.optim.warmup_steps=0"),
         "TRL's constant ignores warmup; rlplat's constant warms up first"),
    Knob(("lr_scheduler_type=constant_with_warmup",), ("actor.optim.lr_schedule=constant",),
         "linear warmup (actor.optim.warmup_steps), then constant"),
    Knob(("lr_scheduler_kwargs",), ("actor.optim.min_lr_ratio",),
         "only min_lr_rate (cosine_with_min_lr) has a key; num_cycles and the rest have no equivalent"),
    Knob(("warmup_steps",), ("actor.optim.warmup_steps",), "optimizer steps in both; TRL's default 0, rlplat's 5"),
    # warmup_ratio_to_steps: ratio x the run's optimizer steps (TRL's max_steps), rounded
    Knob(("warmup_ratio",), ("actor.optim.warmup_steps",),
         "no ratio key: give the ratio times the run's optimizer steps (max_steps)", convert="warmup_ratio_to_steps"),
    Knob(("weight_decay",), ("actor.optim.weight_decay",), "TRL's default 0, rlplat's 0.01"),
    # into_betas_first / into_betas_second: TRL's two scalars are the two entries of rlplat's actor.optim.betas list
    Knob(("adam_beta1",), ("actor.optim.betas",), "the first entry; 0.9 in both", convert="into_betas_first"),
    Knob(("adam_beta2",), ("actor.optim.betas",), "the second entry; 0.999 in both", convert="into_betas_second"),
    Knob(("adam_epsilon",), ("actor.optim.eps",), "1e-8 in both"),
    Knob(("max_grad_norm",), ("actor.optim.grad_clip",), "1.0 in both"),

    # --- batch sizes and steps ---
    Knob(("per_device_train_batch_size",), ("actor.micro_batch_size_seqs_per_worker",),
         "completions per device per forward/backward in both"),
    # accumulation_to_mini_batch_prompts: actor.mini_batch_size_prompts = per_device_train_batch_size x processes
    # x gradient_accumulation_steps / num_generations
    Knob(("gradient_accumulation_steps",), ("actor.mini_batch_size_prompts",),
         "no key: accumulation follows from the mini-batch, rollout.n, the workers and the micro-batch",
         convert="accumulation_to_mini_batch_prompts"),
    Knob(("num_processes",), ("trainer.workers_per_node", "trainer.nnodes"),
         "accelerate's processes = trainer.nnodes x trainer.workers_per_node", convert="processes_to_workers"),
    Knob(("num_generations",), ("rollout.n",), "8 in both"),
    Knob(("num_generations_eval",), ("rollout.val_n",),
         "TRL's None = num_generations, rlplat's 1; > 1 needs rollout.val_temperature > 0"),
    # completions_to_prompts: divide TRL's completion count by num_generations
    Knob(("generation_batch_size",), ("data.train_batch_size_prompts",),
         "TRL counts completions, rlplat prompts", convert="completions_to_prompts"),
    # steps_per_generation_to_mini_batch_prompts: actor.mini_batch_size_prompts = data.train_batch_size_prompts x
    # gradient_accumulation_steps / steps_per_generation
    Knob(("steps_per_generation",), ("actor.mini_batch_size_prompts",),
         "TRL counts micro-steps per generation: optimizer steps per step = data.train_batch_size_prompts / "
         "mini_batch", convert="steps_per_generation_to_mini_batch_prompts"),
    Knob(("num_iterations",), ("actor.ppo_epochs",),
         "passes over each generation's batch; 1 in both (TRL counts each pass's optimizer steps in max_steps)"),
    # optimizer_steps_to_training_steps: rlplat steps = TRL steps x gradient_accumulation_steps /
    # (steps_per_generation x num_iterations); with TRL's defaults: / num_iterations
    Knob(("max_steps",), ("trainer.total_steps",),
         "TRL counts optimizer steps, rlplat generations (training steps)",
         convert="optimizer_steps_to_training_steps"),
    # epochs_to_steps: trainer.total_steps = epochs x (training rows // data.train_batch_size_prompts)
    Knob(("num_train_epochs",), ("trainer.total_steps",),
         "no epoch key: give steps = epochs x training rows / data.train_batch_size_prompts",
         convert="epochs_to_steps"),
    # per_device_completions_to_global_prompts: data.val_batch_size_prompts = per_device_eval_batch_size x
    # processes / num_generations_eval
    Knob(("per_device_eval_batch_size",), ("data.val_batch_size_prompts",),
         "prompts per validation generation call, global; the whole validation set is always used",
         convert="per_device_completions_to_global_prompts"),

    # --- data ---
    # dataset_to_parquet: rows become parquet in the RLHF schema (data_source, prompt, reward_model.ground_truth,
    # extra_info); docs/migrating.md "Rewards and data"
    Knob(("train_dataset",), ("data.train_files",),
         "GRPOTrainer's argument: a parquet file (or list) in the RLHF schema", convert="dataset_to_parquet"),
    # dataset_to_parquet: as for train_dataset
    Knob(("eval_dataset",), ("data.val_files",),
         "GRPOTrainer's argument: a parquet file (or list) in the RLHF schema", convert="dataset_to_parquet"),
    Knob(("max_prompt_length",), ("data.max_prompt_length", "data.truncation=left"),
         "older TRL cut long prompts from the left; removed from TRL in 2026 (#4847): filtering is "
         "data.truncation=filter"),
    Knob(("max_completion_length",), ("data.max_response_length",), "TRL's default 512, rlplat's 8"),
    Knob(("shuffle_dataset",), ("data.shuffle",), "on in both"),
    Knob(("data_seed",), ("data.seed",), "data order only"),
    Knob(("remove_unused_columns",), (), "not needed: every row's extra_info reaches the reward function"),
    Knob(("pad_to_multiple_of",), (),
         "not needed: micro-batches run packed without padding (actor.fsdp.pack_sequences)"),
    Knob(("chat_template_kwargs",), (),
         "no equivalent: the chat template is applied with its defaults (data.apply_chat_template on/off only)"),

    # --- generation ---
    Knob(("temperature",), ("rollout.temperature",), "1.0 in both"),
    Knob(("top_p",), ("rollout.top_p",), "1.0 = off in both"),
    # top_k_off_to_minus_one: TRL's 0 or None (off) becomes -1; other values carry over
    Knob(("top_k",), ("rollout.top_k",), "TRL's off is 0 (or None), rlplat's is -1", convert="top_k_off_to_minus_one"),
    Knob(("min_p",), (), "no equivalent: no min-p sampling"),
    Knob(("repetition_penalty",), (),
         "no equivalent: no repetition penalty (it would change the sampled distribution)"),
    Knob(("generation_kwargs",), (), "no equivalent: no free-form sampling arguments"),
    Knob(("vllm_structured_outputs_regex",), (), "no equivalent: no structured (regex-guided) generation"),
    Knob(("cache_implementation",), (), "not needed: rlplat's hf engine manages its own KV cache"),
    Knob(("use_transformers_continuous_batching",), (),
         "no equivalent: the hf engine samples in static batches; rollout=vllm batches continuously"),
    Knob(("transformers_continuous_batching_config",), (),
         "no equivalent: no transformers continuous batching (rollout=vllm batches continuously)"),
    Knob(("use_transformers_paged",), (), "no equivalent: deprecated alias of use_transformers_continuous_batching"),
    Knob(("ds3_gather_for_generation",), (),
         "not needed: a DeepSpeed ZeRO-3 option; rlplat's engines hold whole weights for generation"),
    Knob(("tools",), ("rollout.agent.name=tool", "rollout.agent.tools"),
         "GRPOTrainer's argument: tools as file.py:function or pkg.module:function (docs/agents.md)"),
    # plus_one: TRL counts tool-calling rounds after the first answer, rlplat assistant turns: max_turns =
    # iterations + 1
    Knob(("max_tool_calling_iterations",), ("rollout.agent.max_turns",),
         "with rollout.agent.name=tool; TRL's None (no limit) has no equivalent: give a number", convert="plus_one"),

    # --- vLLM ---
    Knob(("use_vllm=True",), ("rollout=vllm",), "vLLM generates the rollouts"),
    Knob(("use_vllm=False",), ("rollout=hf",), "TRL's default: transformers generate, rlplat's default engine too"),
    Knob(("vllm_mode=colocate",), ("rollout.mode=colocated",),
         "TRL's default: vLLM inside the training processes, rlplat's default mode"),
    Knob(("vllm_mode=server",), ("rollout=vllm", "rollout.mode=server", "rollout.server.url"),
         "start the server with python -m rlplat.rollout.vllm_serve MODEL instead of trl vllm-serve (docs/rollout.md)",
         convert="host_port_to_url"),
    Knob(("vllm_server_base_url",), ("rollout.server.url",), "e.g. http://10.0.0.5:8000"),
    # host_port_to_url: rollout.server.url = http://<vllm_server_host>:<vllm_server_port>
    Knob(("vllm_server_host",), ("rollout.server.url",), "part of the URL", convert="host_port_to_url"),
    # host_port_to_url: as for vllm_server_host
    Knob(("vllm_server_port",), ("rollout.server.url",), "part of the URL", convert="host_port_to_url"),
    Knob(("vllm_server_timeout",), (),
         "no equivalent: rollout.server.timeout_s is a per-request limit, not a start-up wait"),
    Knob(("vllm_group_port",), (), "not needed: weights reach the server over HTTP (/collective_rpc), no NCCL group"),
    Knob(("vllm_gpu_memory_utilization",), ("rollout.vllm.gpu_memory_utilization",), "TRL's default 0.3, rlplat's 0.5"),
    Knob(("vllm_tensor_parallel_size",), ("rollout.vllm.tensor_parallel_size",), "1 in both"),
    Knob(("vllm_max_model_length",), ("rollout.vllm.max_model_len",),
         "TRL's None = the model config's; rlplat's null = data.max_prompt_length + data.max_response_length"),
    Knob(("vllm_enable_sleep_mode=True",), ("rollout.vllm.sleep_level=1",),
         "weights offloaded and KV cache freed during the update, rlplat's default"),
    Knob(("vllm_enable_sleep_mode=False",), ("rollout.vllm.sleep_level=0",),
         "TRL's default: the engine stays resident; rlplat sleeps by default"),
    Knob(("vllm_model_impl",), (), "no equivalent: vLLM runs its own model implementation"),

    # --- loss ---
    Knob(("beta",), ("algorithm.use_kl_loss=true", "algorithm.kl_loss_coef"),
         "beta > 0: KL loss with TRL's estimator k3 (algorithm.kl_loss_type=k3, the grpo preset's)"),
    Knob(("beta=0.0",), ("algorithm.use_kl_loss=false",),
         "TRL's default: no KL term, which also drops the reference model"),
    Knob(("epsilon",), ("algorithm.clip_ratio_low", "algorithm.clip_ratio_high"),
         "both, unless epsilon_high is set; 0.2 in both"),
    Knob(("epsilon_high",), ("algorithm.clip_ratio_high",), "TRL's None = epsilon (with loss_type=cispo see that row)"),
    Knob(("delta",), ("algorithm.clip_ratio_c",), "the same cap on the ratio of negative-advantage tokens (dual clip)"),
    Knob(("delta=None",), ("algorithm.clip_ratio_c=1e9",), "TRL's default: no dual clip; rlplat's is always on (3.0)"),
    Knob(("loss_type=grpo",), ("algorithm.loss_agg_mode=seq-mean-token-mean",), "the algorithm=grpo default"),
    Knob(("loss_type=dapo",), ("algorithm.loss_agg_mode=token-mean",),
         "TRL's default: both divide by the tokens of the whole accumulated batch"),
    Knob(("loss_type=bnpo",), ("algorithm.loss_agg_mode=token-mean",),
         "TRL divides per local batch; rlplat always divides by the whole mini-batch's tokens, so it gives TRL's dapo"),
    Knob(("loss_type=dr_grpo",), ("algorithm.loss_agg_mode=seq-mean-token-sum-norm",),
         "the constant is data.max_response_length unless algorithm.loss_scale_factor; the aggregation only, as TRL's "
         "(the preset algorithm=dr_grpo also drops the std scaling and the KL, TRL's scale_rewards=false, beta=0)"),
    # cispo_cap_minus_one: TRL caps the IS weight at epsilon_high itself (eps_max, e.g. 5); rlplat at 1 +
    # clip_ratio_high: clip_ratio_high = epsilon_high - 1
    Knob(("loss_type=cispo",), ("algorithm=cispo", "algorithm.clip_ratio_high"),
         "no lower bound in either (the preset's clip_ratio_low=1); token-mean as TRL's",
         convert="cispo_cap_minus_one"),
    Knob(("loss_type=sapo",), ("algorithm.policy_loss=sapo", "algorithm.loss_agg_mode=seq-mean-token-mean"),
         "TRL aggregates sapo as grpo (per-sequence token mean)"),
    Knob(("loss_type=luspo",), ("algorithm.policy_loss=gspo", "algorithm.loss_agg_mode=seq-mean-token-sum"),
         "GSPO's sequence ratio, each sequence's loss times its length (TRL needs importance_sampling_level=sequence)"),
    Knob(("loss_type=vespo",), (), "no equivalent: no VESPO loss"),
    Knob(("sapo_temperature_pos",), ("algorithm.policy_loss_options.sapo_tau_pos",), "1.0 in both"),
    Knob(("sapo_temperature_neg",), ("algorithm.policy_loss_options.sapo_tau_neg",), "1.05 in both"),
    Knob(("vespo_k_pos",), (), "no equivalent: no VESPO loss"),
    Knob(("vespo_lambda_pos",), (), "no equivalent: no VESPO loss"),
    Knob(("vespo_k_neg",), (), "no equivalent: no VESPO loss"),
    Knob(("vespo_lambda_neg",), (), "no equivalent: no VESPO loss"),
    Knob(("importance_sampling_level=token",), ("algorithm.policy_loss=ppo",), "TRL's default: one ratio per token"),
    Knob(("importance_sampling_level=sequence",), ("algorithm=gspo",),
         "GSPO-token with GSPO's clip ranges; algorithm.policy_loss=gspo alone keeps your epsilon and loss_type"),
    Knob(("mask_truncated_completions=True",), ("algorithm.truncated_responses=mask",),
         "no loss on truncated responses (docs/options.md)"),
    Knob(("mask_truncated_completions=False",), ("algorithm.truncated_responses=keep",), "TRL's default, rlplat's too"),
    Knob(("entropy_coef",), ("actor.entropy_coeff",),
         "0 in both; TRL's bonus is a token mean, rlplat aggregates it with algorithm.loss_agg_mode"),
    Knob(("top_entropy_quantile",), (), "no equivalent: every response token keeps its loss"),
    Knob(("use_adaptive_entropy",), (), "no equivalent: the entropy coefficient is fixed (actor.entropy_coeff)"),
    Knob(("entropy_coef_min",), (), "no equivalent: no adaptive entropy control"),
    Knob(("entropy_coef_max",), (), "no equivalent: no adaptive entropy control"),
    Knob(("entropy_coef_delta",), (), "no equivalent: no adaptive entropy control"),
    Knob(("entropy_target",), (), "no equivalent: no adaptive entropy control"),
    Knob(("off_policy_mask_threshold",), (), "no equivalent: no KL-based masking of negative-advantage sequences"),
    Knob(("use_bias_correction_kl",), (), "no equivalent: the KL term is not reweighted by the importance ratio"),

    # --- advantages ---
    Knob(("scale_rewards=group", "scale_rewards=True"), ("algorithm.norm_adv_scale=group",),
         "TRL's default and rlplat's: divide by the group's std (+ 1e-4 in TRL: algorithm.norm_adv_epsilon=1e-4; "
         "rlplat's 1e-6 is verl's)"),
    Knob(("scale_rewards=batch",), ("algorithm.norm_adv_scale=batch",), "divide by the batch's std"),
    Knob(("scale_rewards=none", "scale_rewards=False"), ("algorithm.norm_adv_scale=none",),
         "no std scaling (Dr. GRPO)"),
    Knob(("multi_objective_aggregation=sum_then_normalize",), ("algorithm.adv_estimator=grpo",),
         "TRL's default: the weighted sum is normalised per group"),
    Knob(("multi_objective_aggregation=normalize_then_sum",), ("algorithm.adv_estimator=gdpo",),
         "or the preset algorithm=gdpo (GDPO)"),

    # --- vLLM importance sampling (rollout/training mismatch) ---
    Knob(("vllm_importance_sampling_correction=True",), ("algorithm.off_policy.correction",),
         "TRL's default with vLLM (sequence_mask, cap 3); rlplat's default none: set it with the mode rows below"),
    Knob(("vllm_importance_sampling_correction=False",), ("algorithm.off_policy.correction=none",),
         "no correction, rlplat's default"),
    Knob(("vllm_importance_sampling_mode=token_truncate",),
         ("algorithm.off_policy.correction=tis", "algorithm.off_policy.level=token"),
         "weights min(rho, cap) per token"),
    Knob(("vllm_importance_sampling_mode=token_mask",),
         ("algorithm.off_policy.correction=mis", "algorithm.off_policy.level=token"),
         "tokens with rho outside [low, high] get weight 0"),
    Knob(("vllm_importance_sampling_mode=sequence_truncate",),
         ("algorithm.off_policy.correction=tis", "algorithm.off_policy.level=sequence"),
         "one truncated weight per response"),
    Knob(("vllm_importance_sampling_mode=sequence_mask",),
         ("algorithm.off_policy.correction=mis", "algorithm.off_policy.level=sequence"),
         "TRL's default mode: responses with rho outside [low, high] get weight 0"),
    Knob(("vllm_importance_sampling_clip_max", "vllm_importance_sampling_cap"),
         ("algorithm.off_policy.cap", "algorithm.off_policy.high"),
         "truncate modes: cap; mask modes: high; TRL's default 3.0 (cap: the deprecated name)"),
    Knob(("vllm_importance_sampling_clip_min",), ("algorithm.off_policy.low",),
         "mask modes: low; truncate modes have no lower clamp in rlplat"),
    Knob(("vllm_importance_sampling_clip_min=None",), ("algorithm.off_policy.low=0.0",),
         "TRL's default: no low side (rlplat's default low is 0.5)"),

    # --- reference model ---
    Knob(("sync_ref_model=True",), ("ref.sync_steps",), "set ref.sync_steps > 0 (ref_model_sync_steps)"),
    Knob(("sync_ref_model=False",), ("ref.sync_steps=0",), "TRL's default: a fixed reference, rlplat's too"),
    # optimizer_steps_to_training_steps: as for max_steps (x gradient_accumulation_steps / (steps_per_generation x
    # num_iterations))
    Knob(("ref_model_sync_steps",), ("ref.sync_steps",),
         "TRL counts optimizer steps, rlplat training steps; TRL's default 512",
         convert="optimizer_steps_to_training_steps"),
    Knob(("ref_model_mixup_alpha",), ("ref.sync_alpha",), "TRL's default 0.6, rlplat's 1 (copy)"),

    # --- rewards ---
    # batch_reward_fn_to_compute_score: a Python callable is not a command-line value: rlplat.trainer.GRPOTrainer takes
    # it as it is, the command line by its registered name
    Knob(("reward_funcs=<callable>",), ("reward.functions", "reward.custom_fn.path"),
         "TRL's batched functions work as they are (one call per batch, the dataset's columns by name): pass them "
         "to rlplat.trainer.GRPOTrainer, or register them by name with trainer.imports",
         convert="batch_reward_fn_to_compute_score"),
    Knob(("reward_funcs=<reward model id>",), ("reward.model.path",),
         "a sequence classifier (num_labels=1) as in TRL; listed as reward_model in reward.functions with others "
         "(docs/rewards.md)"),
    Knob(("reward_weights",), ("reward.weights",),
         "one per entry of reward.functions; TRL's None = all 1.0, as rlplat's default"),
    Knob(("reward_processing_classes",), ("reward.model.apply_chat_template",),
         "a reward model always uses its own tokenizer; this renders the chat with its own template"),

    # --- logging, evaluation, checkpoints ---
    Knob(("logging_steps",), (), "not needed: every step's metrics are logged"),
    Knob(("log_completions",), ("trainer.log_completions",),
         "a number, not a switch: the first N responses of each step, with score, advantage and reward terms, go "
         "to completions.jsonl, the report and the loggers' train/completions table (0, the default: none)"),
    Knob(("num_completions_to_print",), ("trainer.log_completions",),
         "written to completions.jsonl and the report rather than printed"),
    Knob(("log_multimodal",), (), "not needed: a logging switch for images in logged completions"),
    Knob(("log_unique_prompts",), (), "not needed: a logging switch"),
    Knob(("log_completions_hub_repo",), (), "no equivalent: completions are not pushed to the Hub"),
    Knob(("report_to",), ("trainer.logger",), "a list of logger names: console | tensorboard | wandb | mlflow"),
    Knob(("run_name",), ("trainer.experiment_name",), "also names rlplat's default output directory"),
    Knob(("output_dir",), ("trainer.output_dir",), "metrics, checkpoints, summary, hf_export"),
    # optimizer_steps_to_training_steps: as for max_steps
    Knob(("save_steps",), ("trainer.save_freq",),
         "TRL counts optimizer steps, rlplat training steps (equal with TRL's defaults)",
         convert="optimizer_steps_to_training_steps"),
    # null_to_zero: TRL's None (keep all) is rlplat's 0 (<= 0 keeps all)
    Knob(("save_total_limit",), ("trainer.max_checkpoints",),
         "TRL's None keeps all, rlplat's default 3 (<= 0 keeps all)", convert="null_to_zero"),
    Knob(("resume_from_checkpoint",), ("trainer.resume_mode",),
         "True = auto, a path = the path; TRL starts fresh by default, rlplat resumes the newest (disable for TRL's "
         "default)"),
    Knob(("eval_strategy",), ("trainer.test_freq",),
         "steps: give eval_steps; TRL's no (default) = trainer.test_freq=0 (rlplat still validates before and after)"),
    # optimizer_steps_to_training_steps: as for max_steps
    Knob(("eval_steps",), ("trainer.test_freq",),
         "TRL counts optimizer steps, rlplat training steps", convert="optimizer_steps_to_training_steps"),
    Knob(("seed",), ("trainer.seed",), "42 in both; seeds model init, sampling and mini-batch shuffling"),
    Knob(("torch_empty_cache_steps",), (),
         "no equivalent: no periodic torch.cuda.empty_cache() (an out-of-memory workaround; results unchanged)"),
]

# TRL's defaults where rlplat's differ and the run's result depends on them (python -m rlplat.tools.migrate adds
# them unless the command sets the key): linear decay to 0 without warmup or weight decay, loss_type="dapo"'s
# token-mean, the std epsilon 1e-4, no dual clip, gradient checkpointing on
TRL_DEFAULTS = [
    "actor.optim.lr_schedule=linear", "actor.optim.warmup_steps=0", "actor.optim.min_lr_ratio=0.0",
    "actor.optim.weight_decay=0.0", "algorithm.loss_agg_mode=token-mean", "algorithm.norm_adv_epsilon=1e-4",
    "algorithm.clip_ratio_c=1e9", "model.gradient_checkpointing=true",
]
