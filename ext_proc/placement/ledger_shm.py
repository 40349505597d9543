"""The workers' in-flight KV ledgers in shared memory: one ring per worker, lock-free readers.

Job: with ``ice serve --workers N`` each worker keeps a ledger of the KV blocks it passed
upstream since a pool's snapshot was taken (``ext_proc.placement.poolview``); alone, N workers would
each admit what the snapshot's free blocks allow, N times over. Here every worker also appends
each ledger entry (key, time passed, blocks) to its own ring, and asks for the sums, per key,
of the *other* workers' entries passed after a snapshot was taken. A key is
``endpoint_key(pool, endpoint)`` (endpoint "" = anywhere); times are ``time.monotonic()``,
CLOCK_MONOTONIC, one clock for every process of the host (as a snapshot's ``taken_at_s``).

Segment layout (native byte order, every word 8-byte aligned; W workers, R ring entries)::

    offset               size  field
    0                      64  header, eight u64 words:
                                 [0] magic b"ICELEDG1"  [1] layout version (1)
                                 [2] workers W          [3] ring entries R
                                 [4] creator pid        [5..7] reserved
    64 + w*(64 + 40R)      64  ring w header: u64 head (entries ever appended), u64 pid of
                               the last handle opened for worker w; padding (own cache line)
    128 + w*(64 + 40R)    40R  ring w, entry n in slot n % R: u64 seq, f64 at_s, i64 blocks,
                               u64 key, u64 check (crc32 of the 24 field bytes, seeded with
                               the low 32 bits of seq)

Invariants:
- One writer per ring: the handle of worker w (one live handle per worker index; a restarted
  worker's new handle continues from the ring's head). Appending entry n stores seq = 2n + 1,
  the fields and check in one copy, seq = 2n + 2, then head = n + 1: entry n is complete iff
  its seq reads 2n + 2 (seq 0: a slot never written). Nobody waits on anybody.
- A reader copies entry n only once head > n, and keeps it only if seq read 2n + 2 before and
  after the copy and the check matches (the check guards against what x86's ordered stores
  give for free but weakly ordered CPUs do not: Python issues no barriers). Anything else means
  the writer lapped the reader: the entry is lost to it (``lost`` counts those).
- A ring holds its newest R entries; older ones are forgotten by writer and readers alike. R
  must exceed the entries one worker appends (all pools together) between two snapshots
  (1024 by default; a passed request appends its entry and a live total, its end another
  total: 3 per request), or the other workers under-count the excess (live totals recover
  with the next one).
- ``at_s`` never decreases along a ring (``publish`` raises an earlier time to its
  predecessor's, which only makes that entry count a little longer); readers rely on it to
  stop a scan at the first entry a snapshot already shows.
- A worker that died leaves its ring as it was: its entries age out, as they are older than
  the next snapshot; its restarted successor appends after them.

Live totals (``publish_live`` / ``others_live``): a worker also appends, whenever its total of
KV blocks held by requests still in flight changes for a key, that total under the key with
bit 63 set (``LIVE_BIT``). Readers keep each other worker's latest total per key (a total, not
a delta: a lost entry is corrected by the next one) and ``others()`` never counts them. A
restarted worker's handle publishes 0 for every live total its ring's last entries show: the
dead worker's streams died with it, and Envoy's fail-open passes them on unjudged.

Cost: a handle keeps a local copy of the other rings' current entries (it copies only those
appended since its last call) and the sums for the last 16 ``since_s`` it was asked about,
which it brings up to date with the new entries only. So ``others()`` reads one word per other
ring when nothing was appended, and sums the entries newer than ``since_s`` when it sees a
``since_s`` for the first time (a new snapshot): its cost grows with the entries newer than
it (a few µs for 64 per ring; see bench/ledger_shm.py). Opening a handle copies every entry.
Pure Python on purpose: numpy is not installed with ``ice serve`` (only with the extras).

Lifetime: as ``ext_proc.signals.shm``: the owner (the supervisor) creates the segment (mode
0600) with ``SharedMemory``, which registers it with the resource tracker (so it is unlinked if
the owner dies), and unlinks it on ``close``/``with`` exit. Handles map it read-write with
``shm_open`` + ``mmap`` and never register with the resource tracker (bpo-38119 / gh-82300,
see shm.py). An unlinked segment stays mapped: open handles keep working.
"""

