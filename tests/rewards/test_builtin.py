"""Built-in rule rewards on hand-made responses (verl parity for GSM8K, MATH normalisation, arith shaping)."""

from __future__ import annotations

import pickle
import random

import pytest

from rlctl.errors import UsageError
from rlctl.rewards.builtin import default_compute_score, resolve_builtin
from rlctl.tasks import arith, gsm8k, math


# --- GSM8K: verl's strict "#### <number>" --------------------------------------------------------

@pytest.mark.parametrize("response, truth, expected", [
    ("She sold 48 + 24 = 72 clips.\n#### 72", "72", 1.0),
    ("#### 1,234", "1234", 1.0),                     # commas are dropped
    ("#### -5", "-5", 1.0),
    ("first #### 3, no wait #### 4", "4", 1.0),      # the last #### wins
    ("The answer is 72", "72", 0.0),                 # no #### at all
    ("####72", "72", 0.0),                           # strict: needs the space
    ("#### 71", "72", 0.0),
    ("#### 72." , "72", 0.0),                        # the trailing dot is captured, as in verl
])
def test_gsm8k_strict_extraction(response, truth, expected):
    assert default_compute_score("openai/gsm8k", response, truth)["score"] == expected


def test_gsm8k_only_reads_the_last_300_characters():
    early = "#### 72 " + "x" * 400
    assert gsm8k.extract_answer(early) is None
    assert gsm8k.extract_answer("x" * 400 + " #### 72") == "72"


def test_gsm8k_answer_lines_are_every_number_line_anywhere_as_written():
    text = "#### Step 1\n#### 3\n" + "x" * 400 + "\n#### 1,200\nThe answer is 1200."
    assert gsm8k.answer_lines(text) == ["3", "1,200"]      # a markdown heading is not an answer line


def test_gsm8k_format_score_only_for_a_wrong_but_well_formed_answer():
    wrong = default_compute_score("openai/gsm8k", "#### 7", "72", format_score=0.1)
    missing = default_compute_score("openai/gsm8k", "seven", "72", format_score=0.1)
    assert (wrong["score"], wrong["acc"]) == (0.1, 0.0)
    assert (missing["score"], missing["acc"]) == (0.0, 0.0)


# --- MATH: last \boxed{...} and string normalisation --------------------------------------------

@pytest.mark.parametrize("text, boxed", [
    ("so \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}"),
    ("\\boxed{x^{2}+\\sqrt{y_{1}}}", "x^{2}+\\sqrt{y_{1}}"),
    ("\\boxed{1} then \\boxed{2}", "2"),
    ("\\fbox{3}", None),                               # verl finds it but cannot unwrap it
    ("$\\boxed 5$", "5"),
    ("\\boxed{12", None),                            # truncated: braces never close
    ("no box here", None),
])
def test_verl_boxed(text, boxed):
    assert math.verl_boxed(text) == boxed


@pytest.mark.parametrize("prediction, truth", [
    ("\\dfrac12", "\\frac{1}{2}"),
    ("0.5", "\\frac{1}{2}"),
    ("1/2", "\\frac{1}{2}"),
    ("10\\%", "10"),
    ("90^\\circ", "90"),
    ("x = 5", "5"),
    ("\\left( 1, 2 \\right)", "(1,2)"),
    ("5 \\text{ cm}", "5"),
    ("\\sqrt2", "\\sqrt{2}"),
    ("\\$10", "10"),
    (".5", "0.5"),
])
def test_math_equivalent_forms(prediction, truth):
    assert math.is_equiv(prediction, truth)


@pytest.mark.parametrize("prediction, truth", [("\\frac{1}{3}", "\\frac{1}{2}"), ("2", "-2"), ("x+1", "x-1")])
def test_math_different_answers_stay_different(prediction, truth):
    assert not math.is_equiv(prediction, truth)


def test_math_score_and_format_score():
    right = default_compute_score("DigitalLearningGmbH/MATH-lighteval", "so \\boxed{\\dfrac{1}{2}}", "\\frac{1}{2}")
    wrong = default_compute_score("lighteval/MATH", "\\boxed{3}", "4", format_score=0.1)
    unboxed = default_compute_score("lighteval/MATH", "the answer is 4", "4", format_score=0.1)
    assert (right["score"], right["acc"]) == (1.0, 1.0)
    assert (wrong["score"], wrong["acc"]) == (0.1, 0.0)
    assert unboxed["score"] == 0.0


# --- arith: the shaped reward of the synthetic task ---------------------------------------------

