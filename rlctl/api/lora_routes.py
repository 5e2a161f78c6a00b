"""LoRA adapters over HTTP, as vLLM serves them: a request's `model` names the base or an adapter,
GET /v1/models lists both, and POST /v1/load_lora_adapter {"lora_name", "lora_path", "load_inplace"}
/ POST /v1/unload_lora_adapter {"lora_name"} answer vLLM's plain-text "Success: ..." lines.

The engine (rlctl.serve.engine.Engine) holds the adapters (`engine.adapters`: None when the server
was started without LoRA) and loads/unloads them (`load_adapter`, `unload_adapter`).
"""

from __future__ import annotations

from rlctl.api.api_error import APIError

LOAD, UNLOAD = "/v1/load_lora_adapter", "/v1/unload_lora_adapter"
ROUTES = (LOAD, UNLOAD)


def _adapters(engine):
    return getattr(engine, "adapters", None)


def model_cards(server, base_card: dict) -> list[dict]:
    adapters = _adapters(server.engine)
    return [base_card] + ([] if adapters is None else adapters.cards())


def models_answer(server, base_card: dict, path: str) -> dict:
    """GET /v1/models (the list) or /v1/models/NAME (one card; 404 when it is not served)."""
    cards = model_cards(server, base_card)
    if path == "/v1/models":
        return {"object": "list", "data": cards}
    name = path[len("/v1/models/"):]
    for card in cards:
        if card["id"] == name:
            return card
    raise APIError(404, f"The model '{name}' does not exist", code="model_not_found")


def adapter_of(body: dict, server) -> str:
    """The adapter a completion request's `model` names ("" for the base model); 400 without a
    model, 404 naming what is served for anything else, never an answer from the base instead."""
    model = body.get("model")
    if model is None:
        raise APIError(400, "'model' is required", param="model")
    if not isinstance(model, str):
        raise APIError(400, "'model' must be a string", param="model")
    if model == server.model_name:
        return ""
    adapters = _adapters(server.engine)
    if adapters is not None and adapters.slot_of(model) is not None:
        return model
    raise APIError(404, not_served(model, [server.model_name], adapters.names if adapters is not None else []),
                   param="model", code="model_not_found")


def not_served(model: str, bases: list[str], adapters: list[str]) -> str:
    """The 404 message for a `model` this server does not serve, naming what it does (both engines')."""
    served = ", ".join(repr(n) for n in bases)
    also = f" and the LoRA adapters {', '.join(repr(n) for n in adapters)}" if adapters else ""
    return f"The model '{model}' does not exist; this server serves {served}{also}"


def handle(engine, path: str, body: dict) -> str:
    adapters = _adapters(engine)
    if adapters is None:
        raise APIError(400, "this server was started without LoRA adapters; start it with --lora NAME=DIR "
                            "or --max-loras N to load them at run time", code="lora_disabled")
    name = body.get("lora_name")
    if not isinstance(name, str) or not name:
        raise APIError(400, "'lora_name' is required", param="lora_name")
    if path == UNLOAD:
        engine.unload_adapter(name)
        return f"Success: LoRA adapter '{name}' removed successfully."
    folder = body.get("lora_path")
    if not isinstance(folder, str) or not folder:
        raise APIError(400, "Both 'lora_name' and 'lora_path' must be provided.", param="lora_path")
    if name == adapters.base_name:
        raise APIError(400, f"The lora adapter '{name}' conflicts with a served base model.", param="lora_name")
    engine.load_adapter(name, folder, replace=bool(body.get("load_inplace")))
    return f"Success: LoRA adapter '{name}' added successfully."
