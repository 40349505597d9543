"""What a verdict leaves behind (``Recorder``, the pipeline's ``recorder``):
its metrics, the endpoint ICE picked, and the KV blocks held in the in-flight ledger by a
request that goes upstream, released by its stream when it ends.

Invariants: only a verdict that sends the request on (pass, downgrade, truncated) holds
blocks or counts a pick; a request's blocks are held once, with its whole shape (every
sequence) and the output limit it goes upstream with.
"""

from __future__ import annotations

from collections.abc import Callable

from ext_proc import telemetry
from ext_proc.admit.routing import Route
from ext_proc.admit.tenant_shares import share_tenant
from ext_proc.admit.verdict import BodyVerdict, RequestFacts
from ext_proc.placement.inflight import Hold
from ext_proc.placement.placer import Placer
from ext_proc.placement.poolview import PoolViews
from ext_proc.policy.decision import Reject
from ext_proc.policy.evaluate import Shape
from ext_proc.policy.output_limit import backend_output
from ext_proc.policy.settings import Policy
from ext_proc.policy.tenant_share import TENANT_SHARE_REASONS
from ext_proc.schemas import RequestFeatures
from ext_proc.signals.snapshot import PoolSnapshot

__all__ = ["Recorder", "SnapshotLookup"]

SnapshotLookup = Callable[[str], PoolSnapshot | None]


def _upstream(verdict: BodyVerdict) -> bool:
    """The verdict sends the request on (pass, downgrade, or truncated)."""
    return verdict.features is not None and verdict.goes_upstream


class Recorder:
    """Counts and holds verdicts for a pipeline (its ``views``, ``placer`` and ``lookup``)."""

    def __init__(
        self, views: PoolViews, placer: Placer, lookup: SnapshotLookup, policy: Policy
    ) -> None:
        self.views = views
        self.placer = placer
        self.lookup = lookup
        self.policy = policy

    def record(
        self, route: Route, verdict: BodyVerdict, facts: RequestFacts | None = None
    ) -> Hold | None:
        """Count a body verdict in ICE's metrics (kept apart from ``on_body``, which may run
        in the helper process); a request that goes upstream holds its KV blocks in the
        ledger: its reservation, for ``views.release`` when its stream ends (``facts``: its
        tenant's too, in a pool with tenant shares)."""
        self.count(route, verdict)
        return self.hold_of(route, verdict, facts)

    def count(self, route: Route, verdict: BodyVerdict) -> None:
        """``record``'s counting: the verdict's metrics, and the endpoint ICE picked."""
        if verdict.shadow is not None:
            telemetry.count_decision(route.name, *verdict.shadow, mode="shadow")
        elif verdict.bad is not None:
            telemetry.BAD_REQUESTS.labels(route=route.name, reason=verdict.bad).inc()
        elif verdict.decision is not None:
            telemetry.count_decision(route.name, verdict.decision.decision, verdict.decision.reason)
            d = verdict.decision
            if isinstance(d, Reject) and d.reason in TENANT_SHARE_REASONS:
                telemetry.TENANT_SHARE_REFUSALS.labels(pool=route.pool, reason=d.reason).inc()
        f = verdict.features
        if f is not None:
            telemetry.count_input_tokens(f.input_tokens_source)
            if f.count_mode:
                telemetry.TOKEN_COUNTS.labels(mode=f.count_mode).inc()
            telemetry.count_shape(route.name, f.sequences, f.media_parts)
        placed = verdict.placement
        if _upstream(verdict) and placed is not None and placed.picked:
            self.placer.sent(route.pool, placed)
            telemetry.count_pick(route.pool, placed.endpoint or "")

    def hold_of(
        self, route: Route, verdict: BodyVerdict, facts: RequestFacts | None = None
    ) -> Hold | None:
        """``record``'s holding: a request that goes upstream holds its blocks (all its
        sequences) at its endpoint ("" when Envoy places it) in the in-flight ledger, and as
        its tenant's (``facts``' tenant) where the pool has tenant shares."""
        f = verdict.features
        if f is None or not _upstream(verdict):
            return None
        tenant = None
        if facts is not None and route.pool in self.policy.tenant_shares:
            tenant = share_tenant(route, facts)
        return self.views.hold(route.profile, *self.hold_terms(route, verdict, f), tenant)

    def hold_terms(
        self, route: Route, verdict: BodyVerdict, f: RequestFeatures
    ) -> tuple[PoolSnapshot | None, Shape, int, str]:
        """What ``verdict``'s request is held with, counted as ``f``: the view, its shape,
        output tokens per sequence and endpoint ("": Envoy places it)."""
        granted = verdict.granted_max_tokens
        output = granted if granted is not None else backend_output(f, route.profile)
        placed = verdict.placement
        endpoint = placed.endpoint if placed is not None and placed.endpoint else ""
        seen = self.views.judged_view(route.profile, route.pool, self.lookup(route.pool))
        return seen, Shape.of(f, route.profile), output, endpoint
