"""What rlctl adds inside vLLM's own OpenAI server (`rlctl serve --engine vllm`), as vLLM's
`--middleware` hook: this module is imported by vLLM's server process, not by rlctl's.

A request whose `model` is neither the base nor a loaded adapter gets vLLM's 404, "The model `x`
does not exist. Valid aliases: <base>", which leaves the adapters out; rlctl's contract is a 404
naming everything served, as the built-in engine answers (rlctl.api.lora_routes.not_served).
The adapters are read from vLLM's model registry at answer time, so ones loaded or dropped through
/v1/load_lora_adapter and /v1/unload_lora_adapter are named as they stand.
"""

from __future__ import annotations

import json
import re

MIDDLEWARE = f"{__name__}.name_served_models"   # the value of vLLM's --middleware flag
_VLLM_MISSING = re.compile(r"^The model `(?P<model>.*)` does not exist\.")


async def name_served_models(request, call_next):
    """vLLM's unknown-model 404 with its message replaced by one naming the base and the adapters;
    every other answer passes through untouched (only a 404's small JSON body is read)."""
    response = await call_next(request)
    if response.status_code != 404 or not response.headers.get("content-type", "").startswith("application/json"):
        return response
    body = b"".join([chunk async for chunk in response.body_iterator])
    rewritten = _rewrite(body, request.app.state)
    from starlette.responses import Response

    headers = {k: v for k, v in response.headers.items() if k.lower() != "content-length"}
    return Response(rewritten if rewritten is not None else body, status_code=404, headers=headers)


def _rewrite(body: bytes, state) -> bytes | None:
    """The error body with rlctl's message, or None when it is not vLLM's unknown-model 404."""
    try:
        answer = json.loads(body)
        missing = _VLLM_MISSING.match(answer["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return None
    models = getattr(state, "openai_serving_models", None)
    if missing is None or models is None:
        return None
    from rlctl.api.lora_routes import not_served

    bases = [path.name for path in models.base_model_paths]
    answer["error"]["message"] = not_served(missing["model"], bases, list(models.lora_requests))
    return json.dumps(answer).encode()
