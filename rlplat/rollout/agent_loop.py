"""Agent loops: how a rollout turns a batch of prompts into trajectories (registry ``AGENT_LOOPS``, key
``rollout.agent.name``).

``single_turn`` (the default) samples one response per prompt with the engine's :meth:`generate`.
``tool`` runs a conversation per prompt: the engine samples an assistant turn for every trajectory still
going (:meth:`~rlplat.rollout.base.RolloutEngine.generate_ids`, the conversation so far as token ids,
and which of the previous turn's samples each one continues, so that an engine keeping its cache runs only
the new tokens), each trajectory's environment reacts (runs the tool calls, or a user's environment
replies), and the observation messages are rendered by the chat template as a suffix of the conversation
(:mod:`rlplat.agents.trajectory`), until the environment says it is done, ``rollout.agent.max_turns``
turns have run, or the trajectory's token budget (``rollout.agent.max_total_tokens``) is spent.
``client`` lets a harness hold each conversation through an OpenAI client on rlplat's endpoint
(:class:`ClientLoop`, :mod:`rlplat.rollout.openai_server`), the same trajectories recorded as the requests
come.

The batch it returns is the rollout layout of :mod:`rlplat.rollout.base` with ``R`` = the total budget:
``responses`` hold every turn's sampled ids and the observation ids between them, token for token;
``response_mask`` is 1 on the sampled ids only (the loss); ``attention_mask`` is 1 on all of them (the
observations are read, not trained); ``rollout_log_probs`` are the engine's, 0 on observations. Each
row's ``extra_info["agent"]`` has the conversation and its counts for the reward functions and the
metrics, ``truncated`` says which trajectories ended inside a turn, and ``response_text`` is the last
assistant message (what the reward functions score).

A loop of your own: subclass :class:`AgentLoop`, register it (``@AGENT_LOOPS.register("mine")``) in a
module named in ``trainer.imports``, and set ``rollout.agent.name=mine``.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import torch

from rlplat.agents.environment import Environment, Step
from rlplat.agents.setup import Environments, check_environment_config
from rlplat.agents.trajectory import TemplateNotIncremental, Trajectory, retokenize_drift
from rlplat.config.errors import ConfigError
from rlplat.models.moe import NO_ROUTING
from rlplat.protocol import Batch
from rlplat.registry import Registry
from rlplat.rollout.base import RolloutEngine, SamplingParams, assemble_rollout, prompt_token_lists
from rlplat.utils.errors import RunError

ENDINGS = ("done", "max_turns", "budget", "truncated")  # why a trajectory ended (extra_info["agent"]["ended"])


class AgentLoop(ABC):
    """Turns prompts into trajectories with a rollout engine (see the module docstring).

    ``reads_rows``: whether the loop reads the rows' text columns (prompt, extra_info, ...: its environments
    do); a loop that needs the tensors only sets False, and the controller then sends its workers no text.
    ``runs_environments``: whether it runs ``rollout.agent.tools`` / ``rollout.agent.environment`` (a loop that
    does not has them refused at start-up rather than ignored). ``carries_routing``: whether its batch holds a
    mixture of experts' rollout routing (``routed_experts``) when the engine's samples do
    (``actor.moe.router_replay=r3`` is refused with a loop that does not)."""

    reads_rows = True
    runs_environments = True
    carries_routing = True

    def __init__(self, agent_cfg, tokenizer, response_length: int):
        self.cfg, self.tokenizer, self.response_length = agent_cfg, tokenizer, response_length

    @classmethod
    def check_config(cls, agent_cfg) -> None:
        """Start-up checks of the loop's own ``rollout.agent`` keys (a ConfigError line each)."""

    @abstractmethod
    def run(self, engine: RolloutEngine, prompts: Batch, params: SamplingParams) -> Batch:
        """The rollout batch of ``prompts`` (one trajectory per row); ``params.max_new_tokens`` is the
        budget of one assistant turn."""


AGENT_LOOPS: Registry[type[AgentLoop]] = Registry("agent loop")


