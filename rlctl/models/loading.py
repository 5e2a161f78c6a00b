"""transformers' side of a model folder, for data, workers and checkpoint alike: the tokenizer loader
(the workers, the controller, merge and `data inspect` share it), transformers' logging turned down,
and the name of a causal LM's KV-cache argument."""

from __future__ import annotations

import functools
import inspect
import os

from rlctl.errors import DataError
from rlctl.models.anatomy import causal_lm_parts


def quiet_transformers() -> None:
    """Workers log through the controller; transformers' per-load bars and warnings are noise."""
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def load_tokenizer(path: str | os.PathLike, trust_remote_code: bool | None = False, *, key: str | None = None):
    """AutoTokenizer from a local folder or hub id.

    key: the flag that named the model on the command line (`--model`). The path is then resolved
    first (rlctl.models.hub: one line, fast, when offline and not cached) and any load failure is
    one DataError line that says what to pass to it. Without a key (model.path, which the controller
    resolved already) transformers' own errors propagate.
    trust_remote_code: None lets transformers ask before it runs a model's own code (`data inspect`).
    """
    if key is None:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    from rlctl.models.hub import resolve_model

    source = resolve_model(str(path), key=key)
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(source.spec, trust_remote_code=trust_remote_code)
    except Exception as e:  # missing folder, offline hub, broken files: one message for all
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise DataError(f"cannot load a tokenizer from {path} ({reason})",
                        hint=f"pass {key} a local model folder (rlctl model tiny OUT makes one).") from None


def policy_tokenizer(model):
    """The policy's tokenizer (`model` is the config's [model], its paths absolute): model.path's, rendering
    chats with model.chat_template when one is set (rlctl.models.chat_template)."""
    from rlctl.models.chat_template import use_template

    return use_template(load_tokenizer(model.path, model.trust_remote_code), model.chat_template)


@functools.lru_cache(maxsize=None)
def _cache_keyword(model_type: type) -> str:
    return "cache" if "cache" in inspect.signature(model_type.forward).parameters else "past_key_values"


def with_cache(model, cache) -> dict:
    """The forward keyword that passes a KV cache to `model`: transformers 5.24 renamed
    `past_key_values` to `cache` (the old name still works but warns on every call), 5.0-5.23 know
    only the old one. The same cache object either way, so the computation is the same. A peft
    wrapper passes the keyword on to its base model, whose signature decides."""
    return {_cache_keyword(type(causal_lm_parts(model))): cache}


def cache_of(out):
    """The KV cache a forward returned, under either name (see with_cache)."""
    return out["cache"] if "cache" in out else out.past_key_values
