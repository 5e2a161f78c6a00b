"""An agent program for `rollout.agent.function = "revise.py:run"`: two calls per episode with the
official `openai` client, the model's answer and then its revision after feedback.

The episode: the row's question goes to the model; its draft comes back with a request to give only
the final number; the revision is scored against the row's ground truth. Both calls train as one
sequence (the second call's prompt continues the first call's tokens), the feedback turn masked out.
It is the agent of the `grpo-agent-smollm2-cpu` recipe, and nothing in it is specific to rlctl: point
`client` at any OpenAI-compatible server and it runs the same.
"""

import re

FEEDBACK = "Now reply with the final number only."


def score(answer: str, truth: str) -> float:
    """1.0 for the number alone, 0.5 when it is the last number inside other text, else 0."""
    text = answer.strip()
    if text == truth:
        return 1.0
    numbers = re.findall(r"-?\d+", text)
    return 0.5 if numbers and numbers[-1] == truth else 0.0


async def run(client, row):
    truth = str(row["reward_model"]["ground_truth"]).strip()
    messages = [dict(m) for m in row["prompt"]]
    first = await client.chat.completions.create(model="policy", messages=messages, max_tokens=16)
    draft = first.choices[0].message.content or ""
    messages += [{"role": "assistant", "content": draft}, {"role": "user", "content": FEEDBACK}]
    second = await client.chat.completions.create(model="policy", messages=messages, max_tokens=16)
    answer = second.choices[0].message.content or ""
    return {"reward": score(answer, truth), "draft": score(draft, truth)}
