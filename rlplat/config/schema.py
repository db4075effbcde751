"""The configuration schema: the single source of truth for every key, its type and its default.

YAML files under ``rlplat/config/`` only select and override values; a key that is not a field here
does not exist. Each field's meaning is the comment next to it (the README's config reference is
generated from this file and :mod:`rlplat.config.engine_sections`, the engines' own sections:
``python -m rlplat.config.reference``).

The defaults run the embedded quickstart (a tiny model on CPU); for a real model set at least
``model.path``, ``data.*_files``, ``data.max_response_length`` and ``actor.optim.lr``.

Batch sizes say what they count: ``*_prompts`` count prompts (each expands to ``rollout.n``
sequences), ``*_seqs`` count sequences (prompt + one response); ``global`` sizes are summed over all
workers, ``*_per_worker`` sizes are what one worker holds at a time.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, Optional, get_type_hints

from hydra.core.config_store import ConfigStore

from rlplat.algorithms.policy_losses import PolicyLossOptions
from rlplat.config.engine_sections import (FSDPConfig, HFRolloutConfig, MegatronConfig, MoEConfig, RolloutServerConfig,
                                           SGLangRolloutConfig, VLLMRolloutConfig, colocated_megatron, count)


def count_keys(cls: type | None = None, prefix: str = "") -> list[str]:
    """The dotted keys of every :func:`count` field, found by walking the schema."""
    cls = cls or RLPlatConfig
    hints, keys = get_type_hints(cls), []
    for f in fields(cls):
        if is_dataclass(hints[f.name]):
            keys += count_keys(hints[f.name], f"{prefix}{f.name}.")
        elif f.metadata.get("count"):
            keys.append(f"{prefix}{f.name}")
    return keys


@dataclass
class LoRAConfig:
    rank: int = 0  # LoRA adapters of this rank on the actor's linear layers (0 = off: every weight is trained; docs/lora.md)
    alpha: float = 16.0  # the adapters' output is scaled by alpha / rank
    dropout: float = 0.0  # must stay 0: rlplat trains without dropout (the update's log-probs are the rollout's)
    target_modules: list[str] = field(default_factory=list)  # layer names to adapt, e.g. [q_proj, v_proj]; [] = every linear layer of the decoder


@dataclass
class ModelConfig:
    path: str = "embedded"  # HF hub id or local directory; "embedded" = rlplat's locally built tiny model
    tokenizer_path: Optional[str] = None  # defaults to model.path
    # a chat template in place of the tokenizer's own (prompts, agent turns, the export): chatml | tulu | zephyr,
    # a file holding a Jinja template, or the template itself; None = the tokenizer's (rlplat.models.chat_template)
    chat_template: Optional[str] = None
    trust_remote_code: bool = False  # allow model code from the hub/model directory
    gradient_checkpointing: bool = False  # recompute activations in backward (saves memory)
    attn_implementation: str = "sdpa"  # passed to from_pretrained (eager | sdpa | flash_attention_2)
    lora: LoRAConfig = field(default_factory=LoRAConfig)


@dataclass
class DataConfig:
    # One path or a list: parquet files, or builtin:<task> for a generated built-in task; a mixture gives each a
    # number: [{path: a.parquet, weight: 0.7}, ...] or open-instruct's [a.parquet, "1.0", b.parquet, "0.3"]
    # (rlplat.data.mixture)
    train_files: Any = field(default_factory=lambda: ["builtin:arithmetic"])
    val_files: Any = field(default_factory=lambda: ["builtin:arithmetic"])  # validation prompts, same forms
    train_batch_size_prompts: int = count(64)  # prompts per training step, global (sequences = this x rollout.n)
    val_batch_size_prompts: int = count(256)  # prompts per validation generation call, global
    max_prompt_length: int = count(512)  # tokens, after the chat template (verl's default too)
    max_response_length: int = count(8)  # tokens generated per response (the one source for max_new_tokens)
    truncation: str = "error"  # over-long prompt: error | left | right | filter
    apply_chat_template: bool = True  # format prompts with the tokenizer's chat template
    shuffle: bool = True  # reshuffle the prompts every epoch
    seed: int = 1  # data order seed (trainer.seed seeds everything else)
    # Curriculum / dynamic prompts: "pkg.module:function" or "path/to/file.py:function", called after each
    # step with that step's samples; the dataset indices or rows it returns are the next prompts served
    # (before the dataset's own order continues). See docs/options.md.
    dynamic_prompts_fn: Optional[str] = None
    # images (vision-language models; docs/vision.md): the image processor resizes each image to at least
    # image_min_pixels pixels and at most image_max_pixels (None = the model's preprocessor_config.json)
    image_min_pixels: Optional[int] = None
    image_max_pixels: Optional[int] = None  # with truncation=error a larger image is an error, else it is shrunk


@dataclass
class OptimConfig:
    lr: float = 3e-4  # peak learning rate (AdamW); the embedded tiny model's value: ~1e-6 for LLMs
    weight_decay: float = 0.01  # AdamW decoupled weight decay
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])  # AdamW (beta1, beta2)
    eps: float = 1e-8  # AdamW epsilon
    lr_schedule: str = "cosine"  # constant | linear | cosine (after warmup, down to min_lr_ratio at the last step)
    warmup_steps: int = 5  # optimizer steps of linear warmup from 0
    min_lr_ratio: float = 0.1  # floor of linear/cosine decay, as a fraction of lr
    grad_clip: float = 1.0  # max global grad norm; <= 0 disables clipping


@dataclass
class VisionConfig:
    # keep the vision tower (encoder and merger) of a vision-language model as loaded: not optimised, not sent by
    # the weight sync (most VLM RL recipes do; docs/vision.md)
    freeze: bool = True


@dataclass
class ActorConfig:
    strategy: str = "fsdp"  # training engine (registry): fsdp | megatron; each reads its own section (actor.fsdp, ...)
    optim: OptimConfig = field(default_factory=OptimConfig)
    # prompts per optimizer step, global (data.train_batch_size_prompts / this = updates per epoch);
    # None = the largest divisor of data.train_batch_size_prompts that is <= 16
    mini_batch_size_prompts: Optional[int] = count(None)
    # sequences per forward/backward on one worker (gradient accumulation); None = the largest divisor of
    # the per-worker mini-batch (mini_batch_size_prompts x rollout.n / workers) that is <= 128
    micro_batch_size_seqs_per_worker: Optional[int] = count(None)
    log_prob_micro_batch_size_seqs_per_worker: int = count(128)  # sequences per log-prob forward on one worker
    # Token budget (real prompt + response tokens) of a micro-batch on one worker, for the update and the
    # log-prob passes: set, micro-batches hold about this many tokens instead of a number of sequences
    # (every replica runs as many as the fullest needs); None = count sequences (the two keys above)
    micro_batch_max_tokens_per_worker: Optional[int] = None
    ppo_epochs: int = count(1)  # passes over each step's batch
    shuffle: bool = True  # shuffle sequences before splitting them into mini-batches (the critic's update too)
    entropy_coeff: float = 0.0  # entropy bonus in the actor loss
    moe: MoEConfig = field(default_factory=MoEConfig)  # mixture-of-experts models (read when model.path is one)
    vision: VisionConfig = field(default_factory=VisionConfig)  # vision-language models (read when model.path is one)
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)
    megatron: MegatronConfig = field(default_factory=MegatronConfig)


@dataclass
class AgentConfig:
    # agent loop (registry): single_turn = one response per prompt | tool = multi-turn, tools and environments |
    # client = a harness's conversations through an OpenAI client
    name: str = "single_turn"
    # tool loop: the environment each trajectory talks to, as path/to/file.py:ClassName or pkg.module:ClassName,
    # or a library's: verifiers:<env id, module or file.py> (docs/environments.md); None = the tools
    environment: Optional[str] = None
    environment_args: dict[str, Any] = field(default_factory=dict)  # keyword arguments the environment is made with
    # client loop: the async function (client, row) -> reward terms that holds a row's conversation through an
    # OpenAI client on rlplat's endpoint, as path/to/file.py:function or pkg.module:function (docs/environments.md)
    harness: Optional[str] = None
    tools: list[str] = field(default_factory=list)  # tools of rows without extra_info.tools: built-in names, file.py:function or pkg.module:function
    parser: str = "hermes"  # tool-call format in the model's output (registry): hermes | llama3_json
    max_turns: int = count(4)  # assistant turns per trajectory (each at most data.max_response_length tokens)
    max_tool_calls: int = count(8)  # tool calls per trajectory; past it the model is told so and the trajectory ends
    # tokens after the prompt, sampled and observation tokens together (the response width the trainer sees);
    # None = max_turns x data.max_response_length
    max_total_tokens: Optional[int] = None


@dataclass
class RolloutConfig:
    name: str = "hf"  # rollout engine (registry): hf | vllm | sglang; settings in rollout.<name>.*
    # colocated = an engine inside each training worker | separate = rollout workers on a pool of their own
    # (rollout.nnodes x rollout.workers_per_node; docs/async.md) | server = rollout.server.url (vllm)
    mode: str = "colocated"
    nnodes: int = count(1)  # rollout.mode=separate: Ray nodes of the rollout pool
    workers_per_node: int = count(1)  # rollout.mode=separate: rollout workers (one device each) on each of them
    # rollout.mode=separate: after a weight sync, compare a checksum of every tensor the rollout engine holds with
    # the actor's (a mismatch stops the run naming the tensor), and its log-probs of a fixed sequence with the
    # actor's: every | first (the first sync only) | off
    verify_weights: str = "every"
    # the probe's largest allowed |difference| of one token's log-prob; None = 1e-5 where the rollout's log-probs
    # are the actor's own (HF engine, float32), else 0.5 (other kernels or 16 bits: catches misplaced weights)
    verify_log_prob_tol: Optional[float] = None
    # rollout.mode=separate: how the weights travel from the actor to the rollout workers: distributed = a
    # torch.distributed group of the actor's rank 0 and the rollout workers (gloo on CPU, NCCL on GPU) |
    # object_store = through Ray's object store and the controller
    weight_transport: str = "distributed"
    # rollout.mode=separate: prompt groups per generation call: 0 = each step's batch is one call, split over the
    # rollout workers | N = calls of N groups, each on one rollout worker; a step takes the first
    # data.train_batch_size_prompts groups scored, in any order, at most trainer.async_steps updates old (docs/async.md)
    stream_groups: int = 0
    # rollout.mode=separate: a weight update that reaches a rollout worker while it generates: finish = waits for
    # the calls submitted before it | resume = is loaded between two tokens of the call under way, which goes on
    # under the new weights (single-turn; hf and vllm engines; docs/async.md)
    partial: str = "finish"
    # rollout.mode=separate: dead rollout workers replaced in a run (each loads the actor's current weights, checked,
    # and its calls in flight are generated again; with weight_transport=distributed the whole pool is replaced);
    # one more death stops the run naming the checkpoint to resume from (docs/reliability.md)
    max_restarts: int = 3
    # rollout.mode=separate: seconds a replacement of a dead rollout worker may take to start before the run stops with
    # one line naming the checkpoint (it starts where its pool was placed: a pool is tied to its nodes, so after its
    # node left the cluster it cannot, and the run resumes on the cluster as it is)
    node_wait_s: float = 300.0
    # rollout.mode=separate: when a dead rollout worker's replacement found no room within node_wait_s: stop = the run
    # stops with one line naming the checkpoint to resume from | continue = the pool goes on with the workers it
    # still has, which generate the lost worker's calls again (needs rollout.weight_transport=object_store; with no
    # worker left the run stops all the same)
    node_lost: str = "stop"
    # rollout.mode=separate: a rollout worker that answers no heartbeat (asked every heartbeat_s, answered beside its
    # calls) within heartbeat_s is killed as hung and replaced like a dead one (rollout.max_restarts); 0 = no heartbeat
    heartbeat_s: float = 120.0
    n: int = count(8)  # responses per prompt (group size)
    temperature: float = 1.0  # sampling temperature for training rollouts (log-probs use the same)
    top_p: float = 1.0  # nucleus sampling (1 = off)
    top_k: int = -1  # -1 = no top-k
    stop_token_ids: list[int] = field(default_factory=list)  # ids that end a response besides the tokenizer's EOS (e.g. <|im_end|>)
    # Training rollouts keep going after EOS (sampled as an ordinary token), so every response runs to
    # data.max_response_length unless a stop_token_ids token ends it: fixed-length benchmarks (vLLM's ignore_eos)
    ignore_eos: bool = False
    val_n: int = count(1)  # responses per validation prompt; > 1 with val_temperature > 0: mean@N, best@N, maj@N, pass@k
    val_temperature: float = 0.0  # 0 = greedy (verl's validation default); e.g. 1.0 with val_n=4 = sampled mean@4
    dtype: str = "auto"  # generation dtype (weights are sent in it): auto = float32 on CPU, bfloat16 on GPU | float32 | bfloat16 | float16
    weight_sync_bucket_mb: int = count(512)  # actor -> rollout weight transfer: one gather and one load per bucket of this size
    # LoRA (model.lora.rank > 0): what the rollout engine receives after an update: merged = the merged weights
    # (W + s B A) | adapter = the adapters alone, which the engine applies itself (hf, vllm)
    lora_sync: str = "merged"
    hf: HFRolloutConfig = field(default_factory=HFRolloutConfig)
    vllm: VLLMRolloutConfig = field(default_factory=VLLMRolloutConfig)
    sglang: SGLangRolloutConfig = field(default_factory=SGLangRolloutConfig)
    server: RolloutServerConfig = field(default_factory=RolloutServerConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)


@dataclass
class KLControlConfig:
    type: str = "fixed"  # fixed | adaptive (Ziegler et al. 1909.08593)
    coef: float = 0.001  # beta of KL in the reward
    target: float = 0.1  # adaptive: target KL
    horizon: float = 10000  # adaptive: horizon in samples


@dataclass
class DynamicSamplingConfig:
    enable: bool = False  # DAPO: drop groups whose scores are all equal and sample more prompts
    max_gen_batches: int = 10  # give up filling the batch after this many generation rounds


@dataclass
class OverlongBufferConfig:
    enable: bool = False  # DAPO soft overlong punishment
    length: int = 4  # tokens before data.max_response_length where the penalty starts
    penalty_factor: float = 1.0  # penalty reaches -penalty_factor at the maximum length


@dataclass
class PFPPOConfig:
    enable: bool = False  # PF-PPO (2409.06957): resample each step's batch by reward after the advantages
    reweight_method: str = "pow"  # pow (|score|^weight_pow) | max_min (batch best and worst) | max_random
    weight_pow: float = 2.0  # exponent of the pow method


@dataclass
class OffPolicyConfig:
    # weights on each token's policy loss from rho = pi_old / pi_rollout (registry): none | tis = min(rho, cap) |
    # mis = rho if low <= rho <= high else 0 | icepop = token-level mis (docs/algorithms.md "Off-policy corrections")
    correction: str = "none"
    level: str = "token"  # rho per token | sequence = exp(sum of log rho) | geometric = exp(mean of log rho), per response
    cap: float = 2.0  # tis: the largest weight
    low: float = 0.5  # mis, icepop: rho under it is masked
    high: float = 5.0  # mis, icepop: rho over it is masked


@dataclass
class DistillConfig:
    # on-policy distillation (docs/distillation.md): coef x -(log pi_student - log pi_teacher) is added to each
    # sampled token's advantage (teacher.model_path scores them); 0 = off; algorithm=opd sets 1 and no task advantage
    coef: float = 0.0


@dataclass
class AlgorithmConfig:
    preset: Optional[str] = None  # the algorithm=<preset> applied (each preset file names itself); None = none
    adv_estimator: str = "grpo"  # advantage estimator (registry)
    gamma: float = 1.0  # discount (gae, reinforce_pp, remax)
    lam: float = 1.0  # GAE lambda
    norm_adv_scale: str = "group"  # grpo std scaling: group | batch | none
    norm_adv_epsilon: float = 1e-6  # epsilon added to the std in grpo-style normalisation
    gpg_f_norm: float = 1.0  # gpg: F_norm, the advantages are divided by it (2504.02546, eq. 9)
    # optimal token baselines: baseline 0 past the second-longest response of a group whose longest response
    # is unique, where no other response is compared (verl's handle_zero_tail)
    otb_zero_tail: bool = True
    policy_loss: str = "ppo"  # policy loss (registry)
    loss_agg_mode: str = "token-mean"  # loss aggregation mode (registry)
    loss_scale_factor: Optional[float] = None  # seq-mean-token-sum-norm constant C; None = the response length (data.max_response_length, or rollout.agent.max_total_tokens)
    clip_ratio_low: float = 0.2  # epsilon_low (dppo_*: the divergence threshold for A <= 0)
    clip_ratio_high: float = 0.2  # epsilon_high (DAPO clip-higher: 0.28; dppo_*: the threshold for A > 0)
    clip_ratio_c: float = 3.0  # dual-clip constant (> 1); dppo_*: cap of the truncated importance weight
    # alias of off_policy.correction=tis, level=token, cap=tis_cap (truncated importance sampling); None = off
    tis_cap: Optional[float] = None
    off_policy: OffPolicyConfig = field(default_factory=OffPolicyConfig)
    # pi_old of the PPO ratio when the update is off-policy (several mini-batches or epochs): recompute = the
    # actor's log-prob pass before the update | rollout = the rollout engine's log-probs (no pass) | auto =
    # rollout where the engine samples with the actor's weights in float32 (hf, no mixed precision), else recompute
    old_log_probs: str = "auto"
    policy_loss_options: PolicyLossOptions = field(default_factory=PolicyLossOptions)
    use_kl_in_reward: bool = False  # r_t - beta * KL_t with algorithm.kl_ctrl
    kl_penalty: str = "k1"  # KL estimator used in the reward (registry)
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)
    use_kl_loss: bool = False  # beta * aggregate(KL) in the actor loss (GRPO style)
    kl_loss_coef: float = 0.001  # beta of the KL loss
    kl_loss_type: str = "k3"  # KL estimator used in the loss (registry; "+" = straight-through)
    dynamic_sampling: DynamicSamplingConfig = field(default_factory=DynamicSamplingConfig)
    # leave out the groups whose responses all scored the same (no policy gradient under a group baseline)
    # before the passes after the reward, without resampling: the batch shrinks (to whole mini-batches of
    # every replica; metrics batch/dropped_groups, batch/kept_groups); group estimators only
    drop_zero_gradient_groups: bool = False
    overlong_buffer: OverlongBufferConfig = field(default_factory=OverlongBufferConfig)
    pf_ppo: PFPPOConfig = field(default_factory=PFPPOConfig)
    # Responses that hit data.max_response_length without a stop token: keep | mask (no loss on them,
    # TRL/open-instruct mask_truncated_completions) | penalize (their score becomes truncated_penalty,
    # open-instruct non_stop_penalty)
    truncated_responses: str = "keep"
    truncated_penalty: float = -1.0  # the score of a truncated response with truncated_responses=penalize
    distill: DistillConfig = field(default_factory=DistillConfig)


@dataclass
class RefConfig:
    enable: Optional[bool] = None  # None = whenever a KL term is used
    strategy: str = "${actor.strategy}"  # training engine (registry) holding the frozen reference policy
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)  # the reference's engine section when strategy=fsdp
    # ... when strategy=megatron; a colocated reference shares the actor's parallel layout
    megatron: MegatronConfig = field(default_factory=lambda: colocated_megatron(
        params_dtype="${actor.megatron.params_dtype}"))  # the same weights as the actor's at the start
    placement: str = "colocated"  # colocated (in the actor's workers) | separate (own worker pool)
    workers_per_node: int = count(1)  # only for placement=separate
    log_prob_micro_batch_size_seqs_per_worker: int = count(128)  # sequences per reference forward on one worker
    log_prob_micro_batch_max_tokens_per_worker: Optional[int] = None  # token budget instead (as the actor's key)
    # 0 = a fixed reference (the initial model). N > 0: every N steps, reference <- alpha * actor +
    # (1 - alpha) * reference (alpha = 1 copies the actor; < 1 is Polyak mixing, TRL's sync_ref_model)
    sync_steps: int = 0
    sync_alpha: float = 1.0  # alpha of the sync: 1 = copy the actor, < 1 = Polyak mixing (TRL ref_model_mixup_alpha)


@dataclass
class TeacherConfig:
    # the teacher of on-policy distillation (algorithm=opd, algorithm.distill.coef): any causal LM the engines load
    # (a directory, a hub id or an embedded model's name), with the student's tokenizer; None = no teacher
    model_path: Optional[str] = None
    strategy: str = "${actor.strategy}"  # training engine (registry) holding the frozen teacher
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)  # the teacher's engine section when strategy=fsdp
    # ... when strategy=megatron; a colocated teacher shares the actor's parallel layout
    megatron: MegatronConfig = field(default_factory=colocated_megatron)
    placement: str = "colocated"  # colocated (in the actor's workers) | separate (own worker pool)
    workers_per_node: int = count(1)  # only for placement=separate
    log_prob_micro_batch_size_seqs_per_worker: int = count(128)  # sequences per teacher forward on one worker
    log_prob_micro_batch_max_tokens_per_worker: Optional[int] = None  # token budget instead (as the actor's key)


@dataclass
class CriticConfig:
    model_path: Optional[str] = None  # defaults to model.path (a value head is added)
    strategy: str = "${actor.strategy}"  # training engine (registry) of the value model
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)  # the critic's engine section when strategy=fsdp
    megatron: MegatronConfig = field(default_factory=MegatronConfig)  # ... when strategy=megatron
    # 1e-4 for the embedded model: a fresh value head reaches the mean-return predictor within ~10 steps
    # (explained variance -0.46 -> +0.02 over 30 steps); at 1e-5 it was still at -0.3 (docs/algorithms.md)
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-4))
    micro_batch_size_seqs_per_worker: Optional[int] = count(None)  # sequences per forward/backward on one worker; None = the actor's value
    micro_batch_max_tokens_per_worker: Optional[int] = None  # token budget instead (update and values; as the actor's key)
    cliprange_value: float = 0.5  # epsilon_v of the clipped value loss
    ppo_epochs: int = count(1)  # passes over each step's batch


@dataclass
class CustomRewardConfig:
    path: Optional[str] = None  # python file defining the function
    name: str = "compute_score"  # function name in that file


@dataclass
class CodeRewardConfig:
    """The ``code`` reward's sandbox (docs/rewards.md "Code execution"): limits per test run."""

    timeout_s: float = 5.0  # wall-clock seconds per test; after a test times out the rest count as failed
    memory_mb: int = 512  # address space of the program (a larger allocation raises MemoryError)
    max_output_bytes: int = 65536  # stdout + stderr per test; past it the program is stopped
    scoring: str = "fraction"  # fraction = share of tests passed | all = 1 only when every test passes


