"""Rewards from elsewhere over HTTP: a remote reward service (OpenRLHF's protocol) and an LLM judge.

Remote service, as OpenRLHF's `--remote_rm_url` speaks it, so services written for it work unchanged:

    POST remote_url  {"query": [prompt + response, ...], "prompts": [prompt, ...], "labels": [ground_truth, ...]}
    ->               {"rewards": [float, ...]}

`query` and `prompts` are the chat-templated text the policy saw (special tokens kept), as
OpenRLHF decodes them. A batch goes out in chunks of REMOTE_CHUNK samples, `reward.concurrency`
at a time, so one slow chunk costs one `reward.timeout_s`, not the step.

LLM judge: one chat-completion request per sample to any OpenAI-compatible server (`rlctl serve`
included); the answer's number, read by `reward.judge_score`, is the score.
"""

from __future__ import annotations

import math
import os
import re

import numpy as np

from rlctl.errors import ConfigError
from rlctl.rewards.http import check_reachable, map_concurrent
from rlctl.utils.http import HttpFailure, post_json

REMOTE_CHUNK = 16
_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"


class RemoteService:
    """reward.remote_url: scores [N] and {sample index: why} for the samples whose request failed."""

    name = "remote"

    def __init__(self, url: str, *, timeout_s: float, retries: int, concurrency: int):
        check_reachable(url, "remote_url")
        self.url, self.timeout_s, self.retries, self.concurrency = url, timeout_s, retries, concurrency

    def score(self, items: list[dict]) -> tuple[np.ndarray, dict[int, str]]:
        starts = list(range(0, len(items), REMOTE_CHUNK))
        answers = map_concurrent(lambda s: self._post(items[s:s + REMOTE_CHUNK]), starts, self.concurrency)
        scores, errors = np.zeros(len(items), dtype=np.float32), {}
        for start, answer in zip(starts, answers):
            n = min(REMOTE_CHUNK, len(items) - start)
            if isinstance(answer, Exception):
                errors.update(dict.fromkeys(range(start, start + n), str(answer)))
            else:
                scores[start:start + n] = answer
        return scores, errors

    def _post(self, chunk: list[dict]) -> list[float]:
        payload = {"query": [it["prompt_str"] + it["solution_str"] for it in chunk],
                   "prompts": [it["prompt_str"] for it in chunk],
                   "labels": [str(it["ground_truth"]) for it in chunk]}
        answer = post_json(self.url, payload, timeout_s=self.timeout_s, retries=self.retries)
        rewards = answer.get("rewards") if isinstance(answer, dict) else None
        if not isinstance(rewards, list) or len(rewards) != len(chunk):
            raise HttpFailure(f"{self.url} answered without a 'rewards' list of {len(chunk)} numbers "
                              f"(got {str(answer)[:80]})")
        try:
            values = [float(r) for r in rewards]
        except (TypeError, ValueError):
            raise HttpFailure(f"{self.url} answered rewards that are not numbers: {str(rewards)[:80]}") from None
        if not all(math.isfinite(v) for v in values):
            raise HttpFailure(f"{self.url} answered a reward that is not finite: {str(rewards)[:80]}")
        return values


class LlmJudge:
    """reward.judge_*: one chat completion per sample; the score is the number in its answer."""

    name = "judge"

    def __init__(self, url: str, model: str, prompt: str, score: str, *, max_tokens: int, api_key_env: str,
                 timeout_s: float, retries: int, concurrency: int):
        if not model:
            raise ConfigError("reward.judge_url is set but reward.judge_model is empty",
                              hint="set reward.judge_model to the model name the judge server serves.")
        self.read_score = score_reader(score)
        check_prompt(prompt)
        url = url.rstrip("/")
        self.url = url if url.endswith("/chat/completions") else url + "/chat/completions"
        check_reachable(self.url, "judge_url")
        key = os.environ.get(api_key_env, "") if api_key_env else ""
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.model, self.prompt, self.max_tokens = model, prompt, max_tokens
        self.timeout_s, self.retries, self.concurrency = timeout_s, retries, concurrency

    def score(self, items: list[dict]) -> tuple[np.ndarray, dict[int, str]]:
        answers = map_concurrent(self._ask, items, self.concurrency)
        scores, errors = np.zeros(len(items), dtype=np.float32), {}
        for i, answer in enumerate(answers):
            if isinstance(answer, Exception):
                errors[i] = str(answer)
                continue
            value = self.read_score(answer)
            if value is None:
                errors[i] = f"the judge's answer has no score: {answer.strip()[-120:]!r}"
            else:
                scores[i] = value
        return scores, errors

    def _ask(self, item: dict) -> str:
        content = self.prompt.format(question=question_of(item), response=item["solution_str"],
                                     ground_truth=item["ground_truth"])
        payload = {"model": self.model, "messages": [{"role": "user", "content": content}],
                   "max_tokens": self.max_tokens, "temperature": 0.0}
        answer = post_json(self.url, payload, timeout_s=self.timeout_s, retries=self.retries, headers=self.headers)
        try:
            text = answer["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise HttpFailure(f"{self.url} answered without choices[0].message.content: {str(answer)[:80]}") from None
        return text or ""


def question_of(item: dict) -> str:
    """The last user message of the prompt; the rendered prompt text when the messages are unknown."""
    for message in reversed(item.get("messages") or []):
        if isinstance(message, dict) and message.get("role") == "user":
            return str(message.get("content", ""))
    return item.get("prompt_str", "")


def check_prompt(prompt: str) -> None:
    try:
        prompt.format(question="", response="", ground_truth="")
    except (KeyError, IndexError, ValueError) as e:
        raise ConfigError(f"reward.judge_prompt cannot be filled in: {type(e).__name__} {e}",
                          hint="use only {question}, {response} and {ground_truth}; write literal braces as {{ }}."
                          ) from None
    if "{response}" not in prompt:
        raise ConfigError("reward.judge_prompt has no {response}: the judge would never see the answer",
                          hint="put {response} where the graded answer goes.")


def score_reader(spec: str):
    """reward.judge_score -> fn(answer) -> float | None: first_number, last_number, or a regex with a group."""
    if spec in ("first_number", "last_number"):
        pick = 0 if spec == "first_number" else -1

        def read(text: str):
            found = re.findall(_NUMBER, text)
            return _finite(found[pick]) if found else None
        return read
    try:
        pattern = re.compile(spec)
    except re.error as e:
        raise ConfigError(f"reward.judge_score = {spec!r} is not first_number, last_number or a regular "
                          f"expression ({e})", hint='e.g. judge_score = "Score: (\\\\d+)".') from None
    if pattern.groups < 1:
        raise ConfigError(f"reward.judge_score = {spec!r} has no group around the number",
                          hint='put parentheses around the number, e.g. "Score: (\\\\d+)".')

    def read_group(text: str):
        match = pattern.search(text)
        return _finite(match.group(1)) if match and match.group(1) is not None else None
    return read_group


def _finite(text: str):
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None
