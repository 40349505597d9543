"""The shared-memory snapshot: a writer, readers in real processes, and the segment's lifetime.

Processes are started with the "spawn" context, as ``ice serve --workers N`` starts its
workers; their targets are the module-level ``_child_*`` functions below. No timing is
asserted: deadlines only turn a hang into a failure.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from multiprocessing.connection import Connection
from multiprocessing.shared_memory import SharedMemory
from multiprocessing.synchronize import Event
from pathlib import Path

import pytest

from ext_proc.signals.shm import (
    SnapshotReader,
    SnapshotTooLargeError,
    SnapshotWriter,
    default_segment_name,
)
from ext_proc.signals.snapshot import BackendSignals, PoolSnapshot

SPAWN = multiprocessing.get_context("spawn")
DEADLINE_S = 60.0
ROOT = Path(__file__).resolve().parents[2]


def pools(n: int) -> dict[str, PoolSnapshot]:
    backend = BackendSignals(
        url=f"http://b{n}/metrics", kv_cache_usage=n / 100, num_gpu_blocks=1024, block_size=16
    )
    return {"chat": PoolSnapshot(pool="chat", backends=(backend,), taken_at_s=float(n))}


def consistent(n: int) -> tuple[int, list[int], str]:
    """An object whose parts must agree: a torn copy would mix two of them."""
    return (n, [n] * (1 + n % 257), f"{n}:" * (n % 13))


def segment_exists(name: str) -> bool:
    try:
        SnapshotReader(name).close()
    except FileNotFoundError:
        return False
    return True


def wait_for_generation(reader: SnapshotReader, generation: int) -> object | None:
    deadline = time.monotonic() + DEADLINE_S
    while reader.generation < generation:
        reader.get()
        if time.monotonic() > deadline:
            raise TimeoutError(f"generation {generation} never came (at {reader.generation})")
    return reader.get()


# --- targets of spawned processes -------------------------------------------------------------


def _child_echo(name: str, conn: Connection, count: int) -> None:
    """Sends back (generation, object) for generations 1..count, each once it appears."""
    with SnapshotReader(name) as reader:
        for generation in range(1, count + 1):
            obj = wait_for_generation(reader, generation)
            conn.send((reader.generation, obj))


def _child_tight_writer(conn: Connection, stop: Event) -> None:
    """Publishes ``consistent(n)`` as generation n as fast as it can, until ``stop``."""
    with SnapshotWriter(None, capacity_bytes=8192) as writer:
        conn.send(writer.name)
        n = 0
        while not stop.is_set():
            n += 1
            writer.publish(consistent(n))
        conn.send(n)
        conn.recv()  # the parent has read the last one before the writer unlinks


def _child_publish_then_go(name: str, conn: Connection, ending: str) -> None:
    writer = SnapshotWriter(name, capacity_bytes=4096)
    writer.publish(pools(7))
    conn.send("published")
    conn.recv()
    if ending == "killed":
        os.kill(os.getpid(), signal.SIGKILL)
    writer.close()


def _child_read_once(name: str, conn: Connection) -> None:
    with SnapshotReader(name) as reader:
        conn.send(reader.get())


def _lifecycle_in_fresh_interpreter() -> None:
    """Writer here, a spawned reader that exits, then the writer closes (run by a test)."""
    with SnapshotWriter(None, capacity_bytes=4096) as writer:
        writer.publish(pools(1))
        parent, child = SPAWN.Pipe()
        proc = SPAWN.Process(target=_child_read_once, args=(writer.name, child))
        proc.start()
        print(parent.recv() == pools(1), flush=True)
        proc.join(DEADLINE_S)
        print(segment_exists(writer.name), flush=True)
    print(segment_exists(writer.name), flush=True)


def _join(proc: multiprocessing.process.BaseProcess) -> int | None:
    proc.join(DEADLINE_S)
    if proc.is_alive():
        proc.kill()
        proc.join()
    return proc.exitcode


# --- one process ------------------------------------------------------------------------------


def test_a_reader_sees_nothing_before_the_first_publication() -> None:
    with SnapshotWriter(None, capacity_bytes=4096) as writer, SnapshotReader(writer.name) as r:
        assert r.get() is None
        assert r.generation == 0
        assert r.age_s() == float("inf")
        assert not r.writer_closed


def test_get_returns_the_same_object_until_the_writer_publishes() -> None:
    with SnapshotWriter(None, capacity_bytes=4096) as writer, SnapshotReader(writer.name) as r:
        assert writer.publish(pools(1)) == 1
        first = r.get()
        assert first == pools(1)
        assert r.get() is first
        assert r.generation == 1
        assert writer.publish(pools(2)) == 2
        assert r.get() == pools(2)
        assert r.generation == 2
        assert 0.0 <= r.age_s() < float("inf")
        assert r.published_unix_s > 0


def test_an_oversize_snapshot_raises_and_the_previous_one_stays() -> None:
    with SnapshotWriter(None, capacity_bytes=1024) as writer, SnapshotReader(writer.name) as r:
        writer.publish(pools(1))
        with pytest.raises(SnapshotTooLargeError, match=r"bytes, more than the 1024-byte slot"):
            writer.publish(b"x" * 2000)
        assert isinstance(SnapshotTooLargeError("x"), ValueError)
        assert writer.generation == 1
        assert r.get() == pools(1)
        assert r.generation == 1


def test_a_closed_writer_unlinks_its_segment() -> None:
    writer = SnapshotWriter(None, capacity_bytes=4096)
    assert segment_exists(writer.name)
    writer.close()
    writer.close()  # idempotent
    assert not segment_exists(writer.name)
    with pytest.raises(ValueError, match="closed"):
        writer.publish(1)


def test_the_segment_is_removed_when_the_with_block_raises() -> None:
    name = default_segment_name()
    with pytest.raises(RuntimeError), SnapshotWriter(name, capacity_bytes=4096) as writer:
        writer.publish(1)
        raise RuntimeError("collector crashed")
    assert not segment_exists(name)


def test_two_writers_cannot_share_a_name() -> None:
    with SnapshotWriter(None, capacity_bytes=4096) as writer:
        with pytest.raises(FileExistsError, match=writer.name):
            SnapshotWriter(writer.name, capacity_bytes=4096)
        assert segment_exists(writer.name)


def test_attaching_to_a_missing_or_foreign_segment_fails_clearly() -> None:
    with pytest.raises(FileNotFoundError, match="writer gone"):
        SnapshotReader(default_segment_name())
    foreign = SharedMemory(default_segment_name(), create=True, size=4096)
    try:
        with pytest.raises(ValueError, match="not an ICE snapshot"):
            SnapshotReader(foreign.name)
    finally:
        foreign.close()
        foreign.unlink()


def test_readers_cannot_write_the_segment() -> None:
    with (
        SnapshotWriter(None, capacity_bytes=4096) as writer,
        SnapshotReader(writer.name) as r,
        pytest.raises(TypeError, match="read-only"),
    ):
        r._buf[0] = 1


def test_a_reader_mid_flip_returns_its_previous_object_without_waiting() -> None:
    from ext_proc.signals.shm import _W_SEQ

    with SnapshotWriter(None, capacity_bytes=4096) as writer, SnapshotReader(writer.name) as r:
        writer.publish(pools(1))
        assert r.get() == pools(1)
        writer._words[_W_SEQ] += 1  # the writer stopped between its two seq stores
        assert r.get() == pools(1)
        assert r.stale_returns == 1
        assert r.torn_reads > 0
        writer._words[_W_SEQ] -= 1
        writer.publish(pools(2))
        assert r.get() == pools(2)


def test_a_copy_whose_crc_does_not_match_is_rejected() -> None:
    from ext_proc.signals.shm import _HEADER_BYTES, _SLOT_HEADER_BYTES, _W_ACTIVE

    with SnapshotWriter(None, capacity_bytes=4096) as writer, SnapshotReader(writer.name) as r:
        writer.publish(pools(1))
        writer.publish(pools(2))
        assert r.get() == pools(2)
        writer.publish(pools(3))
        active = writer._words[_W_ACTIVE]
        payload = _HEADER_BYTES + active * (_SLOT_HEADER_BYTES + 4096) + _SLOT_HEADER_BYTES
        writer._buf[payload + 10] ^= 0xFF  # as if the payload were seen half-written
        assert r.get() == pools(2)
        assert r.generation == 2
        writer._buf[payload + 10] ^= 0xFF
        assert r.get() == pools(3)


# --- real processes ---------------------------------------------------------------------------


def test_a_reader_in_another_process_sees_each_published_object() -> None:
    with SnapshotWriter(None, capacity_bytes=4096) as writer:
        parent, child = SPAWN.Pipe()
        proc = SPAWN.Process(target=_child_echo, args=(writer.name, child, 5))
        proc.start()
        for n in range(1, 6):
            writer.publish(pools(n))
            assert parent.poll(DEADLINE_S), "the reader process did not answer"
            assert parent.recv() == (n, pools(n))
        assert _join(proc) == 0


def test_a_reader_never_sees_a_torn_snapshot_while_the_writer_publishes_in_a_tight_loop() -> None:
    parent, child = SPAWN.Pipe()
    stop = SPAWN.Event()
    proc = SPAWN.Process(target=_child_tight_writer, args=(child, stop))
    proc.start()
    try:
        assert parent.poll(DEADLINE_S), "the writer process did not start"
        reader = SnapshotReader(parent.recv())
        wait_for_generation(reader, 1)
        generations: set[int] = set()
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            obj = reader.get()
            assert isinstance(obj, tuple)
            n, numbers, text = obj
            assert (n, numbers, text) == consistent(n)
            assert n == reader.generation  # the object is the one its generation names
            generations.add(n)
        stop.set()
        assert parent.poll(DEADLINE_S)
        last = parent.recv()
        assert wait_for_generation(reader, last) == consistent(last)
        parent.send("done")
        assert _join(proc) == 0
        assert reader.get() == consistent(last)  # the writer is gone; its last object stays
        assert reader.writer_closed
        assert len(generations) > 1
        reader.close()
    finally:
        stop.set()
        with contextlib.suppress(OSError):
            parent.send("done")
        _join(proc)


@pytest.mark.parametrize("ending", ["closed", "killed"], ids=["writer-closed", "writer-killed"])
def test_when_the_writer_is_gone_the_reader_keeps_its_last_object(ending: str) -> None:
    name = default_segment_name()
    parent, child = SPAWN.Pipe()
    proc = SPAWN.Process(target=_child_publish_then_go, args=(name, child, ending))
    proc.start()
    try:
        assert parent.poll(DEADLINE_S), "the writer process did not publish"
        parent.recv()
        with SnapshotReader(name) as reader:
            assert reader.get() == pools(7)
            parent.send("go")
            assert _join(proc) == (0 if ending == "closed" else -signal.SIGKILL)
            age_s = reader.age_s()
            assert reader.get() == pools(7)
            assert reader.generation == 1
            assert age_s <= reader.age_s() < float("inf")
            assert reader.writer_closed is (ending == "closed")
            assert segment_exists(name) is (ending == "killed")
    finally:
        _join(proc)
        if segment_exists(name):  # killed: its resource tracker (ours) would unlink it at exit
            leftover = SharedMemory(name)
            leftover.close()
            leftover.unlink()


def test_a_spawned_reader_that_exits_does_not_unlink_the_segment() -> None:
    with SnapshotWriter(None, capacity_bytes=4096) as writer:
        writer.publish(pools(3))
        for _ in range(2):
            parent, child = SPAWN.Pipe()
            proc = SPAWN.Process(target=_child_read_once, args=(writer.name, child))
            proc.start()
            assert parent.poll(DEADLINE_S)
            assert parent.recv() == pools(3)
            assert _join(proc) == 0
            assert segment_exists(writer.name)
        writer.publish(pools(4))
        with SnapshotReader(writer.name) as reader:
            assert reader.get() == pools(4)


def test_a_reader_with_its_own_resource_tracker_does_not_unlink_the_segment_at_exit() -> None:
    """bpo-38119: an interpreter that attached with SharedMemory(name) unlinks at exit."""
    code = (
        "from ext_proc.signals.shm import SnapshotReader\n"
        "r = SnapshotReader({name!r})\n"
        "print(r.get())\n"
    )
    with SnapshotWriter(None, capacity_bytes=4096) as writer:
        writer.publish("hello")
        done = subprocess.run(
            [sys.executable, "-c", code.format(name=writer.name)],
            capture_output=True,
            text=True,
            timeout=DEADLINE_S,
            check=True,
            cwd=ROOT,
        )
        assert done.stdout == "hello\n"
        assert done.stderr == ""
        assert segment_exists(writer.name)


def test_the_whole_lifecycle_leaves_the_resource_tracker_quiet() -> None:
    """No "leaked shared_memory" warning and no tracker KeyError (which unregistering a
    reader's attach from a tracker shared with the writer would cause)."""
    code = "import tests.signals.test_shm as t\nt._lifecycle_in_fresh_interpreter()\n"
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
        check=True,
        cwd=ROOT,
    )
    assert done.stdout.split() == ["True", "True", "False"]
    assert done.stderr == ""
