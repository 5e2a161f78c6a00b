"""Running agent programs, one episode each, within their limits.

    function   `async def run(client, row)`: client an openai.AsyncOpenAI for the episode's endpoint
               (no retries: a refused call reaches the agent at once), row the parquet row as a dict;
               returns a number or a dict with "reward" (its other numeric keys are logged as agent/<key>)
    command    argv started per episode, in a process group of its own (a new session), with its
               episode's OPENAI_BASE_URL and OPENAI_API_KEY in its environment and the row as one JSON
               line on stdin; the last non-empty stdout line is the reward: a number or a JSON object
               with "reward". Its stdout is read as it comes, keeping only the line being read and the
               last whole one (each at most LINE_LIMIT bytes), so a command may print without limit

Each episode gets a fresh tag and key from the endpoint (rlctl.agent.endpoint) and is closed in the
engine when it ends, so nothing that outlives it can call as it. A command's whole process group is
killed when the command exits, times out, or the rollout is abandoned (a second Ctrl-C): whatever it
started in its group dies with its episode. An agent that raises, exits non-zero, runs past
rollout.agent.timeout_s (cancelled), makes more than max_calls calls, gives no reward or a
non-finite one fails its episode: reward 0 and counted in agent/failed, the step goes on. Episodes
start as others end, at most `concurrency` at once; an episode's end and the next one's start are
one step for the engine, so no batch forms between them.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import numbers
import os
import signal
from collections import deque
from pathlib import Path

import numpy as np

from rlctl.agent.episodes import Episode
from rlctl.errors import ConfigError, Interrupted
from rlctl.rollouts.table import builtin_agent

STDERR_TAIL = 400         # characters of a failed command's stderr kept for the log
LINE_LIMIT = 1 << 16      # bytes of a command's stdout line kept: a reward line is a number or a small object
CHUNK = 1 << 16           # bytes read from a pipe at a time
PIPE_GRACE_S = 2.0        # after the group is killed: how long its pipes may take to close


def load_agent(agent_cfg, base: Path, tokenizer: str | None = None):
    """The configured function (checked to be async with two parameters), or None for a command.
    `tokenizer`: the policy's tokenizer path, which a built-in agent renders prompts with."""
    if not agent_cfg.function:
        return None
    env = builtin_agent(agent_cfg.function)   # an environment library's own agent (rlctl.rollouts.table)
    if env is not None:
        import functools

        from rlctl.errors import UsageError

        try:
            run = env.agent_function()
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
        self.groups: set[int] = set()   # process groups of the commands running now

    def run(self, episodes: list[Episode]) -> None:
        try:
            asyncio.run(self._all(episodes))
        finally:   # a stop that ended the loop before an episode's own clean-up ran (a second Ctrl-C)
            for group in list(self.groups):
                _kill_group(group)
            self.groups.clear()

    async def _all(self, episodes: list[Episode]) -> None:
        todo, running = deque(episodes), set()
        if self.fn is not None:   # one HTTP client per rollout, each episode a view of it with its URL and key
            import openai

            self.client = openai.AsyncOpenAI(base_url=self.server.base_url("-"), api_key="per-episode",
                                             max_retries=0, timeout=self.cfg.timeout_s)

        def start_next() -> None:   # under the engine's lock, with the close it follows
            if todo:
                episode, tag = todo.popleft(), self.server.new_tag()
                self.engine.open(tag, episode)
                running.add(asyncio.ensure_future(self._one(episode, tag, on_end)))

        def on_end(tag: str, go_on: bool) -> None:
            with self.engine.lock:
                self.engine.close(tag)
                if go_on:   # not while the rollout is being abandoned: no episode starts then
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

    async def _one(self, episode: Episode, tag: str, on_end) -> None:
        go_on = False
        try:
            result = await asyncio.wait_for(self._play(episode, tag), timeout=self.cfg.timeout_s)
            go_on = True
            if not episode.failure:
                _take_result(episode, result)
        except asyncio.TimeoutError:
            episode.failure, go_on = episode.failure or "timeout", True
        except Interrupted:   # a second Ctrl-C that landed in the agent's code stops the run, not the episode
            raise
        except Exception as e:   # the agent's own error: its episode fails, the step goes on
            episode.failure, go_on = episode.failure or f"raised {type(e).__name__}: {str(e)[:200]}", True
        finally:   # go_on stays False when cancelled: the rollout is being torn down (a second Ctrl-C)
            on_end(tag, go_on)

    async def _play(self, episode: Episode, tag: str):
        url, key = self.server.base_url(tag), self.server.key(tag)
        if self.fn is not None:
            return await self.fn(self.client.with_options(base_url=url, api_key=key), episode.row)
        return await self._command(episode, url, key)

    async def _command(self, episode: Episode, url: str, key: str):
        argv = [str(self.base / a) if (self.base / a).is_file() and not Path(a).is_absolute() else a
                for a in self.cfg.command]
        env = {**os.environ, "OPENAI_BASE_URL": url, "OPENAI_API_KEY": key}   # the child's copy only
        proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.PIPE,
                                                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                                                    env=env, cwd=str(self.base), start_new_session=True)
        self.groups.add(proc.pid)   # a new session: its group id is its pid
        out, err = LastLine(LINE_LIMIT), Tail(4 * STDERR_TAIL)
        pipes = [asyncio.ensure_future(_feed(proc.stdin, (json.dumps(plain(episode.row)) + "\n").encode())),
                 asyncio.ensure_future(_drain(proc.stdout, out)), asyncio.ensure_future(_drain(proc.stderr, err))]
        try:
            code = await proc.wait()
        finally:   # exited, timed out or interrupted: whatever it started in its group goes with it
            _kill_group(proc.pid)
            self.groups.discard(proc.pid)
            await asyncio.wait([*pipes, asyncio.ensure_future(proc.wait())], timeout=PIPE_GRACE_S)
            for task in pipes:   # a pipe still held open by a process that left the group
                task.cancel()
        for task in pipes[1:]:   # a reader that raised (a second Ctrl-C landing in it) raises here
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise task.exception()
        return _command_result(episode, code, out, err.text())