@pytest.mark.parametrize("response, truth, expected", [
    ("35", "35", 1.0),
    (" 35\n", "35", 1.0),                       # surrounding whitespace is ignored
    ("34", "35", 0.2 + 0.2 + 0.4 * 0.5),        # digits, short, off by one
    ("25", "35", 0.2 + 0.2 + 0.4 / 11),         # off by ten
    ("3a", "35", 0.2 * 0.5 + 0.2),              # half digits, short, not a number
    ("abc", "35", 0.2),                         # no digits but short
    ("", "35", 0.0),
    ("the answer is 35", "35", 0.2 * 2 / 16 + 0.2 * 3 / 16),
])
def test_arith_shaped_reward(response, truth, expected):
    result = default_compute_score(arith.DATA_SOURCE, response, truth)
    assert result["score"] == pytest.approx(expected)
    assert result["acc"] == float(expected == 1.0)


def test_arith_reward_orders_the_steps_a_model_learns_through():
    """Rambling < short text < short digits < close number < exact: each step RL takes pays more."""
    steps = ["blah blah blah blah", "ab", "94", "36", "35"]
    scores = [arith.score(s, "35")["score"] for s in steps]
    assert scores == sorted(scores) and len(set(scores)) == len(scores)


def test_arith_reward_gives_random_bytes_a_varied_signal():
    """A random byte-level model's outputs (16 random bytes) must not all score the same, or GRPO
    has nothing to learn from; and their mean must sit far below a learned answer's."""
    rng = random.Random(0)
    outputs = [bytes(rng.randrange(256) for _ in range(16)).decode("utf-8", errors="replace") for _ in range(256)]
    scores = [arith.score(o, "35")["score"] for o in outputs]
    assert len(set(round(s, 6) for s in scores)) > 5
    assert 0.0 < sum(scores) / len(scores) < 0.2
    assert arith.score("35", "35")["score"] == 1.0


@pytest.mark.parametrize("response, truth, expected", [
    ("35", "35", 1.0),
    (" 35\n", "35", 1.0),
    ("34", "35", 0.0),                          # a near miss earns nothing (shaped arith: 0.6)
    ("035", "35", 0.0),
    ("", "35", 0.0),
])
def test_arith_exact_is_all_or_nothing(response, truth, expected):
    result = resolve_builtin("arith_exact")(arith.DATA_SOURCE, response, truth)
    assert result == {"score": expected, "acc": expected}


@pytest.mark.parametrize("response, truth, score, number", [
    ("17", "17", 1.0, 1.0),
    (" 17\n", "17", 1.0, 1.0),
    ("7 + 10 = 17", "17", 0.5 * 2 / 11, 1.0),   # the right sum in more text: less the more text
    ("17.", "17", 0.5 * 2 / 3, 1.0),
    ("The answer is 17, not 16", "17", 0.0, 0.0),   # the last integer decides
    ("7 + 10 = 18", "17", 0.0, 0.0),
    ("170", "17", 0.0, 0.0),
    ("", "17", 0.0, 0.0),
])
def test_arith_answer_pays_the_right_number_less_the_more_text_is_around_it(response, truth, score, number):
    result = resolve_builtin("arith_answer")(arith.DATA_SOURCE, response, truth)
    assert result == {"score": pytest.approx(score), "acc": float(score == 1.0), "number": number}


def test_arith_rows_keep_the_shaped_reward_by_default():
    """arith_exact is chosen by name only: rlctl/arith rows still get partial credit."""
    assert default_compute_score(arith.DATA_SOURCE, "34", "35")["score"] > 0.0


# --- dispatch ------------------------------------------------------------------------------------

def test_unknown_data_source_names_the_source_and_the_fix():
    with pytest.raises(UsageError) as err:
        default_compute_score("my/dataset", "x", "y")
    assert "'my/dataset'" in str(err.value) and "reward.function" in str(err.value)
    assert err.value.exit_code == 2


def test_resolve_builtin_by_name():
    assert resolve_builtin("gsm8k") is gsm8k.compute_score
    assert resolve_builtin("math")("any", "\\boxed{4}", "4")["score"] == 1.0
    with pytest.raises(UsageError, match="gsm8k, math, math_verify, arith"):
        resolve_builtin("gsm9k")


def test_scorers_survive_pickling_for_a_process_pool():
    fn = pickle.loads(pickle.dumps(default_compute_score))
    assert fn("openai/gsm8k", "#### 3", "3")["score"] == 1.0
    err = pickle.loads(pickle.dumps(UsageError("no built-in reward", hint="set reward.function")))
    assert "reward.function" in str(err)
