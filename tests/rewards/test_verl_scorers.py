"""Every data_source verl 0.9.1's default_compute_score dispatches scores here as it does there.

Expected values are verl's behaviour (its scorers' rules as their docstrings and the papers state
them: Minerva's normalisation and DAPO's +1/-1 for math_dapo, Hendrycks' MATH equivalence,
PRM800K's and ToRA's graders for PRIME, SQuAD exact match for Search-R1), checked case by case
against verl 0.9.1's own functions while this was written.
"""

from __future__ import annotations

import json

import pytest

from rlctl.rewards.builtin import default_compute_score, resolve_builtin, scorer_for_source
from rlctl.tasks import math, math_dapo, prime_math, search_r1

VERL_SOURCES = {
    "openai/gsm8k": "gsm8k", "lighteval/MATH": "math", "DigitalLearningGmbH/MATH-lighteval": "math",
    "HuggingFaceH4/MATH-500": "math", "math_dapo": "math_dapo", "math": "math_dapo", "math_dapo_reasoning": "math_dapo",
    "aime24": "math_dapo", "aime2025": "math_dapo", "aime": "math_dapo",
    **{f"numina_{s}": "prime_math" for s in ("aops_forum", "synthetic_math", "amc_aime", "synthetic_amc", "cn_k12",
                                              "olympiads")},
    "codecontests": "code", "apps": "code", "codeforces": "code", "taco": "code", "hiyouga/geometry3k": "geo3k",
    **{f"searchR1_{s}": "search_r1" for s in ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique",
                                               "bamboogle")},
}


@pytest.mark.parametrize("data_source, builtin", VERL_SOURCES.items())
def test_every_verl_data_source_has_its_scorer(data_source, builtin):
    assert scorer_for_source(data_source) is resolve_builtin(builtin)


# --- math_dapo (DAPO-Math-17k, AIME): Answer: line first, then the strict box; +1 / -1 -----------------

@pytest.mark.parametrize("response, truth, score", [
    ("Let me think.\nAnswer: 204", "204", 1.0),
    ("answer : 204", "204", 1.0),                          # any case, spaces around the colon
    ("Answer: 1,000", "1000", 1.0),                        # thousands commas of a plain number
    ("Answer: x = 5", "5", 1.0),                           # the text after the last '='
    ("Answer: $\\frac12$", "\\frac{1}{2}", 1.0),           # \frac12 braced, dollars dropped
    ("Answer: \\dfrac{1}{2}", "\\frac{1}{2}", 0.0 - 1.0),  # Minerva does not turn \dfrac into \frac
    ("Answer: 5 degrees", "5", 1.0),                       # units dropped
    ("Answer: \\boxed{7}", "7", 1.0),                      # a box inside the answer line
    ("Answer: 3\nAnswer: 4", "4", 1.0),                    # the last line wins
    ("Answer: 3\nAnswer: 4", "3", -1.0),
    ("Answer: 205", "204", -1.0),
    ("so the result is \\boxed{204}.", "204", 1.0),        # no Answer: line: the last box, as written
    ("\\boxed{204.0}", "204", -1.0),                       # the box is compared exactly
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}", 1.0),
    ("\\boxed{ 204}", "204", -1.0),
    ("\\boxed{204" , "204", -1.0),                         # never closed
    ("the answer is 204", "204", -1.0),                    # neither form
    ("", "204", -1.0),
    ("Answer: 204" + "x" * 300, "204", -1.0),              # only the last 300 characters are read
    ("\\boxed{204}" + " " * 95, "204", -1.0),              # the box must sit in the last 100
])
def test_math_dapo(response, truth, score):
    result = default_compute_score("math_dapo", response, truth)
    assert result == {"score": score, "acc": float(score == 1.0)}
    assert default_compute_score("aime24", response, truth) == result


def test_math_dapo_strict_box_reads_only_the_box():
    strict = resolve_builtin("math_dapo_strict_box")
    assert strict("math_dapo", "Answer: 5", "5")["score"] == -1.0
    assert strict("math_dapo", "Answer: 4\n\\boxed{5}", "5")["score"] == 1.0


@pytest.mark.parametrize("raw, normalized", [
    ("x = \\frac12 \\text{ cm}", "\\frac{1}{2}"), ("\\sqrt3", "\\sqrt{3}"), ("1,234,567", "1234567"),
    ("(1,2)", "(1,2)"), ("\\text{(A)}", "(A)"), ("10 \\text{ inches}", "10"), ("$5$ ways", "5"),
])
def test_minerva_normalisation(raw, normalized):
    assert math_dapo.normalize_final_answer(raw) == normalized


