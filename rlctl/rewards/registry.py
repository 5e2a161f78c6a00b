"""The reward sources, one entry each: its name, when it is configured, how it is built, its checks.

Every reader of "which sources are there" goes through `SOURCES`: build_reward (rlctl.rewards.sources)
builds the configured ones, `rlctl config validate` runs each entry's check and matches
reward.weights against them, and `rlctl eval` labels its report with them. A new reward service
is one module (its class with `name` and `score(items) -> (scores [N], {index: why})`) plus one
entry here; its reward.<key> settings go into rlctl.config.schema (RewardConfig, REWARD_SOURCES).

Order matters: the configured sources' scores are summed in this order (the function first, the
reward model last, since it joins when its workers run), so it is the order of the float sum.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from rlctl.config.loader import Problem
from rlctl.errors import ConfigError


@dataclass(frozen=True)
class RewardSourceEntry:
    name: str                       # its reward.weights key; metrics are reward/<name>/...
    key: str                        # the reward.<key> that turns it on
    is_set: Callable[[Any], bool]   # (config.reward) -> configured by its own keys
    label: Callable[[Any], str]     # (config.reward) -> what `rlctl eval` reports
    build: Callable[[Any, Path], Any] | None = None  # (config.reward, config dir) -> source; None: built elsewhere
    check: Callable[[Any, bool], list] | None = None  # (config.reward, reach the service?) -> [Problem]
    base: bool = False              # its own result carries the batch's metrics; the others add to its scores
    fallback: bool = False          # also on when no other source is configured


def is_configured(entry: RewardSourceEntry, reward) -> bool:
    """`entry` is on: its keys are set, or it is the fallback and nothing else is."""
    return entry.is_set(reward) or (entry.fallback and not any(e.is_set(reward) for e in SOURCES if not e.fallback))


def configured(reward) -> list[RewardSourceEntry]:
    return [e for e in SOURCES if is_configured(e, reward)]


def by_name(name: str) -> RewardSourceEntry | None:
    return next((e for e in SOURCES if e.name == name), None)


def http_options(reward) -> dict:
    return {"timeout_s": reward.timeout_s, "retries": reward.retries, "concurrency": reward.concurrency}


def setting_problems(checks) -> list[Problem]:
    """Run (key, check) pairs; a ConfigError becomes a Problem on reward.<key> (an unreachable
    service is a warning: it may start later)."""
    problems = []
    for key, check in checks:
        try:
            check()
        except ConfigError as err:
            unreachable = "nothing answers" in err.message
            problems.append(Problem(f"reward.{key}", err.message.removeprefix(f"reward.{key}: ").removeprefix(
                f"reward.{key} "), severity="warning" if unreachable else "error"))
    return problems


def url_checks(urls, reach: bool) -> list:
    """(key, check) pairs for the set URLs: http(s), and with `reach` something answers there."""
    from rlctl.rewards.http import check_reachable, check_url

    url_check = check_reachable if reach else check_url
    return [(key, lambda u=url, k=key: url_check(u, k)) for key, url in urls if url]


# --- the sources ------------------------------------------------------------------------------------

def _build_function(reward, config_dir: Path):
    from rlctl.rewards.runner import RewardRunner

    return RewardRunner(reward.function, config_dir, timeout_s=reward.timeout_s, on_error=reward.on_error,
                        workers=reward.workers, format_score=reward.format_score, sandbox_url=reward.sandbox_url)


def _check_function(reward, reach: bool) -> list[Problem]:
    return setting_problems(url_checks((("sandbox_url", reward.sandbox_url),), reach))


def _build_remote(reward, config_dir: Path):
    from rlctl.rewards.remote import RemoteService

    return RemoteService(reward.remote_url, **http_options(reward))


def _check_remote(reward, reach: bool) -> list[Problem]:
    return setting_problems(url_checks((("remote_url", reward.remote_url),), reach))


def _build_judge(reward, config_dir: Path):
    from rlctl.rewards.remote import LlmJudge

    return LlmJudge(reward.judge_url, reward.judge_model, reward.judge_prompt, reward.judge_score,
                    max_tokens=reward.judge_max_tokens, api_key_env=reward.judge_api_key_env, **http_options(reward))


def _check_judge(reward, reach: bool) -> list[Problem]:
    """A judge needs a model name and a usable prompt and score rule (checked even while
    judge_url is unset: a recipe may set the URL per run)."""
    from rlctl.rewards.remote import check_prompt, score_reader

    problems = []
    if reward.judge_url and not reward.judge_model:
        problems.append(Problem("reward.judge_model", "is empty but reward.judge_url is set: name the model the "
                                                      "judge server serves"))
    checks = [("judge_prompt", lambda: check_prompt(reward.judge_prompt)),
              ("judge_score", lambda: score_reader(reward.judge_score))]
    return problems + setting_problems(checks + url_checks((("judge_url", reward.judge_url.rstrip("/")),), reach))


SOURCES: tuple[RewardSourceEntry, ...] = (
    RewardSourceEntry("function", "function", lambda r: bool(r.function) or "function" in r.weights,
                      label=lambda r: r.function or "built-in by data_source", build=_build_function,
                      check=_check_function, base=True, fallback=True),
    RewardSourceEntry("remote", "remote_url", lambda r: bool(r.remote_url), label=lambda r: f"remote {r.remote_url}",
                      build=_build_remote, check=_check_remote),
    RewardSourceEntry("judge", "judge_url", lambda r: bool(r.judge_url), label=lambda r: f"judge {r.judge_url}",
                      build=_build_judge, check=_check_judge),
    # built by the controller once its workers run (RewardSources.attach_model)
    RewardSourceEntry("model", "model", lambda r: bool(r.model), label=lambda r: f"model {r.model}"),
)
