"""rlctl.models.hub: where a model path points, decided without the 50 s of retries.

Real HTTP: a local http.server plays the hub (HF_ENDPOINT), a closed port plays an unreachable
one; a Hugging Face cache laid out on disk plays a cached model.
"""

from __future__ import annotations

import http.server
import shutil
import socket
import threading
import time

import pytest

from rlctl.errors import DataError
from rlctl.models import hub


@pytest.fixture
def online(monkeypatch):
    """No offline switch set; the probe cache cleared before and after."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    hub._probe.cache_clear()
    yield monkeypatch
    hub._probe.cache_clear()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def local_hub():
    """An HTTP server on 127.0.0.1 that answers every request (HEAD / -> 200)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    server.RequestHandlerClass.log_message = lambda *a, **k: None
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def fake_cache(root, repo_id: str, model_dir) -> None:
    """The layout huggingface_hub writes: models--org--name/{refs/main, snapshots/<sha>/...}."""
    repo = root / ("models--" + repo_id.replace("/", "--"))
    shutil.copytree(model_dir, repo / "snapshots" / "abc123")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")


def test_probe_reaches_a_hub_that_answers(online, local_hub):
    online.setenv("HF_ENDPOINT", local_hub + "/")
    status = hub.probe_hub()
    assert status.state == "reachable" and status.endpoint == local_hub


def test_probe_says_unreachable_fast(online):
    online.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed_port()}")
    start = time.monotonic()
    status = hub.probe_hub(timeout_s=2.0)
    assert status.state == "unreachable" and "refused" in status.detail.lower()
    assert time.monotonic() - start < 2.0


def test_probe_honours_its_timeout(online):
    """A server that accepts the connection but never answers: the probe gives up at the timeout."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        online.setenv("HF_ENDPOINT", f"http://127.0.0.1:{silent.getsockname()[1]}")
        start = time.monotonic()
        status = hub.probe_hub(timeout_s=0.5)
        elapsed = time.monotonic() - start
    assert status.state == "unreachable" and status.detail == "timed out"
    assert 0.4 < elapsed < 3.0


def test_offline_mode_makes_no_request(online):
    online.setenv("HF_HUB_OFFLINE", "1")
    online.setenv("HF_ENDPOINT", "http://203.0.113.1")  # TEST-NET: would hang if contacted
    assert hub.probe_hub().state == "offline-mode"


def test_a_local_folder_is_local(tiny_model_dir, tmp_path):
    source = hub.resolve_model(str(tiny_model_dir))
    assert source.where == "local" and source.folder == tiny_model_dir
    with pytest.raises(DataError, match="is not a folder"):
        hub.resolve_model("./no/such/model", tmp_path)


def test_an_uncached_hub_id_offline_is_one_line_with_the_fixes(online, tmp_path):
    from huggingface_hub import constants

    online.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    online.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DataError) as err:
        hub.resolve_model("Qwen/Qwen2.5-0.5B-Instruct")
    text = f"{err.value.message}; {err.value.hint}"
    assert "neither a local folder nor in the Hugging Face cache" in text and "HF_HUB_OFFLINE is set" in text
    assert "rlctl model tiny" in text and "\n" not in text and err.value.exit_code == 3


def test_a_cached_hub_id_with_the_hub_unreachable_goes_offline(online, tmp_path, tiny_model_dir):
    from huggingface_hub import constants

    fake_cache(tmp_path, "someone/tiny", tiny_model_dir)
    online.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    online.setattr(constants, "HF_HUB_OFFLINE", constants.HF_HUB_OFFLINE)  # restored after the test
    online.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed_port()}")
    source = hub.resolve_model("someone/tiny")
    assert source.where == "cache" and source.folder == tmp_path / "models--someone--tiny" / "snapshots" / "abc123"
    assert "unreachable" in source.note and "offline" in source.note
    import os

    assert os.environ["HF_HUB_OFFLINE"] == "1" and constants.HF_HUB_OFFLINE is True


def test_a_hub_id_with_the_hub_reachable_is_left_to_download(online, local_hub, tmp_path):
    from huggingface_hub import constants

    online.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    online.setenv("HF_ENDPOINT", local_hub)
    source = hub.resolve_model("someone/not-cached")
    assert source.where == "hub" and source.folder is None and source.spec == "someone/not-cached"


def test_a_relative_path_is_local_only_where_it_exists_relative_to_base(tmp_path, monkeypatch):
    (tmp_path / "cwd" / "models" / "tiny").mkdir(parents=True)
    (tmp_path / "proj").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    assert hub.looks_local("models/tiny") and not hub.looks_local("models/tiny", tmp_path / "proj")
    assert hub.looks_local("./anything", tmp_path / "proj") and hub.looks_local("~/x")
    assert not hub.looks_local("Qwen/Qwen2.5-0.5B-Instruct", tmp_path / "proj")
