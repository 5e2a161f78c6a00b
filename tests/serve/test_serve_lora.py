"""LoRA adapters served by name on the built-in engine: the batched per-row LoRA against peft's own
model, the refusals at start, and a real `rlctl serve BASE --lora ...` with the official openai client."""

from __future__ import annotations

import queue
import signal

import pytest
import torch
from support.lora_adapters import edit_config, make_adapter, peft_greedy

from rlctl.errors import DataError, UsageError


@pytest.fixture(scope="module")
def adapters(tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    return {"qv": make_adapter(tiny_model_dir, root / "qv", rank=4, targets=["q_proj", "v_proj"], seed=1),
            "all": make_adapter(tiny_model_dir, root / "all", rank=8, targets="all-linear", seed=2)}


def _served(model_dir, adapters, slots=3):
    from transformers import AutoModelForCausalLM

    from rlctl.serve.server import served_adapters

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    plan = {"adapters": list(adapters.items()), "slots": slots, "max_rank": None}
    return model, served_adapters(model, "tiny", plan)


def test_rows_of_different_adapters_in_one_forward_match_peft(tiny_model_dir, adapters):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model, served = _served(tiny_model_dir, adapters)
    ids = torch.randint(0, 200, (3, 9), generator=torch.Generator().manual_seed(0))
    slots = [0, served.slot_of("qv"), served.slot_of("all")]
    with torch.no_grad(), served.lora.rows(slots):
        mixed = model(ids).logits
    with torch.no_grad():
        base = model(ids).logits   # no rows set on this thread: the base model
    assert torch.equal(mixed[0], base[0])
    for row, name in ((1, "qv"), (2, "all")):
        ref = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), adapters[name]).eval()
        with torch.no_grad():
            expected = ref(ids).logits[row]
        assert torch.allclose(mixed[row], expected, atol=1e-5), name
        assert (expected - base[row]).abs().max() > 1e-2, "the adapter must change the answer"


def test_engine_decodes_requests_for_different_adapters_together(tiny_model_dir, adapters):
    from transformers import AutoTokenizer

    from rlctl.api.requests import Request, SamplingParams
    from rlctl.serve.engine import Engine

    model, served = _served(tiny_model_dir, adapters)
    engine = Engine(model, AutoTokenizer.from_pretrained(tiny_model_dir), max_rows=8, adapters=served)
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)

    def run(names):
        events = queue.Queue()
        for i, name in enumerate(names):
            engine.submit(Request([5, 6, 7, 8], params, events, index_base=i, adapter=name))
        tokens, finished = {}, set()
        while len(finished) < len(names):
            ev = events.get(timeout=30)
            assert ev.error is None, ev.error
            tokens[ev.index] = tokens.get(ev.index, "") + ev.text
            if ev.finish_reason:
                finished.add(ev.index)
        return [tokens[i] for i in range(len(names))]

    try:
        alone = [run([name])[0] for name in ("", "qv", "all")]
        assert engine.peak_rows == 1 and len(set(alone)) == 3
        engine.peak_rows = 0
        assert run(["", "qv", "all"]) == alone
        assert engine.peak_rows == 3, "rows of the base and two adapters decode in one batch"
        assert engine.load()["mixed_steps"] > 0
    finally:
        engine.shutdown(timeout=5)


def test_an_adapter_that_does_not_fit_the_base_is_refused(tiny_model_dir, adapters, tmp_path):
    from transformers import AutoModelForCausalLM

    from rlctl.models.tiny import build_tiny_model
    from rlctl.serve.adapters import check_adapters

    build_tiny_model(tmp_path / "wide", layers=2, hidden=128, heads=4, kv_heads=2, seed=0)
    wide = AutoModelForCausalLM.from_pretrained(tmp_path / "wide")
    with pytest.raises(DataError, match=r"does not fit wide .*trained on .*q_proj as \[64, 64\] but the base "
                                        r"model's layer is \[128, 128\]"):
        check_adapters([("qv", adapters["qv"])], wide, "wide", None)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with pytest.raises(DataError, match="rank 8, above --max-lora-rank 4"):
        check_adapters([("all", adapters["all"])], base, "tiny", 4)


@pytest.mark.parametrize("change, words", [({"use_dora": True}, "uses DoRA"),
                                           ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
                                           ({"bias": "lora_only"}, "trains biases"),
                                           ({"peft_type": "IA3"}, "not LoRA")])