@dataclass
class RewardModelConfig:
    """A learned reward model (docs/rewards.md "Reward models"): the reward function ``reward_model``."""

    path: Optional[str] = None  # a Hugging Face sequence-classification model (num_labels=1); None = none
    placement: str = "colocated"  # colocated = on the actor's devices | separate = a pool of its own
    workers_per_node: int = count(1)  # reward-model workers on one node (placement=separate)
    micro_batch_size: int = count(8)  # sequences per forward
    max_length: int = count(2048)  # tokens of prompt + response it reads (longer: the prompt's start is cut)
    apply_chat_template: bool = True  # render (prompt, response) with the reward model's own chat template
    normalize: str = "none"  # none = its raw logit | batch = standardised over the batch (mean 0, std 1)


JUDGE_TEMPLATE = (
    "You are grading a response to a question against a reference answer.\n\n"
    "Question:\n{question}\n\nResponse:\n{response}\n\nReference answer:\n{reference}\n\n"
    "Rate the response from 0 (wrong) to 10 (fully correct). End with a line \"Score: N\"."
)


@dataclass
class JudgeConfig:
    """An LLM judge (docs/rewards.md "LLM judges"): the reward function ``judge``."""

    model_path: Optional[str] = None  # a causal LM served by a rollout engine on judge workers; or:
    url: Optional[str] = None  # an OpenAI-compatible server's base URL (http://host:8000/v1)
    model: Optional[str] = None  # the model name sent to the server (url)
    api_key_env: str = "OPENAI_API_KEY"  # environment variable holding the server's API key (never the key itself)
    engine: str = "hf"  # rollout engine serving model_path (hf | vllm), with the settings of rollout.<engine>
    placement: str = "separate"  # separate = a pool of its own | colocated = on the actor's devices
    workers_per_node: int = count(1)  # judge workers on one node (placement=separate)
    # filled per sample with {question} (the prompt's last user message), {response} and {reference}
    prompt_template: str = JUDGE_TEMPLATE
    verdict: str = "score"  # score = a number in [score_min, score_max], scaled to [0, 1] | yes_no = 1 / 0
    score_min: float = 0.0  # the lowest score the verdict may give (scaled to 0)
    score_max: float = 10.0  # the highest (scaled to 1)
    max_prompt_length: int = count(4096)  # tokens of a judge prompt (longer: its start is cut)
    max_new_tokens: int = count(256)  # tokens of a judge answer
    temperature: float = 0.0  # 0 = greedy
    timeout_s: float = 60.0  # per server request (url); a request past it is a failed call
    concurrency: int = count(8)  # server requests in flight (url)


