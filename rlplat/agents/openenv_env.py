"""OpenEnv environments in rlplat's agent loop: ``rollout.agent.environment=openenv:<server>``.

An `OpenEnv <https://github.com/meta-pytorch/OpenEnv>`_ environment is a server (FastAPI, made by
``openenv.core.env_server.http_server.create_app``) that a client resets and steps over a WebSocket session,
each step an action and back an observation, a reward and ``done``. ``<server>`` is either the URL of a
running server (``openenv:http://127.0.0.1:8000``) or the importable module of its app
(``openenv:my_env.server.app``, ``openenv:my_env.server.app:app``): rlplat then starts it with uvicorn as a
local process on a free loopback port, no container, and stops it when the run ends. Each trajectory is one
session:

* ``reset`` is called with the row's ``extra_info["openenv"]`` (a dict of reset keyword arguments, e.g. a
  seed or the task), if any; the conversation's first messages are the row's prompt (the reset
  observation is kept in the trajectory's info, not shown to the model).
* Each assistant turn becomes an action: its text in the action's one required text field (or
  ``rollout.agent.environment_args.action_field``); the observation comes back as a user message (its one
  text field, or ``observation_field``, else its fields as JSON), ``done`` ends the trajectory, and each
  step's reward adds to the reward term ``openenv`` (``reward/environment/openenv_mean``).
* ``environment_args``: ``action_field``, ``observation_field``, ``start_timeout_s`` (60: how long the
  started server may take to answer ``/health``).

Not yet: environments whose actions are MCP tool calls (``CallToolAction``), and a server's session limit
(its ``max_concurrent_envs``) must cover the rollout's trajectories at once.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

from rlplat.agents.environment import Environment, Step
from rlplat.config.errors import ConfigError
from rlplat.utils.errors import RunError
from rlplat.utils.net import free_port

INSTALL = "pip install -e '.[envs]'"
_SKIP = {"metadata", "done", "reward"}  # the fields every observation and action has


class OpenEnvFailed(RunError):
    """An OpenEnv server failed or refused a session's call."""


def _get(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read() or b"null")


def _text_field(schema: Mapping[str, Any], kind: str, chosen: str | None, where: str) -> str | None:
    """The one text field of an action or observation schema (or ``chosen``, checked against it)."""
    properties = {k: v for k, v in (schema.get("properties") or {}).items() if k not in _SKIP}
    if chosen is not None:
        if chosen not in properties:
            raise ConfigError(f"{where}: its {kind} has no field {chosen!r} (fields: {sorted(properties)})")
        return chosen
    texts = [k for k, v in properties.items() if v.get("type") == "string"]
    if kind == "action":
        required = [k for k in schema.get("required") or [] if k in texts]
        if len(required) != 1:
            raise ConfigError(f"{where}: its action has {len(required)} required text fields ({sorted(properties)}); "
                              f"set rollout.agent.environment_args.action_field to the one the model's text fills")
        return required[0]
    return texts[0] if len(texts) == 1 else None


