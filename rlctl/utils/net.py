"""A free TCP port, for a process group's rendezvous or a server started on this machine; the
interface that holds an address."""

from __future__ import annotations

import socket


def free_port(host: str = "") -> int:
    """A port the kernel reports free on `host` ("": every interface, as a rendezvous other nodes
    reach needs; "127.0.0.1": a server only this machine talks to). Free when asked: the caller
    binds it soon after, and a port taken in between fails there, loudly."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def interface_of(ip: str) -> str | None:
    """The name of this machine's network interface that holds the IPv4 address `ip` (None: none does)."""
    import psutil

    for name, addrs in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == ip for a in addrs):
            return name
    return None
