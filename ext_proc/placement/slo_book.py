"""What ICE itself sent each endpoint that the backend's last scrape cannot show yet, and
the TPOT targets of its requests running there (``admission: slo``; docs/slo.md).

``SloBook`` (one per ``PoolViews``, on the worker's event loop) keeps, per (pool, endpoint):

- the TPOT targets of the requests ICE passed there that are still running (a count per
  target: ``admitted`` adds, ``released`` takes off when the stream ends), for the tightest
  target ``V`` another running request holds the endpoint to;
- the passed requests' (time, prompt tokens), for the work a scrape taken before
  them does not show: ``ahead`` (prompt tokens sent since ``taken_at_s``, not yet among vLLM's
  waiting requests) and the sequences they add to the running count. Entries older than
  ``KEEP_S`` are dropped (a scrape is taken every second or faster).

Envoy-placed requests (endpoint "") count on every endpoint: their targets bind each one,
and their tokens and sequences are shared out, ``÷ n`` of the pool's endpoints.

``slo_case`` builds the ``SloCase`` the ladder's rule reads (``ext_proc.policy.slo_admit``):

    ahead_e   = Σ p × (1 − h) of ICE's requests sent to e since the scrape   (+ "" ÷ n)
    sent_e    = how many of them                                          (+ "" ÷ n)
    TTFT_e    = o + q + (a + b d) ÷ 2 + k a + b (W + k d),                (signals.slo)
                W = waiting_e × c̄ + ahead_e + p × (1 − h), d = running_e, k its steps,
                q = (waiting_e + sent_e + 1) ÷ λ_e when waiting_e > 0 (λ: completions/s)
                (without the engine's step line: W ÷ r + o + q, the speed per request)
    TPOT_e    = max(0, α + β × (running_e + sent_e + 1)),   u₁ = max(0, α + β)
    V_e       = the least TPOT target of ICE's running requests on e or ""

where the request is placed (its endpoint), or, when Envoy places it, the least TTFT and TPOT
over the pool's endpoints. Invariant: a hold is in the book from ``admitted`` until
``released`` (idempotent), and its target counted exactly once meanwhile.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable

from ext_proc.placement.endpoints import Candidate
from ext_proc.placement.inflight import Hold
from ext_proc.policy.settings import SloTarget
from ext_proc.policy.slo_admit import SloCase
from ext_proc.signals.slo import predicted_tpot_s, predicted_ttft_step_s
from ext_proc.signals.snapshot import BackendSignals, PoolSnapshot

__all__ = ["KEEP_S", "SloBook", "by_headroom", "slo_case", "ttfts"]

KEEP_S = 30.0  # a sent request older than this is in any later scrape

_Key = tuple[str, str]


class SloBook:
    """ICE's own sends and running TPOT targets per (pool, endpoint) (module docstring)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._targets: dict[_Key, Counter[float]] = {}
        self._sent: dict[_Key, deque[tuple[float, float]]] = {}
        self._held: dict[int, tuple[Hold, _Key, float | None]] = {}

    def admitted(self, hold: Hold | None, slo: SloTarget, prompt_tokens: float) -> None:
        """A request went upstream, held as ``hold`` (None: nothing to remember it by)."""
        if hold is None or id(hold) in self._held:
            return
        key = (hold.pool, hold.endpoint)
        now = self._clock()
        sent = self._sent.setdefault(key, deque())
        while sent and sent[0][0] < now - KEEP_S:
            sent.popleft()
        sent.append((now, prompt_tokens))
        target = slo.tpot_ms / 1000 if slo.tpot_ms is not None else None
        if target is not None:
            self._targets.setdefault(key, Counter())[target] += 1
        self._held[id(hold)] = (hold, key, target)

    def released(self, hold: Hold) -> None:
        """``hold``'s stream ended (idempotent)."""
        got = self._held.pop(id(hold), None)
        if got is None or got[0] is not hold:
            return
        _, key, target = got
        if target is None:
            return
        counts = self._targets.get(key)
        if counts is None:
            return
        counts[target] -= 1
        if counts[target] <= 0:
            del counts[target]
        if not counts:
            del self._targets[key]

    def tightest_s(self, pool: str, endpoint: str) -> float | None:
        """V: the least TPOT target of ICE's running requests at ``endpoint`` or anywhere."""
        found = [min(c) for k in ((pool, endpoint), (pool, "")) if (c := self._targets.get(k))]
        return min(found) if found else None

    def since(self, pool: str, endpoint: str, taken_at_s: float, n: int) -> tuple[float, float]:
        """(tokens, requests) sent to ``endpoint`` after ``taken_at_s``, with the Envoy-placed
        ones' ``÷ n`` share."""
        tokens = count = 0.0
        for key, share in (((pool, endpoint), 1.0), ((pool, ""), 1.0 / max(1, n))):
            for at, t in self._sent.get(key, ()):
                if at > taken_at_s:
                    tokens += t * share
                    count += share
        return tokens, count


