"""A client that resets its connection (RST, as lm-evaluation-harness's connection pool does) costs
the server one log line, not socketserver's traceback on stderr; the server keeps serving.

The server is `rlctl serve`'s own (make_server) in this process on loopback, with no model: the
reset lands while the handler reads a request line, before any engine is needed."""

from __future__ import annotations

import logging
import socket
import struct
import threading
import time
import urllib.error
import urllib.request

import pytest


@pytest.fixture()
def server():
    from rlctl.serve.server import make_server

    srv = make_server(None, "127.0.0.1", 0, model_name="m")
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()
    thread.join(5)


def _reset(port: int, data: bytes) -> None:
    """Connect, send `data`, then close with RST (SO_LINGER on, 0 s) instead of FIN."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(data)
    time.sleep(0.2)   # the handler is in its read when the RST arrives
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def test_a_reset_connection_is_one_log_line_and_the_server_goes_on(server, capfd, caplog):
    port = server.server_address[1]
    with caplog.at_level(logging.INFO, logger="rlctl.serve"):
        _reset(port, b"GET /health HTTP/1.1\r\nHost: x\r\n")   # cut off inside the headers
        _reset(port, b"")                                       # an idle kept-alive connection
        deadline = time.monotonic() + 10
        while len([r for r in caplog.records if "closed the connection" in r.getMessage()]) < 2:
            assert time.monotonic() < deadline, [r.getMessage() for r in caplog.records]
            time.sleep(0.05)
    lines = [r.getMessage() for r in caplog.records if "closed the connection" in r.getMessage()]
    assert lines == ["127.0.0.1 closed the connection (Connection reset by peer)"] * 2, lines
    assert all(r.exc_info is None for r in caplog.records)
    err = capfd.readouterr().err
    assert "Traceback" not in err and "ConnectionResetError" not in err, err
    # still serving: the next client gets an answer (404 for an unknown path needs no engine)
    with pytest.raises(urllib.error.HTTPError) as answer:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/nothing-here", timeout=10)
    assert answer.value.code == 404
