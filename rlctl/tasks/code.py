"""The `code` task: coding problems with stdin/stdout test cases, run in the sandbox to score.

Prep (`rlctl data prep code --source FILE`) reads your problems, one question and its test cases
per record. `code-synthetic` generates tiny ones offline and seeded: a one-line program over two
integers read from one input line (their sum, difference, product, maximum or minimum, plus a
constant), three test cases each. The shortest right answer is about 40 bytes, so a tiny model's
responses fit in a short response length; with `reward.format_score` a program that runs but
prints the wrong thing earns partial credit.

Ground truth is verl's format for its code sources (codecontests, apps, taco, codeforces): a
JSON string `{"inputs": [stdin, ...], "outputs": [expected stdout, ...]}`. The response's last
fenced Python block runs once per case, each in a fresh sandbox (rlctl.sandbox).

    score     = 1.0 when every case passes, else 0.0
    pass_rate = passed cases / cases
    fail_<status> = 1.0 for the first failing case's status (no_code, wrong_answer, error,
                    timeout, memory, output_limit), 0.0 for the others, so their means are
                    the shares of samples that failed that way.

A `sandbox_error` (the sandbox itself failed: bwrap could not start, SandboxFusion unreachable)
says nothing about the program, so it is no score: `SandboxFailure` is raised and the reward
runner treats it as that sample's error under `reward.on_error` ("fail" stops the run, exit 5;
"zero" scores it 0 and counts it in reward/errors).

With `reward.format_score`, a program that runs cleanly but prints a wrong answer scores that
instead of 0. For rlctl's own `rlctl/code` source a response without a fence is run whole (so a
tiny model's bare `print(...)` counts).

verl's four sources are scored as verl 0.9.1's `prime_code` scores them (continuous, as its
`default_compute_score` asks): the program is what follows the last ```` ```python ```` up to the next
```` ``` ```` (the response up to its first ```` ``` ```` when it has no ```` ```python ````), and `score` is
1.0 when every case passes, else the share of the first 10 cases that pass (those 10 all run, a
timeout too); `format_score` is not used there (verl has none).

An output matches when its whitespace-separated tokens equal the expected ones, line by line
(trailing spaces and blank lines do not matter, as with most contest judges). After a case runs
out of time or memory the remaining cases are not run (they count as failed): ten timeouts in a
row would only make the reward the step's bottleneck.
"""

from __future__ import annotations

import json
import random
import re

from rlctl.data.sources import FileSource, Generated, PrepSource, RowError, rule_row

DATA_SOURCE = "rlctl/code"
DATA_SOURCES = ("codecontests", "apps", "taco", "codeforces", DATA_SOURCE)  # verl's code sources + ours
INSTRUCTION = ("Write a Python program that reads standard input and writes standard output; "
               "put it in a ```python block.")
FAIL_STATUSES = ("no_code", "wrong_answer", "error", "timeout", "memory", "output_limit")
STOP_AFTER = ("timeout", "memory")
VERL_SOURCES = DATA_SOURCES[:4]
VERL_PARTIAL_CASES = 10   # verl's continuous score: the share of the first 10 cases passed


class SandboxFailure(RuntimeError):
    """The sandbox could not run the program: the sample has no score (see the module docstring)."""


_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


def extract_code(solution_str: str) -> str | None:
    """The last fenced ```python (or unlabelled) block of a response, or None."""
    blocks = _FENCE.findall(solution_str)
    return blocks[-1] if blocks else None


def verl_program(solution_str: str) -> str:
    """The program verl's prime_code runs: after the last ```python, up to the next ```."""
    return solution_str.split("```python")[-1].split("```")[0]


def parse_cases(ground_truth) -> list[tuple[str, str]]:
    """[(stdin, expected stdout)] from verl's JSON (a string or an already-parsed dict).

    Raises ValueError saying what is wrong: the runner turns it into that sample's error."""
    data = json.loads(ground_truth) if isinstance(ground_truth, (str, bytes)) else ground_truth
    if not isinstance(data, dict) or "inputs" not in data or "outputs" not in data:
        raise ValueError('code ground truth must be JSON {"inputs": [...], "outputs": [...]}')
    if data.get("fn_name"):
        raise ValueError("call-based test cases (fn_name) are not supported; use stdin/stdout cases")
    inputs, outputs = data["inputs"], data["outputs"]
    if not isinstance(inputs, list) or not isinstance(outputs, list) or len(inputs) != len(outputs) or not inputs:
        raise ValueError(f"code ground truth needs equally long, non-empty inputs and outputs lists "
                         f"(got {_length(inputs)} and {_length(outputs)})")
    return [(_text(i), _text(o)) for i, o in zip(inputs, outputs)]


def outputs_match(actual: str, expected: str) -> bool:
    return _tokens(actual) == _tokens(expected)


