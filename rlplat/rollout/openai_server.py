"""An OpenAI-compatible chat endpoint over a rollout engine that keeps every conversation token-exact.

For environments and harnesses that only talk to a client (verifiers' own rollout loop, OpenEnv agents,
any agent framework): point their OpenAI client at :attr:`ChatServer.url` and rlplat's engine answers,
while the server records what was really sampled::

    server = ChatServer(engine, tokenizer, max_tokens=256).start()      # binds 127.0.0.1 unless told
    client = openai.OpenAI(base_url=server.session_url("traj-0"), api_key="unused")
    client.chat.completions.create(model="rlplat", messages=[...], temperature=0)
    trajectory = server.trajectories("traj-0")[0]   # prompt ids, sampled ids + log-probs, observation ids

``POST {session_url}/chat/completions`` (or ``/v1/chat/completions``: the session ``default``) takes the
usual body — ``messages``, ``tools``, ``max_tokens`` / ``max_completion_tokens``, ``temperature``, ``top_p``,
``seed``, ``stop`` is refused (stop ids are the engine's), ``n`` must be 1 — and answers a
``chat.completion`` whose message holds the decoded text and the tool calls the ``parser`` reads in it
(OpenAI's ``tool_calls``). ``logprobs: true`` returns each sampled token's log-prob. ``GET /v1/models`` and
``/health`` answer too.

**Token-exact.** A session's next request usually repeats the conversation so far — with the assistant
message this server returned — and adds observations (tool results, a user's reply). The server then does
not re-tokenize that history: the new prompt is the previous prompt and sampled ids, and the chat
template's rendering of the new messages as a suffix (:func:`rlplat.agents.trajectory.render_suffix`),
exactly as rlplat's own agent loop builds a trajectory. A request that does not continue the session's
conversation starts a new trajectory of the session. :meth:`ChatServer.trajectories` returns them as
:class:`~rlplat.agents.trajectory.Trajectory` objects (sampled segments trained, observations attended).

**Concurrent.** Requests of many sessions are gathered for a few milliseconds (``batch_wait_s``) and sampled
in one engine call per set of sampling parameters; the engine is called from one thread only. Each request
waits at most ``timeout_s`` (then ``504``). Only the standard library serves it.
"""

from __future__ import annotations

import json
import queue
import threading
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from rlplat.agents.parsers import TOOL_PARSERS
from rlplat.agents.trajectory import TemplateNotIncremental, Trajectory, plain_message, render_suffix
from rlplat.rollout.base import RolloutEngine, Sample, SamplingParams


