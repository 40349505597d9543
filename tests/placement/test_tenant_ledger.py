"""The tenant dimension of the in-flight ledgers (``ext_proc.placement.tenant_ledger``): a
hold that names its tenant counts its blocks as that tenant's in this worker (held, shrunk,
released with the hold, under either ``kv_hold``), in the host's shared memory (other
workers), and in the replicas' Redis ledger (other replicas, real redis-server)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from ext_proc import telemetry
from ext_proc.lab.redis_local import RedisServer
from ext_proc.placement.ledger_redis import TENANT_FIELD, RedisLedger, live_key
from ext_proc.placement.ledger_shm import LedgerHandle, LedgerSegment, endpoint_key
from ext_proc.placement.poolview import PoolViews
from ext_proc.placement.tenant_ledger import TenantLedger, ledger_key
from ext_proc.policy.evaluate import Shape
from ext_proc.policy.settings import Profile
from ext_proc.signals.snapshot import BackendSignals, PoolSnapshot
from tests.builders import forecast_backend

PROFILE = Profile(name="default")
# 11 blocks of 16 tokens: 10 usable. 57 prompt + 40 output = 97 tokens = 7 blocks
SNAPSHOT = PoolSnapshot(
    "chat",
    (BackendSignals("u", 0.0, 0, num_gpu_blocks=11, block_size=16),),
    time.monotonic(),
)
SHAPE = Shape.single(57)


def test_a_hold_with_a_tenant_counts_its_blocks_until_it_is_released() -> None:
    views = PoolViews()
    hold = views.hold(PROFILE, SNAPSHOT, SHAPE, 40, tenant="acme")
    assert hold is not None and hold.blocks == 7 and hold.tenant == "acme"
    assert views.tenants.own == {"chat": {"acme": 7}}
    assert views.tenants.held("chat", {"acme", "zeta"}) == {"acme": 7, "zeta": 0}
    untenanted = views.hold(PROFILE, SNAPSHOT, SHAPE, 40)  # a pool without shares
    assert untenanted is not None and views.tenants.own == {"chat": {"acme": 7}}
    # counted exactly: 57 → 20 prompt tokens, 60 tokens = 4 blocks: 3 given back
    assert views.shrink(hold, PROFILE, SNAPSHOT, Shape.single(20), 40) == 3
    assert views.tenants.own == {"chat": {"acme": 4}}
    views.release(hold)
    views.release(hold)  # idempotent
    assert views.tenants.own == {"chat": {}}


def test_under_kv_hold_seen_the_tenant_still_counts_until_the_stream_ends() -> None:
    views = PoolViews(until_seen=frozenset({"chat"}))
    hold = views.hold(PROFILE, SNAPSHOT, SHAPE, 40, tenant="acme")
    assert hold is not None and not hold.live
    assert views.tenants.held("chat", {"acme"}) == {"acme": 7}
    views.release(hold)
    assert views.tenants.held("chat", {"acme"}) == {"acme": 0}


def test_a_hold_the_shared_ledger_refused_gives_its_tenants_blocks_back() -> None:
    views = PoolViews()
    hold = views.hold(PROFILE, SNAPSHOT, SHAPE, 40, tenant="acme")
    assert hold is not None
    views.unhold(hold)
    assert views.tenants.held("chat", {"acme"}) == {"acme": 0}


def test_blocks_held_is_exported_for_named_tenants_and_summed_as_other() -> None:
    ledger = TenantLedger()
    ledger.named = {"metrics-pool": frozenset({"gold"})}
    ledger.change("metrics-pool", "gold", 5)
    ledger.change("metrics-pool", "x", 3)
    ledger.change("metrics-pool", "y", 4)
    ledger.change("metrics-pool", "x", -3)
    gauge = telemetry.TENANT_BLOCKS_HELD
    assert gauge.labels(pool="metrics-pool", tenant="gold")._value.get() == 5
    assert gauge.labels(pool="metrics-pool", tenant="other")._value.get() == 4


def test_ledger_keys_are_apart_from_endpoint_keys() -> None:
    assert ledger_key("chat", "10.0.0.1:8000") != endpoint_key("chat", "10.0.0.1:8000")
    assert ledger_key("chat", "a") != ledger_key("chat2", "a")
    assert ledger_key("ch", "at") != ledger_key("cha", "t")  # the pool's length is hashed


def test_workers_see_each_others_tenants_through_shared_memory() -> None:
    with LedgerSegment(workers=2) as segment:
        one, two = LedgerHandle(segment.name, 0), LedgerHandle(segment.name, 1)
        try:
            first, second = PoolViews(shared=one), PoolViews(shared=two)
            hold = first.hold(PROFILE, SNAPSHOT, SHAPE, 40, tenant="acme")
            second.hold(PROFILE, SNAPSHOT, SHAPE, 40, tenant="acme")
            assert hold is not None
            # 7 of its own and 7 of the other worker's; the endpoint totals are unchanged
            assert second.tenants.held("chat", {"acme", "b"}) == {"acme": 14, "b": 0}
            assert two.others_live() == {endpoint_key("chat", ""): 7, ledger_key("chat", "acme"): 7}
            first.release(hold)
            assert second.tenants.held("chat", {"acme"}) == {"acme": 7}
        finally:
            one.close()
            two.close()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> Iterator[str]:
    if not redis_server.running:
        redis_server.restart()
    redis_server.client().flushdb()
    yield redis_server.url


def _replica(url: str) -> tuple[PoolViews, RedisLedger]:
    views = PoolViews()
    live = views.live
    ledger = RedisLedger(
        url,
        deadline_s=0.5,
        own_totals=lambda: live,
        own_tenants=views.tenants.totals,
        view_age_ms=lambda _pool: 0,
        pools=lambda: ("chat",),
    )
    views.remote = views.tenants.remote = ledger
    return views, ledger


def test_replicas_count_each_others_tenants_through_redis(redis_url: str) -> None:
    async def run() -> None:
        (a, ra), (b, rb) = _replica(redis_url), _replica(redis_url)
        await ra.start()
        await rb.start()
        try:
            hold = a.hold(PROFILE, SNAPSHOT, SHAPE, 40, tenant="acme")
            assert hold is not None
            await asyncio.sleep(0.1)  # the tenant's total is written in the background
            await rb.sync("chat", 0)
            assert b.tenants.held("chat", {"acme"}) == {"acme": 7}
            # the endpoint figures do not see the tenant's field
            assert rb.live("chat") == {} and rb.tenants("chat") == {"acme": 7}
            # the heartbeat rewrites the replica's own fields whole, tenants included
            await ra._beat()
            fields = await ra.client.hgetall(live_key("chat"))
            assert {k.decode().split("|", 1)[1] for k in fields} == {"", TENANT_FIELD + "acme"}
            await rb.sync("chat", 0)
            assert rb.live("chat") == {"": 7} and rb.tenants("chat") == {"acme": 7}
            a.release(hold)
            await asyncio.sleep(0.1)
            await rb.sync("chat", 0)
            assert b.tenants.held("chat", {"acme"}) == {"acme": 0}
            # while Redis does not answer, a replica counts its own (1 + peers) times
            hold = b.hold(PROFILE, SNAPSHOT, SHAPE, 40, tenant="acme")
            rb._down("sync", ConnectionError("gone"))
            assert rb.peers == 1 and b.tenants.held("chat", {"acme"}) == {"acme": 14}
        finally:
            await ra.close()
            await rb.close()

    asyncio.run(run())


def test_under_the_forecast_a_tenant_counts_its_requests_predicted_total() -> None:
    views = PoolViews()
    forecast = Profile(name="default", admission="forecast")
    snap = PoolSnapshot("pool", (forecast_backend(0.0),), time.monotonic())
    fit = views.endpoints(forecast, snap)[0].fit
    predicted = views.held_blocks(forecast, snap, fit, SHAPE, 2000)
    whole = views.held_blocks(PROFILE, snap, fit, SHAPE, 2000)  # reserve: prompt + 2,000
    assert whole == 129  # ceil((57 + 2000) / 16)
    assert predicted < whole  # the lengths the backend reported predict far less
    hold = views.hold(forecast, snap, SHAPE, 2000, tenant="acme")
    assert hold is not None and hold.blocks == predicted
    assert views.tenants.held("pool", {"acme"}) == {"acme": predicted}
    views.release(hold)
    assert views.tenants.held("pool", {"acme"}) == {"acme": 0}
