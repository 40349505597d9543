"""Each tenant's share of a pool's KV blocks: the limits (``TenantShares``) and the one
check (``share_verdict``). Pure: no clock, no I/O; the figures are passed in.

The tenant is the request's queue tenant (``ext_proc.admit.verdict.tenant_key``: the
profile's ``queue.tenant_header`` value, else the route's name). Units: KV blocks, the
pool's usable blocks U = Σ over its endpoints of ``usable_blocks`` (num_gpu_blocks − 1).

    cap_blocks(t)        = floor(cap(t) × U)          cap(t): caps[t], else cap (default 1)
    guaranteed_blocks(g) = floor(guaranteed(g) × U)   0 for a tenant with no guarantee
    protected(t)         = Σ over g ≠ t, g active: max(0, guaranteed_blocks(g) − held(g))

``held(t)``: the blocks of t's requests in flight in the pool (every worker and replica, as
the in-flight ledgers count them: the same size each request is held at). ``active(g)``: g
has requests waiting in ICE's admission queue for the pool, or holds blocks there (an idle
tenant protects nothing: the guarantee is work-conserving).

A request of tenant t that would hold ``need`` blocks, judged against the pool's free
blocks F (Σ over its endpoints of the room the request would be judged against, after the
ledgers), is held back (``Wait``: it waits in the queue where the profile has one, else its
429) when

    held(t) + need > cap_blocks(t)              → reason ``tenant_share_exceeded``
    need > F − protected(t)                      → reason ``tenant_share_reserved``

checked in that order; the second only while some other tenant's guarantee is unmet. Both
hold even when the pool has room. A tenant holding nothing is never refused by its cap when
``need ≤ cap_blocks``; a request larger than its tenant's cap waits until it times out (the
cap is the limit, documented; raise it for such tenants).

Invariant: with no ``TenantShares`` for a pool nothing here runs; limits are validated at
load (``check``): 0 < cap ≤ 1, 0 ≤ guaranteed ≤ cap(t), Σ guaranteed ≤ 1.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from ext_proc.policy.decision import Wait
from ext_proc.policy.pressure import Pressure
from ext_proc.policy.settings import TenantShares

__all__ = [
    "EXCEEDED",
    "RESERVED",
    "TENANT_SHARE_REASONS",
    "ShareFigures",
    "share_problems",
    "share_verdict",
]

EXCEEDED = "tenant_share_exceeded"
RESERVED = "tenant_share_reserved"
TENANT_SHARE_REASONS = frozenset({EXCEEDED, RESERVED})


def share_problems(shares: TenantShares) -> list[str]:
    """What makes ``shares`` invalid (empty: valid)."""
    out: list[str] = []
    if not 0.0 < shares.cap <= 1.0:
        out.append(f"cap: must be in (0, 1], got {shares.cap}")
    for t, c in shares.caps.items():
        if not 0.0 < c <= 1.0:
            out.append(f"caps.{t}: must be in (0, 1], got {c}")
    for t, g in shares.guaranteed.items():
        if not 0.0 <= g <= shares.cap_of(t):
            out.append(f"guaranteed.{t}: must be in [0, its cap {shares.cap_of(t)}], got {g}")
    total = sum(shares.guaranteed.values())
    if total > 1.0 + 1e-9:
        out.append(f"guaranteed: the shares add up to {total:g}, more than 1")
    return out


@dataclass(frozen=True, slots=True)
class ShareFigures:
    """What the check reads of a pool now: its usable blocks U, its free blocks F (after the
    ledgers), each tenant's blocks held, and the tenants with requests waiting in the queue."""

    usable_blocks: int
    free_blocks: int
    held: Mapping[str, int]
    waiting: Collection[str] = ()

    def protected(self, shares: TenantShares, tenant: str) -> int:
        """Σ over the other active tenants g of max(0, guaranteed_blocks(g) − held(g))."""
        total = 0
        for g in shares.guaranteed:
            if g == tenant:
                continue
            held = self.held.get(g, 0)
            if held <= 0 and g not in self.waiting:
                continue  # idle: it protects nothing
            total += max(0, shares.guaranteed_blocks(g, self.usable_blocks) - held)
        return total


def share_verdict(
    shares: TenantShares,
    tenant: str,
    need_blocks: int,
    figures: ShareFigures,
    pressure: Pressure | None,
    retry_after_s: int,
) -> Wait | None:
    """The ``Wait`` that holds back a request of ``tenant`` needing ``need_blocks``, or None
    when its share allows it (module docstring)."""
    u = figures.usable_blocks
    if u <= 0 or need_blocks <= 0:
        return None
    held = figures.held.get(tenant, 0)
    cap = shares.cap_blocks(tenant, u)
    if held + need_blocks > cap:
        message = (
            f"Tenant {tenant!r} holds {held} of the pool's KV-cache blocks; this request "
            f"needs {need_blocks} more, over its cap of {cap} ({shares.cap_of(tenant):g} of "
            f"{u}). Retry after {retry_after_s} s."
        )
        return Wait(pressure, EXCEEDED, message, retry_after_s)
    protected = figures.protected(shares, tenant)
    if protected and need_blocks > figures.free_blocks - protected:
        message = (
            f"The pool's {figures.free_blocks} free KV-cache blocks include {protected} "
            f"guaranteed to other tenants; this request needs {need_blocks}. Retry after "
            f"{retry_after_s} s."
        )
        return Wait(pressure, RESERVED, message, retry_after_s)
    return None
