"""The OpenAI-compatible endpoint over the rollout engine: concurrent requests from the openai client are
gathered into engine calls and answered with what was sampled, token for token; a harness that calls a
client — verifiers' own rollout loop — gets trajectories identical to rlplat's in-process loop's (greedy),
and the same rubric rewards; bad requests are one clear error."""

import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest

openai = pytest.importorskip("openai", reason="the envs extra: pip install -e '.[envs]'")
vf = pytest.importorskip("verifiers", reason="the envs extra: pip install -e '.[envs]'")

from rlplat.agents.verifiers_env import VerifiersEnvironments  # noqa: E402
from rlplat.data.verifiers import rows as environment_rows  # noqa: E402
from rlplat.models.embedded import embedded_model_dir  # noqa: E402
from rlplat.rollout.agent_loop import ToolLoop  # noqa: E402
from rlplat.rollout.base import SamplingParams  # noqa: E402
from rlplat.rollout.openai_server import ChatServer  # noqa: E402
from rlplat.trainer.sft import ensure_embedded_model  # noqa: E402

from tests.envs.test_verifiers import ENVS, MODELS, SPEC, prompts_of  # noqa: E402
from tests.rollout.test_agent_loop import agent_setup  # noqa: E402


class Counting:
    """The engine, counting its calls and the prompts in each."""

    def __init__(self, engine):
        self.engine, self.calls = engine, []
        self.setup = engine.setup

    def generate_ids(self, prompts, params, continues=None):
        self.calls.append(len(prompts))
        return self.engine.generate_ids(prompts, params, continues)

    def end_conversations(self):
        self.engine.end_conversations()


def test_32_concurrent_requests_are_answered_with_the_recorded_tokens(embedded_cache, tmp_path):
    _, tokenizer, engine = agent_setup(str(embedded_model_dir()), tmp_path)
    counting = Counting(engine)
    questions = [f"{k}+{k % 7}=" for k in range(32)]
    with ChatServer(counting, tokenizer, max_tokens=8, batch_wait_s=0.05) as server:
        def ask(k):
            client = openai.OpenAI(base_url=server.session_url(f"q{k}"), api_key="unused", max_retries=0)
            return client.chat.completions.create(model="rlplat", messages=[{"role": "user", "content": questions[k]}],
                                                  temperature=0.0, logprobs=True)
        with ThreadPoolExecutor(32) as pool:
            answers = list(pool.map(ask, range(32)))
        assert len(counting.calls) < 32 and sum(counting.calls) == 32  # gathered into few engine calls
        for k, answer in enumerate(answers):
            (trajectory,) = server.trajectories(f"q{k}")
            sampled = trajectory.response_ids
            text_ids = sampled[:-1] if sampled[-1] == tokenizer.eos_token_id else sampled
            assert answer.choices[0].message.content == tokenizer.decode(text_ids)
            log_probs = [t.logprob for t in answer.choices[0].logprobs.content]
            assert log_probs == pytest.approx(trajectory.rollout_log_probs)
            assert trajectory.prompt_ids == list(tokenizer.apply_chat_template(
                [{"role": "user", "content": questions[k]}], add_generation_prompt=True, tokenize=True,
                return_dict=True)["input_ids"])
            assert answer.usage.completion_tokens == len(sampled) and trajectory.loss_mask == [1] * len(sampled)
        # greedy: the same answers when asked one at a time
        again = [ask(k) for k in (0, 5, 31)]
        texts = [answers[k].choices[0].message.content for k in (0, 5, 31)]
        assert [a.choices[0].message.content for a in again] == texts


@pytest.mark.parametrize("kind", ["multi", "tool"])
def test_verifiers_own_rollout_loop_through_the_endpoint_gives_the_in_process_trajectories(kind, embedded_cache,
                                                                                          tmp_path):
    model = str(ensure_embedded_model(MODELS[kind]) if MODELS[kind] else embedded_model_dir())
    cfg, tokenizer, engine = agent_setup(model, tmp_path, SPEC, f"rollout.agent.environment_args={{kind: {kind}}}")
    turn = 88 if kind == "tool" else 8
    rows = environment_rows(ENVS, {"kind": kind, "count": 8})
    # rlplat's in-process loop, greedy
    loop = ToolLoop(cfg.rollout.agent, tokenizer, response_length=128 if kind == "tool" else 24)
    out = loop.run(engine, prompts_of(tokenizer, rows, 1, loop.environments.schemas_of(None)),
                   SamplingParams(max_new_tokens=turn, temperature=0.0))
    # verifiers' own rollout loop against the endpoint, greedy: one session per row
    env = VerifiersEnvironments(ENVS, {"kind": kind, "count": 8}, cfg.rollout.agent).env
    with ChatServer(engine, tokenizer, max_tokens=turn) as server:
        async def rollouts():
            states = []
            for k, row in enumerate(env.get_dataset()):
                client = vf.OpenAIChatCompletionsClient(openai.AsyncOpenAI(base_url=server.session_url(f"r{k}"),
                                                                           api_key="unused"))
                states.append(await env.rollout(row, client, "rlplat", {"temperature": 0.0, "max_tokens": turn}))
            for state in states:
                await env.rubric.score_group([state])
            return states
        states = asyncio.run(rollouts())
        multi_turn = 0
        for k, state in enumerate(states):
            (trajectory,) = server.trajectories(f"r{k}")
            width = len(trajectory.response_ids)
            t = out.tensors
            assert trajectory.prompt_ids == [i for i, m in zip(out.tensors["prompts"][k].tolist(),
                                                                out.tensors["prompt_mask"][k].tolist()) if m]
            assert t["responses"][k, :width].tolist() == trajectory.response_ids
            assert t["response_mask"][k, :width].tolist() == trajectory.loss_mask
            assert int(t["attention_mask"][k, -t["responses"].shape[1]:].sum()) == width
            agent = out.non_tensors["extra_info"][k]["agent"]
            assert state["reward"] == pytest.approx(agent["verifiers_reward"])  # the rubric, both ways
            multi_turn += len(trajectory.segments) > 1
        assert multi_turn > 0  # observations between sampled turns, on both paths


def test_bad_requests_are_one_clear_error(embedded_cache, tmp_path):
    _, tokenizer, engine = agent_setup(str(embedded_model_dir()), tmp_path)
    with ChatServer(engine, tokenizer, max_tokens=8) as server:
        client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)
        for extra, message in (({"n": 2}, "n must be 1"), ({"stop": ["\n"]}, "stop is not supported"),
                               ({"max_tokens": 0}, "max_tokens must be a positive integer")):
            with pytest.raises(openai.BadRequestError, match=message):
                client.chat.completions.create(model="rlplat", messages=[{"role": "user", "content": "1+1="}], **extra)
        with pytest.raises(openai.BadRequestError, match="messages must be a non-empty list"):
            client.chat.completions.create(model="rlplat", messages=[])
        assert [m.id for m in client.models.list()] == ["rlplat"]
        assert server.url.startswith("http://127.0.0.1:")  # loopback unless told
