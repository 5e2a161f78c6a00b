"""docs/serve.md's example: the model name its client sends is the one `rlctl serve` really serves."""

from __future__ import annotations

import json
import re
import shutil
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow   # starts Ray, trains a run or starts a subprocess

DOC = Path(__file__).resolve().parents[2] / "docs" / "serve.md"


def documented_example() -> tuple[str, str]:
    """(the folder of the first `rlctl serve` example, the model name the docs' client sends)."""
    text = DOC.read_text()
    first = re.search(r"^rlctl serve (\S+) +# model \"([^\"]+)\"", text, re.M)
    client = re.search(r"client\.chat\.completions\.create\(model=\"([^\"]+)\"", text)
    startup = re.search(r"INFO rlctl\.serve: serving '([^']+)'", text)
    assert first and client and startup, "docs/serve.md lost its serve example, client snippet or start-up line"
    assert first.group(2) == client.group(1) == startup.group(1), "the docs name the served model differently"
    return first.group(1), client.group(1)


def get_json(url: str, body: dict | None = None) -> dict:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def test_documented_model_name_is_the_served_one(tiny_model_dir, tmp_path, start_server):
    folder, name = documented_example()
    # The name comes from the path given on the command line, whatever the folder holds; a model
    # folder at the documented path serves in seconds (a run folder would first need a training run).
    shutil.copytree(tiny_model_dir, tmp_path / folder)
    srv = start_server([str(tmp_path / folder), "--engine", "hf", "--port", "0"])
    assert f"serving {name!r}" in "".join(srv.stderr_lines)
    assert [m["id"] for m in get_json(srv.base_url + "/v1/models")["data"]] == [name]
    answer = get_json(srv.base_url + "/v1/chat/completions",
                      {"model": name, "messages": [{"role": "user", "content": "2+2?"}], "max_tokens": 1})
    assert answer["model"] == name and answer["choices"][0]["finish_reason"] in ("stop", "length")
    assert srv.stop() == 0
