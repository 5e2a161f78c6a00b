"""Drive rlctl's vLLM rollout engine on CPU in a process of its own and print what it saw as JSON.

Its own process because vLLM's external launcher makes the process a torch.distributed world of
one, which must not leak into the pytest process. Usage: python vllm_engine_check.py MODEL_A MODEL_B
(two tiny models of one architecture, head size 64). One engine on A, the weights of B pushed into
it, then a freshly built engine on B's folder: greedy tokens and sampled-token log-probs of each.
"""

from __future__ import annotations

import json
import random
import sys

import numpy as np
import torch

PROMPTS = [[5, 6, 7, 8], [50, 60, 70], [100, 3, 200, 9, 11]]


def run(engine, **kw) -> dict:
    out = engine.generate(PROMPTS, max_new_tokens=12, **kw)
    return {k: v.tolist() for k, v in out.items()}


BOOL_SPEC = json.dumps({"type": "json_schema", "schema": {"type": "object", "properties": {"b": {"type": "boolean"}},
                                                         "required": ["b"]}})


def under_grammar(engine) -> dict:
    """Prompts 0 and 2 under a JSON-schema grammar (vLLM's structured outputs), prompt 1 free: each
    row's tokens, and its log-probs beside the free model's (the trainer's) of the same tokens."""
    out = engine.generate(PROMPTS, n=1, max_new_tokens=24, temperature=1.0, generator=torch.Generator().manual_seed(5),
                          grammars=[BOOL_SPEC, None, BOOL_SPEC])
    return {"grammar_rows": [r[:n].tolist() for r, n in zip(out["responses"], out["response_length"])],
            "grammar_log_probs": [lp[:n].tolist() for lp, n in zip(out["rollout_log_prob"], out["response_length"])]}


def sampled(engine, seed: int, prompts=PROMPTS) -> list:
    g = torch.Generator().manual_seed(seed)
    return engine.generate(prompts, n=3, max_new_tokens=12, temperature=1.0, generator=g)["responses"].tolist()


def trainer_log_probs(model, out: dict) -> list:
    """The transformers model's log-probs of the engine's greedy tokens (as the trainer computes them)."""
    from rlctl.workers.compute.logprob import response_log_probs

    rows = []
    for prompt, resp, length in zip(PROMPTS, out["responses"], out["response_length"]):
        ids = torch.tensor([prompt + resp[:length]])
        lp = response_log_probs(model, ids, torch.ones_like(ids), length)["log_prob"][0]
        rows.append(lp.tolist())
    return rows