def test_dapo_prompt_round_trip():
    prompt = math_dapo.dapo_prompt("What is 1+1?")
    assert prompt.startswith("Solve the following math problem step by step.") and prompt.endswith('after "Answer:".')
    assert math_dapo.problem_of(prompt) == "What is 1+1?"


# --- math (MATH-lighteval, MATH-500): the last box, Hendrycks equivalence; 1 / 0 -------------------------------

@pytest.mark.parametrize("response, truth, score", [
    ("so \\boxed{\\dfrac{1}{2}}", "\\frac{1}{2}", 1.0),
    ("\\boxed{0.5}", "\\frac12", 1.0),
    ("\\boxed{3/4}", "\\frac{3}{4}", 1.0),
    ("\\boxed{03/4}", "\\frac{3}{4}", 0.0),                # not a plainly written integer ratio
    ("\\boxed{10\\%}", "10", 1.0),
    ("\\boxed{5 \\text{ cm}}", "5", 1.0),
    ("\\boxed{$5$}", "5", 0.0),                            # plain dollars stay (only \$ is dropped)
    ("\\boxed{\\$5}", "5", 1.0),
    ("$\\boxed 7$", "7", 1.0),                             # the space form runs to the dollar
    ("\\fbox{7}", "7", 0.0),                               # verl finds the \fbox but cannot unwrap it
    ("\\boxed{1} then \\boxed{2}", "2", 1.0),
    ("\\boxed{2", "2", 0.0),
    ("Answer: 2", "2", 0.0),                               # no box, no score
    ("\\boxed{1 \\text{ m} \\text{ s}}", "1 \\text{ m} \\text{ s}", 1.0),  # two units: equal as written
    ("\\boxed{\\frac}", "\\frac", 1.0),
])
def test_math_reward(response, truth, score):
    assert default_compute_score("HuggingFaceH4/MATH-500", response, truth) == {"score": score, "acc": score}


def test_math_normalize_fails_as_hendrycks_does():
    with pytest.raises(ValueError):
        math.normalize("1 \\text{ m} \\text{ s}")
    with pytest.raises(IndexError):
        math.normalize("\\sqrt")


# --- prime_math (numina_*): loose reading, PRM800K then ToRA graders; 1 / 0 ---------------------------------

@pytest.mark.parametrize("response, truth, score", [
    ("The answer is \\boxed{\\frac{1}{2}}", "0.5", 1.0),
    ("The answer is \\boxed{x^2+2x+1}", "(x+1)^2", 1.0),    # sympy: the difference simplifies to 0
    ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}", 1.0),
    ("so the answer is 5.", "5", 1.0),                     # unboxed: after "answer is"
    ("we get x = 3", "3", 1.0),
    ("Answer: 1,234", "1234", 1.0),
    ("The answer is 7 3/4", "31/4", 1.0),                  # a mixed number
    ("\\boxed{50\\%}", "0.5", 1.0),                        # a percentage either way
    ("\\boxed{2\\pi}", "6.283", 1.0),
    ("\\boxed{(-\\infty, 2]}", "(-\\infty,2]", 1.0),
    ("\\boxed{1011_2}", "1011", 1.0),                      # a base subscript
    ("\\boxed{\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}}", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", 1.0),
    ("final: \\fbox{7}", "7", 1.0),
    ("\\boxed{3/6}", "1/2", 0.0),                          # an unreduced fraction is not the answer
    ("\\boxed{[1, 2)}", "(1,2)", 0.0),                     # brackets matter
    ("\\boxed{2, 3}", "3, 2", 0.0),
    ("\\boxed{a+b+c}", "c+b+a", 0.0),                      # three unknowns never go to sympy
    ("\\boxed{2 million}", "2000000", 0.0),
    ("no answer here", "4", 0.0),
    ("\\boxed{", "4", 0.0),
    ("", "4", 0.0),
    ("\\boxed{__import__('os')}", "1", 0.0),
])
def test_prime_math(response, truth, score):
    assert default_compute_score("numina_olympiads", response, truth) == {"score": score, "acc": score}


def test_prime_math_reads_the_answer_loosely():
    assert prime_math.match_answer("Thus $x=\\boxed{12}$ is the answer.") == (True, "12")
    assert prime_math.match_answer("no digits here") == (False, "no digits here")


# --- search_r1 (searchR1_*): exact match on the last <answer> ----------------------------------------------

