"""A Ray cluster of two nodes on one machine, each node in its own network namespace.

Loopback is not a second node: processes that share it reach each other at 127.0.0.1, and a
process-group bug that advertises a loopback address (gloo does when the hostname resolves to
127.0.0.1) never shows. Here node A (head) and node B live in two namespaces joined by a veth pair
with private addresses, so the only way between them is the "network". Nothing listens on this
machine's own interfaces. Needs root (CAP_NET_ADMIN) and `ip`.

Ray's `ray stop` is not used: it ends every Ray process of the user on the machine, other tests'
included. A node's processes are the ones `ip netns pids` lists in its namespace.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SUBNET = "10.251.0"
PORT = 6379


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def netns_refused() -> str | None:
    """Why the kernel refuses a network namespace here (None: it allows one), tried for real with a
    scratch namespace: not root, no CAP_NET_ADMIN (an unprivileged container)."""
    name = f"rlctl-probe-{os.getpid()}"
    made = _ip("netns", "add", name, check=False)
    if made.returncode != 0:
        return f"`ip netns add` is not permitted here: {made.stderr.strip() or made.returncode}"
    _ip("netns", "del", name, check=False)
    return None


def ray_cli() -> str:
    beside = Path(sys.executable).with_name("ray")
    return str(beside) if beside.exists() else (shutil.which("ray") or "ray")


class NetnsCluster:
    """Two namespaces, `a` (Ray head, the driver runs here too) and `b` (a worker node)."""

    def __init__(self, cpus_per_node: int = 1):
        tag = os.getpid() % 100000
        self.ns = {"a": f"rlctl-{tag}-a", "b": f"rlctl-{tag}-b"}
        self.veth = {"a": f"rl{tag}a", "b": f"rl{tag}b"}
        self.ip = {"a": f"{SUBNET}.1", "b": f"{SUBNET}.2"}
        self.address = f"{self.ip['a']}:{PORT}"
        # Ray's session folder holds AF_UNIX sockets (at most 107 bytes of path): a short folder.
        self.temp_dir = Path(tempfile.mkdtemp(prefix="rlray-", dir="/tmp"))
        self.cpus = cpus_per_node
        # Quicker node-death detection than Ray's default (~15 s): the test waits on it.
        self.env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled",
                    "RAY_health_check_period_ms": "1000", "RAY_health_check_timeout_ms": "1000",
                    "RAY_health_check_failure_threshold": "3"}

    # --- network -------------------------------------------------------------------------
    def create(self) -> None:
        taken = _ip("-brief", "addr").stdout
        if f"{SUBNET}." in taken:
            raise RuntimeError(f"{SUBNET}.0/24 is in use on this machine; the test needs it free")
        for side in ("a", "b"):
            _ip("netns", "add", self.ns[side])
        _ip("link", "add", self.veth["a"], "type", "veth", "peer", "name", self.veth["b"])
        for side in ("a", "b"):
            ns, dev = self.ns[side], self.veth[side]
            _ip("link", "set", dev, "netns", ns)
            _ip("-n", ns, "addr", "add", f"{self.ip[side]}/24", "dev", dev)
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "link", "set", dev, "up")
            # Ray finds a node's address by the route to a public one; inside the namespace that
            # route is the veth (nothing beyond it: no packet leaves the pair).
            _ip("-n", ns, "route", "add", "default", "dev", dev)

    def run_in(self, side: str, *cmd: str, **kwargs) -> subprocess.Popen:
        return subprocess.Popen(["ip", "netns", "exec", self.ns[side], *cmd], env=self.env, **kwargs)

    # --- Ray nodes ------------------------------------------------------------------------
    def start_node(self, side: str) -> None:
        common = ["--node-ip-address", self.ip[side], "--num-cpus", str(self.cpus), "--disable-usage-stats",
                  "--temp-dir", str(self.temp_dir)]
        if side == "a":
            args = ["--head", "--port", str(PORT), "--include-dashboard", "false", *common]
        else:
            args = ["--address", self.address, *common]
        proc = self.run_in(side, ray_cli(), "start", *args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)
        out, _ = proc.communicate(timeout=180)
        if proc.returncode != 0:
            raise RuntimeError(f"ray start on node {side} failed: {out[-2000:]}")

    def pids(self, side: str) -> list[int]:
        out = _ip("netns", "pids", self.ns[side], check=False).stdout
        return [int(p) for p in out.split()]

    def raylet_pid(self, side: str) -> int | None:
        for pid in self.pids(side):
            try:
                exe = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
            except OSError:
                continue
            if exe.endswith(b"/raylet"):
                return pid
        return None

    def kill_raylet(self, side: str) -> int:
        """SIGKILL the node's raylet, as a lost machine or the OOM killer would."""
        pid = self.raylet_pid(side)
        if pid is None:
            raise RuntimeError(f"node {side} has no raylet")
        os.kill(pid, signal.SIGKILL)
        return pid

    def stop_node(self, side: str, grace_s: float = 5.0) -> None:
        """End every process in the node's namespace: SIGTERM, then SIGKILL what is left."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in self.pids(side):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + grace_s
            while self.pids(side) and time.monotonic() < deadline:
                time.sleep(0.1)
            if not self.pids(side):
                return

    def close(self) -> None:
        for side in ("b", "a"):
            if self.ns[side] in _ip("netns", "list", check=False).stdout:
                self.stop_node(side)
                _ip("netns", "del", self.ns[side], check=False)   # the veth pair goes with it
        shutil.rmtree(self.temp_dir, ignore_errors=True)
