"""Token-in-token-out bookkeeping of one conversation, turn by turn, with the real tools and interactions.

The model's turns here are token ids chosen by the test (what a policy could sample), fed through
the same methods the rollout loop calls after each generate_turn; tools run on the real ToolRunner.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from rlctl.config.schema import Config, DataConfig, ModelConfig, MultiTurnConfig, RolloutConfig
from rlctl.errors import ConfigError
from rlctl.models.tiny import build_tokenizer
from rlctl.multiturn.conversation import ChatRenderer, check_transcript
from rlctl.multiturn.rollout import ToolLoop
from rlctl.rollouts.base import RolloutContext
from rlctl.multiturn.tools import ToolRunner, load_tools
from support.cli import rlctl_here

CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "17 * 3"}}\n</tool_call>'


def make_actor(tmp_path: Path, tokenizer, *, tools=("calculator",), interaction="", budget=2048, max_turns=4,
               max_tool_response_length=256, files: dict | None = None) -> ToolLoop:
    for name, text in (files or {}).items():
        (tmp_path / name).write_text(text)
    mt = MultiTurnConfig(enable=True, tools=tuple(tools), interaction=interaction, max_turns=max_turns,
                         max_tool_response_length=max_tool_response_length, tool_timeout_s=2.0)
    config = Config(model=ModelConfig(path="unused"), data=DataConfig(train_files=("x",), max_response_length=budget),
                    rollout=RolloutConfig(multi_turn=mt))
    eos = [tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.convert_tokens_to_ids("<|endoftext|>")]
    return ToolLoop(None, RolloutContext(config, tokenizer, tmp_path, eos))


def start(actor, question="What is 17 * 3?", extra_info=None):
    messages = [{"role": "user", "content": question}]
    prompt_ids = actor.renderer.encode(actor.renderer.render(messages, generation_prompt=True))
    conv = actor._start(prompt_ids, messages, extra_info or {})
    actor.events.run(actor._start_interaction(conv))
    return conv


def model_turn(actor, conv, ids, *, truncated=False, budget=2048):
    """What the loop does with one generated turn: append it, then answer it (tools / interaction)."""
    conv.add_turn(actor.renderer, ids, None, truncated=truncated, eos_ids=actor.eos_ids, max_turns=actor.mt.max_turns,
                  has_tools=bool(actor.runner.tools), has_interaction=actor.interaction is not None,
                  fmt=actor.mt.tool_format)
    actor.events.run(actor._between_turns([conv], budget))


def finish(actor, conv):
    actor.events.run(actor._finish(conv))
    err = check_transcript(actor.renderer, conv.prompt_ids, conv.response_ids, conv.messages, actor.eos_ids)
    assert err is None, err


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def eos(tok):
    return [tok.convert_tokens_to_ids("<|im_end|>")]


def test_tool_call_turn_tool_answer_and_final_turn(tmp_path, tok):
    actor = make_actor(tmp_path, tok)
    conv = start(actor)
    first = tok.encode(CALL, add_special_tokens=False) + eos(tok)
    model_turn(actor, conv, first)
    assert conv.messages[-2]["tool_calls"][0]["function"] == {"name": "calculator",
                                                              "arguments": '{"expression": "17 * 3"}'}
    assert conv.messages[-1] == {"role": "tool", "content": "51"}
    assert conv.calls == [{"name": "calculator", "arguments": {"expression": "17 * 3"}, "error": False}]
    glue = conv.response_ids[len(first):]
    assert conv.response_mask == [1] * len(first) + [0] * len(glue)
    assert tok.decode(glue) == "\n<|im_start|>user\n<tool_response>\n51\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    model_turn(actor, conv, tok.encode("51", add_special_tokens=False) + eos(tok))
    assert conv.finish == "stop" and conv.turns == 2
    assert conv.response_mask[-3:] == [1, 1, 1]
    finish(actor, conv)
    actor.close()


def test_a_call_written_differently_from_the_template_is_kept_as_text_and_still_run(tmp_path, tok):
    actor = make_actor(tmp_path, tok)
    conv = start(actor)
    compact = 'ok\n\n<tool_call>{"name":"calculator","arguments":{"expression":"2+2"}}</tool_call>'
    model_turn(actor, conv, tok.encode(compact, add_special_tokens=False) + eos(tok))
    assert conv.messages[1] == {"role": "assistant", "content": compact}   # rendering it structured would differ
    assert conv.messages[2] == {"role": "tool", "content": "4"}
    model_turn(actor, conv, tok.encode("4", add_special_tokens=False) + eos(tok))
    finish(actor, conv)
    actor.close()


@pytest.mark.parametrize("turn, answer", [
    ('<tool_call>\n{"name": "weather", "arguments": {}}\n</tool_call>', "error: unknown tool 'weather'"),
    ("<tool_call>\n{oops}\n</tool_call>", "error: tool call is not valid JSON"),
    ('<tool_call>\n{"name": "calculator", "arguments": {"x": 1}}\n</tool_call>', "error: calculator: unknown argument"),
    ('<tool_call>\n{"name": "calculator", "arguments": {"expression": "1/0"}}\n</tool_call>', "error: division by zero"),
])
def test_bad_calls_become_the_tool_answer(tmp_path, tok, turn, answer):
    actor = make_actor(tmp_path, tok)
    conv = start(actor)
    model_turn(actor, conv, tok.encode(turn, add_special_tokens=False) + eos(tok))
    assert conv.messages[-1]["role"] == "tool" and conv.messages[-1]["content"].startswith(answer)
    assert not conv.done
    model_turn(actor, conv, eos(tok))
    finish(actor, conv)
    actor.close()


def test_tool_errors_and_timeouts_are_answers_not_crashes(tmp_path, tok):
    files = {"tools.py": '''
import time

def slow(seconds: float) -> str:
    """Sleep.

    Args:
        seconds: how long
    """
    time.sleep(seconds)
    return "woke"

def boom(x: int) -> str:
    """Fail.

    Args:
        x: anything
    """
    raise RuntimeError("broken tool")
'''}
    actor = make_actor(tmp_path, tok, tools=("tools.py:slow", "tools.py:boom"), files=files)
    conv = start(actor)
    calls = ('<tool_call>\n{"name": "slow", "arguments": {"seconds": 5}}\n</tool_call>\n'
             '<tool_call>\n{"name": "boom", "arguments": {"x": 1}}\n</tool_call>')
    model_turn(actor, conv, tok.encode(calls, add_special_tokens=False) + eos(tok))
    assert [m["content"] for m in conv.messages[-2:]] == [
        "error: slow timed out after 2 s", "error: boom: RuntimeError: broken tool"]
    assert [c["error"] for c in conv.calls] == [True, True]
    actor.close()


def test_a_turn_that_does_not_fit_the_budget_ends_the_conversation_without_its_answers(tmp_path, tok):
    actor = make_actor(tmp_path, tok, budget=120)
    conv = start(actor)
    first = tok.encode(CALL, add_special_tokens=False) + eos(tok)
    glue = "\n<|im_start|>user\n<tool_response>\n51\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    assert len(first) < 120 <= len(first) + len(tok.encode(glue, add_special_tokens=False))
    model_turn(actor, conv, first, budget=120)
    assert conv.finish == "length" and conv.response_ids == first and conv.messages[-1]["role"] == "assistant"
    finish(actor, conv)
    actor.close()


def test_max_turns_stops_before_running_the_last_turns_calls(tmp_path, tok):
    actor = make_actor(tmp_path, tok, max_turns=1)
    conv = start(actor)
    model_turn(actor, conv, tok.encode(CALL, add_special_tokens=False) + eos(tok))
    assert conv.finish == "max_turns" and conv.calls == []
    finish(actor, conv)
    actor.close()


def test_long_tool_answers_are_cut_to_max_tool_response_length_tokens(tmp_path, tok):
    files = {"tools.py": '''
def echo(text: str) -> str:
    """Echo.

    Args:
        text: what to say
    """
    return text * 50
'''}
    actor = make_actor(tmp_path, tok, tools=("tools.py:echo",), max_tool_response_length=20, files=files)
    conv = start(actor)
    model_turn(actor, conv, tok.encode('<tool_call>\n{"name": "echo", "arguments": {"text": "abc"}}\n</tool_call>',
                                       add_special_tokens=False) + eos(tok))
    assert conv.messages[-1]["content"] == ("abc" * 7)[:20] + "...(truncated)"
    actor.close()


FUNCTION_USER = '''
def user(messages, extra_info):
    said = messages[-1]["content"]
    if said == extra_info["secret"]:
        return {"content": "", "done": True, "score": 1.0}
    return {"content": "No, try again. Ünïcödé and emoji 🙂 welcome.", "done": False, "score": 0.0}
'''


def test_function_interaction_asks_again_until_done(tmp_path, tok):
    actor = make_actor(tmp_path, tok, tools=(), interaction="user.py:user", files={"user.py": FUNCTION_USER})
    conv = start(actor, "Guess the word.", {"secret": "cat"})
    model_turn(actor, conv, tok.encode("dog", add_special_tokens=False) + eos(tok))
    assert conv.messages[-1]["role"] == "user" and conv.messages[-1]["content"].startswith("No, try again")
    assert conv.response_mask.count(0) > 0 and not conv.done
    model_turn(actor, conv, tok.encode("cat", add_special_tokens=False) + eos(tok))
    assert conv.finish == "interaction" and conv.turn_scores == [0.0, 1.0] and conv.turns == 2
    finish(actor, conv)
    actor.close()


VERL_STYLE = '''
import asyncio

class CountingTool:
    """verl's BaseTool shape, without verl: async create/execute/calc_reward/release."""
    def __init__(self, config, tool_schema):
        self.config, self.tool_schema, self.state, self.released = config, tool_schema, {}, []

    async def create(self, instance_id=None, **kwargs):
        self.state["i1"] = {"start": kwargs["create_kwargs"]["start"], "calls": 0}
        return "i1", None

    async def execute(self, instance_id, parameters, **kwargs):
        await asyncio.sleep(0)
        s = self.state[instance_id]
        s["calls"] += 1
        return {"text": f"count {s['start'] + parameters['step']}"}, 0.25, {"calls": s["calls"]}

    async def calc_reward(self, instance_id, **kwargs):
        return 10.0 * self.state[instance_id]["calls"]

    async def release(self, instance_id, **kwargs):
        self.released.append(instance_id)