from __future__ import annotations

import _posixshmem  # type: ignore[import-not-found]  # CPython's shm_open (what SharedMemory uses)
import functools
import hashlib
import logging
import math
import mmap
import os
import secrets
import struct
import threading
import time
import zlib
from collections import deque
from multiprocessing.shared_memory import SharedMemory
from types import TracebackType
from typing import Final, Self

__all__ = ["DEFAULT_RING_ENTRIES", "LIVE_BIT", "LedgerHandle", "LedgerSegment", "endpoint_key"]

log = logging.getLogger("ice.ledger_shm")

DEFAULT_RING_ENTRIES: Final = 1024
_MAGIC: Final = int.from_bytes(b"ICELEDG1", "little")
_VERSION: Final = 1
_HEADER_BYTES: Final = 64
_RING_HEADER_BYTES: Final = 64
_ENTRY_BYTES: Final = 40
_W_MAGIC, _W_VERSION, _W_WORKERS, _W_RING, _W_PID = range(5)
_FIELDS: Final = struct.Struct("@dqQ")  # at_s, blocks, key
_CHECK: Final = struct.Struct("@Q")
_LOW32: Final = 0xFFFFFFFF
_CACHED_SINCE: Final = 16
LIVE_BIT: Final = 1 << 63  # a key with this bit: a worker's live total (endpoint keys are 63-bit)


@functools.lru_cache(maxsize=4096)
def _key(pool: str, endpoint: str) -> int:
    raw = pool.encode()
    digest = hashlib.blake2b(
        len(raw).to_bytes(4, "little") + raw + endpoint.encode(),
        digest_size=8,
        person=b"ice-ledger",
    ).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def endpoint_key(pool: str, endpoint: str) -> int:
    """The 63-bit key of (pool, endpoint) in the ledger: blake2b, the same in every process."""
    return _key(pool, endpoint)


def default_segment_name() -> str:
    """``ice-<pid>-<random>-ledg``: unique per process, short enough for macOS (31 bytes)."""
    return f"ice-{os.getpid()}-{secrets.token_hex(3)}-ledg"


def _ring_offset(worker: int, ring_entries: int) -> int:
    return _HEADER_BYTES + worker * (_RING_HEADER_BYTES + ring_entries * _ENTRY_BYTES)