def _dies_with_parent() -> None:
    """In the server's process before it starts (Linux): SIGTERM when rlplat's process ends, even by kill -9
    (strictly: when the thread that started it ends; the loop's threads live as long as their worker)."""
    import ctypes
    import signal

    try:
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class OpenEnvEnvironments:
    """The environment source ``openenv:<server>`` (see the module doc)."""

    tools: list = []

    def __init__(self, target: str, args: Mapping[str, Any], agent_cfg=None):
        try:
            from openenv.core.generic_client import GenericEnvClient
        except ImportError:
            raise ConfigError(f"OpenEnv environments need the package 'openenv', which is not installed; install it "
                              f"with: {INSTALL}") from None
        self.client_class, self.target, self.args = GenericEnvClient, target, dict(args)
        self.where = f"rollout.agent.environment=openenv:{target}"
        unknown = set(self.args) - {"action_field", "observation_field", "start_timeout_s"}
        if unknown:
            raise ConfigError(f"{self.where}: rollout.agent.environment_args has unknown keys {sorted(unknown)} "
                              f"(known: action_field, observation_field, start_timeout_s)")
        self.process: subprocess.Popen | None = None
        self.url: str | None = target if target.startswith(("http://", "https://")) else None
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None

    # ------------------------------------------------------------------------------------------ the server
    def _started(self) -> str:
        """The server's URL, the local server started (once) and its schema read."""
        with self._lock:
            if self._loop is None:
                if self.url is None:
                    self.url = self._start(self.target)
                try:
                    schema = _get(f"{self.url}/schema")
                except (urllib.error.URLError, OSError, ValueError) as err:
                    raise OpenEnvFailed(f"{self.where}: the server at {self.url} does not answer /schema ({err})"
                                        ) from None
                self.action_field = _text_field(schema.get("action") or {}, "action", self.args.get("action_field"),
                                                self.where)
                self.observation_field = _text_field(schema.get("observation") or {}, "observation",
                                                     self.args.get("observation_field"), self.where)
                self._loop = asyncio.new_event_loop()
                threading.Thread(target=self._loop.run_forever, name="rlplat-openenv", daemon=True).start()
            return self.url

    def _start(self, module: str) -> str:
        app = module if ":" in module else f"{module}:app"
        port = free_port()
        env = {**os.environ, "ENABLE_WEB_INTERFACE": "false",
               "PYTHONPATH": os.pathsep.join([os.getcwd(), *filter(None, [os.environ.get("PYTHONPATH")])])}
        self.process = subprocess.Popen([sys.executable, "-m", "uvicorn", app, "--host", "127.0.0.1",
                                         "--port", str(port), "--log-level", "warning"], env=env,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=_dies_with_parent)
        atexit.register(self.stop)
        url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + float(self.args.get("start_timeout_s", 60))
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                output = (self.process.stdout.read() or b"").decode(errors="replace").strip().splitlines()
                raise OpenEnvFailed(f"{self.where}: its server (uvicorn {app}) exited with code "
                                    f"{self.process.returncode}: {output[-1] if output else 'no output'}")
            try:
                if _get(f"{url}/health", timeout=1.0):
                    return url
            except (urllib.error.URLError, OSError, ValueError):
                time.sleep(0.1)
        self.stop()
        raise OpenEnvFailed(f"{self.where}: its server (uvicorn {app}) did not answer /health within "
                            f"{self.args.get('start_timeout_s', 60)} s (environment_args.start_timeout_s)")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()

    def run(self, call, what: str):
        """``call()`` (a client method) on the sessions' event loop, where the client answers asynchronously."""
        async def inside():
            return await call()

        try:
            return asyncio.run_coroutine_threadsafe(inside(), self._loop).result(timeout=600)
        except Exception as err:  # noqa: BLE001 - the server's answer, one line that names it
            hint = ("; the server's max_concurrent_envs must cover the trajectories of a rollout at once "
                    "(data.train_batch_size_prompts x rollout.n)" if "CAPACITY_REACHED" in str(err) else "")
            raise OpenEnvFailed(f"{self.where}: {what} failed: {type(err).__name__}: {err}{hint}") from None

    # ------------------------------------------------------------------------------------------ sessions
    def make(self, row: Mapping[str, Any]) -> OpenEnvEnvironment:
        return OpenEnvEnvironment(self, self.client_class(base_url=self._started()))

    def finish(self, envs, groups, conversations) -> None:
        """Close the sessions still open (trajectories that ended without ``done``)."""
        for env in envs:
            env.close()
        return None


class OpenEnvEnvironment(Environment):
    """One trajectory: one session of the environment's server."""

    def __init__(self, source: OpenEnvEnvironments, client):
        self.source, self.client, self.open = source, client, False

    def reset(self, row: Mapping[str, Any]) -> list[dict]:
        kwargs = dict((row.get("extra_info") or {}).get("openenv") or {})
        result = self.source.run(lambda: self.client.reset(**kwargs), "reset")
        self.open = True
        self.first = result.observation
        return list(row["prompt"])

    def step(self, message: dict) -> Step:
        action = {self.source.action_field: message.get("content") or ""}
        result = self.source.run(lambda: self.client.step(action), "step")
        rewards = {"openenv": float(result.reward or 0.0)}
        if result.done:
            self.close()
            return Step([], done=True, rewards=rewards)
        return Step([{"role": "user", "content": self._text(result.observation)}], rewards=rewards)

    def _text(self, observation: Mapping[str, Any]) -> str:
        field = self.source.observation_field
        if field is not None:
            return str(observation.get(field, ""))
        return json.dumps({k: v for k, v in observation.items() if k not in _SKIP})

    def close(self) -> None:
        if self.open:
            self.open = False
            self.source.run(self.client.close, "close")
