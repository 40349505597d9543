"""Where the request path reads pool snapshots: in-process, or from shared memory.

``SnapshotStore`` holds the collector's newest ``{pool: PoolSnapshot}`` in the same process
(one worker); ``SharedSnapshotStore`` reads the supervisor's collector through
``ext_proc.signals.shm`` (several workers). Both answer ``get(pool)`` with a dict lookup and a
clock read, never waiting on the collector.

Invariant: a view older than the pool's ``max_age_s`` (the collector stopped publishing) is
None: pressure unknown. ``time.monotonic()`` is one clock for every process on the host.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from ext_proc.signals.shm import SnapshotReader
from ext_proc.signals.snapshot import PoolSnapshot

__all__ = ["SharedSnapshotStore", "SnapshotStore"]


class SnapshotStore:
    """The newest views of every pool, in this process."""

    def __init__(self, max_age_s: Mapping[str, float]) -> None:
        self._views: dict[str, PoolSnapshot] = {}
        self._max_age_s = dict(max_age_s)

    def set_max_ages(self, max_age_s: Mapping[str, float]) -> None:
        """A reloaded policy's ``max_age_s`` per pool."""
        self._max_age_s = dict(max_age_s)

    def put(self, snapshot: PoolSnapshot) -> None:
        self._views = {**self._views, snapshot.pool: snapshot}

    def put_all(self, views: dict[str, PoolSnapshot]) -> None:
        self._views = views  # swapped whole, by reference

    def get(self, pool: str, now_s: float | None = None) -> PoolSnapshot | None:
        """The pool's newest view, or None when there is none or it is too old."""
        snap = self._views.get(pool)
        if snap is None or not snap.backends:
            return None
        now = time.monotonic() if now_s is None else now_s
        if now - snap.taken_at_s > self._max_age_s.get(pool, 5.0):
            return None
        return snap


class SharedSnapshotStore:
    """The supervisor collector's views, read from shared memory (lock-free)."""

    def __init__(self, reader: SnapshotReader, max_age_s: Mapping[str, float]) -> None:
        self._reader = reader
        self._max_age_s = dict(max_age_s)

    def set_max_ages(self, max_age_s: Mapping[str, float]) -> None:
        self._max_age_s = dict(max_age_s)

    def get(self, pool: str, now_s: float | None = None) -> PoolSnapshot | None:
        views = self._reader.get()
        if not isinstance(views, dict):
            return None
        snap = views.get(pool)
        if not isinstance(snap, PoolSnapshot) or not snap.backends:
            return None
        now = time.monotonic() if now_s is None else now_s
        if now - snap.taken_at_s > self._max_age_s.get(pool, 5.0):
            return None
        return snap
