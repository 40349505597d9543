"""Where in its pool a request is judged, and, when the pool says ``endpoint_pick: ice``,
where it is sent. No I/O: reads ``PoolViews`` and keeps the prefix-affinity table.

Per the pool's ``endpoint_pick``:
- ``none``: Envoy's load balancer places the request anywhere, so it is judged against the
  endpoint with the least room (``PoolViews.room`` without an endpoint); nothing is said to
  Envoy.
- ``ice``: ``picking.pick`` chooses among the endpoints (only those of the request's
  subset hint, ``envoy.lb.subset_hint``, when it carries one; none of them known: not
  picked, judged as the pool's worst) where the request fits now (its blocks at the
  requested output, all sequences, against each endpoint's free blocks less that endpoint's
  ledger): prefix affinity, then the most room after admission, then the shortest queue,
  then a rendezvous hash of the prefix (new prefixes spread). When it fits nowhere it is
  judged against the endpoint with the most free blocks (the ladder then downgrades or sheds
  there), and still sent there if it passes. Under ``admission: slo`` with a TTFT target
  (``ttft_budget_s``: target − waited), the endpoints within budget come first: affinity,
  then the most predicted headroom (``ext_proc.placement.slo_book.by_headroom``).
- ``header``: another picker named the endpoint (``x-gateway-destination-endpoint``); it is
  judged against that endpoint; an endpoint the view does not know is judged as the pool's
  worst, and ``x-ice-endpoint`` says ``unknown``.

Sleeping endpoints (vLLM sleep mode, ``BackendSignals.asleep``) have no room
(``PoolViews.endpoints``: no free blocks), so with ``none`` or ``header`` a request that
could land on one is judged against no free blocks; ``ice`` never picks one (they are not
candidates). When every endpoint of the pool sleeps there is nowhere to place the request:
``asleep_answer`` is its verdict, 503 ``backend_asleep`` at once for every priority (what
vLLM's own valve answers when it cannot take a request, so clients and balancers retry
elsewhere), with Retry-After the profile's ``retry_after_s`` (the drain rate says nothing of
when an engine wakes).

Invariant: a ``Placement`` with ``picked`` set names an awake endpoint of the snapshot it was
made from; the affinity table forgets endpoints that leave the pool.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ext_proc.placement.endpoints import DESTINATION_HEADER, Affinity, Candidate, pick
from ext_proc.placement.poolview import PoolViews
from ext_proc.placement.slo_book import by_headroom, ttfts
from ext_proc.policy.decision import Reject
from ext_proc.policy.evaluate import KvFit, Shape, safe_output_tokens
from ext_proc.policy.output_limit import backend_output
from ext_proc.policy.pressure import Pressure
from ext_proc.policy.settings import Profile
from ext_proc.schemas.base import RequestFeatures
from ext_proc.signals.pool import EndpointPick
from ext_proc.signals.snapshot import PoolSnapshot

__all__ = ["ASLEEP", "H_ENDPOINT", "Placement", "Placer", "asleep_answer"]

H_ENDPOINT = "x-ice-endpoint"
# x-ice-stale: ledger: the request was judged with no live view of the pool (it expired),
# against the last view's blocks less what ICE itself holds (PoolViews.ledger_view); the
# header a stale view already carries (ext_proc.policy.decision.H_STALE), so Envoy echoes it
H_VIEW = "x-ice-stale"
ASLEEP = "backend_asleep"  # the reason of the 503 when every endpoint sleeps


def asleep_answer(profile: Profile, pressure: Pressure | None) -> Reject:
    """The verdict when every endpoint of the pool sleeps (module docstring)."""
    retry = profile.retry_after_s
    return Reject(
        pressure=pressure,
        status=503,
        reason=ASLEEP,
        message=(
            "The inference backend is asleep (sleep mode) and serves no requests now. "
            f"Retry after {retry} s."
        ),
        retry_after_s=retry,
    )


@dataclass(frozen=True, slots=True)
class Placement:
    """The endpoint a request was judged against (None: any); plain data (it travels back
    from the offload helper)."""

    endpoint: str | None = None
    picked: bool = False  # ICE chose the endpoint: Envoy must be told
    unknown: bool = False  # header mode: the named endpoint is not one of the pool's
    prefix: str | None = None  # the request's prefix key (affinity)
    # judged without a live view: the last view's blocks less ICE's own holds
    ledger_only: bool = False

    def headers(self) -> list[tuple[str, str]]:
        """Headers that name the placement (on the backend request and the client reply);
        with ``picked``, also the endpoint-picker protocol's header."""
        if self.ledger_only:
            return [(H_VIEW, "ledger"), *replace(self, ledger_only=False).headers()]
        if self.unknown:
            return [(H_ENDPOINT, "unknown")]
        if self.endpoint is None:
            return []
        if self.picked:
            return [(DESTINATION_HEADER, self.endpoint), (H_ENDPOINT, self.endpoint)]
        return [(H_ENDPOINT, self.endpoint)]


