"""Images through the built-in engine: `rlctl serve` takes OpenAI `image_url` parts (data URLs;
remote URLs refused unless --allow-remote-images), and the continuous-batching engine decodes an
image prompt exactly as transformers' own generate does (M-RoPE positions and rope deltas per row,
image and text rows mixed in one batch), which a dropped image or 1-D positions would break."""

from __future__ import annotations

import base64
import io
import signal

import pytest
from support.servers import ServerProcess

MESSAGES = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Colour?"}]}]


def _image(rgb, size=(56, 56)):
    from PIL import Image

    return Image.new("RGB", size, rgb)


def _data_url(image) -> str:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def test_engine_decodes_images_as_generate_does(tiny_vlm_dir):
    import torch
    from transformers import AutoModelForImageTextToText

    from rlctl.models.vision import load_processor
    from rlctl.serve.batch import LiveBatch
    from rlctl.serve.engine import Engine

    processor = load_processor(tiny_vlm_dir)
    model = AutoModelForImageTextToText.from_pretrained(tiny_vlm_dir).eval()
    engine = Engine(model, processor.tokenizer, processor=processor)
    try:
        red = engine.encode_vision_chat(MESSAGES, [_image((220, 30, 30))])
        wide = engine.encode_vision_chat(MESSAGES, [_image((30, 60, 220), (112, 56))])   # 8 image tokens
        text = (engine.encode_chat([{"role": "user", "content": "a longer text-only question"}]), None)
    finally:
        engine.shutdown(timeout=1.0)
    prompts = [red, wide, text]

    def reference(ids, vision):   # transformers' generate, one prompt at a time, greedy: its raw logits per step
        model.model.rope_deltas = None
        kwargs = {k: torch.as_tensor(v)[None] if k in ("input_ids", "mm_token_type_ids") else torch.as_tensor(v)
                  for k, v in (vision or {"input_ids": ids}).items()}
        out = model.generate(**kwargs, max_new_tokens=6, min_new_tokens=6, do_sample=False,
                             suppress_tokens=engine.banned, return_dict_in_generate=True, output_logits=True)
        return torch.stack([step[0] for step in out.logits])   # [6, V]

    # the same prompts prefilled together (left padded, mixed) and decoded step by step, greedily
    batch = LiveBatch(model, pad_id=engine.pad_id, context_length=engine.context_length, rows_hint=3, vision=True)
    logits = batch.admit([ids for ids, _ in prompts], [0, 1, 2], [v for _, v in prompts])
    steps = []
    for _ in range(6):
        steps.append(logits)
        logits = batch.decode(logits.index_fill(-1, torch.tensor(engine.banned), float("-inf")).argmax(-1))
    got = torch.stack(steps, dim=1)   # [B, 6, V]
    for row, (ids, vision) in enumerate(prompts):
        want = reference(ids, vision)
        assert torch.allclose(got[row], want, atol=2e-5), (row, (got[row] - want).abs().max())
    assert batch.runner.deltas.tolist()[2] == 0 and batch.runner.deltas.tolist()[0] < 0


@pytest.fixture(scope="module")
def vlm_server(tiny_vlm_dir):
    srv = ServerProcess([str(tiny_vlm_dir), "--engine", "hf", "--port", "0", "--served-model-name", "tiny-vl"])
    yield srv
    assert srv.stop(signal.SIGTERM) == 0, "".join(srv.stderr_lines[-20:])


@pytest.mark.slow
def test_openai_client_sends_an_image_data_url(vlm_server):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=vlm_server.base_url + "/v1", api_key="x", max_retries=0, timeout=60)
    content = [{"type": "image_url", "image_url": {"url": _data_url(_image((220, 30, 30)))}},
               {"type": "text", "text": "Colour?"}]
    r = client.chat.completions.create(model="tiny-vl", messages=[{"role": "user", "content": content}],
                                       max_tokens=5, temperature=0.0)
    # 'Colour?' and one 56x56 image: 26 template and text tokens + start, 4 image tokens, end
    assert r.usage.prompt_tokens == 32 and isinstance(r.choices[0].message.content, str)
    text_only = client.chat.completions.create(model="tiny-vl", max_tokens=3, temperature=0.0,
                                               messages=[{"role": "user", "content": "Colour?"}])
    assert text_only.usage.prompt_tokens == 32 - 6   # no vision start, 4 image pads, vision end
    for url, says in (("https://example.com/a.png", "remote image URLs are refused"),
                      ("data:image/png;base64,AAAA", "bytes are not a readable image")):
        bad = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "?"}]
        with pytest.raises(openai.BadRequestError, match=says):
            client.chat.completions.create(model="tiny-vl", messages=[{"role": "user", "content": bad}], max_tokens=2)


@pytest.mark.slow
def test_a_text_model_refuses_image_parts(client):
    openai = pytest.importorskip("openai")
    content = [{"type": "image_url", "image_url": {"url": _data_url(_image((0, 0, 0)))}}]
    with pytest.raises(openai.BadRequestError, match="this model takes no images"):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": content}], max_tokens=2)
