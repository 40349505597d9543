"""A passed request's hold in the worker's in-flight ledger: taken when it goes upstream,
shrunk once it is counted exactly, released when its stream ends (``PoolViews``' holding
half; the ledger's arithmetic is in ``ext_proc.placement.poolview``).

- **hold**: the request's blocks (all its sequences, ``KvFit.need``) as a ledger entry (A,
  until a newer view shows it) and, under ``kv_hold: done``, a live reservation (L, until
  its stream ends), published to the host's shared memory (``--workers N``) and the
  replicas' Redis ledger (``--ledger``); under ``admission: forecast`` also a trajectory in
  the ``ForecastBook``, and the blocks held are the prompt plus its *predicted* output.
- **shrink**: under ``exact_count: needed`` a request the estimate decided is held at the
  estimate's upper bound (``ext_proc.admit.counting``: up to 7.5× its real prompt for a
  short one, 33× with an NFKC normaliser; ``ext_proc.tokencount.derived``). Once the request
  has its answer, ICE counts it exactly off the request path (``ext_proc.serve.recount``)
  and calls ``shrink`` with the exact shape: when that needs fewer blocks, its ledger entry,
  its live total (local, shared memory, Redis) and its trajectory's prompt blocks take the
  exact figure.
  A hold never grows here (the upper bound is never below the exact count). The entry the
  other workers and replicas read (A, seen since their view) keeps its first size: it
  counts only until their next view (scraped every second or faster), which shows the
  request's real blocks; their live totals (L, the request's whole life) are rewritten.
- **release** (idempotent) and **unhold** (a reservation the shared ledger refused).
- **tenant**: a hold that names its tenant (a pool with ``tenant_shares``) also counts its
  blocks in the tenant ledger (``ext_proc.placement.tenant_ledger``) from ``hold`` to
  ``release``, shrunk with it, under either ``kv_hold``.

Invariant: ``live[pool][endpoint]`` is the sum of the blocks of this worker's unreleased
live holds there; a hold's trajectory is in the book exactly while the hold is unreleased.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ext_proc import telemetry
from ext_proc.placement.forecast import Trajectory, slot_tokens
from ext_proc.placement.forecast_book import ForecastBook
from ext_proc.placement.inflight import Endpoint, Entries, Hold
from ext_proc.placement.ledger_shm import LedgerHandle, endpoint_key
from ext_proc.placement.slo_book import SloBook
from ext_proc.placement.tenant_ledger import TenantLedger
from ext_proc.policy.evaluate import KvFit, Shape
from ext_proc.policy.settings import Profile
from ext_proc.signals.snapshot import PoolSnapshot

if TYPE_CHECKING:
    from ext_proc.placement.ledger_redis import RedisLedger

__all__ = ["Holding"]


class Holding:
    """The hold half of ``PoolViews`` (a mixin: ``PoolViews`` sets these attributes)."""

    shared: LedgerHandle | None
    remote: RedisLedger | None
    until_seen: frozenset[str]
    live: dict[str, dict[str, int]]
    book: ForecastBook
    tenants: TenantLedger
    slo: SloBook
    _inflight: dict[str, dict[str, Entries]]

    def endpoints(self, profile: Profile, snapshot: PoolSnapshot | None) -> tuple[Endpoint, ...]:
        raise NotImplementedError  # PoolViews'

    def held_blocks(
        self, profile: Profile, pool: PoolSnapshot, fit: KvFit, shape: Shape, output: int
    ) -> int:
        """The blocks a request of ``shape`` with ``output`` tokens per sequence is held at:
        its whole need under ``reserve``, its predicted total under ``forecast``."""
        if profile.forecasts:  # held at its predicted total (ForecastBook; slo too)
            floor = min(shape.floor, output) if profile.forecast.read_floors else 0
            look = self.book.outlook(profile, pool.pool, pool.backends[0], fit.block_size)
            return fit.need(shape, look.total(0, output, floor))
        return fit.need(shape, output)

    def _sized(
        self, profile: Profile, pool: PoolSnapshot, fit: KvFit, shape: Shape, output: int, at: float
    ) -> tuple[int, Trajectory]:
        """``held_blocks`` and the request's trajectory."""
        floor = min(shape.floor, output) if profile.forecast.read_floors else 0
        tokens = slot_tokens(shape, profile)
        trajectory = Trajectory(
            at, fit.need(shape, 0), shape.sequences, output, floor, None, tokens, kind=profile.name
        )
        if profile.forecasts:  # held at its predicted total (ForecastBook)
            trajectory.runs_s = self.book.planned_start(pool.pool, shape, output, at)
            if trajectory.runs_s is not None:
                telemetry.FORECAST_WAITS.labels(pool=pool.pool).inc()
            return self.held_blocks(profile, pool, fit, shape, output), trajectory
        trajectory.whole = fit.need(shape, output)
        return trajectory.whole, trajectory

    def hold(
        self,
        profile: Profile,
        snapshot: PoolSnapshot | None,
        shape: Shape,
        output: int,
        endpoint: str = "",
        tenant: str | None = None,
    ) -> Hold | None:
        """Remember the blocks of a request (all its sequences) sent upstream to
        ``snapshot``'s pool: to ``endpoint``, or "" when Envoy's load balancer placed it.
        Its reservation (None: no blocks; not ``live`` under ``kv_hold: seen``) lasts until
        ``release``; ``tenant``: also counted as that tenant's (the module docstring)."""
        views = self.endpoints(profile, snapshot)
        if not views or snapshot is None:
            return None
        name = snapshot.pool
        pool = self._inflight.setdefault(name, {})
        entries = pool.get(endpoint)
        if entries is None:
            entries = pool[endpoint] = Entries()
        at = time.monotonic()
        blocks, trajectory = self._sized(profile, snapshot, views[0].fit, shape, output, at)
        self.book.add(name, endpoint, trajectory)
        entries.add(at, blocks)
        key = endpoint_key(name, endpoint) if self.shared is not None else 0
        if self.shared is not None:
            self.shared.publish(key, at, blocks)
        if blocks <= 0:
            self.book.remove(name, endpoint, trajectory)
            return None
        if tenant is not None:
            self.tenants.change(name, tenant, blocks)
        if name in self.until_seen:
            return Hold(name, endpoint, blocks, at, False, trajectory=trajectory, tenant=tenant)
        live = self.live.setdefault(name, {})
        total = live[endpoint] = live.get(endpoint, 0) + blocks
        if self.shared is not None:
            self.shared.publish_live(key, total, at)
        return Hold(name, endpoint, blocks, at, trajectory=trajectory, tenant=tenant)

    def shrink(
        self,
        hold: Hold,
        profile: Profile,
        snapshot: PoolSnapshot | None,
        shape: Shape,
        output: int,
    ) -> int:
        """``hold``'s request counted exactly (``shape``; ``output`` as when it was held): its
        hold takes the exact figure when that is smaller (the module docstring). Returns the
        blocks given back (0: released already, no view, or not smaller)."""
        views = self.endpoints(profile, snapshot)
        if hold.released or not views or snapshot is None:
            return 0
        fit = views[0].fit
        blocks, exact = self._sized(profile, snapshot, fit, shape, output, hold.at_s)
        t = hold.trajectory
        if t is not None and exact.prompt_blocks < t.prompt_blocks:
            t.prompt_blocks, t.tokens = exact.prompt_blocks, exact.tokens
            if t.whole is not None and exact.whole is not None:
                t.whole = min(t.whole, exact.whole)
            self.book.changed()
        freed = hold.blocks - blocks
        if freed <= 0:
            return 0
        entries = self._inflight.get(hold.pool, {}).get(hold.endpoint)
        if entries is not None:
            entries.resize(hold.at_s, hold.blocks, blocks)
        hold.blocks = blocks
        if hold.tenant is not None:
            self.tenants.change(hold.pool, hold.tenant, -freed)
        if hold.live:
            pool = self.live.setdefault(hold.pool, {})
            total = pool[hold.endpoint] = max(0, pool.get(hold.endpoint, 0) - freed)
            self._published_live(hold, total)
        return freed

    def _published_live(self, hold: Hold, total: int) -> None:
        """``hold``'s endpoint's live total is now ``total``: tell the host and the replicas."""
        if self.shared is not None:
            key = endpoint_key(hold.pool, hold.endpoint)
            self.shared.publish_live(key, total, time.monotonic())
        if self.remote is not None:
            self.remote.released(hold.pool, hold.endpoint, total)

    def release(self, hold: Hold, finished: bool = True) -> None:
        """``hold``'s request is over (its stream ended): its blocks are no longer reserved,
        and its length (``finished``) is one observation of its kind. Idempotent."""
        if hold.released:
            return
        hold.released = True
        self.slo.released(hold)
        t = hold.trajectory
        if t is not None:
            self.book.remove(hold.pool, hold.endpoint, t)
            if finished:
                self.book.finished(hold.pool, hold.endpoint, t)
        if hold.tenant is not None:
            self.tenants.change(hold.pool, hold.tenant, -hold.blocks)
        if not hold.live:
            return
        pool = self.live.setdefault(hold.pool, {})
        total = pool[hold.endpoint] = max(0, pool.get(hold.endpoint, 0) - hold.blocks)
        self._published_live(hold, total)

    def unhold(self, hold: Hold) -> None:
        """Take back a request that did not go on after all (the shared ledger refused its
        reservation): its ledger entry and its live reservation. The host's shared memory
        gets the entry's negative (its rings only append)."""
        entries = self._inflight.get(hold.pool, {}).get(hold.endpoint)
        if entries is not None:
            entries.remove(hold.at_s, hold.blocks)
        if self.shared is not None:
            key = endpoint_key(hold.pool, hold.endpoint)
            self.shared.publish(key, time.monotonic(), -hold.blocks)
        remote, self.remote = self.remote, None  # the caller's next reservation says it
        try:
            self.release(hold, finished=False)  # it never ran
        finally:
            self.remote = remote

    def live_total(self, pool: str, endpoint: str) -> int:
        """This worker's live reserved blocks at ``endpoint`` ("" anywhere) of ``pool``."""
        return self.live.get(pool, {}).get(endpoint, 0)
