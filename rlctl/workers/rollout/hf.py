"""The `hf` rollout engine: batched sampling on the trainer's own transformers model.

By default the engine holds no copy of the weights: it runs the very module the actor trains, so
every optimizer step is visible to the next `generate` (update_weights is a no-op). With
`own_weights=True` (the separate rollout group of rollout.mode = "one_step_off") the module is
the engine's own copy, and `update_weights` loads the (HF name, tensor) pairs the actor pushes,
the same stream vLLM and SGLang load (rlctl.workers.rollout.weights.engine_weights). Per call:
  1. prefill each distinct prompt once (left-padded batch [B, P]) and copy its KV n times,
  2. decode all B*n rows one token per step, sampling with sampling.sample_tokens,
  3. drop a row from the batch and the KV cache as soon as it emits an EOS.

Multi-turn rollouts (rlctl.multiturn.rollout) continue a conversation every turn with its whole
token history. With `kv_store` keys, a call keeps each finished row's KV (its prompt and all of
its response but the last token, whose KV was never computed); the next call, given that key in
`kv_lookup`, prefills only the tokens after the kept prefix (the last sampled token, the tool
or user turn and the template's glue) instead of the whole context again. An entry is used only
when its token ids are exactly a prefix of the row's input, and the store holds the last call's
rows only: keys are per rollout (the caller's), so nothing survives a weight update. The fast
decoder (Llama-style models) reuses; other architectures prefill in full, as before.

FSDP2: a sharded model all-gathers parameters in every forward, and ranks that ran a different
number of decode steps (their rows finish at different times) would deadlock on those
collectives. So generation runs inside `rlctl.workers.parallel.fsdp.whole_weights`: every FSDP unit is
all-gathered once (`unshard`, the same calls in the same order on every rank) and kept whole
with reshard-after-forward off, so decoding runs no collective at all, for any number of steps
per rank; afterwards the trainer's settings come back and the units reshard. Peak memory during
generation is one full copy of the weights per rank, as with verl's HF rollout.
"""

from __future__ import annotations

import time
from typing import Any, Iterable, Mapping

import numpy as np
import torch

from rlctl.errors import UsageError
from rlctl.workers.compute.vision import (POSITION_IDS, ban_placeholders, engine_vision, placeholder_ids,
                                          rollout_positions)
from rlctl.workers.parallel.fsdp import whole_weights
from rlctl.workers.rollout.base import (RESPONSE_LENGTH, RESPONSE_MASK, RESPONSES,
                                        TRUNCATED, RolloutEngine, check_sampling_args)
from rlctl.workers.rollout import grammar
from rlctl.models.anatomy import causal_lm_parts
from rlctl.workers.rollout.compiled import compile_seconds
from rlctl.workers.rollout.decoder import DecoderRunner, left_pad, make_runner
from rlctl.workers.rollout.token_sampling import sample_tokens

# rollout.compile = "auto" compiles calls of at least this many new tokens (GSM8K-length and longer)
# on models at least this wide (SmolLM2-135M: 576)
AUTO_COMPILE_TOKENS, AUTO_COMPILE_HIDDEN = 128, 512