def lora_push(engine, model_dir: str) -> dict:
    """A LoRA policy as the actor pushes it (W + scaling * B.A, rlctl's engine_weights): the engine's
    greedy log-probs against the adapted model's and the base model's (the adapter off)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from rlctl.workers.rollout.weights import engine_weights

    torch.manual_seed(5)   # init_lora_weights=False: B is random too, so the adapter changes the model
    lora = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"], init_lora_weights=False))
    engine.update_weights(engine_weights(lora, dtype=torch.float32))
    out = run(engine, n=1, greedy=True)
    with lora.disable_adapter():
        base = trainer_log_probs(lora, out)
    return {"greedy_lora": out, "trainer_log_probs_lora": trainer_log_probs(lora, out), "base_log_probs_lora": base}


def next_turn_cache(engine) -> dict:
    """A second turn re-submits the first turn's prompt and response plus new tokens: how many of
    them vLLM's prefix cache had (it keeps whole KV blocks, generated tokens' included)."""
    from vllm import SamplingParams

    prompt = [3 + (7 * j) % 240 for j in range(24)]
    response = engine.generate([prompt], n=1, max_new_tokens=20, greedy=True)
    turn = prompt + response["responses"][0, :int(response["response_length"][0])].tolist() + [9, 10, 11, 12]
    out = engine.llm.generate([{"prompt_token_ids": turn}], SamplingParams(max_tokens=1), use_tqdm=False)
    return {"turn_2_tokens": len(turn), "turn_2_cached": int(out[0].num_cached_tokens or 0),
            "block_size": int(engine.llm.llm_engine.vllm_config.cache_config.block_size)}


def main(model_a: str, model_b: str) -> dict:
    from transformers import AutoModelForCausalLM

    from rlctl.errors import WorkerDiedError
    from rlctl.workers.rollout.gpu import GPUEngineSpec
    from rlctl.workers.rollout.vllm import VLLMRolloutEngine
    from rlctl.workers.rollout.weights import engine_weights

    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    report: dict = {"cpu_head_sizes": list(CPUAttentionBackend.get_supported_head_sizes())}
    torch.set_num_threads(1)
    torch.manual_seed(7), np.random.seed(7), random.seed(7)
    before = (torch.rand(1).item(), np.random.rand(), random.random())
    torch.manual_seed(7), np.random.seed(7), random.seed(7)
    spec = GPUEngineSpec(model_path=model_a, dtype="float32", max_model_len=64, seed=3, enforce_eager=True)
    engine = VLLMRolloutEngine(spec, pad_token_id=0, eos_token_ids=[1])
    report["rng_kept"] = (torch.rand(1).item(), np.random.rand(), random.random()) == before
    torch.set_num_threads(2)
    report["threads_settable"] = torch.get_num_threads() == 2
    torch.set_num_threads(1)
    report["greedy_a"] = run(engine, n=2, greedy=True)
    report["same_seed_same_samples"] = sampled(engine, 11) == sampled(engine, 11)
    alone = sampled(engine, 11, PROMPTS[:1])
    report["batch_independent"] = alone == sampled(engine, 11)[:3]
    report["limits"] = engine.generate(PROMPTS, n=1, max_new_tokens=12, greedy=True,
                                       limits=[3, 12, 5])["response_length"].tolist()
    report.update(next_turn_cache(engine))
    report.update(under_grammar(engine))
    report["trainer_log_probs_grammar"] = trainer_log_probs(
        AutoModelForCausalLM.from_pretrained(model_a, dtype=torch.float32),
        {"responses": report["grammar_rows"], "response_length": [len(r) for r in report["grammar_rows"]]})
    big = [[3 + (i * 7 + j) % 240 for j in range(40)] for i in range(64)]   # 20 k prefill tokens: over a step's budget
    report["big_batch_rows"] = len(engine.generate(big, n=8, max_new_tokens=4, temperature=1.0,
                                                   generator=torch.Generator().manual_seed(1))["responses"])
    model_b_hf = AutoModelForCausalLM.from_pretrained(model_b, dtype=torch.float32)
    for i in range(2):   # every push, not just the first
        engine.update_weights(engine_weights(model_b_hf, dtype=torch.float32))
        report[f"greedy_pushed_{i}"] = run(engine, n=1, greedy=True)
    report["trainer_log_probs_b"] = trainer_log_probs(model_b_hf, report["greedy_pushed_1"])
    report.update(lora_push(engine, model_a))
    engine.close()
    fresh = VLLMRolloutEngine(GPUEngineSpec(model_path=model_b, dtype="float32", max_model_len=64, seed=3,
                                            enforce_eager=True), pad_token_id=0, eos_token_ids=[1])
    report["greedy_fresh_b"] = run(fresh, n=1, greedy=True)
    bad = [("model.embed_tokens.weight", torch.zeros(3, 3))]   # a push that cannot load
    for attempt in ("push", "generate"):
        try:
            fresh.update_weights(bad) if attempt == "push" else run(fresh, n=1, greedy=True)
            report[f"bad_{attempt}"] = "no error"
        except WorkerDiedError as e:
            report[f"bad_{attempt}"] = e.message
    return report


if __name__ == "__main__":
    print("REPORT " + json.dumps(main(sys.argv[1], sys.argv[2])))
