"""What the routes do: sessions, training runs, samplers and saved states, by the SDK's ids.

Ids follow the SDK's own conventions (it derives a model id from the session and its counter):
session `s-<hex>`, training run `<session>:train:<n>`, sampler `<session>:sample:<n>`.
Handlers that touch a model submit a job to the worker (rlctl.tinker.futures) and return its
request id; the rest answer at once.
"""

from __future__ import annotations

import logging
import os
import uuid
from pathlib import Path

from rlctl.tinker import state as saved
from rlctl.tinker.base import BaseModel, LoraSpec
from rlctl.tinker.clients import Clients
from rlctl.tinker.futures import Futures, Reply
from rlctl.tinker.sampling import Sampler, parse_params, prompt_logprobs, sequences_of, submit
from rlctl.tinker.training import TrainingRun
from rlctl.tinker.wire import PROTO, ForwardBackward, TinkerError, encode_forward_backward, encode_sample

log = logging.getLogger("rlctl.tinker")
MAX_SAMPLERS = 32       # adapter snapshots kept for sampling clients; the oldest is dropped beyond


class Service:
    def __init__(self, bases: dict[str, BaseModel], state_dir: Path, max_samplers: int = MAX_SAMPLERS,
                 max_clients: int | None = None):
        self.bases, self.state_dir = bases, Path(state_dir)
        self.futures = Futures()
        self.clients = Clients(self.futures, max_samplers=max_samplers, max_clients=max_clients)
        self.run, self.sampler = self.clients.run, self.clients.sampler

    # -- sessions and discovery (answered at once) --------------------------------------------
    def create_session(self, body: dict) -> dict:
        return {"type": "create_session", "session_id": f"s-{uuid.uuid4().hex[:12]}"}

    def capabilities(self) -> dict:
        return {"supported_models": [{"model_name": b.name, "max_context_length": b.max_context, "trainable": True,
                                      "sampleable": True} for b in self.bases.values()]}

    def base(self, name: str | None) -> BaseModel:
        found = self.bases.get(name or "")
        if found is None:
            raise TinkerError(f"unknown base_model {name!r}; this server has {', '.join(self.bases)} "
                              "(start rlctl tinker with --model for others)", status=404)
        return found

    def get_info(self, body: dict) -> dict:
        run = self.run(body.get("model_id"))
        return {"type": "get_info", "model_id": run.model_id, "model_name": run.base.name, "is_lora": True,
                "lora_rank": run.spec.rank,
                "model_data": {"arch": run.base.arch, "model_name": run.base.name, "tokenizer_id": str(run.base.path)}}

    # -- training clients ---------------------------------------------------------------------
    def create_model(self, body: dict) -> dict:
        base = self.base(body.get("base_model"))
        _check_optimizer(body.get("optimizer_config"))
        lora = body.get("lora_config") or {}
        if int(lora.get("rank", 0)) < 1:
            raise TinkerError("lora_config.rank must be >= 1: rlctl tinker trains LoRA adapters only")
        spec = LoraSpec(int(lora["rank"]), lora.get("seed"), bool(lora.get("train_mlp", True)),
                        bool(lora.get("train_attn", True)), bool(lora.get("train_unembed", True)))
        model_id = f"{body['session_id']}:train:{body['model_seq_id']}"

        def job() -> Reply:
            self._new_run(model_id, base, spec)
            return Reply({"type": "create_model", "model_id": model_id})
        return self._future(job, model_id=model_id)

    def _new_run(self, model_id: str, base: BaseModel, spec: LoraSpec) -> TrainingRun:
        run = TrainingRun(model_id, base, spec)
        try:
            self.clients.add_run(run)
        except TinkerError:
            run.close()
            raise
        log.info("training client %s: LoRA rank %d on %s", model_id, spec.rank, base.name)
        return run

    def finish_session(self, session_id: str) -> dict:
        self.clients.finish_session(session_id)
        return {}

    def forward_backward(self, req: ForwardBackward) -> dict:
        run = self.run(req.model_id)

        def job() -> Reply:
            outputs, metrics = run.forward_backward(req)
            return Reply(encode_forward_backward(outputs, metrics), PROTO)
        return self._on(run, job, req.seq_id)

    def optim_step(self, body: dict) -> dict:
        run = self.run(body.get("model_id"))
        params = body.get("adam_params") or body.get("optimizer_params") or body.get("optim_params") or {}
        return self._on(run, lambda: Reply({"metrics": run.optim_step(params)}), body.get("seq_id"))

    # -- saved states -------------------------------------------------------------------------
    def save_weights(self, body: dict) -> dict:
        run = self.run(body.get("model_id"))
        name = saved.check_name(body.get("path") or f"step-{uuid.uuid4().hex[:8]}")

        def job() -> Reply:
            path = self._save(run, "weights", name, with_optimizer=True)
            return Reply({"type": "save_weights", "path": path})
        return self._on(run, job, body.get("seq_id"))

    def _save(self, run: TrainingRun, kind: str, name: str, *, with_optimizer: bool) -> str:
        meta = {"base_model": run.base.name, "base_path": str(run.base.path), "model_id": run.model_id,
                "lora": run.spec.as_dict(), "steps": run.steps}
        return saved.save(self.state_dir, run.model_id, kind, name, adapter_state=run.base.adapter_state(run.adapter),
                          adapter_config=run.base.adapter_config(run.adapter), meta=meta,
                          optimizer=run.optimizer.state_dict() if with_optimizer else None)

    def load_weights(self, body: dict) -> dict:
        folder = saved.folder_of(self.state_dir, body.get("path") or "")
        with_optimizer = bool(body.get("optimizer"))
        if body.get("model_id"):     # load_state into an existing training client
            run = self.run(body["model_id"])
            return self._on(run, lambda: self._load_into(run, folder, with_optimizer), body.get("seq_id"))
        model_id = f"{body['session_id']}:train:{body['model_seq_id']}"

        def create() -> Reply:
            meta, _, _ = saved.load(folder, optimizer=False)
            base = self.base(body.get("base_model") or meta["base_model"])
            return self._load_into(self._new_run(model_id, base, saved.spec_of(meta)), folder, with_optimizer)
        return self._future(create, model_id=model_id)

    def _load_into(self, run: TrainingRun, folder: Path, with_optimizer: bool) -> Reply:
        meta, state, optimizer = saved.load(folder, optimizer=with_optimizer)
        if meta["base_model"] != run.base.name or saved.spec_of(meta).rank != run.spec.rank:
            raise TinkerError(f"{folder} holds a rank-{meta['lora']['rank']} adapter of {meta['base_model']}; this training "
                              f"client is rank {run.spec.rank} on {run.base.name}")
        run.base.load_adapter_state(run.adapter, state)
        if optimizer is not None:
            run.optimizer.load_state_dict(optimizer)
            run.steps = int(meta.get("steps", 0))
        for p in run.params:
            p.grad = None
        return Reply({"type": "load_weights", "path": saved.tinker_path(meta["model_id"], folder.parent.name, folder.name),
                      "model_id": run.model_id})

    # -- sampling -----------------------------------------------------------------------------
    def save_weights_for_sampler(self, body: dict) -> dict:
        run = self.run(body.get("model_id"))
        name = body.get("path")
        sampler_id = None if name else f"{run.model_id.split(':')[0]}:sample:{body.get('sampling_session_seq_id')}"

        def job() -> Reply:
            if name:
                path = self._save(run, "sampler_weights", saved.check_name(name), with_optimizer=False)
                return Reply({"type": "save_weights_for_sampler", "path": path})
            self.clients.add_sampler(Sampler(sampler_id, run.base, sampler_id), run.base.snapshot(run.adapter, sampler_id))
            return Reply({"type": "save_weights_for_sampler", "sampling_session_id": sampler_id})
        return self._on(run, job, body.get("seq_id"))

    def create_sampling_session(self, body: dict) -> dict:
        sampler_id = f"{body['session_id']}:sample:{body['sampling_session_seq_id']}"
        path = body.get("model_path")
        if not path:
            self.clients.add_sampler(Sampler(sampler_id, self.base(body.get("base_model")), ""), None)
            return {"type": "create_sampling_session", "sampling_session_id": sampler_id}
        from rlctl.errors import DataError
        from rlctl.models.lora_adapter import read_adapter

        folder = saved.folder_of(self.state_dir, path)
        meta, _, _ = saved.load(folder, optimizer=False)
        try:
            adapter = read_adapter(sampler_id, folder)
        except DataError as e:
            raise TinkerError(f"{path}: {e.message}") from None
        self.clients.add_sampler(Sampler(sampler_id, self.base(meta["base_model"]), sampler_id, path), adapter)
        return {"type": "create_sampling_session", "sampling_session_id": sampler_id}

    def get_sampler(self, sampler_id: str) -> dict:
        s = self.sampler(sampler_id)
        return {"sampler_id": s.sampler_id, "base_model": s.base.name, "model_path": s.model_path}

    def asample(self, body: dict) -> dict:
        """Queue the request on the base's sampling engine, where it decodes in one batch with
        every other sampler's rows; the engine's thread resolves the future when all n ended."""
        if body.get("model_path") or not body.get("sampling_session_id"):
            raise TinkerError("sample requests name a sampling_session_id (create the SamplingClient through the SDK)")
        s = self.sampler(body["sampling_session_id"])
        prompt = _prompt_tokens(body.get("prompt") or {})
        if not prompt:
            raise TinkerError("sample needs a non-empty prompt")
        if max(prompt) >= s.base.vocab_size or min(prompt) < 0:
            raise TinkerError(f"the prompt holds token ids outside the vocabulary [0, {s.base.vocab_size})")
        for key in ("topk_prompt_logprobs", "topk_sample_logprobs", "prompt_alt_tokens_k"):
            if body.get(key):
                raise TinkerError(f"{key} is not served by rlctl tinker (plain prompt and sample log-probs are)")
        n = int(body.get("num_samples", 1))
        params = parse_params(body.get("sampling_params") or {}, s.base, len(prompt), n)
        prompt_lp = prompt_logprobs(s, prompt) if body.get("prompt_logprobs") else None
        request_id = self.futures.open()

        def done(events) -> None:
            failed = next((e for e in events if e.finish_reason == "error"), None)
            if failed is None:
                reply = Reply(encode_sample(sequences_of(events), prompt_lp), PROTO)
            elif s.sampler_id in self.clients.gone:
                reply = TinkerError(f"sampling session {s.sampler_id!r} {self.clients.gone[s.sampler_id]}", status=404)
            else:
                reply = TinkerError(failed.error or "sampling failed", status=failed.status, category="server")
            self.futures.resolve(request_id, reply)
        try:
            submit(s, prompt, params, done)
        except TinkerError as e:
            self.futures.resolve(request_id, e)
        # the SDK names each returned sequence by these (StableReinforce's references; nothing here uses them)
        return {"request_id": request_id, "sample_sequence_ids": [f"{request_id}:{i}" for i in range(n)]}

    def load(self) -> dict:
        """The process that holds the models, the live clients, and each base's sampling engine: rows running and waiting, the most
        rows it decoded in one step and its decode steps over several adapters (samplers batched)."""
        return {"pid": os.getpid(), **self.clients.counts(), "sampling": {name: base.engine.load() for name, base in self.bases.items()},
                "training_adapters": {name: base.adapter_count() for name, base in self.bases.items()}}

    def wait(self, request_id: str, timeout: float):
        """A future's result, or None while it is pending after `timeout` seconds (retrieve_future)."""
        return self.futures.wait(request_id, timeout)

    def close(self) -> None:
        """Stop the training worker and the sampling engines (the server is stopping)."""
        self.futures.stop()
        for base in self.bases.values():
            base.engine.shutdown()

    # -- futures ------------------------------------------------------------------------------
    def _future(self, job, *, model_id: str | None = None, gate: tuple[str, int] | None = None) -> dict:
        out = {"request_id": self.futures.submit(job, gate)}
        if model_id:
            out["model_id"] = model_id
        return out



    def _on(self, run: TrainingRun, fn, seq_id) -> dict:
        """A job of training client `run`, in its seq_id order; fails in one line if the client was
        freed while the job waited."""
        def job() -> Reply:
            self.clients.check_live(run)
            return fn()
        return self._future(job, model_id=run.model_id, gate=None if seq_id is None else (run.model_id, int(seq_id)))


def build_service(models: dict[str, Path], state_dir: Path, max_samplers: int, max_clients: int | None):
    """The server's model side: every base model loaded, the training worker and sampling engines."""
    from rlctl.tinker.wire import proto_module

    proto_module()   # the schema is there before anything heavy starts
    bases = {}
    for name, path in models.items():
        log.info("loading %s (%s)", name, path)
        bases[name] = BaseModel(name, path, sampler_slots=2 * max_samplers)   # room while evicted rows finish
    return Service(bases, state_dir, max_samplers, max_clients)


def _check_optimizer(config: dict | None) -> None:
    kind = (config or {}).get("type", "adamw")
    if kind != "adamw":
        raise TinkerError(f"optimizer {kind!r} is not served by rlctl tinker: only Adam (adamw)")


def _prompt_tokens(prompt: dict) -> list[int]:
    tokens: list[int] = []
    for chunk in prompt.get("chunks") or []:
        if chunk.get("type", "encoded_text") != "encoded_text":
            raise TinkerError(f"only token (encoded_text) prompt chunks are supported, not {chunk.get('type')!r}")
        tokens.extend(int(t) for t in chunk.get("tokens") or [])
    return tokens
