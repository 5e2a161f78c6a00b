"""A tool that answers with an image, in a multi-turn rollout of a tiny Qwen2.5-VL (rlctl.multiturn.vision_turns).

The real turn loop (ToolLoop) on the actor worker's hf engine in this process: turn 1 is the model writing a
zoom call (its tokens chosen, its log-probs the engine's own), the shipped example tool
(examples/vision-zoom/zoom.py) answers with a crop of the prompt's picture, turn 2 is sampled.
The proofs: the trainer's log-probs (the worker's compute_log_prob) of the finished batch equal the ones the engine sampled with,
on every model token of both turns, and the same check fails when the tool image's pixels change
or the positions lose their M-RoPE axes; tool and image tokens carry response_mask 0 and each
image has grid.prod() // merge**2 pads.
"""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from rlctl.runtime.batch import Batch, object_array
from rlctl.workers.rollout import hf as hf_engine

ROOT = Path(__file__).resolve().parents[2]
CALL = '<tool_call>\n{"name": "zoom", "arguments": {"cell": 0}}\n</tool_call>'


class ScriptedFirstTurn:
    """The actor worker's generate_turn (rlctl.workers.roles.actor, in this process: the sync rollout's
    path) whose first call takes `script`'s tokens instead of sampling, and which returns
    rollout_log_prob: log softmax of the engine's logits at each token it returned."""

    world_size = 1

    def __init__(self, worker, script: list[int]):
        self.worker, self.script, self.seen, self.calls = worker, script, [], 0

    def choose(self, real, logits, **kwargs):
        step = len(self.seen)
        tokens = (torch.full((logits.shape[0],), self.script[step], dtype=torch.long) if self.calls == 1
                  else real(logits, **kwargs))
        self.seen.append(torch.log_softmax(logits.float(), -1).gather(-1, tokens[:, None])[:, 0])
        return tokens

    def generate_turn(self, batch: Batch, **kwargs) -> Batch:
        self.calls, self.seen = self.calls + 1, []
        out = self.worker.generate_turn(batch, **kwargs)
        lengths = out["response_length"]
        log_probs = np.zeros(out["responses"].shape, np.float32)
        for step, values in enumerate(self.seen):   # the engine drops finished rows: alive = longer than step
            log_probs[np.flatnonzero(lengths > step), step] = values.numpy()
        out["rollout_log_prob"] = log_probs
        return out


@pytest.fixture(scope="module")
def zoom_rollout(tiny_vlm_dir):
    from rlctl.config.schema import Config, ModelConfig
    from rlctl.workers.roles.actor import ActorRolloutRefWorker

    c = Config(model=ModelConfig(path=str(tiny_vlm_dir), dtype="float32"))
    turns = dataclasses.replace(c.rollout.multi_turn, enable=True, max_turns=2,
                                tools=(str(ROOT / "examples/vision-zoom/zoom.py") + ":zoom",))
    c = dataclasses.replace(c, rollout=dataclasses.replace(c.rollout, n=2, multi_turn=turns),
                            data=dataclasses.replace(c.data, max_prompt_length=512, max_response_length=160),
                            actor=dataclasses.replace(c.actor, micro_batch_size=4, mini_batch_size=2))
    worker = ActorRolloutRefWorker(c)
    batch, vision, script = _rollout(worker, c, CALL + "<|im_end|>", ROOT)
    return worker, batch, vision, script


