"""The records of the in-flight ledger (``ext_proc.placement.poolview.PoolViews``): one
endpoint's entries, a passed request's hold, and an endpoint as a place to send requests.

Plain data and small arithmetic; ``PoolViews`` owns every instance and is the only writer.
Invariant: an ``Entries`` total is the sum of its entries' blocks (kept as entries are
added, removed and expired; at most ``MAX_INFLIGHT`` entries, the newest kept).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

from ext_proc.placement.forecast import Trajectory
from ext_proc.policy.evaluate import KvFit

__all__ = ["MAX_INFLIGHT", "Endpoint", "Entries", "Hold", "add_into", "scaled"]

# Ledger entries kept per pool when no newer view arrives for a long while (the newest stay).
MAX_INFLIGHT = 4096


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One backend of a pool as a place to send requests: its serving address, its own KV
    room (no ledger taken off), its queue, whether its view is stale and whether its engine
    sleeps (then its room has no free blocks: it must not be sent work)."""

    endpoint: str
    fit: KvFit
    waiting: float | None
    stale: bool
    asleep: bool = False


class Entries:
    """One endpoint's ledger: (time passed, KV blocks) of the requests sent there, oldest
    first, and their running total (read on every request: no sum over the entries)."""

    __slots__ = ("entries", "total")

    def __init__(self) -> None:
        self.entries: deque[tuple[float, int]] = deque()
        self.total = 0

    def add(self, at_s: float, blocks: int) -> None:
        self.entries.append((at_s, blocks))
        self.total += blocks
        if len(self.entries) > MAX_INFLIGHT:  # the newest stay
            self.total -= self.entries.popleft()[1]

    def remove(self, at_s: float, blocks: int) -> None:
        """Take back the entry (``at_s``, ``blocks``) if it is still here (newest first)."""
        for i in range(len(self.entries) - 1, -1, -1):
            if self.entries[i] == (at_s, blocks):
                del self.entries[i]
                self.total -= blocks
                return

    def resize(self, at_s: float, blocks: int, to: int) -> None:
        """The entry (``at_s``, ``blocks``), if it is still here, now holds ``to`` blocks."""
        for i in range(len(self.entries) - 1, -1, -1):
            if self.entries[i] == (at_s, blocks):
                self.entries[i] = (at_s, to)
                self.total += to - blocks
                return

    def expire(self, before_s: float) -> None:
        """Drop the entries a view taken at ``before_s`` already shows."""
        entries = self.entries
        while entries and entries[0][0] <= before_s:
            self.total -= entries.popleft()[1]


@dataclass(slots=True, eq=False)
class Hold:
    """A passed request's blocks: ``blocks`` at ``endpoint`` ("": anywhere) of ``pool``,
    its ledger entry passed at ``at_s``; ``live``: also reserved until ``PoolViews.release``
    (its stream ended; False under ``kv_hold: seen``)."""

    pool: str
    endpoint: str
    blocks: int
    at_s: float = 0.0
    live: bool = True
    released: bool = False
    trajectory: Trajectory | None = None  # its place in the forecast (ForecastBook)
    tenant: str | None = None  # its tenant, counted in the tenant ledger (None: not counted)


def add_into(out: dict[str, int], more: Mapping[str, int]) -> None:
    for endpoint, blocks in more.items():
        if blocks:
            out[endpoint] = out.get(endpoint, 0) + blocks


def scaled(out: dict[str, int], factor: int) -> dict[str, int]:
    return {endpoint: blocks * factor for endpoint, blocks in out.items()}
