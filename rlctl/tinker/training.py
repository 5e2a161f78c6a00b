"""A Tinker training client's run: its own LoRA adapter on a shared base, its own AdamW and step
count. forward_backward adds this request's gradient to what earlier ones left (nothing is reset
until optim_step), so a client may split a batch over several requests."""

from __future__ import annotations

import numpy as np
import torch

from rlctl.tinker.base import BaseModel, LoraSpec
from rlctl.tinker.losses import loss_for
from rlctl.tinker.wire import Datum, ForwardBackward, TinkerError

ADAM_KEYS = ("learning_rate", "beta1", "beta2", "eps", "weight_decay", "grad_clip_norm")


class TrainingRun:
    def __init__(self, model_id: str, base: BaseModel, spec: LoraSpec):
        self.model_id, self.base, self.spec = model_id, base, spec
        self.adapter = base.new_adapter_name("r")
        self.params = base.add_adapter(self.adapter, spec)
        # lr / betas / eps / decay are overwritten from each optim_step request before stepping
        self.optimizer = torch.optim.AdamW(self.params, lr=0.0)
        self.steps = 0
        self.closed = False

    def forward_backward(self, req: ForwardBackward) -> tuple[list[dict[str, np.ndarray]], dict[str, float]]:
        """Per datum: `logprobs` [N] (the targets' log-probs under the current weights) and
        `elementwise_loss` [N]; metrics `loss:sum` (the sum over datums and tokens)."""
        loss = loss_for(req.loss_fn, req.config)
        if not req.data:
            raise TinkerError("forward_backward got no datums")
        inputs = [self._inputs(d, i, loss.needs) for i, d in enumerate(req.data)]
        rows = [torch.from_numpy(d.tokens) for d in req.data]
        grad = torch.enable_grad() if not req.forward_only else torch.no_grad()
        with self.base.active(self.adapter) as model, grad:
            model.train(False)   # no dropout: LoRA dropout is 0, and the same batch must give the same numbers
            log_probs = self.base.target_log_probs(model, rows, [x["target_tokens"] for x in inputs])
            per_token = [loss.fn(lp, x, req.config) for lp, x in zip(log_probs, inputs)]
            total = torch.stack([t.sum() for t in per_token]).sum()
            if not req.forward_only:
                total.backward()
        outputs = [{"logprobs": lp.detach().numpy(), "elementwise_loss": t.detach().numpy()}
                   for lp, t in zip(log_probs, per_token)]
        return outputs, {"loss:sum": float(total.detach())}

    def _inputs(self, datum: Datum, index: int, needs: tuple[str, ...]) -> dict[str, torch.Tensor]:
        """The datum's loss_fn_inputs as tensors, each checked to be [N] like the model input."""
        n = len(datum.tokens)
        if n == 0:
            raise TinkerError(f"datum {index} has an empty model_input")
        if n > self.base.max_context:
            raise TinkerError(f"datum {index} has {n} tokens; {self.base.name} takes at most {self.base.max_context}")
        missing = [k for k in needs if k not in datum.inputs]
        if missing:
            raise TinkerError(f"datum {index} lacks loss_fn_inputs {', '.join(missing)} (this loss needs {', '.join(needs)})")
        out = {"weights": torch.ones(n)}
        for key, arr in datum.inputs.items():
            if arr.shape != (n,):
                raise TinkerError(f"datum {index}: loss_fn_inputs[{key!r}] has shape {list(arr.shape)} but model_input "
                                  f"has {n} tokens; every input is one value per input token (targets shifted by one)")
            out[key] = torch.from_numpy(np.array(arr, dtype=np.int64 if key == "target_tokens" else np.float32))
        for name, ids in (("model_input", datum.tokens), ("target_tokens", out["target_tokens"].numpy())):
            if ids.min() < 0 or ids.max() >= self.base.vocab_size:
                raise TinkerError(f"datum {index}: {name} holds token ids outside the vocabulary [0, {self.base.vocab_size})")
        return out

    def optim_step(self, adam: dict) -> dict[str, float]:
        """One AdamW step (torch.optim.AdamW, as Tinker's) with the request's hyperparameters, after
        clipping the accumulated gradient's global norm when grad_clip_norm > 0; gradients reset."""
        unknown = sorted(set(adam) - set(ADAM_KEYS) - {"type"})
        if adam.get("type", "adam") not in ("adam", "adamw") or unknown:
            raise TinkerError(f"optim_step takes AdamParams only ({', '.join(ADAM_KEYS)}); "
                              f"got {adam.get('type') or ', '.join(unknown)}. Other optimizers are not served")
        p = {"learning_rate": 1e-4, "beta1": 0.9, "beta2": 0.95, "eps": 1e-12, "weight_decay": 0.0, "grad_clip_norm": 0.0}
        p.update({k: float(v) for k, v in adam.items() if k in ADAM_KEYS})
        for group in self.optimizer.param_groups:
            group.update(lr=p["learning_rate"], betas=(p["beta1"], p["beta2"]), eps=p["eps"],
                         weight_decay=p["weight_decay"])
        grads = [q.grad for q in self.params if q.grad is not None]
        norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))) if grads else 0.0
        if p["grad_clip_norm"] > 0 and grads:
            torch.nn.utils.clip_grad_norm_(self.params, p["grad_clip_norm"])
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.steps += 1
        return {"grad_norm:mean": norm, "learning_rate:mean": p["learning_rate"], "step:max": float(self.steps)}

    def close(self) -> None:
        """Free the adapter, its gradients and the optimizer state (on the worker thread)."""
        if not self.closed:
            self.closed = True
            self.base.delete_adapter(self.adapter)
            self.params, self.optimizer = [], None