def score(solution_str: str, ground_truth, *, format_score: float = 0.0, bare_program: bool = False,
          limits=None, sandbox_url: str = "", verl: bool = False) -> dict:
    """Run the response's program on every case; see the module docstring for the keys.

    `bare_program`: with no fenced block, run the whole response (rlctl's own source only).
    `format_score`: the score of a program that runs cleanly but prints a wrong answer.
    `sandbox_url`: run the cases on that SandboxFusion service instead of the local sandbox.
    `verl`: verl's program and continuous score (see the module docstring)."""
    from functools import partial

    from rlctl.sandbox import Limits, run as run_here
    from rlctl.sandbox.remote import run_remote

    run = partial(run_remote, sandbox_url) if sandbox_url else run_here

    cases = parse_cases(ground_truth)
    code = verl_program(solution_str) if verl else extract_code(solution_str)
    if code is None and bare_program and solution_str.strip():
        code = solution_str
    if code is None:
        return _result(0, len(cases), "no_code")
    passed, head, first_fail = 0, 0, None
    for index, (stdin, expected) in enumerate(cases):
        if verl and first_fail is not None and index >= VERL_PARTIAL_CASES:
            break   # the score reads only the first 10 once one has failed
        result = run(code, stdin, limits=limits or Limits())
        status = result.status
        if status == "sandbox_error":
            raise SandboxFailure(f"the sandbox failed, not the program: {result.stderr.strip()[:200]}")
        if status == "ok" and not outputs_match(result.stdout, expected):
            status = "wrong_answer"
        if status == "ok":
            passed += 1
            head += index < VERL_PARTIAL_CASES
            continue
        first_fail = first_fail or status
        if status in STOP_AFTER and not (verl and index < VERL_PARTIAL_CASES - 1):
            break
    out = _result(passed, len(cases), first_fail, format_score)
    if verl and first_fail is not None:
        out["score"] = head / min(len(cases), VERL_PARTIAL_CASES)
    return out


def _result(passed: int, total: int, first_fail: str | None, format_score: float = 0.0) -> dict:
    right = first_fail is None
    out = {"score": 1.0 if right else (format_score if first_fail == "wrong_answer" else 0.0),
           "acc": float(right), "pass_rate": passed / total}
    out.update({f"fail_{s}": float(s == first_fail) for s in FAIL_STATUSES})
    return out


def _tokens(text: str) -> list[list[str]]:
    lines = [line.split() for line in text.strip().splitlines()]
    return [line for line in lines if line]


def _text(value) -> str:
    if isinstance(value, list):  # some datasets store a case as a list of lines
        return "\n".join(map(str, value)) + "\n"
    return str(value)


def _length(value) -> str:
    return str(len(value)) if isinstance(value, list) else type(value).__name__


# --- code-synthetic: offline problems (see the module docstring) ------------------------------
OPERATIONS = {"sum": lambda a, b: a + b, "difference": lambda a, b: a - b, "product": lambda a, b: a * b,
              "maximum": max, "minimum": min}
OFFSETS = range(20)
CASES = 3
DEFAULT_VAL_FRACTION = 0.1
SYNTHETIC_INSTRUCTION = "Reply with a Python program in a ```python block."


def synthetic_question(operation: str, offset: int) -> str:
    plus = f" plus {offset}" if offset else ""
    return (f"Read two integers a and b from one line of standard input and print their {operation}{plus}. "
            f"{SYNTHETIC_INSTRUCTION}")


def _synthetic_cases(rng: random.Random, operation: str, offset: int) -> str:
    pairs = [(rng.randint(-50, 50), rng.randint(-50, 50)) for _ in range(CASES)]
    return json.dumps({"inputs": [f"{a} {b}\n" for a, b in pairs],
                       "outputs": [f"{OPERATIONS[operation](a, b) + offset}\n" for a, b in pairs]})


def _synthetic_row(operation: str, offset: int, truth: str, split: str, index: int) -> dict:
    text = synthetic_question(operation, offset)
    return rule_row(DATA_SOURCE, [{"role": "user", "content": text}], "code", truth, split, index,
                    question=text, answer=truth)


def generate_synthetic(seed: int, val_fraction: float = DEFAULT_VAL_FRACTION) -> dict[str, list[dict]]:
    """code-synthetic's {"train": rows, "test": rows}: every (operation, offset) once, test = val_fraction."""
    rng = random.Random(seed)
    problems = [(op, k, _synthetic_cases(rng, op, k)) for op in OPERATIONS for k in OFFSETS]
    rng.shuffle(problems)
    n_test = round(len(problems) * val_fraction)
    splits = {"train": problems[n_test:], "test": problems[:n_test]}
    return {split: [_synthetic_row(op, k, truth, split, i) for i, (op, k, truth) in enumerate(chosen)]
            for split, chosen in splits.items() if chosen}


def compute_score(data_source, solution_str, ground_truth, extra_info=None, *, format_score=0.0,
                  sandbox_url="") -> dict:
    """1.0 when the program passes every stdin/stdout case in the sandbox (rlctl's own, or the
    SandboxFusion service at `sandbox_url`); verl's sources: verl's program and partial score."""
    verl = data_source in VERL_SOURCES
    return score(solution_str, ground_truth, format_score=0.0 if verl else format_score,
                 bare_program=data_source == DATA_SOURCE, sandbox_url=sandbox_url, verl=verl)


def _ground_truth(answer) -> str:
    """verl's code ground truth: a JSON string {"inputs": [...], "outputs": [...]}, checked now."""
    try:
        data = json.loads(answer) if isinstance(answer, str) else answer
        parse_cases(data)
    except ValueError as e:  # json.JSONDecodeError is a ValueError
        raise RowError("bad tests", str(e).splitlines()[0][:200]) from None
    return json.dumps(data)


REWARDS = {"code": compute_score}
_NO_SFT = "rows hold test cases, not a reference solution to imitate"
PREP = (
    PrepSource("code", FileSource("code", DATA_SOURCE, "code", "question", "tests", _ground_truth, INSTRUCTION,
                                  suffixes=(".jsonl", ".json", ".parquet"), structured_answer=True),
               help="your coding problems: question + tests per row", no_sft=_NO_SFT,
               needs_source=("rlctl data prep code needs --source FILE.jsonl (question + tests per line)",
                             "or try the offline task: rlctl data prep code-synthetic.")),
    PrepSource("code-synthetic", Generated(DATA_SOURCE, generate_synthetic, DEFAULT_VAL_FRACTION),
               help="offline coding task", no_sft=_NO_SFT),
)