def _command_result(episode: Episode, code: int, out: LastLine, err: str):
    if code != 0:
        episode.failure = f"exited {code}: {err[-STDERR_TAIL:].strip()}"
        return None
    if out.last is None:
        episode.failure = "printed no reward"
        return None
    last = out.last.decode(errors="replace").strip()
    if out.last_cut:
        episode.failure = f"last stdout line is longer than {LINE_LIMIT} bytes: {last[:80]!r}..."
        return None
    try:
        return json.loads(last)
    except json.JSONDecodeError:
        episode.failure = f"last stdout line is not a number or JSON object: {last[:80]!r}"
        return None


class LastLine:
    """The last non-blank line of a stream fed in chunks, in bounded memory: the line being read and
    the last whole one, each cut at `limit` bytes (`last_cut` says the last one was)."""

    def __init__(self, limit: int):
        self.limit = limit
        self.last: bytes | None = None
        self.last_cut = False
        self._line, self._cut, self._blank = bytearray(), False, True

    def feed(self, chunk: bytes) -> None:
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            self._take(chunk[start:] if end < 0 else chunk[start:end])
            if end < 0:
                return
            self.close()
            start = end + 1

    def close(self) -> None:
        """The line being read is whole (a newline, or the end of the stream)."""
        if not self._blank:
            self.last, self.last_cut = bytes(self._line), self._cut
        self._line, self._cut, self._blank = bytearray(), False, True

    def held(self) -> int:
        return len(self._line) + len(self.last or b"")

    def _take(self, piece: bytes) -> None:
        room = self.limit - len(self._line)
        self._line += piece[:max(room, 0)]
        self._cut = self._cut or len(piece) > room
        self._blank = self._blank and not piece.strip()


class Tail:
    """The last `limit` bytes of a stream fed in chunks."""

    def __init__(self, limit: int):
        self.limit, self._data = limit, b""

    def feed(self, chunk: bytes) -> None:
        self._data = (self._data + chunk)[-self.limit:]

    def close(self) -> None:
        pass

    def text(self) -> str:
        return self._data.decode(errors="replace")


async def _drain(stream, sink) -> None:
    while chunk := await stream.read(CHUNK):
        sink.feed(chunk)
    sink.close()


async def _feed(stdin, data: bytes) -> None:
    """The row on stdin, then EOF; a command that exits without reading it is no error."""
    try:
        stdin.write(data)
        await stdin.drain()
        stdin.close()
    except (BrokenPipeError, ConnectionResetError):
        pass


def _take_result(episode: Episode, result) -> None:
    """The agent's return value -> episode.reward and metrics, or a failure. Numbers may be Python's,
    numpy's or 0-d tensors (`.item()`); a non-finite reward fails the episode."""
    metrics = {}
    if isinstance(result, dict):
        metrics = {k: n for k, v in result.items() if k != "reward" and (n := _number(v)) is not None}
        result = result.get("reward")
    if result is None:
        episode.failure = "returned no reward"
        return
    reward = _number(result)
    if reward is None:
        episode.failure = f"returned a {type(result).__name__} as its reward, not a number"
        return
    if not math.isfinite(reward):
        episode.failure = f"returned reward {reward}"
        return
    episode.reward, episode.metrics = reward, metrics


def _number(value) -> float | None:
    """A real number as a float (Python, numpy or a 0-d array / tensor), else None; booleans are not."""
    if getattr(value, "shape", None) == () and hasattr(value, "item"):   # numpy 0-d array, torch scalar tensor
        value = value.item()
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        return None
    return float(value)


def _kill_group(group: int) -> None:
    try:
        os.killpg(group, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def plain(value):
    """A parquet row (numpy arrays and scalars inside) as plain JSON-able Python."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, np.ndarray)):
        return [plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value
