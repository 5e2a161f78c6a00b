"""The Tinker losses against hand-computed numbers, the protobuf codec against the SDK's own
encoder, and the worker's per-client seq_id order (fast: no server process)."""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest
import torch

from rlctl.tinker.futures import Futures, Reply
from rlctl.tinker.losses import LOSSES, loss_for
from rlctl.tinker.wire import TinkerError, decode_forward_backward, encode_forward_backward

LP = torch.tensor([math.log(0.5), math.log(0.25)])
X = {"logprobs": torch.tensor([math.log(0.25), math.log(0.25)]), "advantages": torch.tensor([1.0, -2.0]),
     "weights": torch.tensor([1.0, -0.5])}


@pytest.mark.parametrize("name,cfg,expected", [
    ("cross_entropy", {}, [-math.log(0.5), 0.5 * math.log(0.25)]),           # -w * lp, any real w
    ("importance_sampling", {}, [-2.0, 2.0]),                                 # r = 2, 1
    ("ppo", {}, [-1.2, 2.0]),                                                 # min(2, 1.2) * 1; r = 1 unclipped
    ("ppo", {"clip_high_threshold": 3.0}, [-2.0, 2.0]),
    ("cispo", {}, [-1.2 * math.log(0.5), 2.0 * math.log(0.25)]),              # -clip(r) * lp * A
    ("dro", {"beta": 0.5}, [-(math.log(0.5) - 0.25 * math.log(2) ** 2), 2 * math.log(0.25)]),
])
def test_losses_per_token(name, cfg, expected):
    got = loss_for(name, cfg).fn(LP, X, cfg)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-6)


def test_cispo_passes_no_gradient_through_its_ratio():
    lp = LP.clone().requires_grad_(True)
    loss_for("cispo", {}).fn(lp, X, {}).sum().backward()
    np.testing.assert_allclose(lp.grad.numpy(), [-1.2, 2.0], rtol=1e-6)     # d/dlp of -c * lp * A, c held


@pytest.mark.parametrize("name,cfg,needle", [("stable_reinforce", {}, "is not supported"),
                                             ("custom", {}, "client-side"),
                                             ("ppo", {"beta": 1.0}, "does not take loss_fn_config key(s) beta"),
                                             ("xent", {}, "unknown loss_fn 'xent'")])
def test_refused_losses_say_why(name, cfg, needle):
    with pytest.raises(TinkerError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        loss_for(name, cfg)


def test_dro_needs_beta():
    with pytest.raises(TinkerError, match="beta"):
        LOSSES["dro"].fn(LP, X, {})


def test_the_sdk_request_decodes_and_outputs_encode():
    tinker = pytest.importorskip("tinker")
    from tinker.proto.request_conv import forward_backward_request_to_proto
    from tinker.proto.response_conv import deserialize_forward_backward_output

    datum = tinker.types.Datum(model_input=tinker.types.ModelInput.from_ints([5, 6, 7]),
                               loss_fn_inputs={"target_tokens": [6, 7, 8], "weights": [0.0, 1.0, 0.5]})
    req = tinker.types.ForwardBackwardRequest(
        forward_backward_input=tinker.types.ForwardBackwardInput(data=[datum], loss_fn="ppo",
                                                                 loss_fn_config={"clip_low_threshold": 0.7}),
        model_id="s:train:0", seq_id=4)
    import zstandard

    body = zstandard.ZstdCompressor().compress(forward_backward_request_to_proto(req).SerializeToString())
    fb = decode_forward_backward(body, "zstd")
    assert (fb.model_id, fb.seq_id, fb.loss_fn, fb.config) == ("s:train:0", 4, "ppo", {"clip_low_threshold": 0.7})
    assert fb.data[0].tokens.tolist() == [5, 6, 7]
    assert fb.data[0].inputs["target_tokens"].tolist() == [6, 7, 8]
    assert fb.data[0].inputs["weights"].tolist() == [0.0, 1.0, 0.5]
    out = deserialize_forward_backward_output(encode_forward_backward(
        [{"logprobs": np.array([-1.0, -2.0], np.float32)}, {"logprobs": np.array([-3.0], np.float32)}], {"loss:sum": 6.0}))
    assert [o["logprobs"].tolist() for o in out.loss_fn_outputs] == [[-1.0, -2.0], [-3.0]]
    assert out.metrics == {"loss:sum": 6.0}
    with pytest.raises(TinkerError, match="not a tinker ForwardBackwardRequest"):
        decode_forward_backward(b"\xff\xff\xff", None)


def test_a_clients_jobs_run_in_seq_id_order_whatever_order_they_arrive():
    futures, ran = Futures(), []
    try:
        gate = threading.Event()
        futures.submit(lambda: (gate.wait(5), Reply({}))[1])          # holds the worker while we queue
        ids = {seq: futures.submit(lambda s=seq: (ran.append(s), Reply({"seq": s}))[1], ("m", seq)) for seq in (3, 1, 2)}
        assert futures.submit(lambda: Reply({}), ("m", 2)) == ids[2]   # a resent request is the same job
        gate.set()
        assert [futures.wait(ids[s], 5).body["seq"] for s in (1, 2, 3)] == [1, 2, 3]
        assert ran == [1, 2, 3]
    finally:
        futures.stop()
