"""What a pool's snapshot says for a profile, each figure computed once per snapshot, and the
worker's ledger of requests in flight.

- ``pressure``: ``mem_pressure_score`` and level under the profile's model (under
  ``admission: forecast`` with a wait, the queue term leaves out the requests ICE admitted
  to wait: ``unplanned``);
- ``efficiency``: ``cache_efficiency_ratio`` (the prefix-cache hit ratio over the window);
- ``drain``: the inputs of the drain-rate Retry-After;
- ``room``: the KV room (``KvFit``: free and usable blocks, blocks a request needs; a
  backend whose engine sleeps has no free blocks, whatever its gauge says) less the
  blocks of the requests this worker passed since the snapshot was taken (``hold``). The
  view cannot show those yet, and a burst that arrives between two scrapes would otherwise
  be judged against the same free blocks request after request. A request counts until a
  view taken after it arrives (then the backend's own gauges hold it, or its queue does),
  so never twice. With ``--workers N`` each worker also publishes its entries to the host's
  shared ledger (``ext_proc.placement.ledger_shm``) and counts the other workers' entries
  newer than the view too, so N workers admit no more than one would; a heavy body judged
  in the offload helper is judged with its worker's figures. What the backend's gauges lag
  behind a scrape is not covered by this part.
- ``kv_hold: done`` (the pool's default) also reserves each passed request's *whole* need
  (prompt and output limit, all sequences) until its ext_proc stream ends (Envoy keeps it
  open until the HTTP response is over, or the client left; ``release``): a backend's gauge
  shows only the blocks a decoding request holds *now*, and vLLM admits a request once its
  prompt fits, so the view alone lets the output of the running requests outgrow the cache
  (preemption). Per endpoint e, with U = usable, F = free (the view), A = unseen ledger
  blocks (above) and L = live reserved blocks (this worker's and, with ``--workers N``, the
  others' published totals):

      room(e) = min(F − A, U − L)    ⇔  held(e) = max(A, L − (U − F))

  exact when every request reaches the backend through ICE (then U − F ≤ L); traffic around
  ICE still counts through F − A. Entries placed by Envoy's balancer (endpoint "") count
  against every endpoint in A, and spread evenly, ceil(L_"" / endpoints), in L (a request
  stays on one endpoint for its whole life; ``endpoint_pick: ice`` makes it exact).
  ``kv_hold: seen`` keeps only the first part (the ledger until a newer view).
- Several replicas (``--ledger redis://``, ``ext_proc.placement.ledger_redis``): while the
  shared ledger answers, the other replicas' A and L come from its mirror instead of the
  host's shared memory (which still gets every entry, for when Redis stops answering), and
  ``unhold`` takes back a request whose reservation the shared ledger refused. While it does
  not answer, this worker's own A and L count ``1 + P`` times, P the other replicas alive
  when it last answered (``RedisLedger.fallback_factor``; the host's shared memory is then
  not added: its workers are among the P).

KV blocks of a sequence: ceil((input + output) / block_size) on a full-attention model, or
the ``ext_proc.kv`` geometry's ``request_blocks`` (sliding-window and hybrid layer groups)
when the profile names the model's config; less the whole blocks of its expected prefix-cache
hit: cached = floor(input × reuse), reuse = the pool's recent hit ratio, at most input − 1
tokens (vLLM always recomputes the last prompt token). Further samples of one prompt (``n``)
hit its whole prompt (at most input − 1 tokens) when every backend caches prefixes; a
request that asks for prompt logprobs (``prompt_logprobs``, ``echo`` with logprobs) reads no
cached block on vLLM (``skip_reading_prefix_cache``, ``ext_proc.policy.kvfit``): every sample
of it counts whole, with no expected hit. A request's blocks are summed over its sequences
(``KvFit.need``).

Invariant: caches are keyed by snapshot identity, so a new snapshot recomputes everything;
nothing here does I/O.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from ext_proc.kv.geometry import KVGeometry
from ext_proc.placement.endpoints import endpoint_of
from ext_proc.placement.forecast_book import ForecastBook
from ext_proc.placement.holding import Holding
from ext_proc.placement.inflight import Endpoint, Entries, add_into, scaled
from ext_proc.placement.ledger_shm import LedgerHandle, endpoint_key
from ext_proc.placement.slo_book import SloBook
from ext_proc.placement.tenant_ledger import TenantLedger
from ext_proc.policy.evaluate import KvFit
from ext_proc.policy.kvfit import blocks_fn
from ext_proc.policy.pressure import Pressure, pressure_of
from ext_proc.policy.scores import DrainInputs, drain_inputs, pool_cache_efficiency
from ext_proc.policy.settings import PressureModel, Profile
from ext_proc.signals.snapshot import PoolSnapshot

if TYPE_CHECKING:
    from ext_proc.placement.ledger_redis import RedisLedger

__all__ = ["PoolViews"]


def _free(fit: KvFit) -> int:
    return fit.free_blocks


def _less(fit: KvFit, held: int) -> KvFit:
    return fit.less(held)


class PoolViews(Holding):
    """Per-snapshot figures of every pool a worker judges against, and its in-flight ledger.

    ``endpoint_overrides``: pool → (metrics URL → serving address), the pools'
    ``backend_endpoints``."""

    def __init__(
        self,
        endpoint_overrides: Mapping[str, Mapping[str, str]] | None = None,
        shared: LedgerHandle | None = None,
        until_seen: frozenset[str] = frozenset(),
        live: dict[str, dict[str, int]] | None = None,
    ) -> None:
        self._overrides = dict(endpoint_overrides or {})
        self.shared = shared  # the host's ledger: the other workers' entries
        self.remote: RedisLedger | None = None  # the replicas' ledger (--ledger), when set
        self.until_seen = until_seen  # pools with kv_hold: seen (no live reservations)
        # pool → endpoint ("" anywhere) → KV blocks reserved by this worker's live requests
        # (shared with the views of a reloaded policy, whose holds release into it)
        self.live: dict[str, dict[str, int]] = {} if live is None else live
        self._pressure: dict[
            tuple[str, PressureModel, bool], tuple[PoolSnapshot, Pressure | None]
        ] = {}
        self._drain: dict[str, tuple[PoolSnapshot, DrainInputs | None]] = {}
        self._efficiency: dict[str, tuple[PoolSnapshot, float | None]] = {}
        self._kv: dict[tuple[str, str], tuple[PoolSnapshot, tuple[Endpoint, ...]]] = {}
        self._geometries: dict[tuple[str, int], KVGeometry] = {}
        # pool → endpoint ("" anywhere) → (time.monotonic() it was passed, KV blocks) of the
        # requests sent upstream
        self._inflight: dict[str, dict[str, Entries]] = {}
        self.book = ForecastBook()  # admission: forecast (ext_proc.placement.forecast_book)
        self.tenants = TenantLedger()  # blocks held per tenant (ext_proc.placement.tenant_ledger)
        self.tenants.shared = shared
        self.slo = SloBook()  # admission: slo (ext_proc.placement.slo_book)
        self._last_fresh: dict[str, PoolSnapshot] = {}  # pool → the last view judged with
        self._made: dict[str, PoolSnapshot] = {}  # pool → ledger_view's last

    def pressure(self, profile: Profile, snapshot: PoolSnapshot | None) -> Pressure | None:
        """The pool's pressure under the profile's model."""
        if snapshot is None:
            return None
        planned = profile.forecasts and profile.forecast.start_within_s > 0
        key = (snapshot.pool, profile.pressure, planned)
        cached = self._pressure.get(key)
        if cached is not None and cached[0] is snapshot:
            return cached[1]
        pressure = pressure_of(self.unplanned(snapshot) if planned else snapshot, profile.pressure)
        self._pressure[key] = (snapshot, pressure)
        return pressure

    def unplanned(self, snapshot: PoolSnapshot) -> PoolSnapshot:
        """``snapshot`` with each backend's waiting count less the requests this worker
        admitted to start within the wait and planned to be waiting there when it was taken
        (``ForecastBook.waiting``): q_e = max(0, waiting_e − W_e). Those wait by the
        forecast's plan, within the wait the policy allows; a queue beyond them is what the
        pressure score's queue term measures (``ext_proc.policy.pressure``)."""
        n = len(snapshot.backends)
        at = snapshot.taken_at_s
        backends = []
        for address, b in zip(self.addresses(snapshot), snapshot.backends, strict=True):
            waiting = b.num_requests_waiting
            planned = self.book.waiting(snapshot.pool, address, n, at) if waiting else 0.0
            less = max(0.0, (waiting or 0.0) - planned)
            backends.append(replace(b, num_requests_waiting=less) if waiting and planned else b)
        return replace(snapshot, backends=tuple(backends))

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

    def endpoints(self, profile: Profile, snapshot: PoolSnapshot | None) -> tuple[Endpoint, ...]:
        """Each backend of the pool that reports its KV blocks, as an endpoint (its own free
        and usable blocks; the ledger not yet taken off), built once per snapshot."""
        if snapshot is None:
            return ()
        key = (snapshot.pool, profile.name)
        cached = self._kv.get(key)
        if cached is not None and cached[0] is snapshot:
            return cached[1]
        views: list[Endpoint] = []
        bs = snapshot.block_size
        if bs is not None:
            reuse = self.efficiency(snapshot) or 0.0
            blocks = blocks_fn(profile, bs, self._geometries)

            def first(i: int, o: int) -> int:
                return blocks(i, o, int(i * reuse))

            def sibling(i: int, o: int) -> int:  # its prompt's full blocks are cached
                return blocks(i, o, i)

            def cold(i: int, o: int) -> int:  # a request vLLM reads no cached block for
                return blocks(i, o, 0)

            shared = sibling if snapshot.prefix_caching else None
            overrides = self._overrides.get(snapshot.pool)
            for b in snapshot.backends:
                free, usable = b.free_blocks, b.usable_blocks
                if free is None or usable is None:
                    continue
                if b.asleep:  # a sleeping engine serves nothing: no room
                    free = 0
                fit = KvFit(free, usable, bs, first, shared, cold)
                address = endpoint_of(b.url, overrides)
                views.append(Endpoint(address, fit, b.num_requests_waiting, b.stale, b.asleep))
        result = tuple(views)
        self._kv[key] = (snapshot, result)
        if result and snapshot is not self._made.get(snapshot.pool):  # not ledger_view's
            self._last_fresh[snapshot.pool] = snapshot
        return result

    def judged_view(
        self, profile: Profile, pool: str, snapshot: PoolSnapshot | None
    ) -> PoolSnapshot | None:
        """The view a request is judged against: ``snapshot`` when it shows KV blocks, else
        (expired, or its pages say nothing) ``ledger_view`` when there is one."""
        if snapshot is not None and self.endpoints(profile, snapshot):
            return snapshot
        return self.ledger_view(pool) or snapshot

    def ledger_view(self, pool: str) -> PoolSnapshot | None:
        """With no live view of ``pool`` (it expired): the last view judged with, every
        backend's blocks free and taken now, so that what bounds admission is ICE's own
        ledger: reserve's room U − L, the forecast's peak of its own trajectories (the
        work around ICE the last view showed is not assumed); None before any view."""
        last = self._last_fresh.get(pool)
        if last is None:
            return None
        backends = tuple(
            replace(b, kv_cache_usage=0.0, num_requests_waiting=None, stale=True)
            for b in last.backends
        )
        made = replace(last, backends=backends, taken_at_s=time.monotonic(), stale=True)
        self._made[pool] = made
        return made

    def addresses(self, snapshot: PoolSnapshot) -> list[str]:
        """The serving address of every backend in ``snapshot``."""
        overrides = self._overrides.get(snapshot.pool)
        return [endpoint_of(b.url, overrides) for b in snapshot.backends]

    def room(
        self, profile: Profile, snapshot: PoolSnapshot | None, endpoint: str | None = None
    ) -> KvFit | None:
        """The KV room a request is judged against, less the blocks of the requests passed
        since ``snapshot``: ``endpoint``'s when it is one of the pool's; else (anywhere, or
        an endpoint the view does not know) the endpoint with the least room, since Envoy's
        load balancer may send the request to any."""
        views = self.endpoints(profile, snapshot)
        if not views or snapshot is None:
            return None
        if profile.forecasts:
            fits = self._forecasts(profile, snapshot, views)
            named = [fit for v, fit in fits if v.endpoint == endpoint]
            return named[0] if named else min((fit for _, fit in fits), key=_free)
        ledger = self.ledger(snapshot)
        if endpoint is not None:
            for v in views:
                if v.endpoint == endpoint:
                    return _less(v.fit, ledger.get("", 0) + ledger.get(v.endpoint, 0))
        return self.worst(views, ledger)

    def worst(self, views: tuple[Endpoint, ...], ledger: Mapping[str, int]) -> KvFit:
        """The least free and the least usable blocks over ``views`` (each less its ledger):
        what a request placed anywhere can count on."""
        anywhere = ledger.get("", 0)
        if len(views) == 1:  # the common case: one endpoint, its fit as it is when nothing is held
            return views[0].fit.less(anywhere + ledger.get(views[0].endpoint, 0))
        free = min(max(0, v.fit.free_blocks - anywhere - ledger.get(v.endpoint, 0)) for v in views)
        usable = min(v.fit.usable_blocks for v in views)
        return replace(views[0].fit, free_blocks=free, usable_blocks=usable)

    def candidates(
        self, profile: Profile, snapshot: PoolSnapshot | None
    ) -> list[tuple[Endpoint, KvFit]]:
        """Every awake endpoint with its room less the ledger (for picking: a sleeping one is
        never a candidate); stale ones only when no fresh awake one is left."""
        views = self.endpoints(profile, snapshot)
        if not views or snapshot is None:
            return []
        awake = [v for v in views if not v.asleep]
        fresh = [v for v in awake if not v.stale] or awake
        if profile.forecasts:
            return self._forecasts(profile, snapshot, tuple(fresh))
        ledger = self.ledger(snapshot)
        anywhere = ledger.get("", 0)
        return [(v, _less(v.fit, anywhere + ledger.get(v.endpoint, 0))) for v in fresh]

    def _forecasts(
        self, profile: Profile, snapshot: PoolSnapshot, views: tuple[Endpoint, ...]
    ) -> list[tuple[Endpoint, KvFit]]:
        """Each of ``views`` with the fit its forecast gives (``ForecastBook.fits``)."""
        own = self.live.get(snapshot.pool, {})
        backends = dict(zip(self.addresses(snapshot), snapshot.backends, strict=True))
        unseen, everyone = self._unseen(snapshot), self._live_of(snapshot)
        return self.book.fits(profile, snapshot.pool, views, backends, unseen, everyone, own)

    def ledger(self, snapshot: PoolSnapshot) -> dict[str, int]:
        """KV blocks to take off the free blocks of ``snapshot``'s endpoints: those of the
        requests passed to its pool since it was taken, by the endpoint they were sent to ("":
        anywhere, Envoy's load balancer placed them); with live reservations, per endpoint
        max(A, L − used) (the module docstring) and no "" entry."""
        unseen = self._unseen(snapshot)
        live = self._live_of(snapshot)
        if not live:
            return unseen
        overrides = self._overrides.get(snapshot.pool)
        known = [
            (endpoint_of(b.url, overrides), b.usable_blocks - b.free_blocks)
            for b in snapshot.backends
            if b.free_blocks is not None and b.usable_blocks is not None
        ]
        if not known:
            return unseen
        spread = -(-live.get("", 0) // len(known))
        anywhere = unseen.get("", 0)
        out: dict[str, int] = {}
        for endpoint, used in known:
            a = anywhere + unseen.get(endpoint, 0)
            held = max(a, spread + live.get(endpoint, 0) - max(0, used))
            if held > 0:
                out[endpoint] = held
        return out

    def _unseen(self, snapshot: PoolSnapshot) -> dict[str, int]:
        """The ledger's entries newer than ``snapshot``, by endpoint ("": anywhere)."""
        pool = self._inflight.get(snapshot.pool)
        out: dict[str, int] = {}
        for endpoint, entries in (pool or {}).items():
            entries.expire(snapshot.taken_at_s)  # the view shows these
            if entries.total:
                out[endpoint] = entries.total
        remote = self.remote
        if remote is not None and remote.active:
            add_into(out, remote.unseen(snapshot.pool))
        elif remote is not None and remote.fallback_factor > 1:
            return scaled(out, remote.fallback_factor)
        elif self.shared is not None:
            self._add_others(out, snapshot, self.shared.others(snapshot.taken_at_s))
        return out

    def _add_others(
        self, out: dict[str, int], snapshot: PoolSnapshot, others: Mapping[int, int]
    ) -> None:
        """Add the other workers' blocks (by ledger key) to ``out`` (by endpoint)."""
        if not others:
            return
        for endpoint in ("", *self.addresses(snapshot)):
            blocks = others.get(endpoint_key(snapshot.pool, endpoint), 0)
            if blocks:
                out[endpoint] = out.get(endpoint, 0) + blocks

    def _live_of(self, snapshot: PoolSnapshot) -> dict[str, int]:
        """Blocks reserved by live requests to ``snapshot``'s pool, this worker's and the
        other workers', by endpoint ("": anywhere)."""
        if snapshot.pool in self.until_seen:
            return {}
        out = {e: b for e, b in self.live.get(snapshot.pool, {}).items() if b}
        remote = self.remote
        if remote is not None and remote.active:
            add_into(out, remote.live(snapshot.pool))
        elif remote is not None and remote.fallback_factor > 1:
            return scaled(out, remote.fallback_factor)
        elif self.shared is not None:
            self._add_others(out, snapshot, self.shared.others_live())
        return out

    def held(self, snapshot: PoolSnapshot) -> int:
        """All KV blocks of the requests passed to ``snapshot``'s pool since it was taken."""
        return sum(self.ledger(snapshot).values())

    def assume_held(self, snapshot: PoolSnapshot, ledger: Mapping[str, int]) -> None:
        """Make ``ledger`` (``ledger()``'s figures) the ledger of ``snapshot``'s pool: the
        offload helper judges a heavy body with the blocks its ICE worker holds, as the worker
        itself would."""
        pool: dict[str, Entries] = {}
        for endpoint, blocks in ledger.items():
            if blocks:
                pool[endpoint] = Entries()
                pool[endpoint].add(float("inf"), blocks)
        self._inflight[snapshot.pool] = pool
