"""validate's checks of [distill]: every problem at once, each one line."""

from __future__ import annotations

import dataclasses

import pytest

from rlctl.config.checks import CheckContext
from rlctl.config.schema import ActorConfig, Config, DistillConfig, ModelConfig, RolloutConfig, RunConfig
from rlctl.workers.roles.distill_checks import check_distill, check_distill_teachers


def problems(c: Config, base, machine: bool = False) -> list:
    ctx = CheckContext(base_dir=base, raw={}, machine=machine)
    found = check_distill(c, ctx) + (check_distill_teachers(c, ctx) if machine else [])
    return [(p.key, p.severity, p.message) for p in found]


def test_off_without_a_teacher(tmp_path):
    assert problems(Config(), tmp_path) == []


def test_config_rules_all_reported(tmp_path):
    c = Config(distill=DistillConfig(teacher="t", teacher_url="http://x/v1"), rollout=RolloutConfig(temperature=0.7),
               actor=ActorConfig(use_kl_loss=True))
    found = problems(c, tmp_path)
    keys = [(k, s) for k, s, _ in found]
    assert ("distill.teacher", "error") in keys               # two teachers given
    assert ("distill.teacher_model", "error") in keys         # a URL without the model name
    assert ("rollout.temperature", "error") in keys           # the teacher scores at temperature 1
    assert ("actor.use_kl_loss", "warning") in keys           # a reference KL beside distillation
    assert all("\n" not in m for _, _, m in found)


def test_sft_run_refuses_distill(tmp_path):
    c = Config(run=RunConfig(kind="sft"), distill=DistillConfig(teacher="t"))
    assert [k for k, _, _ in problems(c, tmp_path)] == ["distill.teacher"]


@pytest.fixture
def swapped_vocab_model(tmp_path, tiny_model_dir):
    """The tiny model with two token ids swapped in its tokenizer: same size, other ids."""
    import json
    import shutil

    out = tmp_path / "swapped"
    shutil.copytree(tiny_model_dir, out)
    tok = json.loads((out / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    a, b = list(vocab)[65:67]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (out / "tokenizer.json").write_text(json.dumps(tok))
    return out


def test_teacher_vocabulary_must_match(tmp_path, tiny_model_dir, tiny_untied_model_dir, swapped_vocab_model):
    base = Config(model=ModelConfig(path=str(tiny_model_dir)))
    same = dataclasses.replace(base, distill=DistillConfig(teacher=str(tiny_untied_model_dir)))
    assert problems(same, tmp_path, machine=True) == []
    other = dataclasses.replace(base, distill=DistillConfig(teacher=str(swapped_vocab_model)))
    (key, severity, message), = problems(other, tmp_path, machine=True)
    assert key == "distill.teacher" and severity == "error" and "vocabulary differs" in message
    missing = dataclasses.replace(base, distill=DistillConfig(teacher=str(tmp_path / "nope")))
    (key, _, message), = problems(missing, tmp_path, machine=True)
    assert key == "distill.teacher" and "rlctl merge" in message
