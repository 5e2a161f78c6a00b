"""run.log_rollouts for a single-turn batch: unpadded ids, the mask, the prompt plus the decoded response."""

from __future__ import annotations

import json

import numpy as np

from rlctl.controller.rollout_log import write_rollouts
from rlctl.multiturn.rollout import ToolLoop
from rlctl.runtime.batch import Batch, object_array


def test_single_turn_rows_are_written_unpadded_with_their_messages(tmp_path):
    pad = 0
    prompts = np.array([[pad, 5, 6], [7, 8, 9]])
    responses = np.array([[11, 12, pad, pad], [13, 14, 15, 16]])
    lengths = np.array([2, 4])
    response_mask = (np.arange(4)[None, :] < lengths[:, None]).astype(np.float32)
    batch = Batch({
        "prompts": prompts, "responses": responses, "response_length": lengths, "response_mask": response_mask,
        "attention_mask": np.concatenate([prompts != pad, response_mask > 0], axis=1).astype(np.int64),
        "uid": object_array(["a", "b"]), "data_source": object_array(["d", "d"]),
        "messages": object_array([[{"role": "user", "content": "q1"}], [{"role": "user", "content": "q2"}]]),
        "response_text": object_array(["r1", "r2"]), "scores": np.array([0.5, 1.0]), "acc": np.array([0.0, 1.0]),
        "old_log_prob": np.array([[-0.123456, -1.0, 0, 0], [-2.0, -0.5, -0.25, -0.125]], dtype=np.float32),
        "advantages": np.array([[0.5, 0.5, 0, 0], [-1.0, -1.0, -1.0, -1.0]], dtype=np.float32),
    })
    path = write_rollouts(tmp_path, 3, batch)
    assert path == tmp_path / "rollouts" / "step_3.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rows[0]["prompt_ids"] == [5, 6] and rows[0]["response_ids"] == [11, 12] and rows[0]["response_mask"] == [1, 1]
    assert rows[1]["prompt_ids"] == [7, 8, 9] and rows[1]["response_ids"] == [13, 14, 15, 16]
    assert rows[0]["messages"] == [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "r1"}]
    assert [r["score"] for r in rows] == [0.5, 1.0] and "num_turns" not in rows[0]
    # per response token, unpadded, for rlctl view's shading
    assert rows[0]["log_probs"] == [-0.1235, -1.0] and rows[1]["advantages"] == [-1.0] * 4


def test_a_nan_turn_score_is_written_as_null_valid_json(tmp_path):
    """An interaction may score a turn NaN: the line must still be valid JSON (null), not a bare NaN."""
    batch = Batch({
        "prompts": np.array([[5, 6]]), "responses": np.array([[11, 12]]), "response_length": np.array([2]),
        "response_mask": np.array([[1.0, 0.0]]), "attention_mask": np.ones((1, 4), dtype=np.int64),
        "uid": object_array(["a"]), "data_source": object_array(["d"]),
        "conversation": object_array([[{"role": "user", "content": "q"}, {"role": "assistant", "content": "r"}]]),
        "multi_turn": object_array([{"num_turns": 2, "turn_scores": [float("nan"), 1.0], "tool_rewards": [],
                                     "finish": "done", "tool_calls": [{"name": None, "arguments": None,
                                                                       "error": True}]}]),
        "scores": np.array([np.nan]), "acc": np.array([0.0]),
    })
    text = write_rollouts(tmp_path, 1, batch, ToolLoop.record_fields).read_text()   # the tool loop's fields

    def no_bare_constants(name):
        raise AssertionError(f"invalid JSON: bare {name}")
    row = json.loads(text, parse_constant=no_bare_constants)
    assert row["turn_scores"] == [None, 1.0] and row["score"] is None and row["response_mask"] == [1, 0]
    assert row["tool_calls"] == [{"name": None, "arguments": None, "error": True}]
    assert not list((tmp_path / "rollouts").glob("*.tmp"))
