"""`rlctl model tiny --arch qwen2_5_vl`: a tiny Qwen2.5-VL whose folder loads with its processor,
whose chat template places the vision tokens, and whose logits depend on the image and on the
M-RoPE token types (the trap: without `mm_token_type_ids` the model silently uses 1-D positions)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rlctl.cli.main import main


@pytest.fixture(scope="module")
def vlm(tiny_vlm_dir):
    from transformers import AutoModelForImageTextToText

    from rlctl.models.vision import load_processor

    return load_processor(tiny_vlm_dir), AutoModelForImageTextToText.from_pretrained(tiny_vlm_dir).eval()


def _logits(model, enc, drop=()):
    import torch

    model.model.rope_deltas = None   # the model caches M-RoPE deltas between calls (a trap of its own)
    inputs = {k: torch.as_tensor(v) for k, v in enc.items() if k not in drop}
    inputs["input_ids"] = inputs["input_ids"][None]
    if "mm_token_type_ids" in inputs:
        inputs["mm_token_type_ids"] = inputs["mm_token_type_ids"][None]
    with torch.no_grad():
        return model(**inputs).logits[0]


def test_folder_is_a_qwen2_5_vl_with_its_processor(tiny_vlm_dir, vlm):
    from rlctl.models.vision import is_vision_model, processor_max_pixels

    processor, model = vlm
    config = json.loads((tiny_vlm_dir / "config.json").read_text())
    assert config["model_type"] == "qwen2_5_vl" and config["vision_config"]["depth"] == 2
    assert config["text_config"]["hidden_size"] == 64 and is_vision_model(tiny_vlm_dir)
    assert json.loads((tiny_vlm_dir / "processor_config.json").read_text())["processor_class"] == "Qwen2_5_VLProcessor"
    assert processor_max_pixels(processor) == 224 * 224
    assert config["image_token_id"] == processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")


def test_marker_and_content_part_render_the_same_vision_tokens(vlm):
    processor, _ = vlm
    marker = processor.apply_chat_template([{"role": "user", "content": "<image>Colour?"}], tokenize=False,
                                           add_generation_prompt=True)
    parts = processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Colour?"}]}], tokenize=False,
        add_generation_prompt=True)
    assert marker == parts == ("<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Colour?<|im_end|>\n"
                               "<|im_start|>assistant\n")


def test_logits_depend_on_the_image_and_on_the_mrope_token_types(vlm):
    from PIL import Image

    from rlctl.models.vision import encode_prompt

    processor, model = vlm
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Colour?"}]}]
    red = encode_prompt(processor, messages, [Image.new("RGB", (56, 56), (220, 30, 30))])
    blue = encode_prompt(processor, messages, [Image.new("RGB", (56, 56), (30, 60, 220))])
    # a 56x56 image: 4 x 4 patches of 14 px, merged 2 x 2 -> 4 image tokens
    assert red["image_grid_thw"].tolist() == [[1, 4, 4]] and int(red["mm_token_type_ids"].sum()) == 4
    assert np.array_equal(red["input_ids"], blue["input_ids"])
    with_red, with_blue = _logits(model, red), _logits(model, blue)
    assert (with_red - with_blue).abs().max() > 1e-4
    without_types = _logits(model, red, drop=("mm_token_type_ids",))
    assert (with_red - without_types).abs().max() > 1e-4   # silently other positions
    assert (_logits(model, red) - with_red).abs().max() == 0


def test_cli_builds_and_refuses_what_a_vlm_does_not_take(tmp_path, capsys):
    assert main(["model", "tiny", str(tmp_path / "vl"), "--arch", "qwen2_5_vl", "--format", "json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["arch"] == "qwen2_5_vl" and 0 < info["vision_params"] < info["params"]
    assert {"model.safetensors", "tokenizer.json", "processor_config.json", "chat_template.jinja"} <= {
        p.name for p in (tmp_path / "vl").iterdir()}
    assert main(["model", "tiny", str(tmp_path / "u"), "--arch", "qwen2_5_vl", "--untied"]) == 2
    assert "drop --reward-model, --untied" in capsys.readouterr().err and not (tmp_path / "u").exists()