def test_adapters_only_a_merge_can_serve_are_refused_by_name(adapters, tmp_path, change, words):
    from rlctl.models.lora_adapter import read_adapter

    folder = edit_config(adapters["qv"], tmp_path / "edited", **change)
    with pytest.raises(DataError, match=words) as err:
        read_adapter("x", folder)
    assert "rlctl merge" in str(err.value)


def test_lora_plan_refusals(tiny_model_dir, adapters):
    from rlctl.models.lora_adapter import vllm_rank
    from rlctl.serve.adapters import lora_plan

    qv = f"qv={adapters['qv']}"
    with pytest.raises(UsageError, match="--engine sglang cannot serve LoRA"):
        lora_plan("sglang", [qv], tiny_model_dir, "tiny")
    with pytest.raises(UsageError, match="2 --lora adapters but --max-loras 1"):
        lora_plan("hf", [qv, f"all={adapters['all']}"], tiny_model_dir, "tiny", max_loras=1)
    with pytest.raises(UsageError, match="not NAME=DIR"):
        lora_plan("hf", [str(adapters["qv"])], tiny_model_dir, "tiny")
    with pytest.raises(UsageError, match="the base model's name"):
        lora_plan("hf", [f"tiny={adapters['qv']}"], tiny_model_dir, "tiny")
    with pytest.raises(UsageError, match="--max-lora-rank 20 is not a rank vLLM takes"):
        lora_plan("vllm", [qv], tiny_model_dir, "tiny", max_rank=20)
    with pytest.raises(DataError, match="rank 1024; vLLM serves ranks up to 512"):
        vllm_rank([1024], None)
    plan = lora_plan("vllm", [qv], tiny_model_dir, "tiny")
    assert plan["max_rank"] == 16 and plan["slots"] == 4
    assert lora_plan("hf", [], tiny_model_dir, "tiny") is None


@pytest.mark.slow
def test_serve_lora_with_the_openai_client(tiny_model_dir, adapters, start_server):
    openai = pytest.importorskip("openai")
    srv = start_server([str(tiny_model_dir), "--engine", "hf", "--port", "0", "--served-model-name", "tiny",
                        "--lora", f"qv={adapters['qv']}", "--lora", f"all={adapters['all']}", "--max-loras", "2"])
    client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="x", max_retries=0, timeout=60)
    assert [m.id for m in client.models.list().data] == ["tiny", "qv", "all"]
    assert client.models.retrieve("qv").parent == "tiny"
    answers = {}
    for name, folder in (("tiny", None), ("qv", adapters["qv"]), ("all", adapters["all"])):
        r = client.completions.create(model=name, prompt="Once upon", max_tokens=8, temperature=0)
        assert r.model == name
        answers[name] = r.choices[0].text
        assert answers[name] == peft_greedy(tiny_model_dir, folder, "Once upon", 8), name
    assert len(set(answers.values())) == 3
    with pytest.raises(openai.NotFoundError, match="serves 'tiny' and the LoRA adapters 'qv', 'all'"):
        client.completions.create(model="qv2", prompt="x", max_tokens=2)
    # vLLM's runtime routes and bodies: both slots are taken, so a third adapter waits for an unload
    load = {"lora_name": "qv2", "lora_path": str(adapters["qv"])}
    with pytest.raises(openai.BadRequestError, match="all 2 adapter slots are in use"):
        client.post("/load_lora_adapter", body=load, cast_to=str)
    assert client.post("/unload_lora_adapter", body={"lora_name": "all"}, cast_to=str) == \
        "Success: LoRA adapter 'all' removed successfully."
    with pytest.raises(openai.NotFoundError, match="the LoRA adapters 'qv'\", 'type'"):   # 'all' is gone
        client.chat.completions.create(model="all", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert "added successfully" in client.post("/load_lora_adapter", body=load, cast_to=str)
    r = client.completions.create(model="qv2", prompt="Once upon", max_tokens=8, temperature=0)
    assert r.choices[0].text == answers["qv"]
    with pytest.raises(openai.NotFoundError, match="is not a folder"):
        client.post("/load_lora_adapter", body={"lora_name": "x", "lora_path": "/no/such"}, cast_to=str)
    with pytest.raises(openai.NotFoundError, match="cannot be found"):
        client.post("/unload_lora_adapter", body={"lora_name": "nope"}, cast_to=str)
    assert srv.stop(signal.SIGTERM) == 0
