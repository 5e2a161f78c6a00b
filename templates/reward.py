"""Reward function for this project, called once per generated response.

rlctl (like verl) calls `compute_score(data_source, solution_str, ground_truth, extra_info)`:
- data_source:  the row's `data_source` column (e.g. "openai/gsm8k"),
- solution_str: the model's response text (no prompt),
- ground_truth: the row's `reward_model.ground_truth`,
- extra_info:   the row's `extra_info` dict (split, index, question, ...).
Return a float, or a dict with "score" plus extra numbers that are logged as reward/<name>.

This starts from rlctl's built-in scorer for the data source; change it to what you need.
It runs in a separate process with a timeout (reward.timeout_s in rlctl.toml).
"""

from rlctl.rewards.builtin import default_compute_score


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    result = default_compute_score(data_source, solution_str, ground_truth, extra_info)
    result = dict(result) if isinstance(result, dict) else {"score": float(result)}
    # An extra metric to watch in metrics.jsonl: how often the response is over 200 characters.
    result["long_answer"] = float(len(solution_str) > 200)
    return result