class RequestError(ValueError):
    """A request this server cannot answer; ``status`` is the HTTP status."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclass
class Session:
    """One session's conversations: the trajectories, and each as its client sees it (the request's messages
    and the assistant message returned: text without its tool-call markup, and ``tool_calls``)."""

    trajectories: list[Trajectory] = field(default_factory=list)
    seen: list[list[dict]] = field(default_factory=list)
    stopped: list[bool] = field(default_factory=list)  # per trajectory: its last reply ended at a stop token
    lock: threading.Lock = field(default_factory=threading.Lock)


def _same_message(sent: dict, returned: dict) -> bool:
    """Whether the message a client sent back is the assistant message returned (content, tool calls)."""
    if sent.get("role") != "assistant":
        return False

    def calls(message: dict) -> list:
        functions = [call.get("function", {}) for call in message.get("tool_calls") or []]
        return [(f.get("name"), json.loads(f.get("arguments") or "{}")) for f in functions]

    try:
        return (sent.get("content") or "") == (returned.get("content") or "") and calls(sent) == calls(returned)
    except (json.JSONDecodeError, AttributeError, TypeError):
        return False


class ChatServer:
    """The endpoint (see the module doc). ``engine``: a :class:`RolloutEngine` no one else calls while the
    server runs; ``max_tokens``: a request's default and largest completion length. For training
    (:class:`~rlplat.rollout.agent_loop.ClientLoop`): ``sampling``, the rollout's settings, which a request's
    temperature, top_p and seed do not change; ``budget``, the tokens a trajectory may hold after its prompt
    (a request past it is answered with no tokens and ``finish_reason`` ``length``)."""

    def __init__(self, engine: RolloutEngine, tokenizer, *, max_tokens: int, host: str = "127.0.0.1", port: int = 0,
                 parser: str = "hermes", model: str = "rlplat", max_batch: int = 64, batch_wait_s: float = 0.005,
                 timeout_s: float = 600.0, sampling: SamplingParams | None = None, budget: int | None = None):
        self.engine, self.tokenizer, self.max_tokens, self.model = engine, tokenizer, max_tokens, model
        self.sampling, self.budget = sampling, budget
        self.max_model_len = engine.setup.max_model_len
        self.parse = TOOL_PARSERS.get(parser)
        self.max_batch, self.batch_wait_s, self.timeout_s = max_batch, batch_wait_s, timeout_s
        self.stops = set((sampling or SamplingParams(max_new_tokens=1)).stop_ids(tokenizer.eos_token_id))
        self.sessions: dict[str, Session] = {}
        self._sessions_lock = threading.Lock()
        self._pending: queue.Queue = queue.Queue()
        self._running = False
        handler = type("Handler", (_Handler,), {"server_ref": self})
        self._http = _Listener((host, port), handler)
        self._threads: list[threading.Thread] = []

    @property
    def url(self) -> str:
        host, port = self._http.server_address[:2]
        return f"http://{host}:{port}/v1"

    def session_url(self, session: str) -> str:
        """The base URL of a session's conversations (an OpenAI client's ``base_url``)."""
        host, port = self._http.server_address[:2]
        return f"http://{host}:{port}/s/{session}/v1"

    def start(self) -> ChatServer:
        self._running = True
        self._threads = [threading.Thread(target=self._http.serve_forever, name="rlplat-chat-http", daemon=True),
                         threading.Thread(target=self._sample_loop, name="rlplat-chat-engine", daemon=True)]
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._running = False
        self._pending.put(None)
        self._http.shutdown()
        self._http.server_close()
        for thread in self._threads:
            thread.join(timeout=10)

    def __enter__(self) -> ChatServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def finished(self, session: str = "default") -> bool:
        """Whether the session's last trajectory ended its last reply at a stop token (not at a length)."""
        with self._sessions_lock:
            found = self.sessions.get(session)
        return bool(found and found.stopped and found.stopped[-1])

    def trajectories(self, session: str = "default") -> list[Trajectory]:
        """The session's conversations, token-exact (a finished one ends with its last sampled turn)."""
        with self._sessions_lock:
            found = self.sessions.get(session)
        return list(found.trajectories) if found else []

    # ------------------------------------------------------------------------------------------ sampling
    def _sample_loop(self) -> None:
        """The one thread that calls the engine: gathers the waiting requests, one call per parameter set."""
        while self._running:
            first = self._pending.get()
            if first is None:
                break
            batch, deadline = [first], time.monotonic() + self.batch_wait_s
            while len(batch) < self.max_batch and (left := deadline - time.monotonic()) > 0:
                try:
                    item = self._pending.get(timeout=left)
                except queue.Empty:
                    break
                if item is None:
                    self._running = False
                    break
                batch.append(item)
            by_params: dict[SamplingParams, list] = {}
            for ids, params, future in batch:
                by_params.setdefault(params, []).append((ids, future))
            for params, items in by_params.items():
                try:
                    samples = self.engine.generate_ids([ids for ids, _ in items], params)
                except Exception as err:  # noqa: BLE001 - every waiting request gets the engine's error
                    for _, future in items:
                        future.set_exception(err)
                    continue
                for (_, future), sample in zip(items, samples):
                    future.set_result(sample)

    def _sample(self, ids: list[int], params: SamplingParams) -> Sample:
        future: Future = Future()
        self._pending.put((ids, params, future))
        try:
            return future.result(timeout=self.timeout_s)
        except TimeoutError:
            raise RequestError(f"no completion within timeout_s={self.timeout_s:g} s", 504) from None

    # ------------------------------------------------------------------------------------------ a request
    def _params(self, body: dict, prompt_length: int) -> SamplingParams:
        if body.get("n", 1) != 1:
            raise RequestError("n must be 1: send one request per completion")
        if body.get("stream"):
            raise RequestError("stream is not supported")
        if body.get("stop"):
            raise RequestError("stop is not supported: completions end at the model's end-of-turn token")
        given = [body[key] for key in ("max_completion_tokens", "max_tokens") if body.get(key) is not None]
        limit = given[0] if given else self.max_tokens
        if not isinstance(limit, int) or limit < 1:
            raise RequestError(f"max_tokens must be a positive integer, got {limit!r}")
        room = self.max_model_len - prompt_length
        if room < 1:
            raise RequestError(f"the prompt is {prompt_length} tokens; the engine takes {self.max_model_len} in all")
        limit = min(limit, self.max_tokens, room)
        if self.sampling is not None:
            return replace(self.sampling, max_new_tokens=limit)
        seed = body.get("seed")
        return SamplingParams(max_new_tokens=limit, temperature=float(body.get("temperature", 1.0)),
                              top_p=float(body.get("top_p", 1.0)), seed=None if seed is None else int(seed))

    def _conversation(self, session: Session, messages: list[dict], tools: list | None
                      ) -> tuple[int | None, list[int], list[dict], list[int]]:
        """Which of the session's trajectories the messages continue (None: a new one), the prompt ids, the
        messages as the template reads them, and the observation ids a continuation adds."""
        for index, (trajectory, seen) in enumerate(zip(session.trajectories, session.seen)):
            done = len(seen)
            if len(messages) <= done or not _same_message(messages[done - 1], seen[-1]) or \
                    [plain_message(m) for m in messages[:done - 1]] != [plain_message(m) for m in seen[:done - 1]]:
                continue
            names = {c.get("id"): c.get("function", {}).get("name") for c in seen[-1].get("tool_calls") or []}
            new = [plain_message(m, names) for m in messages[done:]]
            try:
                observation = render_suffix(self.tokenizer, trajectory.messages, new, tools)
            except TemplateNotIncremental:
                break
            return index, trajectory.prompt_ids + trajectory.response_ids + observation, new, observation
        plain = [plain_message(m) for m in messages]
        ids = self.tokenizer.apply_chat_template(plain, tools=tools or None, tokenize=True, add_generation_prompt=True)
        return None, list(ids["input_ids"] if hasattr(ids, "keys") else ids), plain, []

    def chat(self, session_name: str, body: dict) -> dict:
        """Answer one chat-completion request body (the server's handler calls it)."""
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise RequestError("messages must be a non-empty list of message objects")
        tools = body.get("tools") or None
        with self._sessions_lock:
            session = self.sessions.setdefault(session_name, Session())
        with session.lock:  # one conversation step at a time per session
            index, ids, plain, observation = self._conversation(session, messages, tools)
            params = self._params(body, len(ids))
            if self.budget is not None:
                used = 0 if index is None else len(ids) - len(session.trajectories[index].prompt_ids)
                params = replace(params, max_new_tokens=min(params.max_new_tokens, self.budget - used))
            sample = self._sample(ids, params) if params.max_new_tokens > 0 else Sample([], [], False)
            text_ids = sample.ids[:-1] if sample.ids and sample.ids[-1] in self.stops else sample.ids
            text = self.tokenizer.decode(text_ids)
            parsed = self.parse(text) if tools else None
            message: dict[str, Any] = {"role": "assistant", "content": parsed.content if parsed else text}
            if parsed and parsed.calls:
                message["tool_calls"] = [{"id": f"call_{uuid.uuid4().hex[:12]}", "type": "function",
                                          "function": {"name": call.name, "arguments": json.dumps(call.arguments)
                                                       if not call.error else call.raw}} for call in parsed.calls]
            if index is None:
                trajectory = Trajectory(list(ids), plain)
                session.trajectories.append(trajectory)
                session.seen.append([])
                session.stopped.append(False)
                index = len(session.trajectories) - 1
            else:
                trajectory = session.trajectories[index]
                trajectory.add_observation(self.tokenizer, plain, tools, ids=observation)
            trajectory.add_sampled(sample.ids, sample.log_probs, text)  # the trajectory keeps the whole text
            session.seen[index] = [dict(m) for m in messages] + [message]
            session.stopped[index] = sample.stopped
        finish = "tool_calls" if message.get("tool_calls") else ("stop" if sample.stopped else "length")
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish,
                                  "token_ids": list(sample.ids)}
        if body.get("logprobs"):
            choice["logprobs"] = {"content": [{"token": self.tokenizer.decode([t]), "logprob": lp, "bytes": None,
                                               "top_logprobs": []} for t, lp in zip(sample.ids, sample.log_probs)]}
        return {"id": f"chatcmpl-{uuid.uuid4().hex[:16]}", "object": "chat.completion", "created": int(time.time()),
                "model": self.model, "choices": [choice], "prompt_token_ids": list(ids),
                "usage": {"prompt_tokens": len(ids), "completion_tokens": len(sample.ids),
                          "total_tokens": len(ids) + len(sample.ids)}}


