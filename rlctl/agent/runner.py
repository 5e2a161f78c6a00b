"""Running agent programs, one episode each, within their limits.

    function   `async def run(client, row)`: client an openai.AsyncOpenAI for the episode's endpoint
               (no retries: a refused call reaches the agent at once), row the parquet row as a dict;
               returns a number or a dict with "reward" (its other numeric keys are logged as agent/<key>)
    command    argv started per episode with OPENAI_BASE_URL and OPENAI_API_KEY in its environment and
               the row as one JSON line on stdin; the last non-empty stdout line is the reward: a
               number or a JSON object with "reward"

An agent that raises, exits non-zero, runs past rollout.agent.timeout_s (cancelled; a command is
killed with its process group), makes more than max_calls calls, gives no reward or a NaN one fails
its episode: reward 0 and counted in agent/failed, the step goes on. Episodes start as others end,
at most `concurrency` at once; an episode's end and the next one's start are one step for the
engine, so no batch forms between them.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import os
import signal
from collections import deque
from pathlib import Path

import numpy as np

from rlctl.agent.episodes import Episode
from rlctl.errors import ConfigError

STDERR_TAIL = 400   # characters of a failed command's stderr kept for the log


BUILTIN_AGENTS = ("verifiers",)   # rollout.agent.function names rlctl ships (rlctl.agent.verifiers_agent)


def load_agent(agent_cfg, base: Path, tokenizer: str | None = None):
    """The configured function (checked to be async with two parameters), or None for a command.
    `tokenizer`: the policy's tokenizer path, which a built-in agent renders prompts with."""
    if not agent_cfg.function:
        return None
    if agent_cfg.function == "verifiers":
        import functools

        from rlctl.agent.verifiers_agent import run
        from rlctl.errors import UsageError
        from rlctl.tasks.verifiers_env import require_verifiers

        try:
            require_verifiers()
        except UsageError as e:
            raise ConfigError(f"rollout.agent.function: {e.message}", hint=e.hint) from None
        return functools.partial(run, tokenizer=tokenizer)
    from rlctl.multiturn.tools import load_object

    fn = load_object(agent_cfg.function, base, "rollout.agent.function")
    if not inspect.iscoroutinefunction(fn):
        raise ConfigError(f"rollout.agent.function: {agent_cfg.function} is not an async function",
                          hint="define it as `async def run(client, row)`: it awaits the client's calls")
    if len(inspect.signature(fn).parameters) < 2:
        raise ConfigError(f"rollout.agent.function: {agent_cfg.function} must take (client, row)")
    return fn


class AgentRunner:
    def __init__(self, agent_cfg, base: Path, server, engine):
        self.cfg, self.base, self.server, self.engine = agent_cfg, base, server, engine
        self.fn = load_agent(agent_cfg, base, getattr(engine.tokenizer, "name_or_path", None))

    def run(self, episodes: list[Episode]) -> None:
        asyncio.run(self._all(episodes))

    async def _all(self, episodes: list[Episode]) -> None:
        todo, running = deque(episodes), set()
        if self.fn is not None:   # one HTTP client per rollout, each episode a view of it with its own URL
            import openai

            self.client = openai.AsyncOpenAI(base_url=self.server.base_url("-"), api_key=self.server.key,
                                             max_retries=0, timeout=self.cfg.timeout_s)

        def start_next() -> None:   # under the engine's lock, with the close it follows
            if todo:
                episode = todo.popleft()
                self.engine.open(_tag(episode), episode)
                running.add(asyncio.ensure_future(self._one(episode, on_end)))

        def on_end(episode: Episode) -> None:
            with self.engine.lock:
                self.engine.close(_tag(episode))
                start_next()

        with self.engine.lock:
            for _ in range(min(self.cfg.concurrency, len(todo))):
                start_next()
        try:
            while running:
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                running -= done
                for task in done:
                    task.result()   # _one contains the agent's failures; anything else is ours
        finally:
            if self.fn is not None:
                await self.client.close()

    async def _one(self, episode: Episode, on_end) -> None:
        try:
            result = await asyncio.wait_for(self._play(episode), timeout=self.cfg.timeout_s)
            if not episode.failure:
                _take_result(episode, result)
        except asyncio.TimeoutError:
            episode.failure = episode.failure or "timeout"
        except Exception as e:   # the agent's own error: its episode fails, the step goes on
            episode.failure = episode.failure or f"raised {type(e).__name__}: {str(e)[:200]}"
        finally:
            on_end(episode)

    async def _play(self, episode: Episode):
        url = self.server.base_url(_tag(episode))
        if self.fn is not None:
            return await self.fn(self.client.with_options(base_url=url), episode.row)
        return await self._command(episode, url)

    async def _command(self, episode: Episode, url: str):
        argv = [str(self.base / a) if (self.base / a).is_file() and not Path(a).is_absolute() else a
                for a in self.cfg.command]
        env = {**os.environ, "OPENAI_BASE_URL": url, "OPENAI_API_KEY": self.server.key}
        proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.PIPE,
                                                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                                                    env=env, cwd=str(self.base), start_new_session=True)
        try:
            out, err = await proc.communicate((json.dumps(plain(episode.row)) + "\n").encode())
        except asyncio.CancelledError:   # timed out or interrupted: the whole process group goes
            _kill(proc)
            await proc.wait()   # reaped while the loop runs, so its pipes close with it
            raise
        if proc.returncode != 0:
            episode.failure = f"exited {proc.returncode}: {err.decode(errors='replace')[-STDERR_TAIL:].strip()}"
            return None
        lines = [line for line in out.decode(errors="replace").splitlines() if line.strip()]
        if not lines:
            episode.failure = "printed no reward"
            return None
        last = lines[-1].strip()
        try:
            return json.loads(last)
        except json.JSONDecodeError:
            episode.failure = f"last stdout line is not a number or JSON object: {last[:80]!r}"
            return None


def _take_result(episode: Episode, result) -> None:
    """The agent's return value -> episode.reward and metrics, or a failure."""
    metrics = {}
    if isinstance(result, dict):
        metrics = {k: float(v) for k, v in result.items()
                   if k != "reward" and isinstance(v, (int, float)) and not isinstance(v, bool)}
        result = result.get("reward")
    if result is None:
        episode.failure = "returned no reward"
        return
    if isinstance(result, bool) or not isinstance(result, (int, float)):
        episode.failure = f"returned a {type(result).__name__} as its reward, not a number"
        return
    if not math.isfinite(float(result)):
        episode.failure = f"returned reward {result}"
        return
    episode.reward, episode.metrics = float(result), metrics


def _kill(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _tag(episode: Episode) -> str:
    return f"ep{episode.index}"


def plain(value):
    """A parquet row (numpy arrays and scalars inside) as plain JSON-able Python."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, np.ndarray)):
        return [plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value