class Placer:
    """Places requests for one worker (``PoolViews`` and one affinity table per pool)."""

    def __init__(self, views: PoolViews) -> None:
        self.views = views
        self._affinity: dict[str, Affinity] = {}
        self._seen: dict[str, PoolSnapshot] = {}
        self._addresses: dict[str, frozenset[str]] = {}

    def place(
        self,
        mode: EndpointPick,
        profile: Profile,
        snapshot: PoolSnapshot | None,
        features: RequestFeatures,
        named: str | None = None,
        prefix: str | None = None,
        subset: frozenset[str] | None = None,
        ttft_budget_s: float | None = None,
    ) -> tuple[KvFit | None, Placement]:
        """The KV room to judge the request against, and the placement it stands for."""
        views = self.views
        if mode == "header":
            kv = views.room(profile, snapshot, named)
            known = named is not None and any(
                e.endpoint == named for e in views.endpoints(profile, snapshot)
            )
            return kv, Placement(named if known else None, unknown=kv is not None and not known)
        if mode != "ice" or snapshot is None:
            return views.room(profile, snapshot), Placement()
        candidates = views.candidates(profile, snapshot)
        if subset is not None:  # the protocol's subset hint: pick only among those
            candidates = [(e, fit) for e, fit in candidates if e.endpoint in subset]
        if not candidates:
            return views.room(profile, snapshot), Placement()
        affinity = self._affinity_for(snapshot)
        shape = Shape.of(features, profile)
        if features.generates:
            wanted = backend_output(features, profile)
            safe = safe_output_tokens(profile, features.input_tokens)
            if safe is not None and features.max_tokens is not None:
                wanted = max(1, min(wanted, safe))
        else:
            wanted = 0
        scored = [
            Candidate(e.endpoint, fit.free_blocks, fit.charge(shape, wanted), e.waiting)
            for e, fit in candidates
        ]
        chosen = None
        if ttft_budget_s is not None:  # admission: slo: by predicted headroom
            predicted = ttfts(views.slo, snapshot, views.addresses(snapshot), features.input_tokens)
            chosen = by_headroom(scored, predicted, ttft_budget_s, affinity.get(prefix))
        if chosen is None:
            chosen = pick(scored, affinity.get(prefix), prefix)
        if chosen is None:  # fits nowhere: judged (and sent) where the most room is
            chosen = max(scored, key=lambda c: (c.free_blocks, c.endpoint))
        fit = next(f for e, f in candidates if e.endpoint == chosen.endpoint)
        return fit, Placement(chosen.endpoint, picked=True, prefix=prefix)

    def sent(self, pool: str, placement: Placement) -> None:
        """Remember where a picked request with a prefix went (affinity)."""
        if placement.picked and placement.endpoint is not None:
            self._affinity.setdefault(pool, Affinity()).put(placement.prefix, placement.endpoint)

    def _affinity_for(self, snapshot: PoolSnapshot) -> Affinity:
        affinity = self._affinity.setdefault(snapshot.pool, Affinity())
        if self._seen.get(snapshot.pool) is not snapshot:  # a new view: forget who left
            self._seen[snapshot.pool] = snapshot
            present = frozenset(self.views.addresses(snapshot))
            if present != self._addresses.get(snapshot.pool):
                self._addresses[snapshot.pool] = present
                affinity.forget(present)
        return affinity
