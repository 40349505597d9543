"""The tenant dimension of the in-flight ledgers: the KV blocks each tenant's live requests
hold in a pool (``ext_proc.policy.tenant_share`` reads them).

- **this worker**: ``own[pool][tenant]``, the sum of the blocks of its unreleased holds
  that carry that tenant (``Hold.tenant``; ``ext_proc.placement.holding`` adds, shrinks
  and releases them with the hold itself, whatever ``kv_hold`` says: a tenant's share
  counts what its requests hold until their streams end);
- **the host's other workers** (``--workers N``): each worker publishes its total per
  (pool, tenant) as a live total in the shared-memory ledger under ``ledger_key(pool,
  tenant)`` (``ext_proc.placement.ledger_shm``: a total, not a delta; a key space apart from
  the endpoints'); a worker reads the others' totals for the tenants it asks about;
- **the other replicas** (``--ledger redis://``): each replica writes its totals into the
  pool's live hash under the field ``<replica>|<TENANT_FIELD><tenant>``
  (``ext_proc.placement.ledger_redis``), which its mirror keeps apart from the endpoints'.
  While Redis does not answer, this worker's own totals count ``1 + peers`` times
  (``RedisLedger.fallback_factor``), as its endpoint totals do.

``held(pool, tenants)``: tenant → blocks held, this worker's and the others'.
``waiting_in(pool)``: the tenants with requests waiting in this worker's admission queue
(``ext_proc.admit.queue`` tells it; the queue is per worker, so is this).

Invariant: ``own[pool][tenant]`` ≥ 0, zeros removed; every change of it is published to the
host's shared memory and the replicas' ledger (when they are set) as the new total.
"""

from __future__ import annotations

import functools
import hashlib
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from ext_proc import telemetry
from ext_proc.placement.ledger_redis import TENANT_FIELD
from ext_proc.placement.ledger_shm import LedgerHandle

if TYPE_CHECKING:
    from ext_proc.placement.ledger_redis import RedisLedger

__all__ = ["TENANT_FIELD", "TenantLedger", "ledger_key"]


@functools.lru_cache(maxsize=4096)
def ledger_key(pool: str, tenant: str) -> int:
    """The 63-bit key of (pool, tenant) in the host's shared-memory ledger: blake2b with its
    own personalisation, so it never equals an endpoint's key."""
    raw = pool.encode()
    digest = hashlib.blake2b(
        len(raw).to_bytes(4, "little") + raw + tenant.encode(),
        digest_size=8,
        person=b"ice-tenant",
    ).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


class TenantLedger:
    """Blocks held per (pool, tenant): this worker's, and the others' on request."""

    def __init__(self) -> None:
        self.own: dict[str, dict[str, int]] = {}
        self.shared: LedgerHandle | None = None
        self.remote: RedisLedger | None = None
        # pool → tenants with their own metrics label (the others: "other")
        self.named: dict[str, frozenset[str]] = {}
        # pool → tenant → its requests waiting in this worker's admission queue (no zeros)
        self.waiting: dict[str, dict[str, int]] = {}

    def wait_started(self, pool: str, tenant: str) -> None:
        """A request of ``tenant`` waits in this worker's queue for ``pool``."""
        tenants = self.waiting.setdefault(pool, {})
        tenants[tenant] = tenants.get(tenant, 0) + 1

    def wait_ended(self, pool: str, tenant: str) -> None:
        """A request ``wait_started`` left the queue."""
        tenants = self.waiting.get(pool, {})
        left = tenants.get(tenant, 0) - 1
        if left > 0:
            tenants[tenant] = left
        else:
            tenants.pop(tenant, None)

    def waiting_in(self, pool: str) -> frozenset[str]:
        """The tenants with requests waiting in this worker's queue for ``pool``."""
        return frozenset(self.waiting.get(pool, ()))

    def change(self, pool: str, tenant: str, delta: int) -> None:
        """This worker's blocks of ``tenant`` in ``pool`` change by ``delta``; published."""
        if not delta:
            return
        tenants = self.own.setdefault(pool, {})
        total = max(0, tenants.get(tenant, 0) + delta)
        if total:
            tenants[tenant] = total
        else:
            tenants.pop(tenant, None)
        if self.shared is not None:
            self.shared.publish_live(ledger_key(pool, tenant), total, time.monotonic())
        if self.remote is not None:
            self.remote.released(pool, TENANT_FIELD + tenant, total)
        named = self.named.get(pool, frozenset())
        if tenant in named:
            telemetry.TENANT_BLOCKS_HELD.labels(pool=pool, tenant=tenant).set(total)
        else:  # every tenant the policy does not name, summed
            other = sum(b for t, b in tenants.items() if t not in named)
            telemetry.TENANT_BLOCKS_HELD.labels(pool=pool, tenant="other").set(other)

    def totals(self) -> dict[str, dict[str, int]]:
        """pool → tenant → this worker's blocks (the replicas' heartbeat rewrites them)."""
        return self.own

    def held(self, pool: str, tenants: Iterable[str]) -> dict[str, int]:
        """Tenant → the blocks ``tenants`` hold in ``pool``: this worker's and the others'
        (the replicas' mirror while Redis answers, else the host's shared memory)."""
        own = self.own.get(pool, {})
        names = set(tenants)
        out = {t: own.get(t, 0) for t in names}
        remote = self.remote
        if remote is not None and remote.active:
            theirs = remote.tenants(pool)
            for t in names:
                out[t] += theirs.get(t, 0)
        elif remote is not None and remote.fallback_factor > 1:
            return {t: b * remote.fallback_factor for t, b in out.items()}
        elif self.shared is not None:
            others = self.shared.others_live()
            for t in names:
                out[t] += others.get(ledger_key(pool, t), 0)
        return out
