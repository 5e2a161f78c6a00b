"""`ActorRolloutRefWorker`: the policy's rank, holding actor, rollout and reference together.

One copy of the policy weights per rank serves all three roles: the rollout engine generates
with the very module the optimizer updates (so generation always uses the latest weights), and
with LoRA the reference is the same module with its adapters switched off. Only full
fine-tuning with a KL term keeps a second, frozen copy for the reference.

Batch keys (B rows; see rlctl.runtime.batch for shapes):
    generate          in:  input_ids, attention_mask [B, P] left-padded prompts, plus any per-prompt
                           columns (repeated n times)   out: B*n rows of prompts, responses,
                           response_mask, response_length, truncated, input_ids, attention_mask
    compute_log_prob  in:  input_ids, attention_mask, response_mask   out: old_log_prob, entropy (+ routed_experts)
    compute_ref_log_prob   same in                                    out: ref_log_prob
    update_actor      in:  input_ids, attention_mask, response_mask, advantages, old_log_prob
                           (optional when on-policy), ref_log_prob (when actor.use_kl_loss),
                           teacher_* (distill.loss's supervised forms), routed_experts (router replay)
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch

from rlctl.config.plan import batch_plan
from rlctl.errors import ConfigError
from rlctl.runtime import Batch, Dispatch, register
from rlctl.models.loading import policy_tokenizer
from rlctl.runtime.policy import rollout_batch
from rlctl.workers.compute.engine import TrainEngine, trained_role_methods
from rlctl.workers.compute.logprob import batched_response_outputs, response_log_probs
from rlctl.workers.compute.models import eos_token_ids, load_causal_lm, policy_engine
from rlctl.workers.compute.models import shared_base as shared_base_model
from rlctl.workers.compute.training import mini_batch_count, run_updates, trainer_engine_drift_sums
from rlctl.workers.compute.vision import (IMAGES, PIXEL_VALUES, POSITION_IDS, VISION_KEYS, batch_positions,
                                  has_vision_tower, pad_turn_positions, tower_always_runs, with_pixels,
                                  without_images)
from rlctl.workers.parallel import fsdp, moe_aux, router_replay
from rlctl.workers.rollout.grammar import grammar_args
from rlctl.workers.rollout.hf import kept_kv_args

_MODEL_KEYS = ["input_ids", "attention_mask"]


class ActorRolloutRefWorker:
    """The policy on one rank. `config` is rlctl.config.schema.Config with model.path resolved.

    total_steps: training steps of the run (the cosine schedule's length).
    needs: the run's rlctl.algorithms.Needs, computed once by the controller (`reference`: keep the
    reference's log-probs; `sum_pi_squared`: compute_log_prob returns it); None: this config's
    (rlctl.algorithms.run_needs), for a worker built outside a run.
    shared_base: a LoRA run of a group sharing one base in this process (rlctl.controller.group).
    """

    def __init__(self, config, *, total_steps: int = 0, needs=None, shared_base: bool = False):
        from rlctl.algorithms import run_needs
        from rlctl.plugins import import_plugins

        import_plugins(config.algorithm.plugins)   # a user's policy loss runs here (absolute paths)
        needs = needs if needs is not None else run_needs(config)   # after the plugins: they may name it
        self.cfg, self.with_ref, self.sum_pi_squared = config, needs.reference, needs.sum_pi_squared
        self.rank, self.world = fsdp.rank_and_world()
        self.lora = config.model.lora.rank > 0
        self.base = shared_base_model(config.model) if shared_base else None   # held: the group's runs share it
        self.actor = policy_engine(config, total_steps, base=self.base)
        self.ref = None
        if self.with_ref and not self.lora:
            self.ref = self.actor.frozen_twin(load_causal_lm(config.model))   # on the actor's sp group
        self.tokenizer = policy_tokenizer(config.model)
        self.eos_ids = eos_token_ids(config.model.path, self.tokenizer)
        self.temperature = config.rollout.temperature or 1.0  # log-probs of the sampling distribution
        # vision model over > 1 rank: a micro-batch without images still runs the vision tower
        self.vision_sync = self.world > 1 and has_vision_tower(self.actor.module)
        self.moe_aux_coef = moe_aux.resolve_coef(self.actor.module, config.actor.moe_aux_loss_coef,
                                                 self.actor.sp_size)   # 0: dense, or off
        self.replay = config.actor.router_replay and router_replay.install(self.actor.module)
        self._rollout = None
        # Engines with their own weight copy (vLLM, SGLang) get the trained weights before a
        # generate whenever they changed (the engine's weights_version: an update, a checkpoint
        # load) or were dropped (sleep).
        self._engine_version = 0
        self._adapter_sync = False   # model.lora.sync = "adapter" in effect (rlctl.workers.rollout.adapter_sync)
        self._sync_stats: dict = {}   # the last push's weight_sync_s / weight_sync_mb, for the next batch's meta

    # --- rollout -------------------------------------------------------------------------------
    def rollout_engine(self):
        if self._rollout is None:
            from rlctl.workers.rollout.gpu import GPUEngineSpec
            from rlctl.workers.rollout.registry import make_rollout_engine, rollout_engine_info

            from rlctl.workers.rollout.adapter_sync import adapter_sync_on

            spec = None
            if rollout_engine_info(self.cfg.rollout.engine).owns_weights:
                self._adapter_sync = adapter_sync_on(self.cfg, self.actor.module)
                spec = GPUEngineSpec.from_config(self.cfg, str(self.actor.compute_dtype).removeprefix("torch."),
                                                 vision=has_vision_tower(self.actor.module),
                                                 lora_rank=self.cfg.model.lora.rank if self._adapter_sync else 0)
            self._rollout = make_rollout_engine(self.cfg.rollout.engine, self.actor.module, spec=spec,
                                                pad_token_id=self._pad_id(), eos_token_ids=self.eos_ids,
                                                tokenizer=self.tokenizer, compile=self.cfg.rollout.compile)
        return self._rollout

    def _ready_engine(self):
        """The rollout engine, awake and holding the latest trained weights."""
        engine = self.rollout_engine()
        self._sync_stats = {"weight_sync_s": 0.0, "weight_sync_mb": 0.0}   # the trainer's module, or up to date
        if engine.owns_weights and self._engine_version != self.actor.weights_version:
            from rlctl.workers.rollout.adapter_sync import push_weights

            engine.wake()
            self._sync_stats = push_weights(engine, self.actor.module, self.cfg, adapter=self._adapter_sync,
                                            version=self.actor.weights_version, dtype=self.actor.compute_dtype)
            self._engine_version = self.actor.weights_version
        return engine

    def _release_engine(self, engine) -> None:
        """GPU engines give their memory back to the trainer between generations (weights dropped);
        vLLM on CPU has no sleep mode and keeps its weights (`sleep_drops_weights` False)."""
        if engine.owns_weights:
            engine.sleep()
            if getattr(engine, "sleep_drops_weights", True):
                self._engine_version = None

    @register(Dispatch.DP)
    def generate(self, batch: Batch, *, seed: int, mode: str = "train") -> Batch:
        """Responses with the current weights. mode: "train" (rollout.n at rollout.temperature),
        "val" (val_n at val_temperature) or "greedy" (one argmax response per prompt, ReMax).

        seed: the controller's per-step seed; each rank samples from (seed, rank), so a run
        with the same seeds and ranks generates the same tokens.
        """
        n, temperature = self._mode(mode)
        batch = with_pixels(batch, self.actor.module, self.cfg.model.path)
        out = self._sample(batch, n, self.cfg.data.max_response_length, temperature, seed)
        if PIXEL_VALUES in batch and POSITION_IDS not in out:   # an engine that keeps its own (vLLM)
            out[POSITION_IDS] = batch_positions(self.actor.module, batch, n, self.cfg.data.max_response_length)
        rows = rollout_batch(without_images(batch), out, n, width=self.cfg.data.max_prompt_length, pad=self._pad_id())
        rows.meta.update(self._sync_stats)   # perf/weight_sync_* of the push this generation waited for
        compiled_s = getattr(self._rollout, "last_stats", {}).get("compile_s", 0.0)   # the hf engine's compiling
        if compiled_s:   # perf/compile_s, on the steps that paid it
            rows.meta["compile_s"] = compiled_s
        self._sync_stats = {}
        return rows

    @register(Dispatch.DP)
    def generate_turn(self, batch: Batch, *, seed: int, mode: str = "train", n: int = 1, width: int = 0,
                      log_probs: bool = False) -> Batch:
        """One assistant turn of a multi-turn rollout (rlctl.multiturn.rollout): continue each row's
        tokens (input_ids/attention_mask, left-padded) with n samples of at most max_new_tokens[row]
        tokens, at the mode's temperature. Optional columns kv_lookup [rows] and kv_store [rows, n]:
        the hf engine's kept-KV keys (HFRolloutEngine.generate); grammar [rows] (object, "" = none): the
        spec each row is decoded under (rlctl.workers.rollout.grammar). Returns responses [rows*n, T],
        response_length, truncated (+ rollout_log_prob from GPU engines); T = `width` (the largest
        max_new_tokens of the whole call, the same on every rank, so the ranks' parts concatenate).
        log_probs: rollout_log_prob from the hf engine too (the agent endpoint answers them)."""
        _, temperature = self._mode(mode)
        limits = [int(x) for x in batch["max_new_tokens"]]
        kv = {**kept_kv_args(batch), **grammar_args(batch), **({"log_probs": True} if log_probs else {})}
        out = self._sample(batch, n, max(width, *limits), temperature, seed, limits=limits, kv=kv)
        out = pad_turn_positions(out, batch["input_ids"].shape[1])   # a VLM's rows: every rank's the same width
        return Batch(_clip_to_limits(out, np.repeat(limits, n), self.eos_ids, self._pad_id()))

    def _mode(self, mode: str) -> tuple[int, float]:
        rc = self.cfg.rollout
        modes = {"train": (rc.n, rc.temperature), "val": (rc.val_n, rc.val_temperature), "greedy": (1, 0.0)}
        if mode not in modes:
            raise ValueError(f"generate mode must be one of {sorted(modes)}, got {mode!r}")
        return modes[mode]

    def _sample(self, batch: Batch, n: int, max_new_tokens: int, temperature: float, seed: int,
                limits: list | None = None, kv: dict | None = None) -> dict:
        engine = self._ready_engine()
        extra = {"limits": limits, **(kv or {})} if limits is not None and engine.per_prompt_limits else {}
        try:
            # the hf engine runs the trainer's module (its autocast); GPU engines have their own dtype
            with self.actor.autocast() if not engine.owns_weights else contextlib.nullcontext():
                return sample(engine, batch, self.cfg.rollout, n=n, max_new_tokens=max_new_tokens,
                              temperature=temperature, seed=seed, rank=self.rank, device=self.actor.device, **extra)
        finally:
            self._release_engine(engine)

    @register(Dispatch.RANK0)
    def export_weights(self) -> dict | None:
        """The trained weights as a separate rollout group loads them (one_step_off, async): HF names,
        LoRA merged, tied embeddings once (the stream vLLM/SGLang get), or with model.lora.sync =
        "adapter" the adapter alone, as numpy arrays for the object store (rlctl.workers.rollout.
        adapter_sync.export_push). Every rank joins the gathers; rank 0 returns them (the others None)."""
        from rlctl.workers.rollout.adapter_sync import adapter_sync_on, export_push

        module = self.actor.module
        return export_push(module, self.cfg, rank=self.rank, adapter=adapter_sync_on(self.cfg, module))

    def _pad_id(self) -> int:
        return pad_token_id(self.tokenizer, self.eos_ids)

    # --- log-probs -----------------------------------------------------------------------------
    def _log_probs(self, engine: TrainEngine, batch: Batch, *, with_entropy: bool, adapter: bool = True,
                   with_sum_pi_squared: bool = False, **more) -> dict[str, np.ndarray]:
        off = self.actor.module.disable_adapter() if not adapter else contextlib.nullcontext()
        rows, start, stop = engine.group_rows(batch)   # sp > 1: the sp group's rows; ours at start
        budget = self.cfg.actor.micro_batch_max_tokens * engine.sp_size   # sp ranks split each
        with engine.inference() as module, off:
            out = batched_response_outputs(module, engine.device, rows, self.cfg.actor.micro_batch_size,
                                           max_tokens=budget, sp=engine.sp,
                                           temperature=self.temperature, with_entropy=with_entropy,
                                           with_sum_pi_squared=with_sum_pi_squared, **more)
        return {key: value[start:stop] for key, value in out.items()}

    @register(Dispatch.DP)
    def compute_log_prob(self, batch: Batch) -> Batch:
        """old_log_prob [B, T] and entropy [B, T] under the current policy (+ sum_pi_squared [B, T]
        when the estimator or policy loss reads it; + routed_experts [B, T, L, k] with router replay)."""
        out = self._log_probs(self.actor, batch, with_entropy=True, with_sum_pi_squared=self.sum_pi_squared,
                              **({"routes": router_replay.RECORD} if self.replay else {}))
        out["old_log_prob"] = out.pop("log_prob")
        return Batch(out, batch.meta)

    @register(Dispatch.DP)
    def compute_ref_log_prob(self, batch: Batch) -> Batch:
        """ref_log_prob [B, T]: LoRA = the policy with adapters off; full FT = the frozen copy."""
        if self.lora:
            out = self._log_probs(self.actor, batch, with_entropy=False, adapter=False)
        elif self.ref is not None:
            out = self._log_probs(self.ref, batch, with_entropy=False)
        else:
            raise ConfigError("this actor was built without a reference model",
                              hint="start the workers with needs.reference when a KL term is used")
        return Batch({"ref_log_prob": out["log_prob"]}, batch.meta)

    @register(Dispatch.ALL)
    def sync_reference(self) -> None:
        """algorithm.ref_update_every: the frozen reference becomes a copy of the current policy (SPIN's
        opponent, the previous iterate): each rank copies its shards, split expert banks gathered whole."""
        if self.ref is None:
            raise ConfigError("algorithm.ref_update_every needs a frozen reference copy, and this actor has none",
                              hint="use full fine-tuning (model.lora.rank = 0) with an algorithm or KL term "
                                   "that reads the reference")
        fsdp.copy_weights(self.ref.module, self.actor.module)

    # --- training --------------------------------------------------------------------------------
    @register(Dispatch.DP_TRAIN)
    def update_actor(self, batch: Batch) -> dict[str, float]:
        """PPO epochs x mini-batches x micro-batches. Metrics (the same on every rank): actor/pg_loss,
        entropy, kl (mean log pi - log pi_ref, when ref_log_prob is given), kl_loss, moe_aux_loss, pg_clipfrac,
        pg_clipfrac_lower, ppo_kl, loss, grad_norm, lr, optimizer_steps, skipped_steps."""
        ac = self.cfg.actor
        if ac.use_kl_loss and "ref_log_prob" not in batch:
            raise ConfigError("actor.use_kl_loss needs ref_log_prob in the batch (compute_ref_log_prob)")
        mini = mini_batch_count(batch, world=self.world,
                                sequences_per_mini=batch_plan(self.cfg, "actor").sequences_per_mini_batch)
        if "old_log_prob" not in batch and (ac.ppo_epochs > 1 or mini > 1):
            raise ConfigError("update_actor needs old_log_prob when it takes more than one optimizer step",
                              hint="call compute_log_prob first (it may be skipped only when on-policy)")
        from rlctl.algorithms import get_policy_loss, update_columns

        reads = get_policy_loss(ac.policy_loss).reads
        if missing := [c for c in reads if c not in batch]:
            raise ConfigError(f"actor.policy_loss = {ac.policy_loss!r} reads the batch column(s) {missing}, which the "
                              "batch does not hold", hint="declare only columns the rollout or reward fills")
        keys = _MODEL_KEYS + list(update_columns(reads))   # rlctl.algorithms.COLUMNS marks what the update takes
        rows, _, _ = self.actor.group_rows(batch, mini)   # sp > 1: the sp group's rows, mini-batch-wise
        with router_replay.cleared_after(self.actor.module):
            metrics = run_updates(self.actor, rows, epochs=ac.ppo_epochs, mini_batches=mini,
                                  micro_batch_size=ac.micro_batch_size, horizon=self.cfg.data.max_response_length,
                                  make_loss=self._policy_loss_fn, keys=keys, max_tokens=ac.micro_batch_max_tokens)
        return {f"actor/{k}": v for k, v in router_replay.mismatch_share(metrics).items()}

    def _policy_loss_fn(self, norm):
        from rlctl.algorithms import aggregate_loss, get_policy_loss, kl_penalty, masked_mean, policy_loss

        ac, rc = self.cfg.actor, self.cfg.algorithm.rollout_correction
        distill_loss = self._distill_loss_fn()
        reads = get_policy_loss(ac.policy_loss).reads   # further batch columns the loss reads, by name

        def loss_fn(micro: dict) -> tuple[torch.Tensor, dict]:
            mask = micro["response_mask"]
            with tower_always_runs(self.actor.module, micro, self.vision_sync):
                out = response_log_probs(self.actor.module, micro["input_ids"], micro["attention_mask"],
                                         mask.shape[1], temperature=self.temperature, with_entropy=True,
                                         entropy_grad=ac.entropy_coef > 0, gather_ids=micro.get("teacher_topk_ids"),
                                         vision=micro.get("vision"), moe_aux=self.moe_aux_coef > 0,
                                         routes=router_replay.replay_of(micro) if self.replay else None,
                                         sp=self.actor.sp)
            log_prob = out["log_prob"]
            old = micro["old_log_prob"] if "old_log_prob" in micro else log_prob.detach()
            drift = trainer_engine_drift_sums(old, micro["rollout_log_prob"], mask) \
                if "old_log_prob" not in micro and "rollout_log_prob" in micro else {}
            if rc.bypass_mode:
                pg_loss, metrics = self._bypass_loss(micro, log_prob, norm)
            else:
                pg_loss, metrics = policy_loss(
                    ac.policy_loss, old_log_prob=old, log_prob=log_prob, advantages=micro["advantages"],
                    response_mask=mask, clip_ratio_low=ac.clip_ratio_low, clip_ratio_high=ac.clip_ratio_high,
                    clip_ratio_c=ac.clip_ratio_c, loss_agg_mode=ac.loss_agg_mode, norm=norm, params=ac.loss_params,
                    rollout_is_weights=micro.get("rollout_is_weights"), rollout_log_prob=micro.get("rollout_log_prob"),
                    behav_imp_weight_cap=rc.rollout_is_threshold, **{c: micro[c] for c in reads})
            entropy = aggregate_loss(out["entropy"], mask, ac.loss_agg_mode, norm=norm)
            loss = pg_loss - ac.entropy_coef * entropy if ac.entropy_coef > 0 else pg_loss
            metrics = {**metrics, **drift, **router_replay.counts(out), "pg_loss": float(pg_loss.detach()),
                       "entropy": float(entropy.detach())}
            loss = moe_aux.add_aux_loss(loss, metrics, out, mask, norm, self.moe_aux_coef)   # MoE load balancing
            if distill_loss is not None:
                term, more = distill_loss(micro, out, norm)
                loss, metrics = loss + self.cfg.distill.coef * term, {**metrics, **more}
            if "ref_log_prob" in micro:   # actor/kl: mean log pi - log pi_ref over response tokens
                metrics["kl"] = float(masked_mean(log_prob.detach() - micro["ref_log_prob"], mask))
            if ac.use_kl_loss:
                per_token = kl_penalty(log_prob, micro["ref_log_prob"], ac.kl_loss_type, response_mask=mask)
                kl = aggregate_loss(per_token, mask, ac.loss_agg_mode, norm=norm)
                loss = loss + ac.kl_loss_coef * kl
                metrics["kl_loss"] = float(kl.detach())
            return loss, metrics

        return loss_fn

    def _distill_loss_fn(self):
        """distill.loss's supervised form (k3, forward_kl_topk, jsd) as fn(micro, out, norm) ->
        (loss, metrics), or None (no distillation, or the k1 form, which lives in the advantages)."""
        from rlctl.algorithms import distill_loss, get_distill_loss
        from rlctl.config.schema import distill_enabled

        d = self.cfg.distill
        if not distill_enabled(self.cfg) or get_distill_loss(d.loss).policy_gradient:
            return None

        def fn(micro: dict, out: dict, norm):
            return distill_loss(d.loss, response_mask=micro["response_mask"], log_prob=out["log_prob"],
                                teacher_log_prob=micro["teacher_log_prob"], topk_log_prob=out.get("topk_log_prob"),
                                teacher_topk_log_prob=micro.get("teacher_topk_log_prob"), beta=d.beta,
                                loss_agg_mode=self.cfg.actor.loss_agg_mode, norm=norm)

        return fn

    def _bypass_loss(self, micro: dict, log_prob: torch.Tensor, norm):
        """algorithm.rollout_correction.bypass_mode: old_log_prob is the rollout's log-prob (the
        trainer did not recompute it); correction and loss_type as verl's bypass mode."""
        from rlctl.algorithms.policy_loss_variants import bypass_policy_loss
        from rlctl.config.schema import rollout_is_level

        ac, rc = self.cfg.actor, self.cfg.algorithm.rollout_correction
        return bypass_policy_loss(
            rollout_log_prob=micro["old_log_prob"], log_prob=log_prob, advantages=micro["advantages"],
            response_mask=micro["response_mask"], loss_type=rc.loss_type, rollout_is=rollout_is_level(self.cfg),
            rollout_is_threshold=rc.rollout_is_threshold, rollout_is_batch_normalize=rc.rollout_is_batch_normalize,
            rollout_rs=rc.rollout_rs, rollout_rs_threshold=rc.rollout_rs_threshold, clip_ratio_low=ac.clip_ratio_low,
            clip_ratio_high=ac.clip_ratio_high, clip_ratio_c=ac.clip_ratio_c, loss_agg_mode=ac.loss_agg_mode,
            norm=norm)

    # --- FLOPs and checkpoints: the policy's engine (a load moves its weights_version on, so
    # engines with their own weight copy reload before the next generate)
    flops_profile, save_checkpoint, load_checkpoint = trained_role_methods("actor")


def pad_token_id(tokenizer, eos_ids: list[int]) -> int:
    """The tokenizer's pad token, else the first EOS token."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids[0]


def sample(engine, batch: Batch, rollout_cfg, *, n: int, max_new_tokens: int, temperature: float, seed: int,
           rank: int, device, **extra) -> dict:
    """engine.generate on the batch's prompts (input_ids where attention_mask is set): n samples each
    at `temperature` (0: greedy) with rollout.top_p / top_k. The generator is seeded from (seed, rank),
    so a run with the same seeds and ranks generates the same tokens (the actor's and the
    one_step_off rollout rank's generate alike)."""
    prompts = [row[mask != 0].tolist() for row, mask in zip(batch["input_ids"], batch["attention_mask"])]
    if PIXEL_VALUES in batch:   # a vision-language batch: each prompt's images (rlctl.workers.compute.vision;
        # a multi-turn turn carries its arrays only, no PIL column)
        extra["images"] = {key: list(batch[key]) for key in (*VISION_KEYS, IMAGES) if key in batch}
    generator = torch.Generator(device=device)
    generator.manual_seed(int(np.random.SeedSequence([seed, rank]).generate_state(1)[0]))
    return engine.generate(prompts, n=n, max_new_tokens=max_new_tokens, temperature=temperature,
                           top_p=rollout_cfg.top_p, top_k=rollout_cfg.top_k, generator=generator,
                           greedy=temperature == 0, **extra)


def _clip_to_limits(out: dict, limits: np.ndarray, eos_ids: list[int], pad: int) -> dict:
    """Each row cut to its own token limit (engines without per-prompt limits generate up to the largest)."""
    out = dict(out)
    lengths = np.minimum(out["response_length"], limits)
    if (lengths < out["response_length"]).any():
        width = out["responses"].shape[1]
        keep = np.arange(width)[None, :] < lengths[:, None]
        out["responses"] = np.where(keep, out["responses"], pad)
        last = out["responses"][np.arange(len(lengths)), lengths - 1]
        out["truncated"] = ~np.isin(last, eos_ids)
        out["response_length"] = lengths
        out["response_mask"] = keep.astype(np.int64)
    return out