class HFRolloutEngine(RolloutEngine):
    """Generation with a transformers causal LM (plain, peft-wrapped, or FSDP2-sharded).

    `fast=True` uses DecoderRunner for Llama-style models and HF forward otherwise; `fast=False`
    always uses HF forward (a reference path for tests and unusual models).
    """

    def __init__(self, model: torch.nn.Module, *, pad_token_id: int, eos_token_ids: list[int],
                 fast: bool = True, own_weights: bool = False, reuse_kv: bool = True, tokenizer=None,
                 compile: str = "off"):
        if not eos_token_ids:
            raise UsageError("the hf rollout engine needs at least one EOS token id",
                             hint="set eos_token_id in the model's generation_config.json")
        self.model = model
        self.pad_token_id = int(pad_token_id)
        self.eos_token_ids = [int(e) for e in eos_token_ids]
        self.fast = fast
        self.compile = compile   # rollout.compile: "auto", "on" or "off" (_compiles)
        self.owns_weights = own_weights
        self.reuse_kv = reuse_kv
        self.kept_kv: dict[int, KVEntry] = {}
        self._positions: np.ndarray | None = None   # the last vision call's position_ids [B*n, 3, P+T]
        self.banned = placeholder_ids(model)   # vision placeholder tokens: never sampled
        self.last_stats: dict[str, float] = {}
        self._log_prob_temperature: float | None = None
        self.tokenizer, self._grammars = tokenizer, None   # grammar masks need the tokenizer's strings

    per_prompt_limits = True

    def generate(self, prompt_ids: list[list[int]], *, n: int, max_new_tokens: int,
                 temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0,
                 generator: torch.Generator | None = None,
                 greedy: bool = False, limits: list[int] | None = None,
                 kv_lookup: list[int] | None = None, kv_store: list[int] | None = None,
                 images: dict | None = None, log_probs: bool = False,
                 grammars: list[str | None] | None = None) -> dict[str, np.ndarray]:
        """RolloutEngine.generate; `limits` caps each prompt's responses at its own token count.
        kv_lookup (one key per prompt, -1 = none): continue from the KV a previous call kept under
        that key; kv_store (one key per response row, -1 = none): keep this call's rows' KV.
        images (vision-language models): {pixel_values, image_grid_thw}, one entry per prompt (None
        without an image, rlctl.workers.compute.vision); the result then also holds position_ids
        [B*n, 3, P+T], the M-RoPE positions the rows were sampled with. log_probs: also return
        rollout_log_prob [B*n, T], log softmax(logits / temperature) of each sampled token (the
        trainer's log-prob, before top-k / top-p; temperature 1 when greedy), 0 after the end.
        grammars: one spec per prompt or None (rlctl.workers.rollout.grammar): its rows sample under
        that grammar's mask, and their rollout_log_prob is of that masked distribution (as vLLM's)."""
        check_sampling_args(prompt_ids, n, max_new_tokens, temperature, top_p, top_k)
        params = dict(temperature=0.0 if greedy else float(temperature), top_p=float(top_p),
                      top_k=int(top_k), generator=generator)
        self._log_prob_temperature = (float(temperature) or 1.0) if log_probs else None
        t0, compiled_before = time.perf_counter(), compile_seconds()
        was_training = self.model.training
        self.model.eval()  # no dropout while sampling; restored for the trainer afterwards
        try:
            with whole_weights(self.model), torch.no_grad():
                matchers = self._matchers(grammars, n)
                responses, lengths, steps, token_lp = self._sample(prompt_ids, n, max_new_tokens, params, limits,
                                                                   kv_lookup, kv_store, images, matchers)
        finally:
            self.model.train(was_training)
        out = _to_numpy(responses, lengths, self.eos_token_ids)
        if token_lp is not None:
            out["rollout_log_prob"] = token_lp.float().cpu().numpy()
        if self._positions is not None:
            out[POSITION_IDS] = self._positions
        self.last_stats = {"seconds": time.perf_counter() - t0, "tokens": int(lengths.sum()),
                           "rows": len(lengths), "decode_steps": steps, "compile_s": compile_seconds() - compiled_before, **self._kv_stats}
        return out

    def _sample(self, prompt_ids: list[list[int]], n: int, max_new_tokens: int,
                params: dict[str, Any], limits: list[int] | None = None, kv_lookup: list[int] | None = None,
                kv_store: list[int] | None = None, images: dict | None = None,
                matchers: list | None = None) -> tuple[torch.Tensor, torch.Tensor, int]:
        """The decode loop. Returns responses [B*n, T] (pad after EOS), lengths [B*n], steps, and
        each sampled token's log-prob [B*n, T] when generate asked for them (else None)."""
        device = _device_of(self.model)
        plen_max = max(len(p) for p in prompt_ids)
        runner = self._runner(max_new_tokens, plen_max + max_new_tokens, vision=images is not None)
        keep_kv = self.reuse_kv and isinstance(runner, DecoderRunner) and kv_store is not None
        past, new_ids = self._take_past(prompt_ids, kv_lookup if keep_kv else None, device)
        input_ids, valid = left_pad(new_ids, self.pad_token_id, device)
        rows = len(prompt_ids) * n
        self._positions = None
        if images is not None:   # M-RoPE positions computed once, here, and returned with the rows
            vision = engine_vision(self.model, input_ids, valid, images)
            logits = runner.prefill(input_ids, valid, n, vision=vision)
            self._positions = rollout_positions(vision[POSITION_IDS], vision["deltas"], valid.sum(-1), n,
                                                max_new_tokens)
        elif past is None:
            logits = runner.prefill(input_ids, valid, n)
        else:
            logits = runner.prefill(input_ids, valid, n, past=past)
        logits = logits.repeat_interleave(n, dim=0)
        real = valid.sum(-1) + (0 if past is None else past[2].sum(-1))
        prompt_len = real.repeat_interleave(n)  # [B*n] real prompt tokens per row
        eos = torch.tensor(self.eos_token_ids, device=device)
        responses = torch.full((rows, max_new_tokens), self.pad_token_id, dtype=torch.long, device=device)
        lengths = torch.zeros(rows, dtype=torch.long, device=device)
        active = torch.arange(rows, device=device)  # original row of each active row
        cap = None if limits is None else torch.tensor(limits, device=device).repeat_interleave(n)  # [B*n]
        kept: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}   # row -> its generated KV
        lp_temp = self._log_prob_temperature
        token_lp = None if lp_temp is None else torch.zeros(rows, max_new_tokens, device=device)
        for step in range(max_new_tokens):
            tokens, drawn_from = self._next_tokens(logits, active, params, matchers)
            responses[active, step] = tokens
            if token_lp is not None:
                token_lp[active, step] = torch.log_softmax(drawn_from.float() / lp_temp, -1).gather(
                    -1, tokens.unsqueeze(-1)).squeeze(-1)
            lengths[active] = step + 1
            if step + 1 == max_new_tokens:
                break
            finished = torch.isin(tokens, eos)
            if cap is not None:   # this row's own budget is spent
                finished |= cap[active] <= step + 1
            if bool(finished.any()):
                if keep_kv:
                    kept.update(runner.snapshot(finished.nonzero().squeeze(-1), active))
                keep = keep_order(finished)
                if keep.numel() == 0:
                    break
                runner.select(keep)
                active, tokens = active[keep], tokens[keep]
            logits = runner.decode(tokens, prompt_len[active] + step)
        if keep_kv:
            if len(kept) < rows:   # rows still live at the last step
                kept.update(runner.snapshot(torch.arange(len(active), device=device), active))
            self._keep(prompt_ids, responses, lengths, n, runner, kept, kv_store)
        return responses, lengths, step + 1, token_lp

    def _next_tokens(self, logits: torch.Tensor, active: torch.Tensor, params: dict, matchers: list | None):
        """Each live row's next token [A] and the logits its log-prob is read from [A, V]: placeholders
        banned; a row with a grammar samples under its mask (its matcher then takes the token) and its
        log-prob is of that masked, renormalised distribution. Free rows: the very logits they had."""
        if matchers is None:
            return _sample_in_row_order(ban_placeholders(logits, self.banned), active, params), logits
        live = [matchers[r] for r in active.tolist()]
        masked = grammar.constrained(ban_placeholders(logits, self.banned), live)
        tokens = _sample_in_row_order(masked, active, params)
        grammar.accept(live, tokens.tolist())
        return tokens, masked

    def _matchers(self, grammars: list[str | None] | None, n: int) -> list | None:
        """One grammar matcher per response row (None: a free row); None when no prompt has a grammar."""
        if not grammars or not any(grammars):
            return None
        if self.tokenizer is None:
            raise UsageError("this hf rollout engine was built without a tokenizer and cannot decode under a grammar")
        if self._grammars is None:
            self._grammars = grammar.GrammarCompiler(self.tokenizer, grammar.vocab_size_of(self.model),
                                                     self.eos_token_ids)
        return [self._grammars.matcher(g) if g else None for g in grammars for _ in range(n)]

    def _take_past(self, prompt_ids: list[list[int]], lookup: list[int] | None, device: torch.device):
        """Pop the kept KV of each prompt's key (when its ids are a prefix of the prompt): returns
        (keys, values [layers, B, kv, C, D], valid [B, C]) left-padded, or None when nothing is
        reused, and the ids still to prefill per prompt (all of them where nothing was kept)."""
        store, self.kept_kv = self.kept_kv, {}
        self._kv_stats = {"kv_reused_tokens": 0, "kv_prefill_tokens": sum(len(p) for p in prompt_ids)}
        if not lookup:
            return None, prompt_ids
        hits = []
        for key, ids in zip(lookup, prompt_ids):
            entry = store.pop(int(key), None) if int(key) >= 0 else None
            usable = entry is not None and len(entry.ids) < len(ids) and tuple(ids[:len(entry.ids)]) == entry.ids
            hits.append(entry if usable else None)
        if not any(hits):
            return None, prompt_ids
        width = max(len(e.ids) for e in hits if e is not None)
        sample = next(e for e in hits if e is not None)
        layers, kv, _, dim = sample.keys.shape
        keys = sample.keys.new_zeros(layers, len(hits), kv, width, dim)
        values = torch.zeros_like(keys)
        valid = torch.zeros(len(hits), width, dtype=torch.bool, device=device)
        rest = []
        for b, (entry, ids) in enumerate(zip(hits, prompt_ids)):
            if entry is None:
                rest.append(ids)
                continue
            c = len(entry.ids)
            keys[:, b, :, width - c:], values[:, b, :, width - c:] = entry.keys, entry.values
            valid[b, width - c:] = True
            rest.append(ids[c:])
        reused = int(valid.sum())
        self._kv_stats = {"kv_reused_tokens": reused, "kv_prefill_tokens": self._kv_stats["kv_prefill_tokens"] - reused}
        return (keys, values, valid), rest

    def _keep(self, prompt_ids: list[list[int]], responses: torch.Tensor, lengths: torch.Tensor, n: int,
              runner: "DecoderRunner", kept: dict, store_keys: list[int]) -> None:
        """Keep each keyed row's KV: its prompt's (shared by its n samples) ++ its own generated."""
        prompt_kv: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        resp = responses.tolist()
        for row, key in enumerate(store_keys):
            if int(key) < 0:
                continue
            b, length = row // n, int(lengths[row])
            if b not in prompt_kv:
                prompt_kv[b] = runner.prompt_kv(b)
            pk, pv = prompt_kv[b]
            gk, gv = kept[row]
            self.kept_kv[int(key)] = KVEntry(ids=tuple(prompt_ids[b]) + tuple(resp[row][:length - 1]),
                                              keys=torch.cat([pk, gk[:, :, :length - 1]], dim=2),
                                              values=torch.cat([pv, gv[:, :, :length - 1]], dim=2))

    def _runner(self, max_new_tokens: int, max_len: int, vision: bool = False):
        runner = make_runner(self.model, max_new_tokens, max_len, fast=self.fast, vision=vision,
                             **({"compile": True} if self._compiles(max_new_tokens) else {}))
        return runner

    def _compiles(self, max_new_tokens: int) -> bool:
        """Decode through the compiled layers (rlctl.workers.rollout.compiled, where the runner can):
        "auto" when the call decodes at least AUTO_COMPILE_TOKENS tokens with a model of at least
        AUTO_COMPILE_HIDDEN hidden units: there the per-step saving repays the compile (seconds, once per
        process) within a run's first steps; a test-sized model's step has too little to fuse."""
        if self.compile != "auto":
            return self.compile == "on"
        hidden = getattr(causal_lm_parts(self.model).config, "hidden_size", 0)
        return max_new_tokens >= AUTO_COMPILE_TOKENS and hidden >= AUTO_COMPILE_HIDDEN

    def update_weights(self, weights: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]] | None = None) -> None:
        """Shared module: a no-op (the engine runs the trainer's module, always the live weights).
        Own copy: copy every pushed tensor (torch or numpy, HF names) into the module's parameter
        of that name; a name the module lacks, or a parameter left without a value, is an error
        (tied embeddings: named_parameters() lists the shared tensor once, as the embedding, so
        `lm_head.weight` is neither expected nor accepted)."""
        if not self.owns_weights or weights is None:
            return
        from rlctl.workers.rollout.weights import hf_name

        params = {hf_name(name): p for name, p in self.model.named_parameters()}
        missing = set(params)
        items = weights.items() if isinstance(weights, Mapping) else weights
        with torch.no_grad():
            for name, value in items:
                if name not in params:
                    raise UsageError(f"pushed weight {name!r} is not a parameter of the rollout model",
                                     hint="the actor and the rollout group must load the same model.path")
                params[name].copy_(torch.as_tensor(value))   # copy_ casts dtype and device
                missing.discard(name)
        if missing:
            raise UsageError(f"the weight push left {len(missing)} rollout parameter(s) unset, e.g. {sorted(missing)[0]}",
                             hint="the actor and the rollout group must load the same model.path")

    def sleep(self) -> None:
        """Drop the kept multi-turn KV; on GPU hand the allocator's cached blocks back so the
        trainer can use them."""
        self.kept_kv = {}
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def wake(self) -> None:
        """Nothing to re-acquire: weights are the trainer's, the cache is allocated per call."""


