"""All of a run's reward sources behind one `score(items)`: function, reward model, LLM judge, remote service.

The score of a sample is the weighted sum over the configured sources (`reward.weights`; a source
not named weighs 1.0); each source's own batch mean is logged as `reward/<source>/mean`. Which
sources there are, when each is on and how it is built: rlctl.rewards.registry. The function
source is on when `reward.function` is set, when `reward.weights` names it, or when no other
source is configured (the built-ins by data_source, as before).

`reward.on_error` and `reward.timeout_s` apply to every source: a failed sample stops the run
(exit 5) or scores 0 in the sum, and more than half of a batch failing stops it either way.

Items are dicts with data_source, solution_str, ground_truth, extra_info, plus prompt_str (the
chat-templated prompt the policy saw) and messages (the prompt's chat messages) for the sources
that need them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from rlctl.errors import RewardError
from rlctl.rewards.registry import configured
from rlctl.rewards.runner import RewardResult


class RewardSources:
    """Start with `build_reward(config.reward, config_dir)`; `attach_model(handle)` once the reward-model
    workers run; `close()` at the end."""

    def __init__(self, cfg, function=None, others=()):
        self.cfg = cfg
        self.function = function  # a RewardRunner, or None
        self.others = list(others)  # RemoteService / LlmJudge / RewardModelSource
        self.weights = {name: cfg.weights.get(name, 1.0) for name in self.names}

    @property
    def names(self) -> list[str]:
        return configured_names(self.cfg)

    def attach_model(self, handle) -> None:
        """The reward-model worker group (rlctl.workers.roles.reward_model) scores from now on."""
        from rlctl.rewards.model import RewardModelSource

        self.others.append(RewardModelSource(handle, self.cfg.model))

    def __enter__(self) -> RewardSources:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self.function is not None:
            self.function.close()

    def check_data_sources(self, data_sources) -> None:
        if self.function is not None:
            self.function.check_data_sources(data_sources)

    def score(self, items: list[dict]) -> RewardResult:
        n = len(items)
        if self.function is not None:
            result = self.function.score(items)
            total = self.weights["function"] * result.scores
            if len(self.names) > 1:
                result.metrics["reward/function/mean"] = float(result.scores.mean()) if n else 0.0
        else:
            result = RewardResult(np.zeros(n, dtype=np.float32), failed=np.zeros(n, dtype=bool),
                                  metrics={"reward/errors": 0.0, "reward/timeouts": 0.0})
            total = np.zeros(n, dtype=np.float32)
        for source in self.others:
            if not n:
                break
            scores, errors = source.score(items)
            self._check_errors(source.name, items, errors, result)
            scores = np.where(np.isin(np.arange(n), list(errors)), 0.0, scores).astype(np.float32)
            total = total + self.weights[source.name] * scores
            result.metrics[f"reward/{source.name}/mean"] = float(scores.mean())
            result.metrics[f"reward/{source.name}/errors"] = float(len(errors))
            result.metrics["reward/errors"] = result.metrics.get("reward/errors", 0.0) + len(errors)
            for index, why in errors.items():
                result.errors.setdefault(index, f"{source.name}: {why}")
                result.failed[index] = True
        result.scores = total.astype(np.float32)
        return result

    def _check_errors(self, name: str, items: list[dict], errors: dict[int, str], result: RewardResult) -> None:
        if not errors:
            return
        first = min(errors)
        where = f"sample {first} (data_source {items[first].get('data_source')!r})"
        if self.cfg.on_error == "fail":
            raise RewardError(f"reward source {name!r} failed on {where}: {errors[first]}",
                              hint=f'fix the {name} source, or set reward.on_error = "zero" to score such samples 0.')
        if len(errors) * 2 > len(items):
            raise RewardError(f"reward source {name!r} failed on {len(errors)} of {len(items)} samples; "
                              f"first, {where}: {errors[first]}",
                              hint=f'fix the {name} source; reward.on_error = "zero" tolerates up to half.')


def configured_names(cfg) -> list[str]:
    """The names of the configured sources, in the order their scores are summed."""
    return [entry.name for entry in configured(cfg)]


def build_reward(cfg, config_dir: Path) -> RewardSources:
    """The configured sources, each checked now (a missing file, an unreachable judge: ConfigError,
    exit 2, before the first step); the services first, then the function's process pool. The
    reward model joins later, through attach_model()."""
    entries = [e for e in configured(cfg) if e.build is not None]
    others = [e.build(cfg, config_dir) for e in entries if not e.base]
    function = next((e.build(cfg, config_dir) for e in entries if e.base), None)
    return RewardSources(cfg, function, others)
