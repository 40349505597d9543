"""The newest snapshot in shared memory: one writer (the collector) per host, lock-free readers.

The writer pickles any object (in practice ``dict[str, PoolSnapshot]``) into the inactive half
of a double buffer, then flips a small header under a seqlock. A reader polls one 8-byte word
per ``get()`` and returns its cached object while that word is unchanged; it unpickles only
when the writer published (a few times a second). Readers never wait on the writer, never
write (their mapping is read-only), and keep their last object when the writer is gone.

Segment layout (native byte order, every word 8-byte aligned; ``C`` = slot capacity)::

    offset           size  field
    0                  64  header, eight u64 words:
                             [0] magic b"ICESNAP1"   [1] layout version (1)
                             [2] slot capacity C     [3] seq (seqlock counter)
                             [4] active slot (0/1)   [5] closed (1 once the writer closed)
                             [6] writer pid          [7] reserved
    64 + i*(64 + C)    64  slot i header: u64 generation, u64 length, f64 published
                           CLOCK_MONOTONIC s, f64 published unix s, u32 crc32 of the
                           first 32 header bytes and the payload
    128 + i*(64 + C)    C  slot i payload: the pickle (protocol 5), ``length`` bytes

Invariants:
- One writer (a lock orders the threads of the writer's process). ``publish`` writes the
  *inactive* slot completely, then: seq += 1 (odd: flipping), active = that slot, seq += 1.
  Nobody reads the inactive slot except a reader that started before the flip, and that
  reader sees seq move.
- Whenever seq is even, the active slot holds the publication of generation ``seq // 2``;
  seq == 0 means nothing was published yet.
- A reader accepts a copy only if seq was even and equal before and after the copy, the slot
  says generation ``seq // 2``, and the crc matches; otherwise it retries a bounded number of
  times and then returns its previous object (it never spins on the writer; if the writer died
  mid-flip, seq stays odd and every ``get()`` returns the last object in 1–2 µs). The crc
  and the generation check guard against what x86's ordered stores give for free but weakly
  ordered CPUs (ARM) do not: Python issues no memory barriers.
- The header words are read and written through a ``memoryview.cast("Q")``, one aligned 8-byte
  load or store each (``struct.pack_into`` is not used there: it zeroes the field first).
- Publish times use ``time.monotonic()``, CLOCK_MONOTONIC on Linux, which is one clock for
  every process of the host (of one time namespace), so ``age_s`` compares across processes;
  ``time.time()`` is stored too, for humans.

Lifetime: the writer creates the segment (mode 0600: whoever can write it can make readers
unpickle anything) and unlinks it on ``close``/``with`` exit, even on an exception; if the
writer's process dies without closing, ``multiprocessing``'s resource tracker unlinks it when
that tracker exits. Readers map it with ``shm_open`` + a read-only ``mmap`` and never register
with the resource tracker: registering (as ``SharedMemory(name)`` does on Python < 3.13) makes a
reader with its own tracker unlink the writer's segment at exit (bpo-38119 / gh-82300), and
unregistering afterwards removes the *writer's* entry when the tracker is shared (spawned or
forked children share their parent's), which breaks the writer's unlink and its crash cleanup.
An unlinked segment stays mapped, so a reader keeps the last publication and its age.
"""

from __future__ import annotations

import _posixshmem  # type: ignore[import-not-found]  # CPython's shm_open (what SharedMemory uses)
import logging
import mmap
import os
import pickle
import secrets
import struct
import threading
import time
import zlib
from multiprocessing.shared_memory import SharedMemory
from types import TracebackType
from typing import Final, Self

__all__ = [
    "DEFAULT_CAPACITY_BYTES",
    "SnapshotReader",
    "SnapshotTooLargeError",
    "SnapshotWriter",
    "default_segment_name",
]

log = logging.getLogger("ice.shm")

DEFAULT_CAPACITY_BYTES: Final = 1 << 20  # per slot; tmpfs pages are allocated when written

_MAGIC: Final = int.from_bytes(b"ICESNAP1", "little")
_VERSION: Final = 1
_PICKLE_PROTOCOL: Final = 5
_HEADER_BYTES: Final = 64
_SLOT_HEADER_BYTES: Final = 64
# Header word indexes.
_W_MAGIC, _W_VERSION, _W_CAPACITY, _W_SEQ, _W_ACTIVE, _W_CLOSED, _W_PID = range(7)
# Slot header: generation, length, published monotonic s, published unix s | crc32.
_SLOT_META: Final = struct.Struct("@QQdd")
_SLOT_CRC: Final = struct.Struct("@I")
_CRC_OFFSET: Final = _SLOT_META.size  # 32
_READ_ATTEMPTS: Final = 16


