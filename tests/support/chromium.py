"""A headless Chromium driven over the Chrome DevTools Protocol on a pipe (--remote-debugging-pipe):
standard library only, no websocket package, no browser download (the distribution's chromium).

Chromium reads commands from its fd 3 and writes replies and events to fd 4, each a JSON message
ended by a NUL byte. Used by tests/view/test_html_browser.py, bench/view_bench.py and
scripts/view_screenshots.py.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    """$RLCTL_CHROMIUM, else the first of CANDIDATES on PATH."""
    if os.environ.get("RLCTL_CHROMIUM"):
        return os.environ["RLCTL_CHROMIUM"]
    return next((found for name in CANDIDATES if (found := shutil.which(name))), None)


def _high(fd: int) -> int:
    import fcntl

    high = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
    os.close(fd)
    return high


class Chromium:
    """One headless browser with one page. `with Chromium(path) as b: b.open(url); b.eval("1 + 1")`."""

    def __init__(self, executable: str, width: int = 1280, height: int = 900):
        self.profile = tempfile.TemporaryDirectory(prefix="rlctl-chromium-")
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()
        # the child's ends above 10, so moving them to 3 and 4 never closes one of them
        to_chrome_r, from_chrome_w = (_high(fd) for fd in (to_chrome_r, from_chrome_w))
        args = [executable, "--headless", "--remote-debugging-pipe", "--no-sandbox", "--disable-gpu",
                "--no-first-run", "--no-default-browser-check", "--disable-extensions", "--mute-audio",
                f"--user-data-dir={self.profile.name}", f"--window-size={width},{height}", "about:blank"]
        # fd 3 / fd 4 in the browser: the shell moves our pipe ends there, then becomes chromium
        script = f'exec 3<&{to_chrome_r} 4>&{from_chrome_w} {to_chrome_r}<&- {from_chrome_w}>&-; exec "$@"'
        self.proc = subprocess.Popen(["bash", "-c", script, "chromium", *args], pass_fds=(to_chrome_r, from_chrome_w),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buffer = b""
        self._next_id = 0
        self.session = None
        self.width, self.height = width, height

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def send(self, method: str, params: dict | None = None, *, session: bool = True, timeout: float = 60) -> dict:
        """Send one command and wait for its reply (events in between are dropped); RuntimeError on an error."""
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params or {}}
        if session and self.session:
            message["sessionId"] = self.session
        os.write(self._to_chrome, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def _read(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            if time.monotonic() > deadline:
                raise TimeoutError("chromium did not answer in time")
            chunk = os.read(self._from_chrome, 1 << 20)
            if not chunk:
                raise RuntimeError(f"chromium exited (code {self.proc.poll()})")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    def open(self, url: str, ready: str = "document.body && document.body.dataset.ready === '1'",
             timeout: float = 60) -> float:
        """Open `url` in a new page and wait until `ready` (a JS expression) holds; returns seconds taken."""
        start = time.monotonic()
        if self.session is None:
            target = self.send("Target.createTarget", {"url": "about:blank"}, session=False)["targetId"]
            self.session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True},
                                     session=False)["sessionId"]
            self.send("Page.enable")
            self.send("Emulation.setDeviceMetricsOverride", {"width": self.width, "height": self.height,
                                                             "deviceScaleFactor": 1, "mobile": False})
        self.send("Page.navigate", {"url": url})
        self.wait_for(ready, timeout=timeout)
        return time.monotonic() - start

    def eval(self, expression: str):
        """The value of a JS expression in the page (JSON-able values only)."""
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression[:80]}: {result['exceptionDetails'].get('exception', {}).get('description')}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not self.eval(f"!!({expression})"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the page never satisfied: {expression}")
            time.sleep(0.05)

    def click(self, selector: str) -> None:
        """A real mouse click (press + release) at the middle of the first element `selector` matches."""
        box = self.eval(f"(() => {{ const e = document.querySelector({json.dumps(selector)}); e.scrollIntoView({{block: 'center'}});"
                        "const r = e.getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; })()")
        for kind in ("mousePressed", "mouseReleased"):
            self.send("Input.dispatchMouseEvent", {"type": kind, "x": box[0], "y": box[1], "button": "left",
                                                   "clickCount": 1})

    def type(self, selector: str, text: str) -> None:
        """Focus `selector`, clear it and type `text` as keyboard input (input events fire as for a person)."""
        self.eval(f"(() => {{ const e = document.querySelector({json.dumps(selector)}); e.focus(); e.select(); }})()")
        self.send("Input.insertText", {"text": text})

    def screenshot(self, path: str, full_page: bool = False) -> None:
        params = {"format": "png", "captureBeyondViewport": full_page}
        with open(path, "wb") as f:
            f.write(base64.b64decode(self.send("Page.captureScreenshot", params)["data"]))

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                self.send("Browser.close", session=False, timeout=10)
        except (OSError, RuntimeError, TimeoutError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._to_chrome, self._from_chrome):
            try:
                os.close(fd)
            except OSError:
                pass
        self.profile.cleanup()
