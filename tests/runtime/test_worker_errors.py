"""A worker's exception reaches the user in one line with its real message, even one that Ray cannot
pickle (tests/runtime/test_worker_group.py runs it through real Ray actors): pydantic's
ValidationError, which vLLM raises for an invalid engine config, keeps its unpicklable input
(`ArgsKwargs`) and says what is wrong only after its first line."""

from __future__ import annotations

import pickle

import pytest

from rlctl.runtime.failures import UnpicklableWorkerError, one_line, portable

REASON = "Model architectures ['Qwen2ForCausalLM'] failed to be inspected. Please check the logs for more details."


def _validation_error() -> Exception:
    """The error vLLM 0.32's ModelConfig (a pydantic dataclass) raised on a fresh machine."""
    pydantic = pytest.importorskip("pydantic")

    @pydantic.dataclasses.dataclass
    class ModelConfig:
        model: str

        def __post_init__(self):
            raise ValueError(REASON)

    try:
        ModelConfig(model="models/tiny64")
    except Exception as err:  # noqa: BLE001 - the error itself is the subject
        return err
    raise AssertionError("no error")


def test_a_pydantic_validation_error_is_its_title_and_each_message():
    err = _validation_error()
    assert str(err).splitlines()[0] == "1 validation error for ModelConfig"   # all a first line would say
    assert one_line(err) == f"ModelConfig: Value error, {REASON}"


def test_an_exception_pickle_cannot_carry_becomes_its_name_and_one_line():
    err = _validation_error()
    with pytest.raises(TypeError, match="cannot pickle"):
        pickle.dumps(err)
    carried = portable(err)
    assert isinstance(carried, UnpicklableWorkerError)
    assert (carried.name, str(carried)) == ("ValidationError", f"ModelConfig: Value error, {REASON}")
    back = pickle.loads(pickle.dumps(carried))   # what Ray does with it
    assert (back.name, back.message) == (carried.name, carried.message)


def test_an_exception_that_pickles_is_left_as_it_is():
    err = ValueError("boom\nsecond line")
    assert portable(err) is err and one_line(err) == "boom"