@AGENT_LOOPS.register("single_turn")
class SingleTurn(AgentLoop):
    """One response per prompt: the engine's batch as it is."""

    reads_rows = runs_environments = False

    def run(self, engine, prompts, params):
        return engine.generate(prompts, params)


def prompt_tools(agent_cfg) -> Callable[[Mapping | None], list[dict] | None] | None:
    """For the dataset: the tool schemas each row's prompt is rendered with (None for a loop that does not read
    the rows, e.g. ``single_turn``)."""
    return Environments(agent_cfg).schemas_of if AGENT_LOOPS.get(agent_cfg.name).reads_rows else None


def check_agent_config(agent_cfg) -> None:
    """Start-up checks of ``rollout.agent.*`` that need the registries (one ConfigError line each)."""
    if agent_cfg.name not in AGENT_LOOPS:
        raise ConfigError(f"rollout.agent.name={agent_cfg.name!r} is not registered; {AGENT_LOOPS.suggestion(agent_cfg.name)}")
    if not AGENT_LOOPS.get(agent_cfg.name).runs_environments and (agent_cfg.tools or agent_cfg.environment):
        key = "rollout.agent.tools" if agent_cfg.tools else "rollout.agent.environment"
        raise ConfigError(f"{key} is set, but the agent loop rollout.agent.name={agent_cfg.name!r} runs no tools or "
                          f"environments (one response per prompt): set rollout.agent.name=tool")
    AGENT_LOOPS.get(agent_cfg.name).check_config(agent_cfg)
    check_environment_config(agent_cfg)


class EnvironmentFailed(RunError):
    """An environment's ``reset`` / ``step`` raised: a bug in the environment, not the model's doing."""


