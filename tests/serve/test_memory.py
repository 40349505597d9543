"""Giving a flood's memory back: the trim waits for an idle backlog after enough bodies."""

from __future__ import annotations

import asyncio
import ctypes.util
import platform

import pytest

from ext_proc.serve import memtrim
from ext_proc.serve.memtrim import Trimmer


def test_trim_fires_once_the_backlog_has_stayed_idle_after_enough_bytes() -> None:
    idle = [True]
    calls: list[int] = []

    async def scenario() -> None:
        t = Trimmer(
            lambda: idle[0], delay_s=0.02, min_bytes=100, trim_fn=lambda: bool(calls.append(1))
        )
        t.seen(60)  # below min_bytes: nothing armed
        await asyncio.sleep(0.05)
        assert calls == []
        t.seen(60)  # 120 ≥ 100 and idle: armed
        await asyncio.sleep(0.05)
        assert calls == [1] and t.trims == 1
        t.seen(150)  # armed again …
        idle[0] = False  # … but busy when it fires: no trim, and it stays owed
        await asyncio.sleep(0.05)
        assert calls == [1]
        idle[0] = True
        t.seen(1)  # the next drain re-arms it (150 + 1 bytes still unreturned)
        await asyncio.sleep(0.05)
        assert calls == [1, 1]

    asyncio.run(scenario())


def test_trim_is_not_armed_while_bodies_are_still_in_flight() -> None:
    calls: list[int] = []

    async def scenario() -> None:
        t = Trimmer(lambda: False, delay_s=0.01, min_bytes=1, trim_fn=lambda: bool(calls.append(1)))
        t.seen(10**9)
        await asyncio.sleep(0.03)

    asyncio.run(scenario())
    assert calls == []


@pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
    reason="glibc only",
)
def test_glibc_accepts_the_fixed_mmap_threshold_and_the_trim() -> None:
    assert ctypes.util.find_library("c") is not None
    assert memtrim.tune() is True
    memtrim.trim()  # returns whether memory went back; must not fail
