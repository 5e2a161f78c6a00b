"""`rlctl model tiny --reward-model`: an offline sequence-classification reward model."""

from __future__ import annotations

import json
import subprocess
import sys


def test_cli_writes_a_reward_model_transformers_loads(tmp_path):
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    out = tmp_path / "rm"
    proc = subprocess.run([sys.executable, "-m", "rlctl", "model", "tiny", "--reward-model", str(out), "--format",
                           "json"], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["reward_model"] is True and info["num_labels"] == 1
    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForSequenceClassification.from_pretrained(out).eval()
    chats = [[{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": a}] for a in ("4", "five")]
    with torch.no_grad():
        scores = [model(**tok(tok.apply_chat_template(c, tokenize=False), return_tensors="pt")).logits
                  for c in chats]
    assert all(s.shape == (1, 1) for s in scores) and float(scores[0]) != float(scores[1])