@AGENT_LOOPS.register("tool")
class ToolLoop(AgentLoop):
    """Multi-turn trajectories with tool calls or a user's environment (see the module docstring)."""

    def __init__(self, agent_cfg, tokenizer, response_length: int):
        super().__init__(agent_cfg, tokenizer, response_length)
        self.environments = Environments(agent_cfg)

    def _reset(self, rows: list[dict], prompt_ids: list[list[int]]) -> tuple[list[Environment], list[Trajectory]]:
        """Each row's environment, reset, and its trajectory (the prompt so far)."""
        envs, trajectories = [], []
        for index, (row, ids) in enumerate(zip(rows, prompt_ids)):
            env = self.environments.make(row)
            messages = _call(env, "reset", row, index, env.reset, row)
            if [dict(m) for m in messages] != [dict(m) for m in row["prompt"]]:
                raise EnvironmentFailed(f"environment {type(env).__name__}: reset() of row {index} returned messages "
                                        f"other than the row's prompt; the model reads the dataset's rendering of the "
                                        f"prompt, so reset() must return row['prompt'] (keep other state in the environment)")
            envs.append(env)
            trajectories.append(Trajectory(list(ids), [dict(m) for m in messages]))
        return envs, trajectories

    def run(self, engine, prompts, params):
        rows = _rows(prompts)
        envs, trajectories = self._reset(rows, prompt_token_lists(prompts))
        schemas = [self.environments.schemas_of(row.get("extra_info")) for row in rows]
        ended: dict[int, str] = {}
        rewards: list[dict[str, float]] = [{} for _ in rows]
        infos: list[dict[str, Any]] = [{} for _ in rows]
        active = list(range(len(rows)))
        stops = set(params.stop_ids(self.tokenizer.eos_token_id))
        asked: dict[int, int] = {}  # trajectory -> its index in the last generate_ids call
        routing: list[torch.Tensor | None] = [None] * len(rows)  # a mixture of experts': prompt and response so far
        with ThreadPoolExecutor(max_workers=16) as pool, _conversations(engine):
            for _turn in range(self.cfg.max_turns):
                if not active:
                    break
                room = {i: self.response_length - len(trajectories[i].response_ids) for i in active}
                limit = min(params.max_new_tokens, max(room.values()))
                samples = engine.generate_ids([trajectories[i].prompt_ids + trajectories[i].response_ids
                                               for i in active], replace(params, max_new_tokens=limit),
                                              continues=[asked.get(i) for i in active])
                asked = {i: index for index, i in enumerate(active)}
                reacting = []
                for i, sample in zip(active, samples):
                    ids, log_probs = sample.ids[:room[i]], sample.log_probs[:room[i]]
                    if sample.routing is not None:
                        context = len(trajectories[i].prompt_ids) + len(trajectories[i].response_ids)
                        routing[i] = first_fed(routing[i], sample.routing[:context + len(ids)])
                    text_ids = ids[:-1] if ids and ids[-1] in stops else ids
                    trajectories[i].add_sampled(ids, log_probs, self.tokenizer.decode(text_ids))
                    if sample.stopped and len(ids) == len(sample.ids):
                        reacting.append(i)
                    else:
                        ended[i] = "truncated"  # cut inside the turn: no complete message to react to
                steps = pool.map(lambda i: (i, _call(envs[i], "step", rows[i], i, envs[i].step,
                                                     trajectories[i].messages[-1])), reacting)
                active = []
                for i, step in steps:
                    for name, value in step.rewards.items():
                        rewards[i][name] = rewards[i].get(name, 0.0) + float(value)
                    infos[i].update(step.info)
                    if step.done or not step.observations:
                        ended[i] = "done"
                        continue
                    try:
                        ids = trajectories[i].observation_ids(self.tokenizer, step.observations, schemas[i])
                    except TemplateNotIncremental as err:
                        raise RunError(f"rollout.agent: {err}") from None
                    if len(trajectories[i].response_ids) + len(ids) >= self.response_length:
                        ended[i] = "budget"  # the observation and a next turn do not fit
                        continue
                    trajectories[i].add_observation(self.tokenizer, step.observations, schemas[i], ids=ids)
                    active.append(i)
        for i in active:
            ended[i] = "max_turns"
        self._finish(prompts, rows, envs, trajectories, rewards, infos)
        out = self._assemble(prompts, rows, trajectories, schemas, ended, rewards, infos)
        if all(r is not None for r in routing):
            out = out.union(Batch.from_dict({"routed_experts": routing_layout(prompts, routing, self.response_length)}))
        return out

    def _finish(self, prompts: Batch, rows, envs, trajectories: list[Trajectory], rewards, infos) -> None:
        """Reward terms of environments that score the finished rollouts together (a prompt group at a time)."""
        uids = prompts.non_tensors.get("uid")
        groups = list(uids) if uids is not None else list(range(len(rows)))
        try:
            scored = self.environments.finish(envs, groups, [t.messages for t in trajectories])
        except RunError:
            raise
        except Exception as err:  # noqa: BLE001 - the environment's code: one line that names it
            raise EnvironmentFailed(f"environment {type(envs[0]).__name__}: scoring the finished trajectories "
                                    f"raised {type(err).__name__}: {err}") from err
        for i, (terms, info) in enumerate(scored or []):
            for name, value in terms.items():
                rewards[i][name] = rewards[i].get(name, 0.0) + float(value)
            infos[i].update(info)

    def _assemble(self, prompts: Batch, rows, trajectories: list[Trajectory], schemas, ended, rewards, infos) -> Batch:
        width, pad = self.response_length, self.tokenizer.pad_token_id
        responses = torch.full((len(rows), width), pad, dtype=torch.long)
        trained = torch.zeros(len(rows), width, dtype=torch.long)
        attended = torch.zeros(len(rows), width, dtype=torch.long)
        log_probs = torch.zeros(len(rows), width, dtype=torch.float32)
        extra_info, texts = [], []
        for i, (row, trajectory) in enumerate(zip(rows, trajectories)):
            ids = trajectory.response_ids
            responses[i, :len(ids)] = torch.as_tensor(ids, dtype=torch.long)
            trained[i, :len(ids)] = torch.as_tensor(trajectory.loss_mask, dtype=torch.long)
            attended[i, :len(ids)] = 1
            log_probs[i, :len(ids)] = torch.as_tensor(trajectory.rollout_log_probs, dtype=torch.float32)
            drift = retokenize_drift(self.tokenizer, trajectory, schemas[i], cut=ended[i] == "truncated")
            assistant = [m for m in trajectory.messages if m.get("role") == "assistant"]
            agent = {"messages": trajectory.messages, "turns": len(assistant), "ended": ended[i],
                     "rewards": rewards[i], "observation_tokens": len(ids) - sum(trajectory.loss_mask),
                     "tool_calls": 0, "tool_errors": 0, "tool_timeouts": 0, "tool_seconds": 0.0, **infos[i],
                     "retokenize_mismatch_frac": drift.mismatch_frac, "retokenize_first_difference": drift.first_difference,
                     "retokenize_detail": drift.detail}
            extra_info.append({**(row.get("extra_info") or {}), "agent": agent})
            texts.append(assistant[-1]["content"] if assistant else "")
        out = assemble_rollout(prompts, responses, trained, log_probs, attended)
        if "extra_info" in out.non_tensors:
            out.pop(non_tensor_keys=["extra_info"])  # replaced by the copy with the conversation
        return out.union(Batch.from_dict(
            tensors={"truncated": torch.tensor([ended[i] == "truncated" for i in range(len(rows))])},
            non_tensors={"extra_info": extra_info, "response_text": texts}))