@dataclass
class RewardConfig:
    custom_fn: CustomRewardConfig = field(default_factory=CustomRewardConfig)
    functions: list[str] = field(default_factory=lambda: ["auto"])  # reward functions (registry); auto = by data_source
    weights: list[float] = field(default_factory=lambda: [1.0])  # one weight per function
    isolation: str = "process"  # process = run reward code in a worker process (timeout, crash-safe) | inprocess
    timeout_s: float = 30.0  # per reward call (isolation=process): a call still running then scores 0, counted
    # reward worker processes (isolation=process): a batch's calls run concurrently, one per process at a
    # time, each with its own timeout_s; None = one per CPU core, up to 8
    num_workers: Optional[int] = None
    fail_fraction_to_stop: float = 1.0  # stop when this share of a step's reward calls fail (1 = all; > 1 = never)
    # Entries of reward.functions whose term counts only when the other functions judge the answer correct
    # (e.g. [format]: a format reward that a wrong answer does not earn); [] = every term is added
    only_when_correct: list[str] = field(default_factory=list)
    code: CodeRewardConfig = field(default_factory=CodeRewardConfig)  # the code reward's sandbox limits
    model: RewardModelConfig = field(default_factory=RewardModelConfig)  # a learned reward model
    judge: JudgeConfig = field(default_factory=JudgeConfig)  # an LLM judge


