"""The Tinker wire format: protobuf bodies in and out, and the error shape the SDK shows.

forward_backward arrives as the SDK's `ForwardBackwardRequest` protobuf (zstd-compressed when the
server's client config asks for it); its results and sampling results go back as protobuf too
(the SDK refuses JSON for those two types). The schema is the SDK's own `tinker.proto` module, so
server and client cannot drift: `rlctl tinker` needs the `tinker` extra installed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

PROTO = "application/x-protobuf"
# Tinker's TensorData dtypes by proto enum value (DTYPE_FLOAT32 = 1, DTYPE_INT64 = 2, DTYPE_INT32 = 3).
_NUMPY = {1: np.float32, 2: np.int64, 3: np.int32}


class TinkerError(Exception):
    """A request the server refuses: `status` for a route's own answer, `category` ("user" /
    "server") for a future that fails; the SDK prints `message` in one line either way."""

    def __init__(self, message: str, *, status: int = 400, category: str = "user"):
        super().__init__(message)
        self.message, self.status, self.category = message, status, category

    def body(self) -> dict:
        return {"error": self.message, "category": self.category}


def proto_module():
    try:
        from tinker.proto import tinker_public_pb2
    except ImportError:
        from rlctl.errors import UsageError

        raise UsageError("rlctl tinker needs the tinker SDK's protocol schema",
                         hint="pip install 'rlctl[tinker]' (the official tinker package, 0.38)") from None
    return tinker_public_pb2


@dataclass
class Datum:
    tokens: np.ndarray                          # [N] int64: the model input
    inputs: dict[str, np.ndarray] = field(default_factory=dict)   # loss_fn_inputs, each [N]


@dataclass
class ForwardBackward:
    model_id: str
    seq_id: int
    loss_fn: str
    config: dict[str, float | str]
    forward_only: bool
    data: list[Datum]


def decode_forward_backward(body: bytes, encoding: str | None) -> ForwardBackward:
    """The SDK's ForwardBackwardRequest body -> ForwardBackward; TinkerError (400) for a body that
    does not decode or a tensor this server cannot read."""
    pb = proto_module()
    if (encoding or "").lower() == "zstd":
        body = _unzstd(body)
    msg = pb.ForwardBackwardRequest()
    try:
        msg.ParseFromString(body)
    except Exception as e:   # protobuf's DecodeError and friends
        raise TinkerError(f"the forward_backward body is not a tinker ForwardBackwardRequest protobuf ({e})") from None
    config: dict[str, float | str] = {k: float(v) for k, v in msg.loss_fn_config.items()}
    for key, value in msg.loss_fn_config_v2.items():
        config[key] = value.text if value.WhichOneof("value") == "text" else float(value.number)
    data = [Datum(_tokens(d, i), {name: _tensor(t, f"datum {i} {name}") for name, t in d.loss_fn_inputs.items()})
            for i, d in enumerate(msg.data)]
    return ForwardBackward(msg.model_id, int(msg.seq_id), msg.loss_fn, config, bool(msg.forward_only), data)


def _unzstd(body: bytes) -> bytes:
    import zstandard

    try:
        return zstandard.ZstdDecompressor().decompressobj().decompress(body)
    except zstandard.ZstdError as e:
        raise TinkerError(f"the forward_backward body says Content-Encoding zstd but does not decompress ({e})") from None


def _tokens(datum, index: int) -> np.ndarray:
    parts = []
    for chunk in datum.model_input:
        if chunk.WhichOneof("chunk") != "encoded_text":
            raise TinkerError(f"datum {index}: only token (encoded_text) chunks are supported; "
                              f"got a {chunk.WhichOneof('chunk')} chunk (images and audio are not)")
        parts.append(np.frombuffer(chunk.encoded_text.tokens, dtype=np.int32).astype(np.int64))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def _tensor(t, what: str) -> np.ndarray:
    dtype = _NUMPY.get(int(t.dtype))
    if dtype is None:
        raise TinkerError(f"{what}: tensor dtype {t.dtype} is not float32 or int64")
    if t.WhichOneof("encoding") == "sparse_csr":
        return _dense_from_csr(t, dtype, what)
    arr = np.frombuffer(t.dense, dtype=dtype)
    shape = list(t.shape) or [arr.size]
    if int(np.prod(shape)) != arr.size:
        raise TinkerError(f"{what}: shape {shape} does not hold its {arr.size} values")
    return arr.reshape(shape)


def _dense_from_csr(t, dtype, what: str) -> np.ndarray:
    shape = list(t.shape)
    if len(shape) != 2:
        raise TinkerError(f"{what}: a sparse tensor needs a 2-D shape, got {shape}")
    values = np.frombuffer(t.sparse_csr.values, dtype=dtype)
    crow = np.frombuffer(t.sparse_csr.crow_indices, dtype=np.int64)
    col = np.frombuffer(t.sparse_csr.col_indices, dtype=np.int64)
    if len(crow) != shape[0] + 1 or len(col) != len(values) or (len(col) and col.max() >= shape[1]):
        raise TinkerError(f"{what}: sparse indices do not fit shape {shape}")
    out = np.zeros(shape, dtype=dtype)
    rows = np.repeat(np.arange(shape[0]), np.diff(crow))
    out[rows, col] = values
    return out


def encode_forward_backward(outputs: list[dict[str, np.ndarray]], metrics: dict[str, float]) -> bytes:
    """ForwardBackwardOutput: one ArrayRecord holding every datum's float32 outputs back to back."""
    pb = proto_module()
    msg = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord", metrics=metrics)
    record = msg.loss_fn_outputs.add(type_tag="ArrayRecord", num_datums=len(outputs))
    for name in (outputs[0] if outputs else {}):
        arrays = [np.ascontiguousarray(o[name], dtype=np.float32) for o in outputs]
        offsets = np.cumsum([0] + [a.nbytes for a in arrays]).astype(np.int64)
        record.fields[name].CopyFrom(pb.BatchedTensor(data=b"".join(a.tobytes() for a in arrays),
                                                      offsets=offsets.tobytes(), dtype=pb.DTYPE_FLOAT32))
    return msg.SerializeToString()


def encode_sample(sequences: list[dict], prompt_logprobs: np.ndarray | None) -> bytes:
    """SampleResponse: each sequence's int32 tokens and float32 log-probs; prompt log-probs with
    NaN where none exists (the first prompt token)."""
    pb = proto_module()
    msg = pb.SampleResponse()
    for seq in sequences:
        msg.sequences.add(stop_reason=pb.STOP_REASON_STOP if seq["stop"] else pb.STOP_REASON_LENGTH,
                          tokens=np.asarray(seq["tokens"], dtype=np.int32).tobytes(),
                          logprobs=np.asarray(seq["logprobs"], dtype=np.float32).tobytes())
    if prompt_logprobs is not None:
        msg.prompt_logprobs = np.asarray(prompt_logprobs, dtype=np.float32).tobytes()
    return msg.SerializeToString()
