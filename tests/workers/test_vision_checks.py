"""What validate says about a vision-language model.path (rlctl.workers.compute.vision_checks), vLLM's
image path (CPU refused; one placeholder per image sent, vLLM expands it) and the exit code."""

from __future__ import annotations

import dataclasses

from rlctl.config.checks import CheckContext
from rlctl.config.schema import Config, ModelConfig
from rlctl.rollouts.checks import check_rollout_images
from rlctl.workers.compute.vision_checks import check_vision
from rlctl.workers.rollout.vllm import collapse_runs, vision_requests, vllm_sampling_args
from rlctl.workers.rollout.vllm_platform import cpu_refusal


def _config(path, **changes) -> Config:
    c = Config(model=ModelConfig(path=str(path)))
    for section, values in changes.items():
        c = dataclasses.replace(c, **{section: dataclasses.replace(getattr(c, section), **values)})
    return c


def test_what_is_not_built_for_a_vlm_is_refused_a_text_critic_too_and_freeze_needs_a_tower(tiny_vlm_dir, tiny_model_dir, tmp_path):
    ctx = CheckContext(base_dir=tmp_path, raw={})
    assert check_vision(_config(tiny_vlm_dir), ctx) == []
    assert check_vision(_config(tiny_vlm_dir, algorithm={"name": "gae"}), ctx) == []   # a VLM critic is built
    problems = check_vision(_config(tiny_vlm_dir, algorithm={"name": "gae"}, rollout={"engine": "sglang"},
                                    critic={"model_path": str(tiny_model_dir)}), ctx)
    assert [p.key for p in problems] == ["rollout.engine", "critic.model_path"]
    assert "text-only" in problems[1].message and "images" in problems[1].message
    for mode in ("one_step_off", "async"):   # the separate rollout group carries images with the hf engine
        assert check_vision(_config(tiny_vlm_dir, rollout={"mode": mode}), ctx) == []
    off = check_vision(_config(tiny_vlm_dir, rollout={"mode": "async", "engine": "vllm", "partial_rollout": True}), ctx)
    assert [p.key for p in off] == ["rollout.mode", "rollout.partial_rollout"]
    assert "\"hf\" only" in off[0].message and "not built" in off[1].message
    assert check_vision(_config(tiny_vlm_dir, rollout={"engine": "vllm"}), ctx) == []   # sync vLLM: the GPU path
    turns = {"multi_turn": dataclasses.replace(Config().rollout.multi_turn, enable=True)}
    assert check_rollout_images(_config(tiny_vlm_dir, rollout=turns), ctx) == []   # sync + hf: tool images are built
    for other in ({"mode": "one_step_off"}, {"mode": "async"}, {"engine": "vllm"}):
        refused = check_rollout_images(_config(tiny_vlm_dir, rollout={**turns, **other}), ctx)
        assert [p.key for p in refused] == ["rollout.multi_turn.enable"] and "\"sync\"" in refused[0].message
        assert check_rollout_images(_config(tiny_model_dir, rollout={**turns, **other}), ctx) == []   # text: any
    text = check_vision(_config(tiny_model_dir, model={"freeze_vision_tower": True}), ctx)
    assert [p.key for p in text] == ["model.freeze_vision_tower"] and "no vision tower" in text[0].message


def test_vllm_gets_one_placeholder_per_image_and_never_samples_placeholders():
    image = 262
    assert collapse_runs([5, 260, image, image, image, 261, 7, image, image], image) == [5, 260, image, 261, 7, image]
    requests = vision_requests([[1, image, image, 2], [3, 4]], {"images": [["pil"], []]}, image)
    assert requests == [{"prompt_token_ids": [1, image, 2], "multi_modal_data": {"image": ["pil"]}},
                        {"prompt_token_ids": [3, 4]}]
    args = vllm_sampling_args(n=2, max_new_tokens=4, temperature=1.0, top_p=1.0, top_k=0, greedy=False, seed=0,
                              eos_token_ids=[1], banned=[260, 262])
    assert args["logit_bias"] == {260: -100.0, 262: -100.0}
    assert "torchvision" in cpu_refusal({"vision_config": {"depth": 2}})


def test_the_cpu_vision_recipe_validates():
    from pathlib import Path

    from rlctl.config.loader import load_config
    from rlctl.validate import validate

    recipe = Path(__file__).resolve().parents[2] / "recipes" / "grpo-shapes-cpu.toml"
    problems, plan = validate(load_config(recipe), machine=False)
    assert [f"{p.key}: {p.message}" for p in problems if p.severity == "error"] == []
    assert plan.sequences_per_step == 128
