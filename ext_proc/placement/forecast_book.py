"""This worker's forecast of every endpoint's KV blocks (``admission: forecast``): the
trajectories of the requests it passed, the caution preemptions raise, and the ``KvFit``
a request is judged against (``ext_proc.placement.forecast`` has the formulas).

- **Decode rate** r of an endpoint (tokens per second per running sequence) and the
  first-token delay d: ``BackendSignals.decode_rate`` and ``first_token_delay_s`` (the
  slower of 1 ÷ the mean inter-token latency since start and the window's generation rate
  ÷ running: the window rate ÷ the running gauge swung 110–340 tok/s within a second on the
  bench, so neither alone is trusted upwards; d the window's TTFT p50). A g estimated too
  high only moves a request's blocks from "ahead" to "now".
- **Caution** c of an endpoint: 1 when its ``vllm:num_preemptions_total`` rose since the
  last view this worker read while requests it passed to the pool were running, then
  halving every ``forecast.recovery_s`` seconds:
  c(t) = c₀ × 2^(−(t − t₀) / recovery_s). It raises the quantile of the predicted
  outputs, q' = q + c × (1 − q) (``ext_proc.policy.output_dist``): after a preemption ICE holds
  each request at the longest the pool has run (its limit where requests run to their
  limits), and returns to the forecast as the endpoint stays calm.
- **The fit** of an endpoint e with usable U, free F (the view), unseen ledger blocks A
  (requests passed since the view, ``PoolViews``), the other workers' live holds O_e:
      budget = floor(U × (1 − margin)) − max(0, (U − F) − b_now − O_e)
      free   = max(0, budget − peak)            (``KvFit.free_blocks``)
      charge(shape, limit) = max(peak_with − peak, start + max(0, free − (F − A)))
  where b_now and peak are this worker's trajectories at e (those Envoy places, endpoint
  "", count 1/n on each of the n endpoints) with O_e held flat, peak_with the peak with
  the new request (its prompt blocks now, its predicted total ahead, its sequences), and
  start = ``KvFit.need(shape, 1)``, the blocks it takes the moment it starts: so a request
  is admitted only when the forecast peak fits the budget *and* it fits the free blocks now.
- **At scale**: from ``STANDING_FROM`` trajectories at an endpoint, b_now and the peaks
  come from its standing forecast (``ext_proc.placement.forecast_standing``: built once for
  a span, read by every decision in it, never below the exact peak nor above the exact
  blocks now); the wait below still reads the trajectories at now.
- **Kinds** (``ext_proc.placement.length_kinds``): when a trajectory's stream ends, its ĝ at the
  last outlook read for its endpoint is one observation of its kind (profile, limit
  bucket); under ``forecast.refine`` an outlook's lengths of kind k are the backend's,
  stretched by f_k.
- **The wait** (``forecast.start_within_s`` W > 0): a request whose start does not fit the
  free blocks now is admitted when, at the first predicted end within W where it does (the
  backend starts a waiting request as soon as its blocks fit), the peak with it fits the
  budget (``_starts_later``); its trajectory runs from there (``Trajectory.runs_s``), and
  until then it is one of the requests waiting by plan (``waiting``) that the pressure
  score's queue term leaves out (``PoolViews.unplanned``).

Invariant: a trajectory is added by ``PoolViews.hold`` and removed by ``release`` /
``unhold``, once; the clock is ``time.monotonic()``.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from ext_proc import telemetry
from ext_proc.placement.forecast import Outlook, Peaks, Trajectory, slot_tokens
from ext_proc.placement.forecast_standing import Standing
from ext_proc.placement.inflight import Endpoint
from ext_proc.placement.length_kinds import LIMIT_LABELS, Kind, ObservedLengths, limit_bucket
from ext_proc.policy.kvfit import KvFit, Shape
from ext_proc.policy.settings import Profile
from ext_proc.signals.snapshot import BackendSignals

__all__ = ["ForecastBook"]

log = logging.getLogger("ice.forecast")
REUSE_S = 0.005
LATER_POINTS = 32  # predicted ends within the wait that a request is tried against
PLANNED_FOR_S = 1.0  # a start planned by a fit is taken by a hold within this
PLANNED_KEPT = 256  # planned starts kept before the old ones are dropped
STANDING_FROM = 64  # trajectories at an endpoint from which a fit reads a standing forecast
MEMOS = 8  # totals memos kept (one per length readings: histogram, quantile, caution, p)


class ForecastBook:
    """Trajectories by pool and endpoint ("": placed by Envoy), and cautions by backend."""

    def __init__(self) -> None:
        self.items: dict[str, dict[str, dict[int, Trajectory]]] = {}
        # (pool, backend url) → (caution at t0, t0, preemptions counter last read)
        self._caution: dict[tuple[str, str], tuple[float, float, float]] = {}
        self._version = 0  # changes with every add and remove
        # (pool, endpoint) → (inputs, time, fit): the judgements of one request (the
        # estimate's two bounds, the shared ledger's check) within REUSE_S share one fit
        self._last: dict[tuple[str, str], tuple[tuple[object, ...], float, KvFit]] = {}
        # (pool, shape, output limit) → (predicted start, when judged): the requests the fit
        # admitted to start within the wait, until ``PoolViews.hold`` takes their start
        self._planned: dict[tuple[str, Shape, int], tuple[float, float]] = {}
        self.lengths = ObservedLengths()  # what ICE saw finish, by kind
        # (pool, endpoint) and (pool, None) → the last outlook read there: a finished
        # trajectory's ĝ is read with it
        self._looks: dict[tuple[str, str | None], Outlook] = {}
        # pool → (endpoint, endpoints) → its standing forecast (STANDING_FROM trajectories)
        self._standing: dict[str, dict[tuple[str, int], Standing]] = {}
        # the length readings → (the histogram, kept alive for its id; the totals memo)
        self._memos: dict[tuple[object, ...], tuple[object, dict[Any, int]]] = {}

    def add(self, pool: str, endpoint: str, t: Trajectory) -> None:
        self.items.setdefault(pool, {}).setdefault(endpoint, {})[id(t)] = t
        self._version += 1
        for (where, _), s in self._standing.get(pool, {}).items():
            if endpoint in (where, ""):
                s.added(t, endpoint)

    def remove(self, pool: str, endpoint: str, t: Trajectory) -> None:
        if self.items.get(pool, {}).get(endpoint, {}).pop(id(t), None) is not None:
            self._version += 1
            for (where, _), s in self._standing.get(pool, {}).items():
                if endpoint in (where, ""):
                    s.removed(t)

    def finished(self, pool: str, endpoint: str, t: Trajectory) -> None:
        """``t``'s stream ended: its ĝ now, at the endpoint's last outlook (the pool's when
        the endpoint has none), is one observation of its kind; none for a request held
        whole or with the decode rate unknown."""
        look = self._looks.get((pool, endpoint)) or self._looks.get((pool, None))
        if t.whole is not None or look is None or not look.rate:
            return
        g = look.generated(t, time.monotonic())
        self.lengths.observe(pool, (t.kind, limit_bucket(t.limit)), g)

    def changed(self) -> None:
        """A trajectory in the book changed (``PoolViews.shrink``): fits are computed again,
        standing forecasts built again."""
        self._version += 1
        self._standing.clear()

    def _plan(self, key: tuple[str, Shape, int], runs_s: float | None, now_s: float) -> None:
        """Remember that a request judged now starts at ``runs_s`` (None: at once, or not
        admitted: forget any earlier plan for its key)."""
        if runs_s is None:
            self._planned.pop(key, None)
            return
        if len(self._planned) >= PLANNED_KEPT:  # judged but never held (refused after all)
            old = [k for k, (_, t) in self._planned.items() if now_s - t > PLANNED_FOR_S]
            for k in old:
                del self._planned[k]
        self._planned[key] = (runs_s, now_s)

    def planned_start(self, pool: str, shape: Shape, limit: int, now_s: float) -> float | None:
        """When a request of ``shape`` passed now at ``limit`` starts running, if the fit
        just admitted it to start within the wait (``Trajectory.runs_s``); None: at once."""
        got = self._planned.pop((pool, shape, limit), None)
        if got is None or now_s - got[1] > PLANNED_FOR_S or got[0] <= now_s:
            return None
        return got[0]

    def waiting(self, pool: str, endpoint: str, endpoints: int, at_s: float) -> float:
        """W_e: this worker's requests at ``endpoint`` (those Envoy places counting
        1/``endpoints`` each) admitted by ``at_s`` to start within the wait and planned to be
        still waiting then (``Trajectory.waiting_at``)."""
        mine = self.items.get(pool, {})
        here = sum(t.waiting_at(at_s) for t in mine.get(endpoint, {}).values())
        anywhere = sum(t.waiting_at(at_s) for t in mine.get("", {}).values())
        return here + anywhere / max(1, endpoints)

    def caution(
        self, pool: str, b: BackendSignals, recovery_s: float, now_s: float, busy: bool = True
    ) -> float:
        """The endpoint's caution now (see the module docstring); reads its counter. A rise
        while ``busy`` is false (this worker has no request running there: the preemptions
        are other traffic's, before ICE's requests arrived) is taken as the new baseline."""
        key = (pool, b.url)
        c0, t0, seen = self._caution.get(key, (0.0, now_s, -1.0))
        if b.preemptions is not None:
            if seen >= 0 and b.preemptions > seen and busy:
                c0, t0 = 1.0, now_s
            seen = b.preemptions
        self._caution[key] = (c0, t0, seen)
        return c0 * math.pow(2.0, -max(0.0, now_s - t0) / recovery_s) if c0 else 0.0

    def outlook(
        self, profile: Profile, pool: str, b: BackendSignals, bs: int, endpoint: str | None = None
    ) -> Outlook:
        """The forecast's reading of backend ``b`` (at ``endpoint``; None: any) for
        ``profile`` (the module docstring)."""
        now = time.monotonic()
        rate, delay = b.decode_rate, b.first_token_delay_s
        spec = profile.forecast
        busy = any(self.items.get(pool, {}).values())
        c = self.caution(pool, b, spec.recovery_s, now, busy)
        factor = self._factor(pool, spec.min_observations) if spec.refine else None
        share = b.limit_share or 0.0
        readings = (id(b.output_lengths), spec.quantile, spec.min_observations, c, share)
        memo = self._memo(readings, b.output_lengths)
        look = Outlook(
            rate, b.output_lengths, c, bs, spec, delay, share, profile.name, factor, memo
        )
        self._looks[(pool, endpoint)] = self._looks[(pool, None)] = look
        return look

    def _memo(self, readings: tuple[object, ...], lengths: object) -> dict[Any, int]:
        """The totals memo of outlooks with these length ``readings`` (the last MEMOS kept)."""
        got = self._memos.get(readings)
        if got is None or got[0] is not lengths:
            if len(self._memos) >= MEMOS:
                del self._memos[next(iter(self._memos))]
            got = self._memos[readings] = (lengths, {})
        return got[1]

    def _factor(self, pool: str, min_observations: int) -> Callable[[Kind], float]:
        def factor(kind: Kind) -> float:
            f = self.lengths.factor(pool, kind, min_observations)
            bucket = LIMIT_LABELS[kind[1]]
            telemetry.FORECAST_LENGTH_FACTOR.labels(pool=pool, profile=kind[0], limit=bucket).set(f)
            return f

        return factor

    def fits(
        self,
        profile: Profile,
        pool: str,
        views: tuple[Endpoint, ...],
        backends: Mapping[str, BackendSignals],
        unseen: Mapping[str, int],
        everyone: Mapping[str, int],
        own: Mapping[str, int],
    ) -> list[tuple[Endpoint, KvFit]]:
        """Each of ``views`` with its forecast fit: ``unseen`` the ledger's entries newer
        than the view (A, by endpoint, "" anywhere), ``everyone`` the live holds of every
        worker and replica, ``own`` this worker's (O_e = everyone − own, "" spread evenly)."""
        spread = -(-max(0, everyone.get("", 0) - own.get("", 0)) // len(views))
        out = []
        for v in views:
            others = max(0, everyone.get(v.endpoint, 0) - own.get(v.endpoint, 0)) + spread
            seen = unseen.get("", 0) + unseen.get(v.endpoint, 0)
            b = backends[v.endpoint]
            out.append((v, self.fit(profile, pool, v.endpoint, len(views), b, v.fit, seen, others)))
        return out

    def _states(
        self,
        pool: str,
        endpoint: str,
        endpoints: int,
        look: Outlook,
        at: float,
        ends: Mapping[int, float] | None = None,
    ) -> list[tuple[int, int, int, int]]:
        """(blocks, tokens ahead, sequences, free slots of the last block) at time ``at`` of
        this worker's requests at ``endpoint``, those Envoy places counting 1/``endpoints``
        each; ``ends`` (id → predicted end): those ended by ``at`` are left out."""
        mine = self.items.get(pool, {})
        states: list[tuple[int, int, int, int]] = []
        share = 1.0 / max(1, endpoints)
        for where, part in ((endpoint, 1.0), ("", share)):
            for t in mine.get(where, {}).values():
                if ends is not None and ends.get(id(t), math.inf) <= at:
                    continue
                blocks, left, room = look.state(t, at)
                states.append((math.ceil(blocks * part), left, math.ceil(t.seqs * part), room))
        return states

    def _later(
        self,
        pool: str,
        endpoint: str,
        endpoints: int,
        look: Outlook,
        now: float,
        wait_s: float,
        current: Peaks | None,
        others: int,
    ) -> list[tuple[float, Peaks, int]]:
        """The endpoint at each predicted end of a running request within ``wait_s``: the
        time, the peaks of what still runs then (the others' holds flat, as in ``current``,
        the fit's peaks now; None: a standing forecast's, read again at ``now``), and the
        blocks freed by then."""
        if current is None:
            current = Peaks(
                self._states(pool, endpoint, endpoints, look, now), look.block_size, others
            )
        mine = self.items.get(pool, {})
        ends: dict[int, float] = {}
        for where in (endpoint, ""):
            for t in mine.get(where, {}).values():
                end = look.end_s(t, now)
                if end is not None:
                    ends[id(t)] = end
        # each end rounded up to 10 ms (never before the end: the request is gone by then)
        at = sorted({math.ceil(e * 100) / 100 for e in ends.values() if now < e <= now + wait_s})
        bs = look.block_size
        out = []
        for e in at[:LATER_POINTS]:
            states = self._states(pool, endpoint, endpoints, look, e, ends)
            then = Peaks(states, bs, current.fixed)
            out.append((e, then, max(0, current.now_blocks - then.now_blocks)))
        return out

    def _peaks(
        self, pool: str, endpoint: str, endpoints: int, look: Outlook, now: float, others: int
    ) -> tuple[Peaks, int, int, bool]:
        """(the peaks, blocks added to each of their points, the blocks now, whether they
        are read at ``now``, not from a standing forecast) of ``endpoint``: read at ``now`` below
        ``STANDING_FROM`` trajectories there, else from its standing forecast
        (``ext_proc.placement.forecast_standing``), built again when it is not fresh."""
        mine = self.items.get(pool, {})
        here, anywhere = mine.get(endpoint, {}), mine.get("", {})
        members = len(here) + len(anywhere)
        if members < STANDING_FROM:
            self._standing.get(pool, {}).pop((endpoint, endpoints), None)
            states = self._states(pool, endpoint, endpoints, look, now)
            peaks = Peaks(states, look.block_size, others)
            return peaks, 0, peaks.now_blocks, True
        standings = self._standing.setdefault(pool, {})
        s = standings.get((endpoint, endpoints))
        if s is None or not s.fresh(look, now, members):
            share = 1.0 / max(1, endpoints)
            parts = {endpoint: 1.0, "": share}
            everyone = [(t, 1.0) for t in here.values()]
            everyone += [(t, share) for t in anywhere.values()]
            least = 4.0 * s.build_s if s is not None else 0.0
            s = standings[(endpoint, endpoints)] = Standing.build(look, everyone, now, parts, least)
            s.build_s = time.monotonic() - now
        return s.peaks, others + s.extra(), others + s.blocks_now, False

    def fit(
        self,
        profile: Profile,
        pool: str,
        endpoint: str,
        endpoints: int,
        backend: BackendSignals,
        base: KvFit,
        unseen: int,
        others: int,
    ) -> KvFit:
        """The ``KvFit`` a request placed at ``endpoint`` (one of ``endpoints``) is judged
        against (the module docstring); ``base``: the view's fit, ``unseen``: A, ``others``:
        O_e."""
        now = time.monotonic()
        inputs = (id(profile), id(base), unseen, others, endpoints, self._version)
        last = self._last.get((pool, endpoint))
        if last is not None and last[0] == inputs and now - last[1] < REUSE_S:
            return last[2]
        look = self.outlook(profile, pool, backend, base.block_size, endpoint)
        peaks, extra, blocks_now, exact = self._peaks(pool, endpoint, endpoints, look, now, others)
        u, f, peak = base.usable_blocks, base.free_blocks, peaks.peak + extra
        other = max(0, (u - f) - blocks_now)
        budget = math.floor(u * (1.0 - profile.forecast.margin)) - other
        free = max(0, budget - peak)
        gap = max(0, free - max(0, f - unseen))  # what the free blocks now lack of ``free``
        log.debug(
            "forecast %s/%s: usable %d free %d unseen %d others %d now %d other %d budget %d "
            "peak %d → free %d (caution %.2f, rate %s)",
            *(pool, endpoint, u, f, unseen, others, blocks_now, other, budget),
            *(peak, free, look.caution, look.rate),
        )
        telemetry.FORECAST_PEAK.labels(pool=pool, endpoint=endpoint).set(peak)
        telemetry.FORECAST_CAUTION.labels(pool=pool, endpoint=endpoint).set(look.caution)
        read_floors, wait_s = profile.forecast.read_floors, profile.forecast.start_within_s
        later: list[list[tuple[float, Peaks, int]]] = []  # built when a request first needs it

        def charge(shape: Shape, limit: int) -> int:
            start = base.need(shape, 1) if limit > 0 else base.need(shape, 0)
            total = look.total(0, limit, min(shape.floor, limit) if read_floors else 0)
            tokens = slot_tokens(shape, profile)
            room = 0 if tokens is None else -tokens % base.block_size
            prompt = base.need(shape, 0)
            added = peaks.with_new(prompt, total, shape.sequences, room) + extra - peak
            now_charge = max(added, start + gap)
            key = (pool, shape, limit)
            if now_charge <= free or wait_s <= 0 or not look.rate:
                self._plan(key, None, now)
                return now_charge
            if not later:
                where, current = (pool, endpoint, endpoints), peaks if exact else None
                later.append(self._later(*where, look, now, wait_s, current, others))
            new = (prompt, total, shape.sequences, room)
            runs = _starts_later(later[0], new, start, budget, max(0, f - unseen))
            self._plan(key, runs, now)
            return now_charge if runs is None else free  # starts within the wait: what is left

        fit = replace(base, free_blocks=free, forecast=charge)
        self._last[(pool, endpoint)] = (inputs, now, fit)
        return fit


def _starts_later(
    later: list[tuple[float, Peaks, int]],
    new: tuple[int, int, int, int],
    start: int,
    budget: int,
    physical: int,
) -> float | None:
    """When a request (prompt blocks, tokens ahead, sequences, free slots of its last block)
    that takes ``start`` blocks when it runs will start, if it fits then; None otherwise.

    The backend, not ICE, starts a waiting request: vLLM schedules it as soon as its blocks
    fit the free ones. So it starts at the first of the ``later`` points where ``start`` fits
    the free blocks now (``physical``) plus those freed by then, and the peak with it there
    must stay within ``budget``: a request whose start fits now would start now (the charge
    now judges it), and one that would start before the forecast has room for it is not
    admitted for later."""
    if start <= physical:
        return None
    for at, then, freed in later:
        if start <= physical + freed:
            fits = then.with_new(*new) <= budget and start <= budget - then.peak
            return at if fits else None
    return None