@dataclass
class TrainerConfig:
    total_steps: int = count(450)  # training steps (one batch of data.train_batch_size_prompts prompts each)
    output_dir: str = "outputs/${trainer.experiment_name}"  # metrics, checkpoints, summary, hf_export
    project_name: str = "rlplat"  # for loggers that group runs (wandb)
    experiment_name: str = "run"  # run name (and the default output directory)
    test_freq: int = 50  # validate every N steps (and before training); <= 0 = only before and after
    save_freq: int = 0  # checkpoint every N steps; <= 0 = only at the end
    resume_mode: str = "auto"  # auto | disable | <checkpoint path>
    resume_allow_config_change: bool = False  # resume although algorithm/model/data/batch/schedule keys changed
    max_checkpoints: int = 3  # keep the newest N checkpoints; <= 0 = keep all
    nonfinite: str = "stop"  # a NaN/inf loss or grad norm: stop (one line, last checkpoint kept) | skip (warn, go on)
    max_skipped_steps: int = 3  # nonfinite=skip stops after this many skipped steps in a row; <= 0 = never
    save_on_signal: bool = True  # on SIGINT/SIGTERM, save a checkpoint after the current step before exiting
    # also write hf_export/ at every checkpoint; by default it is written once, at the end of the run (any
    # checkpoint becomes a model with python -m rlplat.tools.export)
    export_every_save: bool = False
    nnodes: int = count(1)  # Ray nodes to place workers on
    workers_per_node: int = count(1)  # actor/rollout/ref workers (one per device) on each node
    device: str = "auto"  # auto | cpu | cuda
    # console | tensorboard | wandb | mlflow (extras); metrics.jsonl is written whatever this says (jsonl is accepted)
    logger: list[str] = field(default_factory=lambda: ["console", "jsonl"])
    progress: str = "auto"  # live progress: auto (rich bar on a terminal, plain lines otherwise) | rich | plain | off
    verbose: bool = False  # also show third-party output (loading bars, deprecation warnings, Ray start-up lines)
    val_samples: int = count(16)  # prompts per validation whose responses go to val_samples.jsonl (prompt, response, score)
    # responses per training step written to completions.jsonl (prompt, response, score, advantage, reward terms)
    # and shown by the report and the loggers; 0 = none
    log_completions: int = 0
    seed: int = 42  # seeds model init, sampling and mini-batch shuffling
    # reorder each step's rows so the data-parallel replicas get about equal tokens (several workers only)
    balance_batch: bool = True
    ray_address: Optional[str] = None  # None = RAY_ADDRESS or a local cluster; "inprocess" = no Ray (world size 1)
    # check what the run needs and print its plan (data, batch ledger, memory per device; python -m
    # rlplat.tools.plan), then exit without training
    dry_run: bool = False
    # Your modules, imported (in the controller and every worker) before registered names are checked,
    # so their estimators / losses / rewards register without a copied main.py: [my_pkg.estimators]
    imports: list[str] = field(default_factory=list)
    # steps the rollout pool generates ahead of the trainer (rollout.mode=separate): 0 = generate each step's
    # batch with the newest weights, in turn with training | K = batches for steps s+1..s+K are generated while
    # step s trains, with weights at most K updates old (docs/async.md)
    async_steps: int = 0


@dataclass
class RLPlatConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    ref: RefConfig = field(default_factory=RefConfig)
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    # A recipe's own settings, free-form and read only by the recipe: recipe.max_abs=2 (recipes/README.md)
    recipe: dict[str, Any] = field(default_factory=dict)


SCHEMA_NAME = "rlplat_schema"


def register_schema() -> None:
    """Register the schema in Hydra's ConfigStore (the root YAML's defaults list starts with it)."""
    ConfigStore.instance().store(name=SCHEMA_NAME, node=RLPlatConfig)
