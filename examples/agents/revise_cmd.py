"""The `revise.py` agent as a separate process, for `rollout.agent.command = ["python", "revise_cmd.py"]`:
rlctl starts it once per episode with OPENAI_BASE_URL and OPENAI_API_KEY set (the official client reads
both) and the row as one JSON line on stdin; the last line it prints is the reward. An agent in
another language or with its own dependencies follows the same contract.
"""

import json
import re
import sys

from openai import OpenAI

FEEDBACK = "Now reply with the final number only."


def score(answer: str, truth: str) -> float:
    text = answer.strip()
    if text == truth:
        return 1.0
    numbers = re.findall(r"-?\d+", text)
    return 0.5 if numbers and numbers[-1] == truth else 0.0


def main() -> None:
    row = json.loads(sys.stdin.readline())
    truth = str(row["reward_model"]["ground_truth"]).strip()
    client = OpenAI(max_retries=0)   # OPENAI_BASE_URL / OPENAI_API_KEY from the environment
    messages = list(row["prompt"])
    draft = client.chat.completions.create(model="policy", messages=messages, max_tokens=16).choices[0].message.content
    messages += [{"role": "assistant", "content": draft or ""}, {"role": "user", "content": FEEDBACK}]
    answer = client.chat.completions.create(model="policy", messages=messages, max_tokens=16).choices[0].message.content
    print(json.dumps({"reward": score(answer or "", truth), "draft": score(draft or "", truth)}))


if __name__ == "__main__":
    main()