counter = CountingTool({}, {"type": "function", "function": {"name": "count", "description": "Count.",
    "parameters": {"type": "object", "properties": {"step": {"type": "integer"}}, "required": ["step"]}}})

class Teacher:
    """verl's BaseInteraction shape: (should_terminate, response, score, metadata)."""
    def __init__(self, config):
        self.config, self.seen, self.finalized = config, {}, []

    async def start_interaction(self, instance_id=None, ground_truth=None, **kwargs):
        self.seen[instance_id] = ground_truth
        return instance_id

    async def generate_response(self, instance_id, messages, **kwargs):
        right = messages[-1]["content"] == self.seen[instance_id]
        return right, "correct" if right else "wrong, again", 1.0 if right else 0.0, {}

    async def finalize_interaction(self, instance_id, **kwargs):
        self.finalized.append(instance_id)
'''


def test_verl_style_tool_and_interaction_objects_work_unchanged(tmp_path, tok):
    actor = make_actor(tmp_path, tok, tools=("verl_style.py:counter",), interaction="verl_style.py:Teacher",
                       files={"verl_style.py": VERL_STYLE})
    extra = {"tools_kwargs": {"count": {"create_kwargs": {"start": 40}}},
             "interaction_kwargs": {"name": "teacher", "ground_truth": "42"}}
    conv = start(actor, "Count to 42.", extra)
    model_turn(actor, conv, tok.encode('<tool_call>\n{"name": "count", "arguments": {"step": 2}}\n</tool_call>',
                                       add_special_tokens=False) + eos(tok))
    assert conv.messages[-1] == {"role": "tool", "content": "count 42"}
    model_turn(actor, conv, tok.encode("41", add_special_tokens=False) + eos(tok))
    assert conv.messages[-1] == {"role": "user", "content": "wrong, again"}
    model_turn(actor, conv, tok.encode("42", add_special_tokens=False) + eos(tok))
    assert conv.finish == "interaction" and conv.turn_scores == [0.0, 1.0]
    finish(actor, conv)
    assert conv.tools.rewards == [0.25, 10.0]   # execute's step reward, then calc_reward at the end
    tool = actor.runner.tools["count"].obj
    assert tool.released == ["i1"]
    assert actor.interaction.obj.finalized == list(actor.interaction.obj.seen)
    actor.close()


SEVERAL = VERL_STYLE + FUNCTION_USER + '''
interactions = {"teacher": Teacher, "guess": user}
'''


def test_a_dict_of_interactions_lets_each_row_pick_one_by_name(tmp_path, tok):
    """verl's interaction_config_path lists several interactions; a row picks one with interaction_kwargs.name."""
    from rlctl.errors import DataError

    actor = make_actor(tmp_path, tok, tools=(), interaction="several.py:interactions", files={"several.py": SEVERAL})
    teacher = start(actor, "Count to 42.", {"interaction_kwargs": {"name": "teacher", "ground_truth": "42"}})
    guess = start(actor, "Guess the word.", {"secret": "cat", "interaction_kwargs": {"name": "guess"}})
    for conv in (teacher, guess):
        model_turn(actor, conv, tok.encode("41", add_special_tokens=False) + eos(tok))
    assert teacher.messages[-1] == {"role": "user", "content": "wrong, again"}
    assert guess.messages[-1]["content"].startswith("No, try again")
    model_turn(actor, teacher, tok.encode("42", add_special_tokens=False) + eos(tok))
    model_turn(actor, guess, tok.encode("cat", add_special_tokens=False) + eos(tok))
    assert teacher.finish == guess.finish == "interaction" and teacher.turn_scores == guess.turn_scores == [0.0, 1.0]
    for conv in (teacher, guess):
        finish(actor, conv)
    member = actor.interaction.members["teacher"].obj
    assert member.config == {"name": "teacher"} and member.finalized == list(member.seen)
    with pytest.raises(DataError, match="names interaction 'judge'; .* has 'teacher', 'guess'"):
        start(actor, "?", {"interaction_kwargs": {"name": "judge"}})
    actor.close()


def test_config_validate_checks_every_row_picks_one_of_several_interactions(tmp_path, tiny_model_dir):
    from support.parquet_rows import write_rows

    (tmp_path / "several.py").write_text(SEVERAL)
    write_rows(tmp_path / "train.parquet", [
        {"data_source": "x", "prompt": [{"role": "user", "content": "hi"}], "reward_model": {"ground_truth": "1"},
         "extra_info": {"index": i, "interaction_kwargs": {"name": name}}}
        for i, name in enumerate(["teacher", "guess", "judge", "judge"])])
    (tmp_path / "rlctl.toml").write_text(f"""
[model]
path = "{tiny_model_dir}"
[data]
train_files = ["train.parquet"]
val_files = []
[rollout.multi_turn]
enable = true
interaction = "several.py:interactions"
""")
    out = rlctl_here("config", "validate", "rlctl.toml", cwd=tmp_path)
    text = out.stdout + out.stderr
    assert out.returncode == 2, text
    assert ("data.train_files: train.parquet: 2 row(s) pick no interaction of rollout.multi_turn.interaction "
            "(extra_info.interaction_kwargs.name: judge); it has teacher, guess") in " ".join(text.split()), text


def test_a_tool_file_imports_helpers_next_to_it_and_runs_once_per_process(tmp_path):
    """As reward.py and plugins: the file's folder joins sys.path, and one file loaded for tools and
    for the interaction is executed once (rlctl.plugins.import_file)."""
    from rlctl.multiturn.interactions import load_interaction
    from rlctl.multiturn.tools import load_object

    (tmp_path / "helper_mt.py").write_text("def double(x):\n    return 2 * x\n")
    (tmp_path / "tools_mt.py").write_text(
        "from helper_mt import double\nRUNS = []\nRUNS.append(1)\n\n"
        "def twice(x: int) -> int:\n    \"\"\"Twice x.\n\n    Args:\n        x: a number.\n    \"\"\"\n"
        "    return double(x)\n\n"
        "def user(messages, extra_info):\n    return {\"content\": \"again\", \"done\": False}\n")
    (tool,) = load_tools(["tools_mt.py:twice"], tmp_path)
    assert tool.name == "twice" and tool.fn(21) == 42
    load_interaction("tools_mt.py:user", tmp_path)
    assert load_object("tools_mt.py:RUNS", tmp_path, "x") == [1]


def test_function_schemas_come_from_type_hints_and_docstrings(tmp_path):
    (tmp_path / "t.py").write_text('''
