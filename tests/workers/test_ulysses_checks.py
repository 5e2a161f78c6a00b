"""What validate says about actor/critic.ulysses_sequence_parallel_size (rlctl.workers.parallel.ulysses_checks)."""

from __future__ import annotations

import dataclasses
import json

from rlctl.config.checks import CheckContext
from rlctl.config.schema import Config, ModelConfig
from rlctl.workers.parallel.ulysses_checks import check_ulysses, check_ulysses_model


def _config(path, sp=2, workers=2, **changes) -> Config:
    c = Config(model=ModelConfig(path=str(path)))
    changes = {"resources": {"workers": workers, **changes.pop("resources", {})},
               "actor": {"ulysses_sequence_parallel_size": sp, **changes.pop("actor", {})}, **changes}
    for section, values in changes.items():
        current = getattr(c, section)
        nested = {k: dataclasses.replace(getattr(current, k), **v) for k, v in values.items() if isinstance(v, dict)}
        flat = {k: v for k, v in values.items() if not isinstance(v, dict)}
        c = dataclasses.replace(c, **{section: dataclasses.replace(current, **flat, **nested)})
    return c


def _model_dir(tmp_path, heads, kv_heads, **more):
    folder = tmp_path / f"m{heads}-{kv_heads}-{len(more)}"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen2", "num_attention_heads": heads,
                                                    "num_key_value_heads": kv_heads, **more}))
    return folder


def test_sp_1_is_off_and_a_fitting_layout_passes(tmp_path):
    ctx = CheckContext(base_dir=tmp_path, raw={})
    model = _model_dir(tmp_path, 4, 2)
    assert check_ulysses(_config(model, sp=1, workers=3), ctx) == []
    assert check_ulysses(_config(model), ctx) == [] and check_ulysses_model(_config(model), ctx) == []
    assert check_ulysses(_config(model, workers=4), ctx) == []   # two sp groups of 2


def test_ranks_that_do_not_split_and_heads_that_do_not_split_are_one_line_each(tmp_path):
    ctx = CheckContext(base_dir=tmp_path, raw={})
    problems = check_ulysses(_config(_model_dir(tmp_path, 4, 2), workers=3), ctx)
    assert [p.key for p in problems] == ["actor.ulysses_sequence_parallel_size"]
    assert "3 training ranks" in problems[0].message and "\n" not in problems[0].message
    heads = check_ulysses_model(_config(_model_dir(tmp_path, 6, 3), sp=4, workers=4), ctx)
    assert len(heads) == 1 and "6 attention heads" in heads[0].message
    kv = check_ulysses_model(_config(_model_dir(tmp_path, 6, 2), sp=3, workers=3), ctx)
    assert len(kv) == 1 and "2 KV heads" in kv[0].message
    assert check_ulysses_model(_config(_model_dir(tmp_path, 8, 1), sp=4, workers=4), ctx) == []   # KV repeated


def test_what_is_not_built_with_sp_is_refused_in_one_line(tmp_path):
    ctx = CheckContext(base_dir=tmp_path, raw={})
    model = _model_dir(tmp_path, 4, 2)
    problems = check_ulysses(_config(model, run={"kind": "sft"}, model={"dtype": "float16",
                                                                        "gradient_checkpointing": True,
                                                                        "lora": {"rank": 8}}), ctx)
    assert [p.key for p in problems] == ["model.dtype"]
    tested = {"dtype": "bfloat16", "lora": {"rank": 8}, "gradient_checkpointing": True}
    assert check_ulysses(_config(model, model=tested), ctx) == []
    assert check_ulysses(_config(model, run={"kind": "sft"}, model=tested), ctx) == []   # SFT is built
    assert all("is not supported with" in p.message and "yet" in p.message for p in problems)
    vlm = _model_dir(tmp_path, 4, 2, vision_config={"depth": 1})
    assert "vision-language" in check_ulysses_model(_config(vlm), ctx)[0].message


def test_attention_sp_does_not_implement_is_refused_and_a_sliding_window_passes(tmp_path):
    """Sliding windows and soft-capping run per packed sequence (tests/workers/test_ulysses.py);
    attention sinks (gpt-oss) and ALiBi are refused by the model's family, one line each."""
    ctx = CheckContext(base_dir=tmp_path, raw={})
    gemma = _model_dir(tmp_path, 4, 2, model_type="gemma3_text", sliding_window=64, attn_logit_softcapping=50.0)
    assert check_ulysses_model(_config(gemma), ctx) == []
    sinks = check_ulysses_model(_config(_model_dir(tmp_path, 4, 2, model_type="gpt_oss")), ctx)
    assert [p.key for p in sinks] == ["actor.ulysses_sequence_parallel_size"] and "s_aux" in sinks[0].message
    assert "\n" not in sinks[0].message


def test_the_critic_is_checked_like_the_actor_with_its_own_model(tmp_path):
    ctx = CheckContext(base_dir=tmp_path, raw={})
    critic = _config(_model_dir(tmp_path, 4, 2), sp=1, workers=3, critic={"ulysses_sequence_parallel_size": 2})
    assert [p.key for p in check_ulysses(critic, ctx)] == ["critic.ulysses_sequence_parallel_size"]
    other = _model_dir(tmp_path, 6, 3)
    critic = _config(_model_dir(tmp_path, 4, 4), sp=1, workers=4,
                     critic={"ulysses_sequence_parallel_size": 4, "model_path": str(other)})
    assert [p.key for p in check_ulysses_model(critic, ctx)] == ["critic.ulysses_sequence_parallel_size"]


def test_distillation_runs_with_sp_and_each_teachers_heads_are_checked(tmp_path):
    ctx = CheckContext(base_dir=tmp_path, raw={})
    student, good, bad = _model_dir(tmp_path, 4, 2), _model_dir(tmp_path, 8, 2), _model_dir(tmp_path, 6, 3)
    one = _config(student, distill={"teacher": str(good)})
    assert check_ulysses(one, ctx) == [] and check_ulysses_model(one, ctx) == []
    routed = _config(student)
    routed = dataclasses.replace(routed, distill=dataclasses.replace(routed.distill,
                                                                     teachers={"a": str(good), "b": str(bad)}))
    problems = check_ulysses_model(routed, ctx)
    assert [p.key for p in problems] == ["actor.ulysses_sequence_parallel_size"]
    assert "teacher 'b'" in problems[0].message and "3 KV heads" in problems[0].message
    assert check_ulysses_model(_config(student, sp=1, workers=2, distill={"teacher": str(bad)}), ctx) == []
