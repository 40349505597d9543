"""What a pool's snapshot says for a profile, each figure computed once per snapshot, and the
worker's ledger of requests in flight.

- ``pressure``: ``mem_pressure_score`` and level under the profile's model;
- ``efficiency``: ``cache_efficiency_ratio`` (the prefix-cache hit ratio over the window);
- ``drain``: the inputs of the drain-rate Retry-After;
- ``room``: the KV room (``KvFit``: free and usable blocks, blocks a request needs) less the
  blocks of the requests this worker passed since the snapshot was taken (``hold``). The
  view cannot show those yet, and a burst that arrives between two scrapes would otherwise
  be judged against the same free blocks request after request. A request counts until a
  view taken after it arrives (then the backend's own gauges hold it, or its queue does),
  so never twice; per worker (a heavy body judged in the offload helper is judged with its
  worker's ledger); what the backend's gauges lag behind a scrape is not covered.

KV blocks of a sequence: ceil((input + output) / block_size) on a full-attention model, or
the ``ext_proc.kv`` geometry's ``request_blocks`` (sliding-window and hybrid layer groups)
when the profile names the model's config; less the whole blocks of its expected prefix-cache
hit: cached = floor(input × reuse), reuse = the pool's recent hit ratio, at most input − 1
tokens (vLLM always recomputes the last prompt token). Further samples of one prompt (``n``)
hit its whole prompt (at most input − 1 tokens) when every backend caches prefixes; a
request's blocks are summed over its sequences (``KvFit.need``).

Invariant: caches are keyed by snapshot identity, so a new snapshot recomputes everything;
nothing here does I/O.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace

from ext_proc.kv.geometry import KVGeometry, build_geometry
from ext_proc.policy.evaluate import KvFit, Shape
from ext_proc.policy.model import PressureModel, Profile
from ext_proc.policy.pressure import Pressure, pressure_of
from ext_proc.policy.scores import DrainInputs, drain_inputs, pool_cache_efficiency
from ext_proc.signals.snapshot import PoolSnapshot

__all__ = ["PoolViews"]

# Ledger entries kept per pool when no newer view arrives for a long while (the newest stay).
MAX_INFLIGHT = 4096


class PoolViews:
    """Per-snapshot figures of every pool a worker judges against, and its in-flight ledger."""

    def __init__(self) -> None:
        self._pressure: dict[tuple[str, PressureModel], tuple[PoolSnapshot, Pressure | None]] = {}
        self._drain: dict[str, tuple[PoolSnapshot, DrainInputs | None]] = {}
        self._efficiency: dict[str, tuple[PoolSnapshot, float | None]] = {}
        self._kv: dict[tuple[str, str], tuple[PoolSnapshot, KvFit | None]] = {}
        self._geometries: dict[tuple[str, int], KVGeometry] = {}
        # pool → (time.monotonic() it was passed, KV blocks) of requests sent upstream
        self._inflight: dict[str, deque[tuple[float, int]]] = {}

    def pressure(self, profile: Profile, snapshot: PoolSnapshot | None) -> Pressure | None:
        """The pool's pressure under the profile's model."""
        if snapshot is None:
            return None
        key = (snapshot.pool, profile.pressure)
        cached = self._pressure.get(key)
        if cached is not None and cached[0] is snapshot:
            return cached[1]
        pressure = pressure_of(snapshot, profile.pressure)
        self._pressure[key] = (snapshot, pressure)
        return pressure

    def drain(self, snapshot: PoolSnapshot | None) -> DrainInputs | None:
        """The pool's drain-rate inputs (None without rates)."""
        if snapshot is None:
            return None
        cached = self._drain.get(snapshot.pool)
        if cached is not None and cached[0] is snapshot:
            return cached[1]
        drain = drain_inputs(snapshot)
        self._drain[snapshot.pool] = (snapshot, drain)
        return drain

    def efficiency(self, snapshot: PoolSnapshot | None) -> float | None:
        """The pool's cache_efficiency_ratio (None: no backend says)."""
        if snapshot is None:
            return None
        cached = self._efficiency.get(snapshot.pool)
        if cached is not None and cached[0] is snapshot:
            return cached[1]
        ratio = pool_cache_efficiency(snapshot)
        self._efficiency[snapshot.pool] = (snapshot, ratio)
        return ratio

    def room(self, profile: Profile, snapshot: PoolSnapshot | None) -> KvFit | None:
        """The KV room less the blocks held by requests passed since ``snapshot``."""
        fit = self._fit(profile, snapshot)
        if fit is None or snapshot is None:
            return fit
        held = self.held(snapshot)
        return replace(fit, free_blocks=max(0, fit.free_blocks - held)) if held else fit

    def held(self, snapshot: PoolSnapshot) -> int:
        """KV blocks of the requests passed to ``snapshot``'s pool since it was taken."""
        entries = self._inflight.get(snapshot.pool)
        if not entries:
            return 0
        while entries and entries[0][0] <= snapshot.taken_at_s:  # the view now shows these
            entries.popleft()
        return sum(blocks for _, blocks in entries)

    def assume_held(self, snapshot: PoolSnapshot, blocks: int) -> None:
        """Make ``blocks`` the ledger of ``snapshot``'s pool: the offload helper judges a heavy
        body with the blocks its ICE worker holds (``held``), as the worker itself would."""
        self._inflight[snapshot.pool] = deque([(float("inf"), blocks)] if blocks else [])

    def hold(
        self, profile: Profile, snapshot: PoolSnapshot | None, shape: Shape, output: int
    ) -> None:
        """Remember the blocks of a request (all its sequences) sent upstream to
        ``snapshot``'s pool."""
        fit = self._fit(profile, snapshot)
        if fit is None or snapshot is None:
            return
        entries = self._inflight.setdefault(snapshot.pool, deque())
        entries.append((time.monotonic(), fit.need(shape, output)))
        if len(entries) > MAX_INFLIGHT:
            entries.popleft()

    def _fit(self, profile: Profile, snapshot: PoolSnapshot | None) -> KvFit | None:
        """The pool's KV room for the profile's model, built once per snapshot."""
        if snapshot is None:
            return None
        key = (snapshot.pool, profile.name)
        cached = self._kv.get(key)
        if cached is not None and cached[0] is snapshot:
            return cached[1]
        fit: KvFit | None = None
        free, usable, bs = (
            snapshot.max_free_blocks,
            snapshot.max_usable_blocks,
            snapshot.block_size,
        )
        if free is not None and usable is not None and bs is not None:
            reuse = self.efficiency(snapshot) or 0.0
            blocks = self._blocks_fn(profile, bs)

            def first(i: int, o: int) -> int:
                return blocks(i, o, int(i * reuse))

            def sibling(i: int, o: int) -> int:  # its prompt's full blocks are cached
                return blocks(i, o, i)

            shared = sibling if snapshot.prefix_caching else None
            fit = KvFit(free, usable, bs, first, shared)
        self._kv[key] = (snapshot, fit)
        return fit

    def _blocks_fn(self, profile: Profile, block_size: int) -> Callable[[int, int, int], int]:
        """Blocks a request of (input, output) tokens needs with ``cached`` prompt tokens
        already in the prefix cache (see the module docstring)."""
        spec = profile.kv_model
        if spec is None:

            def full_attention(i: int, o: int, cached: int) -> int:
                hit = min(cached, i - 1) if i > 1 else 0
                return -(-(i + o) // block_size) - hit // block_size

            return full_attention
        key = (profile.name, block_size)
        geometry = self._geometries.get(key)
        if geometry is None:
            geometry = self._geometries[key] = build_geometry(
                spec.shape,
                tp=spec.tp,
                kv_dtype=spec.kv_dtype,
                block_size=block_size,
                max_num_batched_tokens=spec.max_num_batched_tokens,
            )
        return geometry.request_blocks