def lookup(city: str, days: int = 1) -> str:
    """Weather forecast.

    Args:
        city: City name.
        days: How many days ahead.
    """
    return city

def untyped(city):
    """No hints."""
''')
    [tool] = load_tools(["t.py:lookup"], tmp_path)
    assert tool.schema["function"]["name"] == "lookup"
    assert tool.schema["function"]["parameters"]["properties"] == {
        "city": {"type": "string", "description": "City name."},
        "days": {"type": "integer", "description": "How many days ahead."}}
    assert tool.schema["function"]["parameters"]["required"] == ["city"]
    for spec, message in (("t.py:untyped", "has no usable schema"), ("t.py:nothere", "has no 'nothere'"),
                          ("nofile.py:f", "does not exist"), ("weather", "unknown tool")):
        with pytest.raises(ConfigError, match=message) as e:
            load_tools([spec], tmp_path)
        assert e.value.exit_code == 2


def test_tools_of_a_turn_run_concurrently(tmp_path):
    """Four calls meet at a barrier of four: run one after another, the first would wait in vain."""
    (tmp_path / "t.py").write_text('''
import threading

BARRIER = threading.Barrier(4, timeout=3)

def meet(name: str) -> str:
    """Wait for the others.

    Args:
        name: who
    """
    BARRIER.wait()
    return "met " + name
