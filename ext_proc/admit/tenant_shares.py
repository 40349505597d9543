"""Tenant shares on the request's way: a decision that would send a request upstream is held
back (``Wait``: the queue where the profile has one, else its 429) when its tenant's share of
the pool says so (``ext_proc.policy.tenant_share``: the formulas).

- **the tenant**: ``share_tenant`` — the queue's tenant (the profile's ``queue.tenant_header``
  value, else the route's name; ``ext_proc.admit.verdict.tenant_key``), the one value the
  fair queue and the tenant ledger use;
- **the figures**: U and F from the view the request was judged against (every endpoint's
  usable blocks; every awake endpoint's room after the ledgers, ``PoolViews.candidates``),
  the blocks held per tenant from the tenant ledger (``ext_proc.placement.tenant_ledger``:
  this worker, the host's other workers, the other replicas), the tenants waiting in this
  worker's queue (``TenantLedger.waiting``);
- **the request's blocks**: what its hold would be (``Holding.held_blocks``: its whole need
  under ``reserve``, its predicted total under ``forecast``), for the output it would go
  upstream with.

Not held back: a pool without ``tenant_shares``, a decision that does not go upstream, and a
``critical`` request (never shed for memory; not for its share either).

The helper process (``ext_proc.serve.offload``) judges a heavy body without the worker's
tenant ledger or the request's tenant: its verdict is checked again in the worker
(``recheck``, before the queue sees it).

Invariant: ``check`` changes only a decision that goes upstream, into a ``Wait`` passed
through ``waits_where_it_can`` (one mapping of a wait to its 429).
"""

from __future__ import annotations

from collections.abc import Callable

from ext_proc.admit.identity import request_tenant
from ext_proc.admit.routing import Route
from ext_proc.admit.verdict import BodyVerdict, RequestFacts, make_verdict
from ext_proc.placement.poolview import PoolViews
from ext_proc.policy.decision import Decision
from ext_proc.policy.evaluate import Shape, waits_where_it_can
from ext_proc.policy.output_limit import backend_output
from ext_proc.policy.scores import retry_after_s
from ext_proc.policy.settings import Policy
from ext_proc.policy.tenant_share import ShareFigures, share_verdict
from ext_proc.schemas import RequestFeatures
from ext_proc.signals.snapshot import PoolSnapshot

__all__ = ["check", "recheck", "share_tenant"]


def share_tenant(route: Route, facts: RequestFacts) -> str:
    """The tenant a request counts against (module docstring)."""
    return request_tenant(route, facts)


def figures(
    views: PoolViews, route: Route, seen: PoolSnapshot, tenants: set[str]
) -> ShareFigures | None:
    """The pool's U, F, blocks held by ``tenants`` and its waiting tenants (None: no KV
    view)."""
    endpoints = views.endpoints(route.profile, seen)
    if not endpoints:
        return None
    usable = sum(e.fit.usable_blocks for e in endpoints)
    free = sum(fit.free_blocks for _, fit in views.candidates(route.profile, seen))
    held = views.tenants.held(route.pool, tenants)
    return ShareFigures(usable, free, held, views.tenants.waiting_in(route.pool))


def check(
    policy: Policy,
    views: PoolViews,
    route: Route,
    facts: RequestFacts,
    features: RequestFeatures,
    decision: Decision,
    seen: PoolSnapshot | None,
    *,
    can_wait: bool = True,
) -> Decision:
    """``decision``, or the ``Wait`` (or its 429) its tenant's share gives instead."""
    shares = policy.tenant_shares.get(route.pool)
    if shares is None or seen is None or not decision.goes_upstream:
        return decision
    if facts.priority == "critical":
        return decision
    tenant = share_tenant(route, facts)
    got = figures(views, route, seen, {tenant, *shares.guaranteed})
    if got is None:
        return decision
    profile = route.profile
    fit = views.endpoints(profile, seen)[0].fit
    granted = decision.granted_max_tokens
    output = granted if granted is not None else backend_output(features, profile)
    shape = Shape.of(features, profile)
    need = views.held_blocks(profile, seen, fit, shape, output)
    retry = retry_after_s(
        views.drain(seen),
        need * fit.block_size,
        min_s=profile.retry_after_min_s,
        max_s=profile.retry_after_max_s,
        fallback_s=profile.retry_after_s,
    )
    wait = share_verdict(shares, tenant, need, got, decision.pressure, retry)
    if wait is None:
        return decision
    return waits_where_it_can(wait, profile, can_wait=can_wait)


def recheck(
    policy: Policy,
    views: PoolViews,
    lookup: Callable[[str], PoolSnapshot | None],
    route: Route,
    facts: RequestFacts,
    verdict: BodyVerdict,
) -> BodyVerdict:
    """A verdict judged elsewhere (the helper process), checked against the tenant's share
    here (a pipeline's ``policy``, ``views`` and ``lookup``): ``verdict``, or the same
    request's ``Wait`` (or 429)."""
    d, f = verdict.decision, verdict.features
    if d is None or f is None or verdict.shadow is not None or facts.adapter is None:
        return verdict
    seen = views.judged_view(route.profile, route.pool, lookup(route.pool))
    got = check(policy, views, route, facts, f, d, seen)
    if got is d:
        return verdict
    placement = verdict.placement
    assert placement is not None
    return make_verdict(got, f, facts.adapter, verdict.body, placement)
