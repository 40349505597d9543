"""``ice demo`` (and every lab stack) stops all it started whenever it is signalled, start-up
included: SIGTERM to the demo's process group (what a CI job or a closed terminal sends),
then a second one to the demo itself (``make`` passes its own on to its child), at several
moments of its start leaves no child process and no port behind."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

DEMO_PORTS = (8000, 50051, 10000, 9901)  # backend, ICE, Envoy, Envoy's admin


def listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def descendants(pid: int) -> set[int]:
    """Every process whose ancestry reaches ``pid`` (from /proc), even in another session."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        children = {c for c, p in parents.items() if p in frontier and c not in found}
        found |= children
        frontier = children
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_for(check: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return False


MOMENTS: dict[str, Callable[[], bool]] = {
    "at-once": lambda: True,
    "backend-up": lambda: listening(8000),
    "ice-up": lambda: listening(50051),
    "envoy-up": lambda: listening(10000),
}


@pytest.mark.parametrize("moment", list(MOMENTS))
def test_sigterm_to_the_demos_group_leaves_no_process_and_no_port(moment: str) -> None:
    if any(listening(p) for p in DEMO_PORTS):
        pytest.skip(f"a demo port is in use ({DEMO_PORTS})")
    demo = subprocess.Popen(
        [sys.executable, "-m", "ext_proc.cli", "demo", "--backend", "dev"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its own group, as under make or a terminal
    )
    seen: set[int] = set()
    try:
        assert wait_for(lambda: seen.update(descendants(demo.pid)) or MOMENTS[moment](), 90)
        seen |= descendants(demo.pid)
        os.killpg(demo.pid, signal.SIGTERM)
        time.sleep(0.05)
        with contextlib.suppress(ProcessLookupError):  # make passes it on to its child too
            os.kill(demo.pid, signal.SIGTERM)
        demo.wait(timeout=40)
        left = {p for p in seen | descendants(demo.pid) if alive(p)}
        assert wait_for(lambda: not any(alive(p) for p in left), 10), left
        assert wait_for(lambda: not any(listening(p) for p in DEMO_PORTS), 10)
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
        for pid in seen | descendants(demo.pid):
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