class LedgerSegment:
    """Creates the segment ``name`` for ``workers`` rings; the supervisor owns it, one per host."""

    def __init__(
        self, workers: int, ring_entries: int = DEFAULT_RING_ENTRIES, name: str | None = None
    ) -> None:
        if workers < 1 or ring_entries < 1:
            raise ValueError(
                f"need workers >= 1 and ring_entries >= 1, got {workers}, {ring_entries}"
            )
        self._closed = False
        try:
            self._shm = SharedMemory(
                name or default_segment_name(),
                create=True,
                size=_ring_offset(workers, ring_entries),
            )
        except FileExistsError as e:
            raise FileExistsError(f"shared memory segment {name!r} already exists") from e
        try:
            buf = self._shm.buf
            assert buf is not None
            with buf.cast("Q") as words:
                words[_W_VERSION] = _VERSION
                words[_W_WORKERS] = workers
                words[_W_RING] = ring_entries
                words[_W_PID] = os.getpid()
                words[_W_MAGIC] = _MAGIC  # last: a handle that sees it sees the rest
        except BaseException:
            self._shm.close()
            self._shm.unlink()
            raise
        self._shm.close()  # the owner never touches the rings; unlink() still works
        self.workers = workers
        self.ring_entries = ring_entries

    @property
    def name(self) -> str:
        """The name to pass to each worker's ``LedgerHandle`` (no leading slash)."""
        return self._shm.name

    def close(self) -> None:
        """Unlink the segment: no new handle can open it; open ones keep working. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self._shm.unlink()
        except FileNotFoundError:
            log.warning("shared memory segment %s was already removed", self.name)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class LedgerHandle:
    """Worker ``worker``'s access to the segment: appends to its ring, sums the others'.

    Thread-safe (one lock, uncontended in a worker). Pass the segment's *name* to processes."""

    def __init__(self, name: str, worker: int) -> None:
        self.name = name
        self.lost = 0  # other workers' entries overwritten before this handle copied them
        self._lock = threading.Lock()
        self._closed = False
        try:
            fd = _posixshmem.shm_open("/" + name, os.O_RDWR, mode=0o600)
        except FileNotFoundError as e:
            raise FileNotFoundError(f"no shared memory segment {name!r} (supervisor gone?)") from e
        try:
            size = os.fstat(fd).st_size
            if size < _HEADER_BYTES:
                raise ValueError(f"shared memory segment {name!r} is not an ICE ledger")
            self._mm = mmap.mmap(fd, size)  # MAP_SHARED, read-write
        finally:
            os.close(fd)
        self._buf = memoryview(self._mm)
        self._words = self._buf[: size - size % 8].cast("Q")
        words = self._words
        workers, ring = words[_W_WORKERS], words[_W_RING]
        if (
            words[_W_MAGIC] != _MAGIC
            or words[_W_VERSION] != _VERSION
            or min(workers, ring) < 1
            or size < _ring_offset(workers, ring)
        ):
            self.close()
            raise ValueError(f"shared memory segment {name!r} is not an ICE ledger (v1)")
        if not 0 <= worker < workers:
            self.close()
            raise ValueError(
                f"worker {worker} out of range: ledger segment {name!r} has {workers} "
                f"worker rings (0..{workers - 1})"
            )
        self._workers, self._ring, self._worker = workers, ring, worker
        self._heads = [_ring_offset(w, ring) // 8 for w in range(workers)]  # word index
        self._slots = [_ring_offset(w, ring) + _RING_HEADER_BYTES for w in range(workers)]
        self._others = tuple(w for w in range(workers) if w != worker)
        # writer: the next entry's index and the last at_s (continues a dead predecessor's ring)
        self._head = words[self._heads[worker]]
        self._last_at = float("-inf")
        words[self._heads[worker] + 1] = os.getpid()
        # reader: per ring, the next entry to copy, the copies (n, at_s, key, blocks) of its
        # current entries, the newest at_s dropped from them; since_s → (sums, cursors)
        self._cursor = [0] * workers
        self._local: list[deque[tuple[int, float, int, int]]] = [deque() for _ in range(workers)]
        self._dropped_at = [float("-inf")] * workers
        self._sums: dict[float, tuple[dict[int, int], list[int]]] = {}
        # per ring, key (LIVE_BIT cleared) → its latest live total
        self._live: list[dict[int, int]] = [{} for _ in range(workers)]
        self._sync()  # copy what the rings hold now, here rather than in a request's others()
        self._forget_predecessor()

    @property
    def workers(self) -> int:
        """How many worker rings the segment has."""
        return self._workers

    @property
    def worker(self) -> int:
        """This handle's ring (excluded from ``others()``)."""
        return self._worker

    def publish(self, key: int, at_s: float, blocks: int) -> None:
        """Append (key, at_s, blocks) to this worker's ring, overwriting its oldest entry."""
        if math.isnan(at_s):
            raise ValueError("at_s is NaN")
        try:
            with self._lock:
                at_s = max(at_s, self._last_at)
                n = self._head
                seq = 2 * n + 2
                fields = _FIELDS.pack(at_s, blocks, key)
                check = _CHECK.pack(zlib.crc32(fields, seq & _LOW32))
                off = self._slots[self._worker] + (n % self._ring) * _ENTRY_BYTES
                words = self._words
                words[off >> 3] = seq - 1
                self._buf[off + 8 : off + _ENTRY_BYTES] = fields + check
                words[off >> 3] = seq
                words[self._heads[self._worker]] = n + 1
                self._head, self._last_at = n + 1, at_s
        except struct.error as e:
            raise ValueError(f"key {key} or blocks {blocks} out of the ledger's range") from e

    def publish_live(self, key: int, total: int, at_s: float) -> None:
        """This worker's KV blocks held by requests in flight for ``key`` are now ``total``."""
        self.publish(key | LIVE_BIT, at_s, total)

    def others_live(self) -> dict[int, int]:
        """Key → the sum of the other workers' latest live totals (zeros left out)."""
        with self._lock:
            self._sync()
            out: dict[int, int] = {}
            for w in self._others:
                for key, total in self._live[w].items():
                    if total:
                        out[key] = out.get(key, 0) + total
            return out

    def _forget_predecessor(self) -> None:
        """Publish 0 for each live total a dead predecessor of this worker left non-zero."""
        latest: dict[int, int] = {}
        for _, _, key, blocks in self._entries(
            self._worker, max(0, self._head - self._ring), self._head
        ):
            if key & LIVE_BIT:
                latest[key] = blocks
        for key, total in latest.items():
            if total:
                self.publish(key, time.monotonic(), 0)

    def others(self, since_s: float) -> dict[int, int]:
        """Key → sum of blocks of the other workers' entries with at_s > ``since_s``."""
        with self._lock:
            self._sync()
            cached = self._sums.get(since_s)
            if cached is not None:
                sums, cursors = cached
                if all(self._dropped_at[w] <= since_s for w in self._others):
                    for w in self._others:
                        start = cursors[w]
                        if start == self._cursor[w]:
                            continue
                        for n, at, key, blocks in reversed(self._local[w]):
                            if n < start:
                                break
                            if at > since_s:
                                sums[key] = sums.get(key, 0) + blocks
                        cursors[w] = self._cursor[w]
                    return dict(sums)
            sums = {}
            for w in self._others:
                for _, at, key, blocks in reversed(self._local[w]):
                    if at <= since_s:
                        break
                    sums[key] = sums.get(key, 0) + blocks
            if cached is None and len(self._sums) >= _CACHED_SINCE:
                del self._sums[next(iter(self._sums))]  # the oldest asked
            self._sums[since_s] = (sums, list(self._cursor))
            return dict(sums)

    def _sync(self) -> None:
        """Copy the entries the other workers appended since the last call."""
        words, ring = self._words, self._ring
        for w in self._others:
            head, cursor = words[self._heads[w]], self._cursor[w]
            if head == cursor:
                continue
            local, low = self._local[w], head - ring  # entries before low are overwritten
            while local and local[0][0] < low:
                self._dropped_at[w] = local.popleft()[1]
            if cursor < low:
                self.lost += low - cursor
                cursor = low
            live = self._live[w]
            for entry in self._entries(w, cursor, head):
                key = entry[2]
                if key & LIVE_BIT:
                    live[key & ~LIVE_BIT] = entry[3]
                else:
                    local.append(entry)
            self._cursor[w] = head

    def _entries(self, w: int, start: int, head: int) -> list[tuple[int, float, int, int]]:
        """Ring ``w``'s complete entries ``start``..``head`` - 1 as (n, at_s, key, blocks);
        the others (being written, or lapped) count in ``lost``."""
        words, buf, ring, base = self._words, self._buf, self._ring, self._slots[w]
        out: list[tuple[int, float, int, int]] = []
        for n in range(start, head):
            off = base + (n % ring) * _ENTRY_BYTES
            seq = 2 * n + 2
            if words[off >> 3] != seq:
                self.lost += 1
                continue
            raw = buf[off + 8 : off + _ENTRY_BYTES].tobytes()
            if (
                words[off >> 3] != seq
                or zlib.crc32(raw[:24], seq & _LOW32) != (_CHECK.unpack_from(raw, 24)[0])
            ):
                self.lost += 1
                continue
            at, blocks, key = _FIELDS.unpack_from(raw)
            out.append((n, at, key, blocks))
        return out

    def close(self) -> None:
        """Unmap the segment (never unlinks it). Idempotent; the handle is unusable afterwards."""
        if self._closed:
            return
        self._closed = True
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
