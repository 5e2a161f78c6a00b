"""The reader the training loop calls: validated rows from several files, and a data fingerprint."""

from __future__ import annotations

import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlctl.data.dataset import files_fingerprint, load_rows, read_table, render_prompts
from rlctl.errors import DataError
from rlctl.models.tiny import build_tokenizer
from rlctl.tasks.prep import PrepOptions, prepare


def test_load_rows_concatenates_files_with_different_extra_info(tmp_path):
    prepare("arith", PrepOptions(out=tmp_path / "a", limit=3))
    verl_like = {"data_source": ["openai/gsm8k"], "prompt": [[{"role": "user", "content": "q"}]],
                 "ability": ["math"], "reward_model": [{"style": "rule", "ground_truth": "1"}],
                 "extra_info": [{"split": "train", "index": 7}]}
    pq.write_table(pa.table(verl_like), tmp_path / "v.parquet")
    rows = load_rows([tmp_path / "a/train.parquet", tmp_path / "v.parquet"])
    assert len(rows) == 4 and rows[-1]["extra_info"] == {"split": "train", "index": 7, "question": None,
                                                          "answer": None}
    assert rows[0]["prompt"][0]["role"] == "user" and rows[0]["reward_model"]["style"] == "rule"
    assert read_table(tmp_path / "v.parquet").num_rows == 1


def test_load_rows_errors(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        load_rows([tmp_path / "missing.parquet"])
    with pytest.raises(DataError, match="no data files"):
        load_rows([])


def test_files_fingerprint_follows_content_and_order(tmp_path):
    a, b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    a.write_bytes(b"one")
    b.write_bytes(b"two")
    first = files_fingerprint([a, b])
    assert first.startswith("sha256:") and first == files_fingerprint([str(a), str(b)])
    assert first != files_fingerprint([b, a])
    b.write_bytes(b"tw0")
    assert first != files_fingerprint([a, b])
    with pytest.raises(DataError, match="cannot read"):
        files_fingerprint([tmp_path / "gone"])


def test_render_prompts_with_and_without_a_chat_template():
    tok = build_tokenizer()
    prompts = [[{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]]
    assert render_prompts(prompts, tok) == ["<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n"
                                            "<|im_start|>assistant\n"]
    tok.chat_template = None
    assert render_prompts(prompts, tok) == ["S\nU"]


@pytest.mark.slow
def test_help_stays_light():
    code = ("import sys; from rlctl.cli.main import main; rc = main(['data', 'prep', '--help']); "
            "heavy = [m for m in ('pyarrow', 'torch', 'transformers', 'ray', 'peft') if m in sys.modules]; "
            "print(rc, heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "0 []"
    for args in (["data", "--help"], ["data", "inspect", "--help"]):
        result = subprocess.run([sys.executable, "-m", "rlctl.cli", *args], capture_output=True, text=True)
        assert result.returncode == 0 and "Usage: rlctl data" in result.stdout