@pytest.mark.parametrize("response, truth, score, acc", [
    ("<answer>Paris</answer>", {"target": ["Paris"]}, 1.0, 1.0),
    ("<answer> the paris! </answer>", {"target": ["Paris", "Lyon"]}, 1.0, 1.0),   # SQuAD normalisation
    ("<answer>Lyon</answer> no, <answer>Paris</answer>", {"target": ["Paris"]}, 1.0, 1.0),
    ("<answer>Paris, France</answer>", {"target": ["Paris"]}, 0.0, 0.0),
    ("Paris", {"target": ["Paris"]}, 0.0, 0.0),
    ("<answer>Paris" , {"target": ["Paris"]}, 0.0, 0.0),
    ("<answer>x</answer>" * 11 + "<answer>Paris</answer>", {"target": ["Paris"]}, 0.25, 1.0),  # tag flooding
])
def test_search_r1(response, truth, score, acc):
    for written in (truth, json.dumps(truth), truth["target"]):
        assert default_compute_score("searchR1_nq", response, written) == {"score": score, "acc": acc}


def test_search_r1_format_score_for_a_wrong_answer():
    assert search_r1.score("<answer>Lyon</answer>", "Paris", format_score=0.1) == {"score": 0.1, "acc": 0.0}


def test_search_r1_rows_with_verl_struct_ground_truth_load_and_score(tmp_path, tiny_model_dir):
    """verl's Search-R1 preprocessing writes reward_model.ground_truth as a struct {target: [...]}: the
    file passes the schema and its rows reach the reward with the dict, as verl's reward managers pass it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rlctl.controller.prompts import read_rows, render_prompts
    from rlctl.models.loading import load_tokenizer

    rows = [{"data_source": "searchR1_nq", "prompt": [{"role": "user", "content": "Who wrote Hamlet?"}],
             "ability": "fact-reasoning",
             "reward_model": {"style": "rule", "ground_truth": {"target": ["William Shakespeare", "Shakespeare"]}},
             "extra_info": {"split": "train", "index": 0}}]
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    prompts = render_prompts(read_rows([path]), load_tokenizer(tiny_model_dir), 256, "error")
    truth = prompts.rows[0].ground_truth
    assert truth == {"target": ["William Shakespeare", "Shakespeare"]}
    assert default_compute_score("searchR1_nq", "<answer>shakespeare</answer>", truth)["score"] == 1.0
    assert default_compute_score("searchR1_nq", "<answer>Marlowe</answer>", str(truth))["score"] == 0.0
    assert default_compute_score("searchR1_nq", "<answer>Shakespeare.</answer>", str(truth))["score"] == 1.0


# --- math_verify (verl's optional MATH grader, reward.function = "math_verify") ----------------------

@pytest.mark.parametrize("response, truth, score", [
    ("so \\boxed{\\frac{1}{2}}", "0.5", 1.0),
    ("The answer is $x^2+2x+1$", "(x+1)^2", 1.0),        # symbolic, unboxed LaTeX
    ("$\\sqrt{8}$", "2\\sqrt{2}", 1.0),
    ("\\boxed{\\pi/2}", "\\frac{\\pi}{2}", 1.0),
    ("\\boxed{2, 3}", "3, 2", 1.0),                       # Math-Verify compares sets of answers as sets
    ("\\boxed{3}", "4", 0.0),
    ("no number here", "4", 0.0),
    ("\\boxed{", "1", 0.0),
])
def test_math_verify(response, truth, score):
    pytest.importorskip("math_verify", reason='reward.function = "math_verify" needs rlctl[math] (the test extra has it)')
    assert resolve_builtin("math_verify")("lighteval/MATH", response, truth) == {"score": score, "acc": score}


# --- geo3k (hiyouga/geometry3k): 0.9 x mathruler's grade of the last box + 0.1 x format ------------------

@pytest.mark.parametrize("response, truth, score", [
    ("<think>r</think> so \\boxed{60}", "60", 1.0),
    ("\\boxed{\\sqrt{12}}", "2\\sqrt{3}", 0.9),          # sympy: equal
    ("\\boxed{2 \\sqrt 3}", "2\\sqrt{3}", 0.9),
    ("\\boxed{12 cm}", "12", 0.9),                        # units dropped
    ("\\boxed{5.0}", "5", 0.9),
    ("\\boxed{\\frac{10}{20}}", "\\frac{1}{2}", 0.0),     # an unreduced fraction is not the answer
    ("\\boxed{3.46}", "2\\sqrt{3}", 0.0),
    ("<think>r</think> \\boxed{61}", "60", 0.1),          # format only
    ("\\fbox{5}", "5", 0.0),
])
def test_geo3k(response, truth, score):
    assert default_compute_score("hiyouga/geometry3k", response, truth)["score"] == pytest.approx(score)


def test_prime_math_grading_past_its_budget_is_wrong(monkeypatch):
    monkeypatch.setattr(prime_math, "GRADE_BUDGET_S", 0.05)

    def slow(*_):
        import time
        time.sleep(1.0)
        return True

    monkeypatch.setattr(prime_math, "is_correct", slow)
    assert prime_math.compute_score("numina_olympiads", "\\boxed{1}", "1") == {"score": 0.0, "acc": 0.0}
