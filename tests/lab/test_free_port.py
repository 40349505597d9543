"""The lab's port picker (``ext_proc.lab.stack.free_port``) hands out ports the kernel does
not give to outgoing connections, and never the same one twice in a process: a port told to
Envoy must still be free when Envoy binds it (CI saw Envoy exit with 1 on a taken port)."""

from __future__ import annotations

import random
import socket

import pytest

from ext_proc.lab.stack import _ephemeral_low, free_port


def test_ports_are_below_the_ephemeral_range_and_never_repeat() -> None:
    ports = [free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)
    assert all(1024 < p < _ephemeral_low() for p in ports)


def test_a_port_handed_out_can_be_bound() -> None:
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        assert s.getsockname()[1] == port


def test_a_port_bound_by_someone_else_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        spare = free_port()  # free now, handed out once: skipped too
        picks = iter([taken, spare, spare - 1, spare - 2, spare - 3])
        monkeypatch.setattr(random, "randrange", lambda *_: next(picks))
        got = free_port()
    assert got not in (taken, spare)
    assert got in (spare - 1, spare - 2, spare - 3)