''')
    from rlctl.multiturn.tools import EventLoop, SampleTools

    runner, loop = ToolRunner(load_tools(["t.py:meet"], tmp_path), timeout_s=10), EventLoop()

    async def four():
        return await asyncio.gather(*(runner.call("meet", {"name": str(i)}, SampleTools({})) for i in range(4)))

    assert [r.text for r in loop.run(four())] == [f"met {i}" for i in range(4)]
    loop.close()


def test_renderer_closing_is_the_templates_text_after_an_assistant_turn(tok):
    assert ChatRenderer(tok).closing == "<|im_end|>\n"


def test_a_turn_cut_at_max_turn_length_is_closed_by_the_template_with_mask_0(tmp_path, tok):
    actor = make_actor(tmp_path, tok, tools=(), interaction="user.py:user", files={"user.py": FUNCTION_USER})
    conv = start(actor, "Guess the word.", {"secret": "cat"})
    cut = tok.encode("abcd", add_special_tokens=False)   # no end token: max_turn_length ran out
    conv.add_turn(actor.renderer, cut, None, truncated=True, eos_ids=actor.eos_ids, max_turns=4, has_tools=False,
                  has_interaction=True, fmt="hermes", at_budget=False)
    actor.events.run(actor._between_turns([conv], 2048))
    assert not conv.done and conv.messages[-2] == {"role": "assistant", "content": "abcd"}
    glue = conv.response_ids[len(cut):]
    assert tok.decode(glue).startswith("<|im_end|>\n<|im_start|>user\n")
    assert conv.response_mask == [1] * 4 + [0] * len(glue)
    model_turn(actor, conv, tok.encode("cat", add_special_tokens=False) + eos(tok))
    finish(actor, conv)
    actor.close()


def test_config_validate_reports_bad_tools_in_one_line_exit_2(tmp_path, tiny_model_dir):

    (tmp_path / "t.py").write_text("def untyped(x):\n    return x\n")
    (tmp_path / "rlctl.toml").write_text(f"""
[model]
path = "{tiny_model_dir}"
[data]
train_files = ["train.parquet"]
[rollout.multi_turn]
enable = true
tools = ["calculator", "t.py:untyped"]
interaction = "nofile.py:user"
""")
    out = rlctl_here("config", "validate", "rlctl.toml", cwd=tmp_path)
    text = out.stdout + out.stderr
    assert out.returncode == 2, text
    assert "rollout.multi_turn.tools: tool 'untyped' has no usable schema" in text, text
    assert "rollout.multi_turn.interaction: nofile.py does not exist" in text and "Traceback" not in text
    (tmp_path / "rlctl.toml").write_text((tmp_path / "rlctl.toml").read_text().replace(
        '"calculator", "t.py:untyped"', '"weather"'))
    out = rlctl_here("config", "validate", "rlctl.toml", cwd=tmp_path)
    assert out.returncode == 2 and "unknown tool 'weather'" in out.stdout + out.stderr


@pytest.mark.slow
def test_python_tool_runs_in_the_sandbox(tmp_path):
    from rlctl.multiturn.tools import EventLoop, SampleTools

    runner, loop = ToolRunner(load_tools(["python"], tmp_path), timeout_s=30), EventLoop()
    session = SampleTools({})
    ok = loop.run(runner.call("python", {"code": "print(sum(range(101)))"}, session))
    bad = loop.run(runner.call("python", {"code": "raise ValueError('nope')"}, session))
    loop.close()
    assert ok.text == "5050" and not ok.error
    assert "ValueError: nope" in bad.text
