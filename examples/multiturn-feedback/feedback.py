"""A simulated user that asks again, with feedback, until the answer is right (or the turns run out).

The interaction (rollout.multi_turn.interaction = "feedback.py:ask_again") grades each assistant
turn with the arith task's partial credit (digits only, short, close to the sum; 1.0 when exact),
records it as the turn's score and, unless it was exact, says what was wrong. The reward function
(reward.function = "feedback.py:compute_score") scores the conversation by its LAST turn's score:
the answer the model ended with, after the feedback it got.
"""

from rlctl.tasks.arith import score


def ask_again(messages, extra_info):
    answer = messages[-1]["content"]
    result = score(answer, extra_info["answer"])
    if result["acc"]:
        return {"content": "Correct.", "done": True, "score": 1.0}
    if result["digits"] < 1.0:
        feedback = "Not quite. Reply with the number only: digits, nothing else."
    else:
        feedback = "Not quite. That is not the sum; try again with digits only."
    return {"content": feedback, "done": False, "score": result["score"]}


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    turn_scores = extra_info.get("turn_scores") or [0.0]
    last = turn_scores[-1]
    return {"score": last, "acc": float(last == 1.0), "turns": float(extra_info.get("num_turns", 1))}