def _rollout(worker, c, first_turn: str, base: Path):
    """ToolLoop.generate over two shapes prompts (a picture each), n = 2, turn 1 scripted."""
    from rlctl.models.vision import encode_prompt, load_processor
    from rlctl.multiturn.rollout import ToolLoop
    from rlctl.rollouts.base import RolloutContext
    from rlctl.tasks.shapes import _draw
    from rlctl.workers.compute.models import eos_token_ids

    processor = load_processor(c.model.path)
    tokenizer = processor.tokenizer
    script = tokenizer(first_turn, add_special_tokens=False)["input_ids"]
    gen = ScriptedFirstTurn(worker, script)
    actor = ToolLoop(gen, RolloutContext(c, tokenizer, base, eos_token_ids(c.model.path, tokenizer), engine_log_probs=True))
    messages = [[{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Colour?"}]}]] * 2
    pictures = [[_draw(random.Random(i), colour, 2)[0]] for i, colour in enumerate(("red", "blue"))]
    ids = [encode_prompt(processor, m, p, actor.runner.schemas)["input_ids"].tolist()
           for m, p in zip(messages, pictures)]
    width = max(map(len, ids))
    input_ids, mask = np.zeros((2, width), np.int64), np.zeros((2, width), np.int64)
    for r, row in enumerate(ids):
        input_ids[r, width - len(row):], mask[r, width - len(row):] = row, 1
    prompts = Batch({"input_ids": input_ids, "attention_mask": mask, "messages": object_array(messages),
                     "extra_info": object_array([{}, {}]), "images": object_array(pictures)})
    real = hf_engine.sample_tokens
    hf_engine.sample_tokens = lambda logits, **kw: gen.choose(real, logits, **kw)
    try:
        return actor.generate(prompts, seed=0), actor.vision, script
    finally:
        hf_engine.sample_tokens = real
        actor.close()


def _log_probs(worker, batch: Batch) -> np.ndarray:
    """The trainer's old_log_prob of the batch (the worker's compute_log_prob)."""
    return worker.compute_log_prob(batch)["old_log_prob"]


def test_tool_images_reach_the_row_with_masked_pads(zoom_rollout):
    from rlctl.workers.compute.vision import token_types

    worker, batch, vision, script = zoom_rollout
    model = worker.actor.module
    image = model.config.image_token_id
    assert "images" not in batch and batch["position_ids"].shape == (4, 3, batch["input_ids"].shape[1])
    for r in range(4):
        info, grid = batch["multi_turn"][r], batch["image_grid_thw"][r]
        assert info["num_turns"] == 2 and info["tool_calls"][0] == {"name": "zoom", "arguments": {"cell": 0},
                                                                    "error": False}
        assert len(grid) == 2 and grid[1].tolist() == [1, 4, 4]   # the prompt's picture, then the 56 x 56 crop
        assert len(batch["pixel_values"][r]) == int(grid.prod(-1).sum())
        response, model_mask = batch["responses"][r], batch["response_mask"][r]
        pads = response == image
        assert pads.sum() == vision.pads(grid[1:])[0] == 4 and not model_mask[pads].any()
        tool_span = np.flatnonzero(model_mask[:batch["response_length"][r]] == 0)
        assert pads.nonzero()[0].min() > tool_span.min()   # the pads sit inside the tool's message
        assert model_mask[:len(script)].all() and model_mask[tool_span.max() + 1:batch["response_length"][r]].all()
        types = token_types(model, torch.from_numpy(batch["input_ids"][r:r + 1]))
        assert int((types == 1).sum()) == int(grid.prod(-1).sum()) // vision.merge ** 2
    assert batch["conversation"][0][2]["content"][0] == {"type": "image"}


def test_trainer_log_probs_equal_the_rollouts_and_losing_the_tool_image_is_caught(zoom_rollout):
    worker, batch, _, _ = zoom_rollout
    model = worker.actor.module
    mask = batch["response_mask"] != 0
    rollout = batch["rollout_log_prob"]
    assert np.abs(_log_probs(worker, batch) - rollout)[mask].max() < 1e-5

    after = np.zeros_like(mask)   # model tokens after the tool image: the ones it can change
    for r in range(len(mask)):
        after[r, np.flatnonzero(batch["responses"][r] == model.config.image_token_id).max() + 1:] = True
    other = Batch(dict(batch.tensors))   # the crop's patches replaced by the prompt picture's first ones
    other["pixel_values"] = object_array([np.concatenate([p[:-16], p[:16]]) for p in batch["pixel_values"]])
    flat = Batch(dict(batch.tensors))    # 1-D positions: the images' M-RoPE axes lost
    flat["position_ids"] = np.repeat(np.maximum(np.cumsum(batch["attention_mask"], 1) - 1, 0)[:, None], 3, 1)
    for broken in (other, flat):
        assert np.abs(_log_probs(worker, broken) - rollout)[mask & after].max() > 1e-4


def test_a_tool_image_that_does_not_fit_is_left_out_whole(tiny_vlm_dir):
    """The response budget never cuts an image's pads: the whole tool answer is left out and the
    conversation ends ("length"); with room, the pads come in whole with the image's arrays."""
    from PIL import Image

    from rlctl.models.vision import load_processor
    from rlctl.multiturn.conversation import ChatRenderer, Conversation
    from rlctl.multiturn.tools import SampleTools
    from rlctl.multiturn.vision_turns import TurnImages, tool_message

    renderer, vision = ChatRenderer(load_processor(tiny_vlm_dir).tokenizer), TurnImages(str(tiny_vlm_dir))
    image = vision.encode([Image.new("RGB", (56, 56), (200, 0, 0))])
    message = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "call"}]

    def conversation():
        text = renderer.render(message, generation_prompt=False)
        return Conversation(messages=list(message), prompt_ids=[1], text=text, extra_info={},
                            tools=SampleTools(tools_kwargs={}))

    roomy, tight = conversation(), conversation()
    assert roomy.extend(renderer, [tool_message("crop", [object()])], 200, images=image, vision=vision)
    needed = len(roomy.response_ids)
    assert roomy.response_ids.count(vision.image_pad) == 4 and len(roomy.images) == 1
    assert not tight.extend(renderer, [tool_message("crop", [object()])], needed, images=image, vision=vision)
    assert tight.finish == "length" and tight.response_ids == [] and tight.images == []
    assert tight.text == roomy.text[:len(tight.text)] and "<|image_pad|><|vision_end|>" in roomy.text


def test_a_rank_with_narrower_inputs_returns_positions_at_the_calls_width(zoom_rollout):
    """generate_turn pads position_ids to the call's input width: ranks whose inputs are narrower
    than the call's (DP shares) return rows that line up with the others' and concatenate."""
    worker, batch, _, _ = zoom_rollout
    real = batch["attention_mask"][0, :batch["prompts"].shape[1]] > 0
    prompt = batch["prompts"][0][real]
    grid = batch["image_grid_thw"][0][:1]

    def turn(extra: int) -> Batch:
        ids = np.concatenate([np.zeros(extra, np.int64), prompt])[None]
        return worker.generate_turn(Batch({
            "input_ids": ids, "attention_mask": (np.arange(ids.shape[1]) >= extra).astype(np.int64)[None],
            "max_new_tokens": np.array([3]), "pixel_values": object_array([batch["pixel_values"][0][:int(grid.prod())]]),
            "image_grid_thw": object_array([grid])}), seed=0, mode="greedy", width=3)

    narrow, wide = turn(0), turn(5)
    assert wide["position_ids"].shape == (1, 3, len(prompt) + 5 + 3)
    assert np.array_equal(wide["position_ids"][:, :, 5:], narrow["position_ids"])
    assert np.array_equal(wide["responses"], narrow["responses"])


def test_an_interaction_may_answer_with_an_image(zoom_rollout, tmp_path):
    """A function interaction's "images" reach the next user turn the same way (pads, arrays, mask 0)."""
    worker, _, vision, _ = zoom_rollout
    (tmp_path / "user.py").write_text(
        "from PIL import Image\n\n\ndef look(messages, extra_info):\n"
        "    return {'content': 'look again', 'done': False, 'images': [Image.new('RGB', (56, 28), (0, 0, 200))]}\n")
    c = worker.cfg
    turns = dataclasses.replace(c.rollout.multi_turn, tools=(), interaction="user.py:look")
    c = dataclasses.replace(c, rollout=dataclasses.replace(c.rollout, multi_turn=turns))
    batch, _, script = _rollout(worker, c, "red<|im_end|>", tmp_path)
    image = worker.actor.module.config.image_token_id
    for r in range(len(batch)):
        grid, model_mask = batch["image_grid_thw"][r], batch["response_mask"][r]
        assert grid[1].tolist() == [1, 2, 4] and batch["conversation"][r][2]["role"] == "user"
        pads = batch["responses"][r] == image
        assert pads.sum() == vision.pads(grid[1:])[0] == 2 and not model_mask[pads].any()
        assert model_mask[:len(script)].all()
    mask = batch["response_mask"] != 0
    assert np.abs(_log_probs(worker, batch) - batch["rollout_log_prob"])[mask].max() < 1e-5
