"""The workers' shared in-flight ledger: real shared memory, handles in real processes.

Processes are started with the "spawn" context, as ``ice serve --workers N`` starts its
workers; their targets are the module-level ``_child_*`` functions below. No timing is
asserted: deadlines only turn a hang into a failure.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import subprocess
import sys
import time
from multiprocessing.connection import Connection
from multiprocessing.shared_memory import SharedMemory
from multiprocessing.synchronize import Event
from pathlib import Path

import pytest

from ext_proc.placement.ledger_shm import (
    LedgerHandle,
    LedgerSegment,
    default_segment_name,
    endpoint_key,
)

SPAWN = multiprocessing.get_context("spawn")
DEADLINE_S = 60.0
ROOT = Path(__file__).resolve().parents[2]
PAIRS = [("chat", ""), ("chat", "10.0.0.1:8000"), ("batch", "10.0.0.1:8000"), ("a", "bc")]


def segment_exists(name: str) -> bool:
    try:
        LedgerHandle(name, 0).close()
    except FileNotFoundError:
        return False
    return True


def _join(proc: multiprocessing.process.BaseProcess) -> int | None:
    proc.join(DEADLINE_S)
    if proc.is_alive():
        proc.kill()
        proc.join()
    return proc.exitcode


# --- targets of spawned processes -------------------------------------------------------------

COUNT = 20_000
KEYS = 3
LAPS = 300_000


def _child_publisher(name: str, ready: Event, go: Event) -> None:
    """Worker 1: entry i has key i % KEYS, at_s i and blocks i + 1, published as fast as it
    goes, with a short pause every 100 entries so that the parent reads in between."""
    with LedgerHandle(name, 1) as handle:
        ready.set()
        go.wait(DEADLINE_S)
        for i in range(COUNT):
            handle.publish(i % KEYS, float(i), i + 1)
            if i % 100 == 99:
                time.sleep(0.0005)


def _child_lapper(name: str, ready: Event, go: Event) -> None:
    """Worker 1 as fast as it goes: entry n has at_s n, key n % KEYS, blocks n + 1."""
    with LedgerHandle(name, 1) as handle:
        ready.set()
        go.wait(DEADLINE_S)
        for n in range(LAPS):
            handle.publish(n % KEYS, float(n), n + 1)


def _child_keys(conn: Connection) -> None:
    conn.send([endpoint_key(pool, endpoint) for pool, endpoint in PAIRS])


# --- one process ------------------------------------------------------------------------------


def test_others_sums_the_other_workers_entries_newer_than_since() -> None:
    with (
        LedgerSegment(3, ring_entries=16) as seg,
        LedgerHandle(seg.name, 0) as h0,
        LedgerHandle(seg.name, 1) as h1,
        LedgerHandle(seg.name, 2) as h2,
    ):
        assert (h0.workers, h1.worker) == (3, 1)
        assert h1.others(0.0) == {}
        h0.publish(7, 1.0, 5)
        h0.publish(8, 2.0, 7)
        h0.publish(7, 3.0, 1)
        h2.publish(7, 2.5, 100)
        h1.publish(7, 9.0, 1000)  # its own: never in h1's sums
        assert h1.others(0.0) == {7: 106, 8: 7}
        assert h1.others(1.0) == {7: 101, 8: 7}  # strictly newer: the entry at 1.0 is out
        assert h1.others(2.5) == {7: 1}
        assert h1.others(3.0) == {}
        assert h0.others(0.0) == {7: 1100}
        assert h2.others(2.0) == {7: 1001}
        # a since_s asked before is brought up to date with the entries appended since
        h0.publish(8, 4.0, 3)
        h2.publish(9, 5.0, 2)
        assert h1.others(1.0) == {7: 101, 8: 10, 9: 2}
        assert h1.others(0.0) == {7: 106, 8: 10, 9: 2}
        assert h1.others(4.0) == {9: 2}
        out = h1.others(1.0)
        out[7] = 0  # the caller's copy
        assert h1.others(1.0) == {7: 101, 8: 10, 9: 2}
        assert h1.others(6.0) == {}
        h0.publish(8, 5.5, 4)  # appended after since_s 6.0 was asked, but older than it
        h0.publish(8, 7.0, 8)
        assert h1.others(6.0) == {8: 8}


def test_a_ring_keeps_its_newest_entries() -> None:
    with LedgerSegment(2, ring_entries=8) as seg, LedgerHandle(seg.name, 0) as h0:
        early = LedgerHandle(seg.name, 1)
        for i in range(5):
            h0.publish(1, float(i), 1 << i)
        assert early.others(-1.0) == {1: 0b11111}
        for i in range(5, 20):
            h0.publish(1, float(i), 1 << i)
        newest = sum(1 << i for i in range(12, 20))
        assert early.others(-1.0) == {1: newest}  # its cached sums forget the overwritten
        assert early.others(13.0) == {1: sum(1 << i for i in range(14, 20))}
        assert early.lost == 7  # entries 5..11: overwritten before it copied them
        early.close()
        with LedgerHandle(seg.name, 1) as late:
            assert late.others(-1.0) == {1: newest}
            assert late.lost == 12


def test_a_restarted_worker_continues_its_ring_and_times_never_go_back() -> None:
    with LedgerSegment(2, ring_entries=8) as seg, LedgerHandle(seg.name, 1) as reader:
        with LedgerHandle(seg.name, 0) as first:
            first.publish(1, 1.0, 1)
            first.publish(1, 2.0, 2)
        with LedgerHandle(seg.name, 0) as second:
            second.publish(1, 3.0, 4)
            second.publish(1, 5.0, 8)
            second.publish(1, 4.0, 16)  # earlier than its predecessor: counted from 5.0
        assert reader.others(0.0) == {1: 31}
        assert reader.others(4.5) == {1: 24}


def test_closing_unlinks_the_segment_and_open_handles_keep_working() -> None:
    seg = LedgerSegment(2, ring_entries=8)
    name = seg.name
    path = Path("/dev/shm") / name
    if sys.platform == "linux":
        assert path.stat().st_mode & 0o777 == 0o600
    h0, h1 = LedgerHandle(name, 0), LedgerHandle(name, 1)
    h0.publish(3, 1.0, 2)
    seg.close()
    seg.close()  # idempotent
    assert not segment_exists(name)
    assert not path.exists()
    with pytest.raises(FileNotFoundError, match="supervisor gone"):
        LedgerHandle(name, 0)
    h0.publish(3, 2.0, 5)
    assert h1.others(0.0) == {3: 7}
    h0.close()
    h0.close()
    h1.close()


def test_the_segment_is_removed_when_the_with_block_raises() -> None:
    name = default_segment_name()
    with pytest.raises(RuntimeError), LedgerSegment(2, name=name):
        assert segment_exists(name)
        raise RuntimeError("supervisor crashed")
    assert not segment_exists(name)


def test_bad_input_fails_clearly() -> None:
    with LedgerSegment(2, ring_entries=8) as seg:
        for worker in (2, -1):
            with pytest.raises(ValueError, match=rf"worker {worker} out of range: .* 2 worker"):
                LedgerHandle(seg.name, worker)
        with pytest.raises(FileExistsError, match=seg.name):
            LedgerSegment(2, name=seg.name)
        with LedgerHandle(seg.name, 0) as h:
            with pytest.raises(ValueError, match="NaN"):
                h.publish(1, float("nan"), 1)
            with pytest.raises(ValueError, match="out of the ledger's range"):
                h.publish(1 << 64, 1.0, 1)
            with pytest.raises(ValueError, match="out of the ledger's range"):
                h.publish(1, 1.0, 1 << 63)
    with pytest.raises(FileNotFoundError, match="no shared memory segment"):
        LedgerHandle(default_segment_name(), 0)
    for workers, ring in ((0, 8), (2, 0)):
        with pytest.raises(ValueError, match="need workers >= 1 and ring_entries >= 1"):
            LedgerSegment(workers, ring)
    foreign = SharedMemory(default_segment_name(), create=True, size=4096)
    try:
        with pytest.raises(ValueError, match="not an ICE ledger"):
            LedgerHandle(foreign.name, 0)
    finally:
        foreign.close()
        foreign.unlink()


def test_endpoint_keys_are_63_bit_and_distinct() -> None:
    keys = [endpoint_key(pool, endpoint) for pool, endpoint in PAIRS]
    assert all(0 <= k < 1 << 63 for k in keys)
    assert len(set(keys)) == len(keys)
    assert endpoint_key("a", "bc") != endpoint_key("ab", "c")


# --- several processes ------------------------------------------------------------------------


def test_endpoint_key_is_the_same_in_another_process() -> None:
    parent, child = SPAWN.Pipe()
    proc = SPAWN.Process(target=_child_keys, args=(child,))
    proc.start()
    assert parent.poll(DEADLINE_S)
    assert parent.recv() == [endpoint_key(pool, endpoint) for pool, endpoint in PAIRS]
    assert _join(proc) == 0


def test_a_reader_never_sees_a_torn_sum_while_another_process_publishes() -> None:
    # prefix[p][k]: blocks of key k over entries 0..p-1; totals are strictly increasing
    prefix = [[0] * KEYS]
    for i in range(COUNT):
        row = list(prefix[-1])
        row[i % KEYS] += i + 1
        prefix.append(row)
    by_total = {sum(row): p for p, row in enumerate(prefix)}

    def expected(p: int, t: int) -> dict[int, int]:  # entries t..p-1 (at_s > t - 0.5)
        present = {i % KEYS for i in range(t, min(p, t + KEYS))}
        return {k: prefix[p][k] - prefix[t][k] for k in present}

    rng = random.Random(7)
    with LedgerSegment(2, ring_entries=COUNT) as seg, LedgerHandle(seg.name, 0) as reader:
        ready, go = SPAWN.Event(), SPAWN.Event()
        proc = SPAWN.Process(target=_child_publisher, args=(seg.name, ready, go))
        proc.start()
        try:
            assert ready.wait(DEADLINE_S)
            go.set()
            p, reads, between = 0, 0, 0
            while p < COUNT:
                reads += 1
                assert reads < 50_000_000, f"stuck at {p} of {COUNT}"
                whole = reader.others(-1.0)  # asked again and again: the cached sums
                total = sum(whole.values())
                assert total in by_total, f"read {reads}: {whole} is no prefix"
                seen = by_total[total]
                assert seen >= p, f"went back from {p} to {seen}"
                p = seen
                assert whole == expected(p, 0)
                if 0 < p < COUNT:
                    between += 1
                t = rng.randrange(COUNT)  # mostly a since_s never asked: summed afresh
                part = reader.others(t - 0.5)
                later = by_total.get(sum(part.values()) + sum(prefix[t]))
                assert later is not None and later >= p, f"since {t - 0.5}: {part}"
                assert part == expected(later, t)
            assert reader.others(-1.0) == expected(COUNT, 0)
            assert reader.lost == 0
            assert between > 0, "the reader never read while the child published"
        finally:
            assert _join(proc) == 0


def test_a_lapped_reader_keeps_only_whole_entries() -> None:
    """A ring of 16 that the child laps again and again while the parent copies from it: every
    entry the parent keeps is one the child wrote whole (at_s n, key n % KEYS, blocks n + 1)."""
    with LedgerSegment(2, ring_entries=16) as seg, LedgerHandle(seg.name, 0) as reader:
        ready, go = SPAWN.Event(), SPAWN.Event()
        proc = SPAWN.Process(target=_child_lapper, args=(seg.name, ready, go))
        proc.start()
        try:
            assert ready.wait(DEADLINE_S)
            go.set()
            kept = reads = 0
            while proc.is_alive() or kept == 0:
                reads += 1
                if reads % 64 == 0:
                    time.sleep(0.0001)  # the child surely laps the reader meanwhile
                sums = reader.others(-1.0)
                local = reader._local[1]
                for n, at, key, blocks in local:
                    assert (at, key, blocks) == (float(n), n % KEYS, n + 1), (n, at, key, blocks)
                kept += len(local)
                assert len(local) <= 16
                assert sum(sums.values()) == sum(e[3] for e in local)
            assert reader.lost > 0, "the child never lapped the reader"
        finally:
            assert _join(proc) == 0


def test_a_handle_in_a_fresh_interpreter_does_not_unlink_the_segment_at_exit() -> None:
    """bpo-38119: a ``SharedMemory(name)`` there would be unlinked by its resource tracker."""
    with LedgerSegment(2, ring_entries=8) as seg:
        code = (
            "from ext_proc.placement.ledger_shm import LedgerHandle\n"
            f"h = LedgerHandle({seg.name!r}, 1)\n"
            "h.publish(5, 1.0, 9)\n"
            "print(h.others(0.0))\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", code],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=DEADLINE_S,
            check=False,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "{}"
        assert "leaked" not in done.stderr
        assert segment_exists(seg.name)
        with LedgerHandle(seg.name, 0) as h:
            assert h.others(0.0) == {5: 9}


def test_live_totals_are_the_latest_per_worker_and_never_counted_as_entries() -> None:
    with LedgerSegment(3, ring_entries=8) as segment:
        w0, w1, w2 = (LedgerHandle(segment.name, i) for i in range(3))
        try:
            key = endpoint_key("pool", "")
            w1.publish_live(key, 7, 1.0)
            w1.publish_live(key, 12, 2.0)  # a total, not a delta
            w2.publish_live(key, 5, 2.0)
            assert w0.others_live() == {key: 17}
            assert w0.others(0.0) == {}  # live totals are not ledger entries
            for t in range(20):  # lap w1's ring: its latest total still stands
                w1.publish(key, 3.0 + t, 1)
            assert w0.others_live() == {key: 17}
            w1.publish_live(key, 0, 30.0)
            assert w0.others_live() == {key: 5}
        finally:
            for h in (w0, w1, w2):
                h.close()


def test_a_restarted_worker_drops_its_predecessors_live_totals() -> None:
    with LedgerSegment(2) as segment:
        w0 = LedgerHandle(segment.name, 0)
        dead = LedgerHandle(segment.name, 1)
        try:
            key = endpoint_key("pool", "10.0.0.1:8000")
            dead.publish_live(key, 9, 1.0)
            assert w0.others_live() == {key: 9}
            dead.close()  # the worker died with its streams
            successor = LedgerHandle(segment.name, 1)
            assert w0.others_live() == {}
            successor.close()
        finally:
            w0.close()
