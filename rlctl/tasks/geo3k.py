"""Geometry3K (vision): a figure and a question, prepared as verl's examples/data_preprocess/geo3k.py
does, scored as verl's geo3k reward.

Source layout (the hub's hiyouga/geometry3k, which verl's example reads, or a local copy of it):
`data/{train,validation,test}-*.parquet` with `problem` (text holding one `<image>` marker per
image), `answer` and `images` (a list of Hugging Face image structs {bytes, path}). A row: the
problem, a space and INSTRUCTION as the user message, the images unchanged (a path's file read in),
ground truth = the answer, data_source "hiyouga/geometry3k", ability "math".

Reward (verl's geo3k): 0.9 x accuracy + 0.1 x format, accuracy = the last `\\boxed{}` equals the
answer by mathruler's grader (the package verl's geo3k reward uses: PRM800K's normalisation, then
sympy, so `\\sqrt{12}` is `2\\sqrt{3}`), format = `<think>...</think>` then a box.
"""

from __future__ import annotations

import re

from rlctl.data.sources import FileSource, PrepSource

DATA_SOURCE = "hiyouga/geometry3k"
DATA_SOURCES = (DATA_SOURCE,)
INSTRUCTION = ("You FIRST think about the reasoning process as an internal monologue and then provide the final "
               "answer. The reasoning process MUST BE enclosed within <think> </think> tags. The final answer MUST "
               "BE put in \\boxed{}.")
_FORMAT = re.compile(r"<think>.*</think>.*\\boxed\{.*\}.*", re.DOTALL)


def score(solution_str: str, ground_truth: str) -> dict:
    from mathruler.grader import extract_boxed_content, grade_answer

    correct = bool(grade_answer(extract_boxed_content(solution_str), str(ground_truth)))
    formatted = bool(_FORMAT.fullmatch(solution_str.strip()))
    return {"score": 0.9 * correct + 0.1 * formatted, "acc": float(correct), "format": float(formatted)}


def compute_score(data_source, solution_str, ground_truth, extra_info=None, *, format_score=0.0, **_) -> dict:
    """verl's geo3k reward (format_score unused: the format share is fixed at 0.1)."""
    return score(solution_str, ground_truth)


def _ground_truth(answer: str) -> str:
    return answer.strip()


REWARDS = {"geo3k": compute_score}
PREP = (PrepSource("geo3k", FileSource("geo3k", DATA_SOURCE, "math", "problem", "answer", _ground_truth, INSTRUCTION,
                                       hub_id=DATA_SOURCE, hub_patterns=("data/*.parquet",), image_col="images"),
                   help="Geometry3K figures and questions (vision; --source a local copy of hiyouga/geometry3k)",
                   no_sft="has no worked solutions, only final answers (and SFT of vision-language models is not "
                          "built)"),)
