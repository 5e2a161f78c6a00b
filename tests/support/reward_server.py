"""A small reward service for tests: OpenRLHF's protocol on loopback, in a thread of the test process.

It scores the share of lowercase ASCII letters in each response (query minus its prompt), a dense
reward the tiny random model can learn. `fail_after` makes it answer HTTP 500 from that request on
(a service that died mid-run); `delay_s` makes every answer slow.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from support.servers import ServerProcess, send_json


def lowercase_share(text: str) -> float:
    return sum("a" <= ch <= "z" for ch in text) / max(len(text), 1)


class RewardService:
    def __init__(self, *, fail_after: int | None = None, delay_s: float = 0.0, port: int = 0):
        self.requests: list[dict] = []
        self.fail_after, self.delay_s = fail_after, delay_s
        service = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                service.requests.append(body)
                time.sleep(service.delay_s)
                if service.fail_after is not None and len(service.requests) > service.fail_after:
                    self.send_error(500, "service is down")
                    return
                rewards = [lowercase_share(q[len(p):]) for q, p in zip(body["query"], body["prompts"])]
                send_json(self, {"rewards": rewards})

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/get_reward"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> RewardService:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


class JudgeServer(ServerProcess):
    """`rlctl serve MODEL` (built-in engine) on a free loopback port, as an LLM judge; `url` is its /v1."""

    def __init__(self, model_dir, *, api_key: str, name: str = "judge", timeout_s: float = 120.0):
        super().__init__([str(model_dir), "--engine", "hf", "--port", "0", "--api-key", api_key,
                          "--served-model-name", name], timeout_s=timeout_s)
        self.url = self.base_url + "/v1"

    def __enter__(self) -> JudgeServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def build_digit_judge(out) -> None:
    """A tiny model whose greedy answer is always the digit 7 or 3, depending on the input.

    Its (untied) output head is zero except two opposite rows: logit('7') = h.w, logit('3') = -h.w,
    every other token 0, so one of the two digits always wins. A real judge, answering over HTTP."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import AutoTokenizer

    from rlctl.models.tiny import build_tiny_model

    build_tiny_model(out, tie_embeddings=False)
    tok = AutoTokenizer.from_pretrained(out)
    (seven,), (three,) = tok.encode("7"), tok.encode("3")
    path = f"{out}/model.safetensors"
    weights = load_file(path)
    head = torch.zeros_like(weights["lm_head.weight"])
    w = torch.randn(head.shape[1], generator=torch.Generator().manual_seed(0))
    head[seven], head[three] = w, -w
    weights["lm_head.weight"] = head
    save_file({k: v.contiguous() for k, v in weights.items()}, path, metadata={"format": "pt"})
