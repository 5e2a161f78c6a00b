"""`rlctl model tiny`: deterministic, offline, loadable by transformers, with a working chat template."""

from __future__ import annotations

import json

import pytest
from support.cli import rlctl_here


def tiny_here(*args):
    """The same command in this process (what it prints and returns, without the imports)."""
    return rlctl_here("model", "tiny", *args)


def test_same_seed_same_bytes_other_seed_differs(tmp_path):
    """One seed through the command, the others through the function it calls."""
    from rlctl.models.tiny import build_tiny_model

    out = tiny_here(tmp_path / "a", "--seed", 3, "--format", "json")
    assert out.returncode == 0, out.stderr
    build_tiny_model(tmp_path / "b", seed=3)
    build_tiny_model(tmp_path / "c", seed=4)
    weights = {n: (tmp_path / n / "model.safetensors").read_bytes() for n in "abc"}
    assert weights["a"] == weights["b"] and weights["a"] != weights["c"]
    info = json.loads(tiny_here(tmp_path / "d", "--layers", 3, "--hidden", 32, "--format", "json").stdout)
    assert info["layers"] == 3 and info["hidden"] == 32 and info["vocab"] == 260


def test_refuses_non_empty_and_bad_shapes(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "keep.txt").write_text("mine")
    out = tiny_here(tmp_path / "x")
    assert out.returncode == 2 and "--force" in out.stderr and (tmp_path / "x" / "keep.txt").exists()
    bad = tiny_here(tmp_path / "y", "--hidden", 30, "--heads", 4)
    assert bad.returncode == 2 and "do not divide" in bad.stderr


def test_loads_and_chats(tiny_model_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    text = tok.apply_chat_template([{"role": "user", "content": "héllo 12"}], tokenize=False,
                                   add_generation_prompt=True)
    ids = tok(text, return_tensors="pt")["input_ids"]
    assert tok.decode(ids[0]) == text and text.endswith("<|im_start|>assistant\n")
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], 260) and torch.isfinite(logits).all()


def test_the_byte_template_lists_tools_compactly(tiny_model_dir):
    """One token per byte: the tools block is one line per tool (name, parameters, description) and the call
    format once, not Qwen's ~700-token JSON block, which Qwen's own vocabulary keeps."""
    from transformers import AutoTokenizer

    from rlctl.models.chat_templates import QWEN_CHAT_TEMPLATE

    def lookup(city: str, days: int = 1) -> str:
        """Weather forecast for a city.

        Args:
            city: The city's name.
            days: How many days ahead.
        """

    def calculator(expression: str) -> str:
        """Evaluate arithmetic.

        Args:
            expression: e.g. "2 + 2".
        """

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Paris?"}]
    text = tok.apply_chat_template(messages, tools=[lookup, calculator], tokenize=False, add_generation_prompt=True)
    assert text == ("<|im_start|>system\nBe brief.\n\n# Tools\nlookup(city, days): Weather forecast for a city.\n"
                    "calculator(expression): Evaluate arithmetic.\nCall a tool as <tool_call>\n"
                    "{\"name\": <name>, \"arguments\": <json object>}\n</tool_call><|im_end|>\n"
                    "<|im_start|>user\nParis?<|im_end|>\n<|im_start|>assistant\n")
    bare = {"type": "function", "function": {"name": "now"}}   # a schema without parameters or description
    assert "# Tools\nnow()\nCall a tool as" in tok.apply_chat_template(messages, tools=[bare], tokenize=False)
    tok.chat_template = QWEN_CHAT_TEMPLATE
    qwen = tok.apply_chat_template(messages, tools=[lookup, calculator], tokenize=False, add_generation_prompt=True)
    assert "<tools>\n{\"type\": \"function\"" in qwen and len(qwen) > 2 * len(text)


@pytest.mark.slow   # the doctor asks `uname` (platform.processor) in a subprocess
@pytest.mark.parametrize("fmt", ["text", "json"])
def test_doctor_reports(fmt):
    out = rlctl_here("doctor", "--format", fmt)
    assert out.returncode == 0, out.stderr
    if fmt == "json":
        report = json.loads(out.stdout)
        assert report["core"]["torch"] and report["core"]["ray"]
        assert report["devices"]["cpus"] >= 1 and "vllm" in report["optional"]
        assert 'rlctl[vllm]' in report["optional"]["vllm"]["how"]
    else:
        assert "packages" in out.stdout and "devices" in out.stdout


def test_other_architectures(tmp_path):
    out = tiny_here(tmp_path / "phi3", "--arch", "phi3", "--hidden", 32, "--format", "json")
    assert out.returncode == 0, out.stderr
    config = json.loads((tmp_path / "phi3" / "config.json").read_text())
    assert config["architectures"] == ["Phi3ForCausalLM"] and json.loads(out.stdout)["arch"] == "phi3"
    bad = tiny_here(tmp_path / "x", "--arch", "gpt9")
    assert bad.returncode == 2 and "--arch 'gpt9' is not one of qwen2, llama" in bad.stderr