def _predict(
    book: SloBook, snap: PoolSnapshot, b: BackendSignals, endpoint: str, prompt_tokens: float
) -> tuple[float | None, float | None, float | None]:
    """(TTFT, TPOT with it, u₁) of a request of ``prompt_tokens`` at backend ``b``."""
    sp = b.speed
    if sp is None:
        return None, None, None
    ahead, sent = book.since(snap.pool, endpoint, snap.taken_at_s, len(snap.backends))
    hit = min(1.0, max(0.0, b.hit_ratio or 0.0))
    ttft = predicted_ttft_step_s(
        sp,
        b.num_requests_waiting,
        b.num_requests_running,
        prompt_tokens,
        hit,
        ahead * (1.0 - hit),
        ahead_requests=sent,
        completions_per_s=b.derived.completions_per_s if b.derived is not None else None,
    )
    tpot = predicted_tpot_s(sp, (b.num_requests_running or 0.0) + sent + 1.0)
    return ttft, tpot, predicted_tpot_s(sp, 1.0)


def slo_case(
    book: SloBook,
    snapshot: PoolSnapshot | None,
    endpoints: list[str],
    placed: str | None,
    slo: SloTarget,
    waited_s: float,
    prompt_tokens: float,
) -> SloCase:
    """The ``SloCase`` of a request of ``prompt_tokens`` with targets ``slo``, placed at
    ``placed`` (None: Envoy places it); ``endpoints``: the serving address of each of
    ``snapshot``'s backends, in order (``PoolViews.addresses``)."""
    ttft_s = None if slo.ttft_ms is None else slo.ttft_ms / 1000
    tpot_s = None if slo.tpot_ms is None else slo.tpot_ms / 1000
    case = SloCase(ttft_s, tpot_s, max(0.0, waited_s))
    if snapshot is None:
        return case
    found = [
        (*_predict(book, snapshot, b, e, prompt_tokens), book.tightest_s(snapshot.pool, e))
        for b, e in zip(snapshot.backends, endpoints, strict=True)
        if (placed is None and not b.asleep) or e == placed
    ]
    if not found:
        return case
    ttfts = [f[0] for f in found if f[0] is not None]
    tpots = [f[1] for f in found if f[1] is not None]
    alones = [f[2] for f in found if f[2] is not None]
    tights = [f[3] for f in found if f[3] is not None]
    return SloCase(
        ttft_s,
        tpot_s,
        case.waited_s,
        min(ttfts) if ttfts else None,
        min(tpots) if tpots else None,
        min(alones) if alones else None,
        min(tights) if tights else None,
    )


def ttfts(
    book: SloBook, snapshot: PoolSnapshot, endpoints: list[str], prompt_tokens: float
) -> dict[str, float]:
    """Each endpoint's predicted TTFT for a request of ``prompt_tokens`` (those it knows)."""
    out: dict[str, float] = {}
    for b, e in zip(snapshot.backends, endpoints, strict=True):
        t = _predict(book, snapshot, b, e, prompt_tokens)[0]
        if t is not None:
            out[e] = t
    return out


def by_headroom(
    scored: list[Candidate], ttft_s: dict[str, float], budget_s: float, affine: str | None
) -> Candidate | None:
    """``endpoint_pick: ice`` under ``admission: slo``: among the endpoints where the request
    fits, those whose predicted TTFT is within its budget (``budget_s``: target − waited);
    its prefix's endpoint (``affine``) when it is one of them, else the one with the most
    headroom ``budget_s − TTFT_e`` (ties: the name). None: none is within budget (the
    usual pick then places it, and the rule judges it there)."""
    within = [
        c for c in scored if c.fits and c.endpoint in ttft_s and ttft_s[c.endpoint] <= budget_s
    ]
    if not within:
        return None
    for c in within:
        if c.endpoint == affine:
            return c
    return max(within, key=lambda c: (budget_s - ttft_s[c.endpoint], c.endpoint))
