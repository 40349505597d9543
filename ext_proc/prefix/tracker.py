"""``PrefixTracker``: per route, how much of each prompt a prefix cache could have reused.

Job: for every route, remember the block hashes (``blocks.block_hashes``) of recent prompts
in a bounded LRU table and, for each new prompt, count its leading blocks already there: the
blocks a prefix cache that had kept everything recent could have served. A sliding window of
the last ``window`` requests' ``(shared_blocks, total_blocks)`` gives the route's prefix
stability score. The server calls ``observe(route, tokens)`` per request and exports
``scores()`` (e.g. as ``ice_prefix_stability_score{route}``); no metric object lives here.

Formula::

    total_blocks(r)  = floor(P / B)                          full blocks of a P-token prompt
    shared_blocks(r) = leading blocks of r whose hashes are in the route's table,
                       at most floor((P − 1) / B)             (vLLM recomputes the last token)
    score(route)     = Σ shared_blocks / Σ total_blocks over the route's last ``window``
                       requests, in 0..1; None before any full block was seen

A repeated 33-token prompt (B = 16) scores 2/2; a repeated 32-token one 1/2 (block-aligned:
its last block is recomputed, as vLLM does). The first request of a route shares nothing.

What it is not: the backend's measured hit rate (``ice_cache_efficiency_ratio``). The table
is per route and per process (each ``--workers`` process has its own), never shared across
routes, and evicts only by its own capacity, not by the backend's memory pressure: the score
says how stable a route's prompts are, an upper bound on what its cache hits could be.

Defaults: ``capacity_blocks`` 65536 (1 Mi tokens at B = 16), ``window`` 1000 requests,
``block_size`` 16, ``max_routes`` 16 (the least recently observed route is forgotten when a
new one would exceed it).

Memory bound: a table entry is a 64-bit int key (the first 8 bytes of the block's sha256: a
false hit needs a 2^-64 collision) in an ``OrderedDict``, 124 bytes measured (CPython 3.11,
``tracemalloc``); a window entry is a tuple of two ints, at most 120 bytes. Per route:
``124 × capacity_blocks + 120 × window`` bytes (8.2 MB at the defaults); in all at most
``max_routes`` times that (131 MB at the defaults; size ``capacity_blocks`` down for many
routes).

Invariants: every method is thread-safe (one lock; ``observe`` holds it for about 1 µs a
block); ``len(table) <= capacity_blocks`` and ``len(window) <= window`` per route, and at most
``max_routes`` routes, after every call; ``0 <= shared <= total`` for every request.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from ext_proc.prefix.blocks import DEFAULT_BLOCK_SIZE, block_hashes, hit_blocks

__all__ = ["DEFAULT_CAPACITY_BLOCKS", "DEFAULT_WINDOW", "PrefixTracker", "RouteStats"]

DEFAULT_CAPACITY_BLOCKS = 65536
DEFAULT_WINDOW = 1000
DEFAULT_MAX_ROUTES = 16
ENTRY_BYTES = 124  # one table entry, measured (see the module docstring)
WINDOW_ENTRY_BYTES = 120


@dataclass(frozen=True, slots=True)
class RouteStats:
    """One route's window: requests, Σ shared and Σ total blocks, and the score."""

    requests: int
    shared_blocks: int
    total_blocks: int

    @property
    def score(self) -> float | None:
        """Σ shared / Σ total, or None when the window holds no full block."""
        return self.shared_blocks / self.total_blocks if self.total_blocks else None


@dataclass(slots=True)
class _Route:
    table: OrderedDict[int, None] = field(default_factory=OrderedDict)
    window: deque[tuple[int, int]] = field(default_factory=deque)
    shared: int = 0
    total: int = 0


class PrefixTracker:
    """Per-route LRU tables of block hashes and windows of reuse (see the module doc)."""

    def __init__(
        self,
        capacity_blocks: int = DEFAULT_CAPACITY_BLOCKS,
        window: int = DEFAULT_WINDOW,
        *,
        block_size: int = DEFAULT_BLOCK_SIZE,
        max_routes: int = DEFAULT_MAX_ROUTES,
    ) -> None:
        for name, value in (
            ("capacity_blocks", capacity_blocks),
            ("window", window),
            ("block_size", block_size),
            ("max_routes", max_routes),
        ):
            if value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")
        self.capacity_blocks = capacity_blocks
        self.window = window
        self.block_size = block_size
        self.max_routes = max_routes
        self._routes: OrderedDict[str, _Route] = OrderedDict()
        self._lock = threading.Lock()

    def memory_bound_bytes(self) -> int:
        """The most bytes the tables and windows may hold (see the module docstring)."""
        per_route = ENTRY_BYTES * self.capacity_blocks + WINDOW_ENTRY_BYTES * self.window
        return self.max_routes * per_route

    def observe(self, route: str, tokens: Sequence[int]) -> int:
        """Count the leading blocks of ``tokens`` already in ``route``'s table (capped as
        vLLM caps a hit), then insert all its full blocks (most recent last). Returns the
        shared count. Raises ``ValueError`` for token ids outside 0..2^32 − 1."""
        return self.observe_hashes(route, block_hashes(tokens, self.block_size), len(tokens))

    def observe_hashes(self, route: str, hashes: Sequence[bytes], n_tokens: int) -> int:
        """``observe`` with the prompt's block hashes already made (``n_tokens`` tokens)."""
        keys = [int.from_bytes(h[:8], "little") for h in hashes]
        cap = min(len(keys), hit_blocks(n_tokens, self.block_size))
        with self._lock:
            state = self._route(route)
            table = state.table
            shared = 0
            while shared < cap and keys[shared] in table:
                shared += 1
            for key in keys:
                table[key] = None
                table.move_to_end(key)
            while len(table) > self.capacity_blocks:
                table.popitem(last=False)
            if len(state.window) >= self.window:
                old_shared, old_total = state.window.popleft()
                state.shared -= old_shared
                state.total -= old_total
            state.window.append((shared, len(keys)))
            state.shared += shared
            state.total += len(keys)
        return shared

    def stats(self, route: str) -> RouteStats | None:
        """The route's window, or None for a route never observed (or forgotten)."""
        with self._lock:
            state = self._routes.get(route)
            if state is None:
                return None
            return RouteStats(len(state.window), state.shared, state.total)

    def score(self, route: str) -> float | None:
        """Σ shared leading blocks / Σ prompt blocks over the route's window (0..1), or
        None when the route has no full block in its window."""
        stats = self.stats(route)
        return None if stats is None else stats.score

    def scores(self) -> dict[str, float]:
        """Every route's score, for routes that have one (for a gauge per route)."""
        with self._lock:
            return {
                name: state.shared / state.total
                for name, state in self._routes.items()
                if state.total
            }

    def _route(self, route: str) -> _Route:
        state = self._routes.get(route)
        if state is None:
            state = self._routes[route] = _Route()
            while len(self._routes) > self.max_routes:
                self._routes.popitem(last=False)
        else:
            self._routes.move_to_end(route)
        return state
