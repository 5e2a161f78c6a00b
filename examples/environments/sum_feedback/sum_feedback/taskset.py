"""sum-feedback: "What is 7 + 10?"; an answer that is not the number alone gets a feedback turn.

The environment (SumFeedbackEnv) asks the question; when the reply is not exactly the sum it says
so, in one of two ways (the right number in other words, or a wrong one), and the model answers
again, up to `feedback_turns` times. The rubric scores the last reply: 1.0 for the number alone,
0.5 when the right number is the last one in other text, else 0 (`correct`); the metrics are the
first reply's score (`first_try`) and the model's turns (`turns`).

Tasks are every pair a, b in 0..max_operand, shuffled by `seed` (400 by default), so a held-out
share of them (`rlctl data prep --val-fraction`) is never trained on.
"""

from __future__ import annotations

import random
import re

import verifiers.v1 as vf

RIGHT_BUT_WORDY = "Right, but reply with the number only."
WRONG = "That is not the right sum. Try again, and reply with the number only."


def score(reply: str, answer: str) -> float:
    text = (reply or "").strip()
    if text == answer:
        return 1.0
    numbers = re.findall(r"-?\d+", text)
    return 0.5 if numbers and numbers[-1] == answer else 0.0


def feedback(reply: str, answer: str) -> str:
    return RIGHT_BUT_WORDY if score(reply, answer) > 0 else WRONG


class SumFeedbackData(vf.TaskData):
    answer: str = ""


class SumFeedbackTask(vf.Task[SumFeedbackData]):
    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        return score(trace.last_reply, self.data.answer)

    @vf.metric
    async def first_try(self, trace: vf.Trace) -> float:
        replies = trace.assistant_messages
        return score(replies[0].content or "", self.data.answer) if replies else 0.0

    @vf.metric
    async def turns(self, trace: vf.Trace) -> float:
        return float(len(trace.assistant_messages))


class SumFeedbackConfig(vf.TasksetConfig):
    num_tasks: int = 400
    """How many sums (at most (max_operand + 1) ** 2)."""
    max_operand: int = 19
    seed: int = 0
    """The shuffle of the pairs."""


class SumFeedbackEnvConfig(vf.EnvConfig):
    agent: vf.AgentConfig = vf.AgentConfig()
    feedback_turns: int = 1
    """Feedback turns after a reply that is not the number alone."""


class SumFeedbackEnv(vf.Env[SumFeedbackEnvConfig]):
    async def run(self, task, agents):
        async with agents.agent.interaction(task) as interaction:
            segment = await interaction.turn()
            for _ in range(self.config.feedback_turns):
                if segment.terminated or score(segment.last_reply, task.data.answer) == 1.0:
                    break
                segment = await interaction.turn(feedback(segment.last_reply, task.data.answer))


class SumFeedbackTaskset(vf.Taskset[SumFeedbackTask, SumFeedbackConfig]):
    def load(self) -> list[SumFeedbackTask]:
        top = self.config.max_operand
        pairs = [(a, b) for a in range(top + 1) for b in range(top + 1)]
        random.Random(self.config.seed).shuffle(pairs)
        return [SumFeedbackTask(SumFeedbackData(prompt=f"What is {a} + {b}?", answer=str(a + b), id=str(i)),
                                self.config.task)
                for i, (a, b) in enumerate(pairs[:self.config.num_tasks])]