@AGENT_LOOPS.register("client")
class ClientLoop(ToolLoop):
    """Trajectories that a harness drives through an OpenAI client (``rollout.agent.harness``: an async
    function ``harness(client, row) -> dict of reward terms | None``, ``file.py:function`` or
    ``package.module:function``). Each row gets a session of an OpenAI-compatible endpoint over the engine
    (:class:`~rlplat.rollout.openai_server.ChatServer`, with the rollout's sampling settings and each turn's
    budget) and an ``openai.AsyncOpenAI`` client on it; the harness holds one conversation that starts with the
    row's prompt (``row["prompt"]``, with ``row["tools"]``: the schemas the prompt was rendered with), and the
    session's record of it, token for token, is the trajectory. Its reward terms add to the score as an
    environment's do. The harnesses of a batch run concurrently. (The session does not record routing.)"""

    carries_routing = False

    def __init__(self, agent_cfg, tokenizer, response_length: int):
        super().__init__(agent_cfg, tokenizer, response_length)
        self.harness = load_harness(agent_cfg.harness)

    @classmethod
    def check_config(cls, agent_cfg) -> None:
        load_harness(agent_cfg.harness)

    def run(self, engine, prompts, params):
        import openai

        from rlplat.rollout.openai_server import ChatServer

        rows, prompt_ids = _rows(prompts), prompt_token_lists(prompts)
        schemas = [self.environments.schemas_of(row.get("extra_info")) for row in rows]
        server = ChatServer(engine, self.tokenizer, max_tokens=params.max_new_tokens, parser=self.cfg.parser,
                            sampling=params, budget=self.response_length)

        async def one(index: int, row: dict):
            client = openai.AsyncOpenAI(base_url=server.session_url(f"row{index}"), api_key="unused", max_retries=0)
            try:
                return await self.harness(client, {**row, "tools": schemas[index]})
            except Exception as err:  # noqa: BLE001 - the harness's code: one line that names it
                raise EnvironmentFailed(f"rollout.agent.harness {self.cfg.harness!r} raised on row {index} "
                                        f"({row.get('data_source')}): {type(err).__name__}: {err}") from err
            finally:
                await client.close()

        async def everything():
            return await asyncio.gather(*(one(i, row) for i, row in enumerate(rows)))

        with server:
            returned = asyncio.run(everything())
        trajectories, ended = [], {}
        for i, ids in enumerate(prompt_ids):
            found = server.trajectories(f"row{i}")
            if len(found) != 1 or found[0].prompt_ids != ids:
                raise EnvironmentFailed(
                    f"rollout.agent.harness {self.cfg.harness!r} on row {i}: {len(found)} conversation(s), "
                    f"{'not starting with the row prompt' if found else 'none'}; a trajectory is one conversation "
                    f"from the row's prompt, each request sending it back with the reply and the new messages")
            trajectories.append(found[0])
            cut = len(found[0].response_ids) > self.response_length or not server.finished(f"row{i}")
            ended[i] = "truncated" if cut else "done"
        rewards = [{name: float(value) for name, value in (terms or {}).items()} for terms in returned]
        return self._assemble(prompts, rows, [t.cut(self.response_length) for t in trajectories], schemas, ended,
                              rewards, [{} for _ in rows])


