"""What a request must pass before any route reads it: its key, its size and its JSON's shape. Shared by
`rlctl serve` and the agent endpoint (rlctl.api.http), so both refuse the same bodies the same way."""

from __future__ import annotations

import hashlib
import hmac
import json

from rlctl.api.api_error import APIError

MAX_JSON_DEPTH = 64  # objects and arrays inside each other; a deeper body is a 400 before anything walks it


def json_object(raw: bytes) -> dict:
    """The body as a JSON object, or a 400: not JSON, not an object, or nested past MAX_JSON_DEPTH."""
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise APIError(400, f"invalid JSON body: {e}", code="invalid_json") from None
    except RecursionError:   # deeper than the parser's own limit (the interpreter's recursion limit)
        raise _too_deep() from None
    if _nests_deeper(body, MAX_JSON_DEPTH):
        raise _too_deep()
    if not isinstance(body, dict):
        raise APIError(400, "the JSON body must be an object", code="invalid_json")
    return body


def check_bearer(header: str, expected: bytes | None) -> None:
    """401 unless `header` is `Bearer <key>` whose sha256 is `expected` (None: no key required). Digests
    are compared, not keys: equal length whatever was sent, so the time says nothing."""
    if expected is None:
        return
    if not (key_matches(header.removeprefix("Bearer "), expected) and header.startswith("Bearer ")):
        raise APIError(401, "Incorrect or missing API key: send 'Authorization: Bearer <key>'",
                       type="authentication_error", code="invalid_api_key")


def key_matches(sent: str, expected: bytes) -> bool:
    """Whether `sent`'s sha256 is `expected`, compared in constant time (latin-1: as http.client decoded
    the header)."""
    return hmac.compare_digest(hashlib.sha256(sent.encode("latin-1", "replace")).digest(), expected)


def _nests_deeper(value, limit: int) -> bool:
    """Whether objects and arrays nest more than `limit` deep (the body itself is level 1); iterative,
    so a deep body costs no stack, and it stops at the first level too deep."""
    stack = [(value, 1)] if isinstance(value, (dict, list)) else []
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        children = node.values() if isinstance(node, dict) else node
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return False


def _too_deep() -> APIError:
    return APIError(400, f"the JSON body nests objects and arrays more than {MAX_JSON_DEPTH} deep",
                    code="invalid_json")


def too_large(length: int, limit: int, where: str = "rlctl serve --max-body-bytes") -> APIError:
    """`where`: what sets the limit, for the message (the agent endpoint's is fixed)."""
    return APIError(413, f"request body of {length} bytes exceeds the limit of {limit} bytes ({where})",
                    code="request_too_large")
