#!/usr/bin/env bash
# GRPO with an LLM judge as the reward (reward.judge.*; docs/rewards.md "LLM judges").
# The judge reads a prompt made from JUDGE_TEMPLATE ({question}, {response}, {reference}) and its answer
# is parsed as a score in [JUDGE_MIN, JUDGE_MAX] (scaled to [0, 1]) or, with JUDGE_VERDICT=yes_no, as
# yes / no. An answer that does not parse scores 0 and is counted (reward_calls/judge_errors).
# Served either by a model on judge workers (JUDGE_PATH, a local causal LM, with JUDGE_ENGINE=hf | vllm) or
# by an OpenAI-compatible server (JUDGE_URL=http://host:8000/v1 JUDGE_MODEL=name; the API key is read
# from the environment variable named by JUDGE_KEY_ENV, default OPENAI_API_KEY, and never logged).
# The defaults only try the plumbing on CPU: the embedded arithmetic model "judges" by adding 0 to the
# response ('{response}+0='), so its scores mean nothing; set JUDGE_PATH or JUDGE_URL and JUDGE_TEMPLATE
# (e.g. the default template, by leaving JUDGE_TEMPLATE=default) for a real judge.
# Knobs: examples/common.sh, plus the JUDGE_* above, JUDGE_PLACEMENT (separate | colocated), JUDGE_TOKENS.
set -euo pipefail
ALGO=grpo
EXPERIMENT=${EXPERIMENT:-grpo_judge}
STEPS=${STEPS:-20}
TRAIN_BATCH_PROMPTS=${TRAIN_BATCH_PROMPTS:-16}
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
judge=()
if [ -n "${JUDGE_URL:-}" ]; then
    judge+=("reward.judge.url=$JUDGE_URL" "reward.judge.model=${JUDGE_MODEL:?JUDGE_URL needs JUDGE_MODEL}"
            "reward.judge.api_key_env=${JUDGE_KEY_ENV:-OPENAI_API_KEY}")
else
    judge+=("reward.judge.model_path=${JUDGE_PATH:-embedded}" "reward.judge.engine=${JUDGE_ENGINE:-hf}"
            "reward.judge.placement=${JUDGE_PLACEMENT:-separate}")
fi
JUDGE_TEMPLATE=${JUDGE_TEMPLATE:-$([ -z "${JUDGE_PATH:-}${JUDGE_URL:-}" ] && echo '{response}+0=' || echo default)}
if [ "$JUDGE_TEMPLATE" != default ]; then judge+=("reward.judge.prompt_template='$JUDGE_TEMPLATE'"); fi
JUDGE_MAX=${JUDGE_MAX:-$([ -z "${JUDGE_PATH:-}${JUDGE_URL:-}" ] && echo 200 || echo 10)}
run_rlplat "${judge[@]}" reward.judge.verdict="${JUDGE_VERDICT:-score}" reward.judge.score_min="${JUDGE_MIN:-0}" \
    reward.judge.score_max="$JUDGE_MAX" reward.judge.max_new_tokens="${JUDGE_TOKENS:-256}" "$@"
