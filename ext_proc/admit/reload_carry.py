"""What a pipeline built after a policy reload takes over from the one it replaces.

- ``carried_views``: the in-flight ledger and pool views, when the pools' endpoints are
  unchanged; else new ones, into which the live reservations (and the replicas' shared
  ledger) carry over, so a request passed before the reload releases into the same totals;
- ``carried_prefix``: the live prefix-stability tracker, when its settings are unchanged;
- ``carried_counters``: the tokenizers, when their files and cache size are unchanged (else
  loaded now: a bad file stops start-up or the reload).

Invariant: nothing the old pipeline holds is dropped while a stream may still release into
it; without ``carry`` (start-up) everything is new.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from ext_proc.placement.ledger_shm import LedgerHandle
from ext_proc.placement.poolview import PoolViews
from ext_proc.policy.settings import Policy
from ext_proc.prefix.live import LivePrefix
from ext_proc.schemas import BY_NAME
from ext_proc.tokencount import CounterRegistry

__all__ = ["Replaced", "carried_counters", "carried_prefix", "carried_views"]


class Replaced(Protocol):
    """What is carried over from the pipeline being replaced."""

    policy: Policy
    views: PoolViews
    prefix: LivePrefix | None
    counters: CounterRegistry | None


def carried_views(policy: Policy, carry: Replaced | None, ledger: LedgerHandle | None) -> PoolViews:
    """The in-flight ledger and pool views: the replaced pipeline's when the pools'
    endpoints are unchanged; else new ones, into which live reservations carry over."""
    endpoints = {n: p.backend_endpoints for n, p in policy.pools.items()}
    until_seen = frozenset(n for n, p in policy.pools.items() if p.kv_hold == "seen")
    named = {n: s.named for n, s in policy.tenant_shares.items()}  # their own metrics label
    if carry is None:
        views = PoolViews(endpoints, ledger, until_seen, None)
    elif endpoints == {n: p.backend_endpoints for n, p in carry.policy.pools.items()}:
        views = carry.views
        views.until_seen = until_seen
    else:
        views = PoolViews(endpoints, carry.views.shared, until_seen, carry.views.live)
        views.remote = carry.views.remote  # the replicas' shared ledger (--ledger) too
        views.book = carry.views.book  # and the forecast's trajectories, which release into it
        views.tenants = carry.views.tenants  # and the tenants' blocks held
        views.slo = carry.views.slo  # and the running requests' TPOT targets (admission: slo)
    views.tenants.named = named
    return views


def carried_prefix(policy: Policy, carry: Replaced | None) -> LivePrefix | None:
    """The live prefix_stability_score (ext_proc/prefix/live.py), carried over when its
    settings are unchanged; None when the policy does not track prefixes."""
    if policy.prefix_tracking is None:
        return None
    same = carry is not None and carry.policy.prefix_tracking == policy.prefix_tracking
    return LivePrefix.for_spec(policy.prefix_tracking, carry.prefix if same and carry else None)


def carried_counters(policy: Policy, carry: Replaced | None) -> CounterRegistry | None:
    """The tokenizers (``CounterRegistry``): the replaced pipeline's when their files and
    cache size are unchanged; else loaded now (a bad file stops start-up)."""
    old = carry.policy if carry is not None else None
    if (
        carry is not None
        and old is not None
        and (
            old.tokenizers == policy.tokenizers
            and old.token_count_cache_bytes == policy.token_count_cache_bytes
        )
    ):
        return carry.counters
    if not policy.tokenizers:
        return None
    # each tokenizer's estimate bounds are measured against the adapters' own estimate
    return CounterRegistry(
        dict(policy.tokenizers), policy.token_count_cache_bytes, estimate_request
    )


def estimate_request(api: str, body: Mapping[str, Any]) -> int:
    """The schema adapter's estimate of a request body's input tokens (what
    ``exact_count: needed`` scales), for ``ext_proc.tokencount.calibration``."""
    return BY_NAME[api].features(dict(body)).input_tokens
