"""`rlctl model tiny --reward-model`: an offline sequence-classification reward model."""

from __future__ import annotations

import json

from support.cli import rlctl_here


def test_cli_writes_a_reward_model_transformers_loads(tmp_path):
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    out = tmp_path / "rm"
    proc = rlctl_here("model", "tiny", "--reward-model", out, "--format", "json")
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


def test_the_reward_model_is_the_tiny_policy_with_a_score_head(tmp_path):
    """Same config as the tiny Qwen2 policy but for the head (one built config, not two copies that
    drift), and the same seed gives the same weights."""
    from safetensors.torch import load_file

    from rlctl.models.tiny import build_tiny_model, build_tiny_reward_model

    build_tiny_model(tmp_path / "policy", seed=3)
    for name in ("rm", "rm2"):
        build_tiny_reward_model(tmp_path / name, seed=3)
    policy, rm = (json.loads((tmp_path / d / "config.json").read_text()) for d in ("policy", "rm"))
    head_only = {"architectures", "id2label", "label2id", "tie_word_embeddings"}
    assert {k: v for k, v in rm.items() if k not in head_only} == \
        {k: v for k, v in policy.items() if k not in head_only and k in rm}
    a, b = (load_file(tmp_path / d / "model.safetensors") for d in ("rm", "rm2"))
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)