def keep_order(finished: torch.Tensor) -> torch.Tensor:
    """The live rows to keep after a step whose `finished` [A] rows ended, as runner.select takes
    them: rows keep their place, and the last live rows move into the finished rows' places, so a
    select copies one cache row per finished row (in-order compaction moved every row after the
    first finished one). Every keep[j] >= j."""
    alive = (~finished).nonzero().squeeze(-1)
    keep = torch.arange(alive.numel(), device=finished.device)
    holes = finished[:alive.numel()].nonzero().squeeze(-1)
    keep[holes] = alive[alive >= alive.numel()]
    return keep


def _sample_in_row_order(logits: torch.Tensor, active: torch.Tensor, params: dict) -> torch.Tensor:
    """sample_tokens on the live rows in original-row order (keep_order leaves them out of order),
    so each row draws the same noise, and the same tokens, as when the rows stayed sorted."""
    order = torch.argsort(active)
    if bool((order == torch.arange(len(order), device=order.device)).all()):
        return sample_tokens(logits, **params)
    tokens = torch.empty_like(active)
    tokens[order] = sample_tokens(logits[order], **params)
    return tokens


def kept_kv_args(batch) -> dict:
    """generate()'s kv_lookup / kv_store from a generate_turn batch's optional columns of the same
    names ([rows] and [rows, n]); {} when the caller keeps no KV."""
    if "kv_lookup" not in batch:
        return {}
    return {"kv_lookup": batch["kv_lookup"].tolist(), "kv_store": batch["kv_store"].reshape(-1).tolist()}


class KVEntry:
    """One kept row: its token ids and their keys/values [layers, kv_heads, len(ids), head_dim]."""

    __slots__ = ("ids", "keys", "values")

    def __init__(self, ids: tuple, keys: torch.Tensor, values: torch.Tensor):
        self.ids, self.keys, self.values = ids, keys, values


def _to_numpy(responses: torch.Tensor, lengths: torch.Tensor, eos_token_ids: list[int]) -> dict[str, np.ndarray]:
    responses_np = responses.cpu().numpy().astype(np.int64)
    lengths_np = lengths.cpu().numpy().astype(np.int64)
    width = responses_np.shape[1]
    last = responses_np[np.arange(len(lengths_np)), lengths_np - 1]
    return {
        RESPONSES: responses_np,
        RESPONSE_MASK: (np.arange(width)[None, :] < lengths_np[:, None]).astype(np.int64),
        RESPONSE_LENGTH: lengths_np,
        TRUNCATED: ~np.isin(last, eos_token_ids),
    }


def _device_of(model: torch.nn.Module) -> torch.device:
    for p in model.parameters():
        return p.device
    return torch.device("cpu")
