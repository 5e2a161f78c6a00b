"""The built-in calculator: exact arithmetic on what a model writes, and a text error for anything else."""

from __future__ import annotations

import pytest

from rlctl.multiturn.builtin_tools import calculator


@pytest.mark.parametrize("expression, expected", [
    ("4821 * 37", "178377"),
    ("62581 + 45247", "107828"),
    ("  (2 + 3) * -4 ", "-20"),
    ("1,234 + 5", "1239"),                      # thousands separators are read as part of the number
    ("6 / 3", "2"),                             # a whole quotient prints without ".0"
    ("1 / 3", "0.333333333333"),
    ("17 // 5", "3"), ("17 % 5", "2"), ("2 ** 10", "1024"),
    ("123456789 * 987654321", str(123456789 * 987654321)),  # exact big integers, no float rounding
])
def test_arithmetic_is_exact(expression, expected):
    assert calculator(expression) == expected


@pytest.mark.parametrize("expression, why", [
    ('__import__("os").system("true")', "only numbers"),
    ("abs(-3)", "only numbers"),
    ("x + 1", "only numbers"),
    ("[1]", "only numbers"),
    ("'a' * 3", "only numbers"),
    ("True + 1", "only numbers"),
    ("(lambda: 1)()", "only numbers"),
    ("1; 2", "not an arithmetic expression"),
    ("3 +", "not an arithmetic expression"),
    ("", "empty expression"),
    ("1 / 0", "division by zero"),
    ("9 ** 9 ** 9", "exponent"),                # would take the process down if evaluated
    ("10 ** 64 * 10 ** 64", "more than 100 digits"),
    ("1e308 * 10", "not a finite number"),
    ("(-8) ** 0.5", "not a real number"),
    ("1 + " * 60 + "1", "longer than 200"),
])
def test_anything_but_arithmetic_is_refused_as_text(expression, why):
    answer = calculator(expression)
    assert answer.startswith("error: ") and why in answer


def test_non_string_input_is_an_error_not_a_crash():
    assert calculator(12).startswith("error: expression must be a string")


def test_the_schema_comes_from_the_signature_and_docstring():
    from transformers.utils import get_json_schema

    function = get_json_schema(calculator)["function"]
    assert function["name"] == "calculator"
    assert function["parameters"]["required"] == ["expression"]
    assert function["parameters"]["properties"]["expression"]["type"] == "string"
    assert "4821 * 37" in function["parameters"]["properties"]["expression"]["description"]


def test_the_builtins_table_is_the_schemas_list():
    """config.schema keeps its own copy (config imports nothing of multiturn): the same names, in
    the same order, since messages list them."""
    from rlctl.config.schema import BUILTIN_TOOLS
    from rlctl.multiturn.builtin_tools import BUILTINS

    assert tuple(BUILTINS) == BUILTIN_TOOLS


def test_every_builtin_loads_as_a_tool_of_its_name(tmp_path):
    from rlctl.multiturn.builtin_tools import BUILTINS
    from rlctl.multiturn.tools import load_tools

    assert [tool.name for tool in load_tools(list(BUILTINS), tmp_path)] == list(BUILTINS)


def test_a_name_outside_the_table_is_a_config_error_not_the_python_tool(tmp_path):
    from rlctl.errors import ConfigError
    from rlctl.multiturn.tools import make_tool

    with pytest.raises(ConfigError, match="unknown tool 'search'") as err:
        make_tool("search", tmp_path)
    assert "calculator, python" in err.value.hint
