"""`rlctl merge` of a vision-language run: the folder it writes loads with transformers' auto class
and rlctl's processor loader (processor files included), its logits with an image equal the trained
weights', and its verification includes an image prompt, so a vision tower that did not survive the
export (which text prompts cannot see) stops the merge: exit 3, nothing written."""

from __future__ import annotations

import json

import pytest
from ckpt_runs import fixed_batch, run_config, save_run

from rlctl.cli.main import main


@pytest.fixture(scope="module")
def vlm_run(tmp_path_factory, tiny_vlm_dir):
    """One full fine-tuning step of the tiny VLM (lr 1e-2: the weights move), saved as the trainer saves."""
    from rlctl.workers.roles.actor import ActorRolloutRefWorker

    run_dir = tmp_path_factory.mktemp("vlm_run")
    config = run_config(tiny_vlm_dir, lora=False, workers=1)
    worker = ActorRolloutRefWorker(config, total_steps=4)
    worker.update_actor(fixed_batch(0))
    save_run(run_dir, config, worker.save_checkpoint)
    return run_dir, {n: p.detach().clone() for n, p in worker.actor.module.named_parameters()}


def test_merge_writes_a_vlm_folder_with_its_processor_verified_on_an_image(vlm_run, tiny_vlm_dir, tmp_path, capsys):
    import torch
    from transformers import AutoModelForImageTextToText

    from rlctl.checkpoint import verify_export as V
    from rlctl.models.vision import load_processor

    run_dir, trained = vlm_run
    out = tmp_path / "hf"
    assert main(["merge", str(run_dir), "--to-hf", str(out), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert {"processor_config.json", "chat_template.jinja", "tokenizer.json", "model.safetensors"} <= set(report["files"])
    assert report["verification"]["written_max_abs_diff"] <= report["verification"]["tolerance"]

    model = AutoModelForImageTextToText.from_pretrained(out).eval()
    processor = load_processor(out)
    assert json.loads((out / "processor_config.json").read_text())["processor_class"] == "Qwen2_5_VLProcessor"
    merged = dict(model.named_parameters())
    for name, value in trained.items():   # the trained weights, vision tower included
        assert torch.equal(merged[name.removeprefix("_fsdp_wrapped_module.")], value), name
    base = AutoModelForImageTextToText.from_pretrained(tiny_vlm_dir).eval()
    image = V.vision_prompts(processor)
    assert V.max_abs_diff(V.logits_of(model, image), V.logits_of(base, image)) > 1e-4   # it did train

    # and `rlctl serve OUT` / `rlctl eval OUT` load it as they do (model, tokenizer, processor) and answer an image
    from rlctl.api.requests import SamplingParams
    from rlctl.serve.generate import generate_local
    from rlctl.serve.source import load_model, load_processor_of

    served, tokenizer = load_model(out, "float32", "cpu")
    answer = generate_local(served, tokenizer, [image[0]["input_ids"].tolist()],
                            [SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)], visions=image,
                            processor=load_processor_of(out))
    assert answer[0][0].tokens == 3 and answer[0][0].finish_reason == "length"


def _halve_first_vision_block(model):
    import torch

    with torch.no_grad():
        for p in model.model.visual.blocks[0].parameters():
            p.mul_(0.5)
    return model


def test_a_vision_tower_lost_in_the_export_fails_the_merge(vlm_run, tiny_vlm_dir, tmp_path, monkeypatch, capsys):
    from transformers import AutoModelForImageTextToText, AutoTokenizer

    from rlctl.checkpoint import verify_export as V

    # text prompts alone cannot see the tower: their logits do not change when it does
    text = V.prompt_ids(AutoTokenizer.from_pretrained(tiny_vlm_dir))
    base = AutoModelForImageTextToText.from_pretrained(tiny_vlm_dir)
    before = V.logits_of(base, text)
    assert V.max_abs_diff(V.logits_of(_halve_first_vision_block(base), text), before) == 0

    load = V.load_written
    monkeypatch.setattr(V, "load_written", lambda *a, **k: _halve_first_vision_block(load(*a, **k)))
    assert main(["merge", str(vlm_run[0]), "--to-hf", str(tmp_path / "bad")]) == 3
    assert "merge verification failed: the written folder vs the weights" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists() and not list(tmp_path.glob(".bad.tmp-*"))