class _Listener(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # the listen backlog: a harness opens many connections at once (the default is 5)


class _Handler(BaseHTTPRequestHandler):
    server_ref: ChatServer
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # no line per request
        pass

    def _send(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _route(self) -> tuple[str, str]:
        """(session, the path after the version) for ``/s/<session>/v1/...`` and ``/v1/...``."""
        path = self.path.split("?", 1)[0].rstrip("/")
        if path.startswith("/s/"):
            session, _, rest = path[3:].partition("/")
            return session, "/" + rest
        return "default", path

    def do_GET(self) -> None:  # noqa: N802 - the http.server interface
        _, path = self._route()
        if path == "/health":
            self._send(200, {"status": "ok"})
        elif path == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": self.server_ref.model, "object": "model",
                                                         "owned_by": "rlplat"}]})
        else:
            self._send(404, {"error": {"message": f"no such endpoint {self.path}", "type": "not_found"}})

    def do_POST(self) -> None:  # noqa: N802
        session, path = self._route()
        if path != "/v1/chat/completions":
            self._send(404, {"error": {"message": f"no such endpoint {self.path}", "type": "not_found"}})
            return
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            if not isinstance(body, dict):
                raise RequestError("the body must be a JSON object")
            self._send(200, self.server_ref.chat(session, body))
        except json.JSONDecodeError as err:
            self._send(400, {"error": {"message": f"the body is not JSON: {err}", "type": "invalid_request_error"}})
        except RequestError as err:
            self._send(err.status, {"error": {"message": str(err), "type": "invalid_request_error"}})
        except Exception as err:  # noqa: BLE001 - the engine's failure, to the client that asked
            self._send(500, {"error": {"message": f"{type(err).__name__}: {err}", "type": "server_error"}})