def first_fed(known: torch.Tensor | None, turn: torch.Tensor) -> torch.Tensor:
    """A trajectory's routing after a turn: ``turn`` (the routing of the conversation the turn fed and of its sampled
    ids) where ``known`` (the earlier turns') has none, so that each token keeps its routing in the forward that first
    fed it, as in one generation: the observation tokens and the previous turn's last sampled id take this turn's."""
    if known is None:
        return turn
    merged = turn.clone()
    merged[:len(known)] = torch.where(known >= 0, known, turn[:len(known)])
    return merged


def routing_layout(prompts: Batch, routing: list[torch.Tensor], response_length: int) -> torch.Tensor:
    """The trajectories' routing (each ``[prompt + response tokens, layers, top_k]``) as the ``routed_experts`` field
    ``[B, P + R, layers, top_k]``: the prompt's part left-padded, the response's right-padded, with -1 (none)."""
    width, lengths = prompts.tensors["prompts"].shape[1], prompts.tensors["prompt_mask"].sum(-1).tolist()
    out = torch.full((len(routing), width + response_length, *routing[0].shape[1:]), NO_ROUTING, dtype=torch.int16)
    for row, (tokens, length) in enumerate(zip(routing, lengths)):
        out[row, width - length:width - length + len(tokens)] = tokens
    return out


def load_harness(spec: str | None):
    """The async harness function ``spec`` names (ConfigError, one line, when it is missing or not async)."""
    from rlplat.agents.tools import load_object

    if not spec:
        raise ConfigError("rollout.agent.name=client needs rollout.agent.harness: an async function "
                          "(client, row) -> reward terms, as path/to/file.py:function or package.module:function")
    try:
        harness = load_object(spec, "harness")
    except ValueError as err:
        raise ConfigError(f"rollout.agent.harness: {err}") from None
    if not inspect.iscoroutinefunction(harness):
        raise ConfigError(f"rollout.agent.harness {spec!r} is not an async function (async def harness(client, row))")
    return harness


@contextlib.contextmanager
def _conversations(engine: RolloutEngine):
    """The loop's turns: the engine may keep each trajectory's cache between them, and drops it after."""
    try:
        yield
    finally:
        engine.end_conversations()


def _rows(prompts: Batch) -> list[dict[str, Any]]:
    """Each row in the dataset schema an environment's ``reset`` reads (prompt, reward_model, ...)."""
    nt = prompts.non_tensors
    size = len(prompts)
    column = lambda key: list(nt[key]) if key in nt else [None] * size  # noqa: E731
    return [{"prompt": list(prompt or []), "data_source": source, "reward_model": {"ground_truth": truth},
             "extra_info": dict(info or {})}
            for prompt, source, truth, info in zip(column("raw_prompt"), column("data_source"),
                                                   column("ground_truth"), column("extra_info"))]


def _call(env: Environment, what: str, row, index: int, fn: Callable, *args) -> Any:
    try:
        result = fn(*args)
    except Exception as err:  # noqa: BLE001 - the user's code: one line that names it
        raise EnvironmentFailed(f"environment {type(env).__name__}.{what}() raised on row {index} "
                                f"({row.get('data_source')}): {type(err).__name__}: {err}") from err
    if what == "step" and not isinstance(result, Step):
        raise EnvironmentFailed(f"environment {type(env).__name__}.step() returned {type(result).__name__}, "
                                f"expected rlplat.agents.Step")
    return result
