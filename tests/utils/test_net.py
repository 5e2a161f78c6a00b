"""rlctl.utils.net: a free port, and the interface that holds an address (gloo's interface on a cluster)."""

from __future__ import annotations

import socket

import psutil

from rlctl.utils.net import free_port, interface_of


def test_interface_of_finds_the_interface_holding_an_address():
    held = {name: {a.address for a in addrs if a.family == socket.AF_INET}
            for name, addrs in psutil.net_if_addrs().items()}
    assert any(held.values())
    for addresses in held.values():
        for address in addresses:
            assert address in held[interface_of(address)]
    unused = next(f"203.0.113.{i}" for i in range(1, 255)
                  if not any(f"203.0.113.{i}" in a for a in held.values()))
    assert interface_of(unused) is None


def test_free_port_can_be_bound():
    port = free_port("127.0.0.1")
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
