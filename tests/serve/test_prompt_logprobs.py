"""`rlctl serve --prompt-logprobs K` answers vLLM's prompt_logprobs, and a distillation teacher
behind that URL (rlctl.controller.teacher_client) gives the same columns as the teacher worker
running the same model in-process."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import numpy as np
import pytest
import torch

from support.servers import ServerProcess

pytestmark = pytest.mark.slow   # starts Ray, trains a run or starts a subprocess


def _post(url: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.fixture(scope="module")
def teacher_server(tiny_model_dir):
    server = ServerProcess([str(tiny_model_dir), "--port", "0", "--prompt-logprobs", "4"])
    yield server
    server.stop()


def _batch(tiny_model_dir):
    """Two rows: left-padded prompts [2, 6] ++ right-padded responses [2, 5]."""
    from rlctl.runtime.batch import Batch

    prompts = np.array([[0, 0, 72, 105, 33, 10], [65, 66, 67, 68, 69, 70]])
    responses = np.array([[49, 50, 51, 0, 0], [97, 98, 99, 100, 101]])
    pmask = (prompts != 0).astype(np.int64)
    rmask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    return Batch({"input_ids": np.concatenate([prompts, responses], 1),
                  "attention_mask": np.concatenate([pmask, rmask], 1), "response_mask": rmask})


def test_url_teacher_equals_the_in_process_teacher(teacher_server, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from rlctl.config.schema import Config, DistillConfig
    from rlctl.controller.teacher_client import TeacherClient
    from rlctl.workers.roles.teacher import teacher_outputs

    batch = _batch(tiny_model_dir)
    config = Config(distill=DistillConfig(teacher_url=teacher_server.base_url + "/v1",
                                          teacher_model=tiny_model_dir.name, topk=4))
    remote = TeacherClient(config).compute_teacher_log_prob(batch)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    with torch.no_grad():
        local = teacher_outputs(model, torch.from_numpy(batch["input_ids"]), torch.from_numpy(batch["attention_mask"]),
                                5, k=4)
    valid = batch["response_mask"] > 0
    assert np.allclose(remote["teacher_log_prob"][valid], local["teacher_log_prob"].numpy()[valid], atol=1e-4)
    assert (remote["teacher_topk_ids"][valid] == local["teacher_topk_ids"].numpy()[valid]).all()
    assert np.allclose(remote["teacher_topk_log_prob"][valid], local["teacher_topk_log_prob"].numpy()[valid],
                       atol=1e-4)
    assert (remote["in_teacher_topk"] == local["in_teacher_topk"].numpy()).all()


def test_prompt_logprobs_are_refused_beyond_the_servers_limit(teacher_server, tiny_model_dir):
    url = teacher_server.base_url + "/v1/completions"
    status, body = _post(url, {"model": tiny_model_dir.name, "prompt": [72, 105], "max_tokens": 1,
                               "prompt_logprobs": 5})
    assert status == 400 and "--prompt-logprobs" in body["error"]["message"]
    status, body = _post(url, {"model": tiny_model_dir.name, "prompt": [72, 105, 33], "max_tokens": 1,
                               "prompt_logprobs": 2})
    entries = body["choices"][0]["prompt_logprobs"]
    assert status == 200 and entries[0] is None and len(entries) == 3
    assert "105" in entries[1] and "33" in entries[2]   # the actual token is always there, with its rank
