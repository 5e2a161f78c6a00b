"""vLLM's `prompt_logprobs` extension of /v1/completions for the built-in engine (`rlctl serve
--prompt-logprobs K`): the log-prob of every prompt token given the ones before it, with the K most
likely tokens at each position. A distillation teacher served this way scores a student's tokens
(distill.teacher_url).

Answer format (vLLM's): one entry per prompt token, the first None (nothing predicts it), each
other {token_id: {"logprob", "rank", "decoded_token"}} holding the top K and the actual token.
"""

from __future__ import annotations

from rlctl.api.api_error import APIError


def requested_k(body: dict, limit: int) -> int:
    """The request's prompt_logprobs (0 = none); a 400 when this server does not allow that many."""
    k = body.get("prompt_logprobs")
    if k in (None, 0, False):
        return 0
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise APIError(400, "'prompt_logprobs' must be a non-negative integer", param="prompt_logprobs")
    if k > limit:
        raise APIError(400, f"'prompt_logprobs' = {k} exceeds this server's limit of {limit} "
                            "(start it with `rlctl serve --prompt-logprobs K`)", param="prompt_logprobs")
    return k


def prompt_logprobs(engine, ids: list[int], k: int) -> list:
    """One forward over `ids` (temperature 1); the entries described above."""
    import torch

    with torch.no_grad():
        logits = engine.model(torch.tensor([ids], device=engine.model.device)).logits[0, :-1].float()
    log_probs = torch.log_softmax(logits, -1)
    top, top_ids = log_probs.topk(min(k, log_probs.shape[-1]), -1)
    with engine.tokenizer_lock:
        decode = {i: engine.tokenizer.decode([i]) for i in set(top_ids.flatten().tolist()) | set(ids)}
    out: list = [None]
    for pos, token in enumerate(ids[1:]):
        entry = {str(i): {"logprob": float(v), "rank": r + 1, "decoded_token": decode[i]}
                 for r, (v, i) in enumerate(zip(top[pos].tolist(), top_ids[pos].tolist()))}
        if str(token) not in entry:
            value = log_probs[pos, token]
            entry[str(token)] = {"logprob": float(value), "rank": int((log_probs[pos] > value).sum()) + 1,
                                 "decoded_token": decode[token]}
        out.append(entry)
    return out