class SnapshotTooLargeError(ValueError):
    """The pickled snapshot does not fit a slot; nothing was published."""


def default_segment_name() -> str:
    """``ice-<pid>-<random>-snap``: unique per process, short enough for macOS (31 bytes)."""
    return f"ice-{os.getpid()}-{secrets.token_hex(3)}-snap"


def _slot_offset(slot: int, capacity_bytes: int) -> int:
    return _HEADER_BYTES + slot * (_SLOT_HEADER_BYTES + capacity_bytes)


def _segment_bytes(capacity_bytes: int) -> int:
    return _slot_offset(2, capacity_bytes)


class SnapshotWriter:
    """Creates the segment ``name`` and publishes objects into it; one per host."""

    def __init__(
        self, name: str | None = None, capacity_bytes: int = DEFAULT_CAPACITY_BYTES
    ) -> None:
        if capacity_bytes <= 0:
            raise ValueError(f"capacity_bytes must be positive, got {capacity_bytes}")
        self._capacity = -(-capacity_bytes // 64) * 64  # keeps every slot 8-byte aligned
        self._lock = threading.Lock()
        self._closed = False
        self._unlinked = False
        self._generation = 0
        self.last_publish_bytes = 0
        try:
            self._shm = SharedMemory(
                name or default_segment_name(), create=True, size=_segment_bytes(self._capacity)
            )
        except FileExistsError as e:
            raise FileExistsError(f"shared memory segment {name!r} already exists") from e
        try:
            buf = self._shm.buf
            assert buf is not None
            self._buf: memoryview = buf
            self._words = buf.cast("Q")
            words = self._words
            words[_W_VERSION] = _VERSION
            words[_W_CAPACITY] = self._capacity
            words[_W_PID] = os.getpid()
            words[_W_MAGIC] = _MAGIC  # last: a reader that sees it sees the rest
        except BaseException:
            self._release()
            raise

    @property
    def name(self) -> str:
        """The name readers attach to (no leading slash)."""
        return self._shm.name

    @property
    def capacity_bytes(self) -> int:
        """The largest pickle a slot holds."""
        return self._capacity

    @property
    def generation(self) -> int:
        """How many objects were published; 0 before the first."""
        return self._generation

    def publish(self, obj: object) -> int:
        """Make ``obj`` the newest snapshot; returns its generation (1, 2, …).

        Raises ``SnapshotTooLargeError`` (the previous snapshot stays) when the pickle is
        larger than ``capacity_bytes``, and ``ValueError`` once closed."""
        payload = pickle.dumps(obj, protocol=_PICKLE_PROTOCOL)
        length = len(payload)
        if length > self._capacity:
            raise SnapshotTooLargeError(
                f"snapshot pickles to {length} bytes, more than the {self._capacity}-byte slot "
                f"of shared memory segment {self.name!r}; create the SnapshotWriter with a "
                f"larger capacity_bytes"
            )
        with self._lock:
            if self._closed:
                raise ValueError(f"SnapshotWriter {self.name!r} is closed")
            words, buf = self._words, self._buf
            seq = words[_W_SEQ]
            slot = 1 - words[_W_ACTIVE]
            base = _slot_offset(slot, self._capacity)
            generation = self._generation + 1
            meta = _SLOT_META.pack(generation, length, time.monotonic(), time.time())
            start = base + _SLOT_HEADER_BYTES
            buf[start : start + length] = payload
            buf[base : base + _CRC_OFFSET] = meta
            _SLOT_CRC.pack_into(buf, base + _CRC_OFFSET, zlib.crc32(payload, zlib.crc32(meta)))
            words[_W_SEQ] = seq + 1
            words[_W_ACTIVE] = slot
            words[_W_SEQ] = seq + 2
            self._generation = generation
            self.last_publish_bytes = length
        return generation

    def unlink(self) -> None:
        """Remove the name: no new reader can attach; attached readers keep their mapping."""
        if self._unlinked:
            return
        self._unlinked = True
        try:
            self._shm.unlink()
        except FileNotFoundError:
            log.warning("shared memory segment %s was already removed", self.name)

    def close(self) -> None:
        """Mark the segment closed for readers, unmap it and unlink it. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                self._words[_W_CLOSED] = 1
            finally:
                self._release()

    def _release(self) -> None:
        try:
            if hasattr(self, "_words"):
                self._words.release()
            self._shm.close()
        finally:
            self.unlink()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class SnapshotReader:
    """Attaches read-only to a writer's segment; ``get()`` returns the newest object.

    Not thread-safe: give each thread its own reader (they are cheap), or share one on an
    event loop. Pass the *name* to other processes, not the reader."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.torn_reads = 0  # attempts rejected (writer mid-flip, copy overtaken, bad crc)
        self.stale_returns = 0  # get() calls that gave up retrying and returned the old object
        self.unpickle_errors = 0
        self._seq = 0
        self._obj: object | None = None
        self._published_monotonic_s = 0.0
        self._published_unix_s = 0.0
        try:
            fd = _posixshmem.shm_open("/" + name, os.O_RDONLY, mode=0o600)
        except FileNotFoundError as e:
            raise FileNotFoundError(f"no shared memory segment {name!r} (writer gone?)") from e
        try:
            size = os.fstat(fd).st_size
            if size < _HEADER_BYTES:
                raise ValueError(f"shared memory segment {name!r} is not an ICE snapshot")
            self._mm = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)
        self._buf = memoryview(self._mm)
        self._words = self._buf[: size - size % 8].cast("Q")
        words = self._words
        capacity = words[_W_CAPACITY]
        if (
            words[_W_MAGIC] != _MAGIC
            or words[_W_VERSION] != _VERSION
            or size < _segment_bytes(capacity)
        ):
            self.close()
            raise ValueError(f"shared memory segment {name!r} is not an ICE snapshot (v1)")
        self._capacity = capacity
        self._slot_offsets = (_slot_offset(0, capacity), _slot_offset(1, capacity))

    def get(self) -> object | None:
        """The newest published object, or None before the first publication.

        Steady state: one 8-byte load and a compare. After a publication: copy, check and
        unpickle it once. Never waits: if no consistent copy can be taken right now (the writer
        is mid-flip), returns the previous object and tries again on the next call."""
        if self._words[_W_SEQ] == self._seq:
            return self._obj
        return self._refresh()

    @property
    def generation(self) -> int:
        """Generation of the object ``get()`` last returned (0: none yet)."""
        return self._seq // 2

    @property
    def published_unix_s(self) -> float:
        """The writer's ``time.time()`` when it published that object (0.0: none yet)."""
        return self._published_unix_s

    def age_s(self) -> float:
        """Seconds since the newest publication was made (``inf`` before the first).

        Refreshes first, so it never reports an old object's age while a newer one is there.
        Keeps growing once the writer is gone."""
        self.get()
        if not self._seq:
            return float("inf")
        return time.monotonic() - self._published_monotonic_s

    @property
    def writer_closed(self) -> bool:
        """True once the writer closed the segment (the current object is the last one)."""
        return bool(self._words[_W_CLOSED])

    def _refresh(self) -> object | None:
        words, buf = self._words, self._buf
        for _ in range(_READ_ATTEMPTS):
            seq = words[_W_SEQ]
            if seq == self._seq:
                return self._obj
            if seq & 1:
                self.torn_reads += 1
                continue
            slot = words[_W_ACTIVE]
            if slot > 1:
                self.torn_reads += 1
                continue
            base = self._slot_offsets[slot]
            meta = bytes(buf[base : base + _CRC_OFFSET + _SLOT_CRC.size])
            generation, length, published_mono, published_unix = _SLOT_META.unpack_from(meta)
            if length > self._capacity:
                self.torn_reads += 1
                continue
            start = base + _SLOT_HEADER_BYTES
            payload = bytes(buf[start : start + length])
            if words[_W_SEQ] != seq or generation != seq // 2:
                self.torn_reads += 1
                continue
            (crc,) = _SLOT_CRC.unpack_from(meta, _CRC_OFFSET)
            if zlib.crc32(payload, zlib.crc32(meta[:_CRC_OFFSET])) != crc:
                self.torn_reads += 1
                continue
            try:
                obj: object = pickle.loads(payload)
            except Exception:
                # Trusted bytes that passed the crc: a code mismatch, not a torn read. Skip
                # this generation (no retry per call); the old object stays and ages.
                self.unpickle_errors += 1
                log.exception("cannot unpickle snapshot %d from %s", generation, self.name)
                self._seq = seq
                return self._obj
            self._obj = obj
            self._seq = seq
            self._published_monotonic_s = published_mono
            self._published_unix_s = published_unix
            return obj
        self.stale_returns += 1
        return self._obj

    def close(self) -> None:
        """Unmap the segment (never unlinks it). ``get()`` raises ValueError afterwards."""
        self._words.release()
        self._buf.release()
        self._mm.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
