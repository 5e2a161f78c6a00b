"""`rlctl tinker --address`: the server joins a Ray cluster (the test session's shared Ray, by its
GCS address on loopback) and its models train and sample in an actor there, driven by the SDK."""

from __future__ import annotations

import re

import numpy as np
import pytest

tinker = pytest.importorskip("tinker")
from tinker import types  # noqa: E402

from support.servers import ServerProcess  # noqa: E402

pytestmark = pytest.mark.slow
URL = re.compile(r"Tinker API for .* on (http://[^ ;]+)")


def test_training_and_sampling_run_in_an_actor_of_the_joined_cluster(ray_cluster, tiny_model_dir, tmp_path):
    import httpx
    import ray

    from rlctl.runtime import warm_ranks

    warm_ranks.drop()   # ranks parked by earlier modules keep the shared Ray's CPUs reserved
    state = tmp_path / "state"
    proc = ServerProcess(["--model", str(tiny_model_dir), "--port", "0", "--state-dir", str(state),
                          "--address", ray.get_runtime_context().gcs_address, "--cpus", "1"],
                         timeout_s=180, command="tinker", url_line=URL)
    try:
        health = httpx.get(f"{proc.base_url}/api/v1/healthz").json()
        assert health["pid"] != proc.proc.pid, "the models must live in the Ray actor, not the HTTP front"
        service = tinker.ServiceClient(base_url=proc.base_url, api_key="tml-ray")
        tc = service.create_lora_training_client(base_model=str(tiny_model_dir.resolve()), rank=4, seed=0).result()
        ids = tc.get_tokenizer().encode("Q: 2+2? A: 4")
        datum = types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                            loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * (len(ids) - 1)})
        losses = []
        for _ in range(4):
            losses.append(tc.forward_backward([datum], "cross_entropy").result().metrics["loss:sum"])
            tc.optim_step(types.AdamParams(learning_rate=2e-2)).result()
        assert losses[-1] < losses[0], losses
        sampler = tc.save_weights_and_get_sampling_client().result()
        seq = sampler.sample(types.ModelInput.from_ints(ids[:5]), 1,
                             types.SamplingParams(max_tokens=4, seed=1, stop=[])).result().sequences[0]
        assert len(seq.tokens) == 4 and np.all(np.array(seq.logprobs) <= 0)
        path = tc.save_state("on-ray").result().path
        assert list(state.glob("*/weights/on-ray/adapter_model.safetensors")), path   # written by the actor
        with pytest.raises(Exception) as e:    # errors cross the cluster in the SDK's shape
            service.create_lora_training_client(base_model="no/such", rank=4).result()
        assert "unknown base_model 'no/such'" in str(e.value)
        service.close("success").result()
    finally:
        assert proc.stop() == 0, "".join(proc.stderr_lines[-20:])
