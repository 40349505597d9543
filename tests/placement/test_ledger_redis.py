"""Several ICE replicas on one shared ledger in a real Redis (``ext_proc.placement.ledger_redis``,
``ext_proc.admit.shared_ledger``): N replicas admit no more than one would, reservations race
safely, a dead replica's reservations stop counting after its TTL, and a Redis that dies or hangs
turns the ledger local (and back) without failing a request."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest

from ext_proc import telemetry
from ext_proc.admit.backlog import Backlog
from ext_proc.admit.pipeline import BodyVerdict, Pipeline, RequestFacts
from ext_proc.admit.queue import AdmissionQueue
from ext_proc.admit.shared_ledger import admit_shared, view_age_ms
from ext_proc.admit.stream import Stream
from ext_proc.lab.redis_local import RedisServer
from ext_proc.placement.ledger_redis import (
    SLOW_CALLS_DOWN,
    LedgerURLError,
    RedisLedger,
    Reserve,
    check_ledger_url,
    live_key,
)
from ext_proc.policy.load import parse_policy
from ext_proc.schemas import OPENAI_CHAT
from ext_proc.signals.snapshot import BackendSignals, PoolSnapshot
from tests.builders import admission


def aio(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Run an async test body in its own event loop (the suite has no asyncio plugin)."""

    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(test(*args, **kwargs))

    return run


# "x" * 200 → 57 input tokens; + 40 output = 97 tokens = 7 blocks of 16
BODY = json.dumps({"messages": [{"role": "user", "content": "x" * 200}], "max_tokens": 40})
POLICY = "profiles: {default: {on_kv_shortfall: shed}}\n"


def backend(gpu_blocks: int) -> BackendSignals:
    """An idle backend: gpu_blocks − 1 usable (vLLM keeps a null block), all free."""
    return BackendSignals(
        url="u",
        kv_cache_usage=0.0,
        num_requests_waiting=0,
        num_gpu_blocks=gpu_blocks,
        block_size=16,
    )


class Replica:
    """One ICE replica: its pipeline, judging against ``view``, and its shared-ledger handle."""

    def __init__(self, url: str, view: dict[str, PoolSnapshot], ttl_s: float = 3.0) -> None:
        self.view = view
        self.pipeline = Pipeline(parse_policy(POLICY), lambda _: view["now"])
        live = self.pipeline.views.live
        self.ledger = RedisLedger(
            url,
            deadline_s=0.5,  # generous: a loaded test machine must not fall back by accident
            ttl_s=ttl_s,
            own_totals=lambda: live,
            view_age_ms=lambda _pool: view_age_ms(view["now"]),
            pools=lambda: ("default",),
        )
        self.pipeline.views.remote = self.ledger

    async def admit(self) -> tuple[str, BodyVerdict]:
        """BODY judged, held and reserved as the servicer does: "decision:reason"."""
        route = self.pipeline.router.resolve([])
        facts = RequestFacts(adapter=OPENAI_CHAT, priority="standard")
        queue = AdmissionQueue()
        stream = Stream(Backlog(), self.pipeline.views, queue)
        committing = admission(self.pipeline, route, facts, queue, stream)
        verdict = self.pipeline.on_body(route, facts, BODY.encode())
        assert verdict is not None
        if self.ledger.active:
            verdict, hold = await admit_shared(self.pipeline, route, facts, stream, verdict)
            committing.commit(verdict, held=hold, shared=True)
        else:
            committing.commit(verdict)
        self.stream = stream
        assert verdict.decision is not None
        return f"{verdict.decision.decision}:{verdict.decision.reason}", verdict

    @staticmethod
    def end(stream: Stream) -> None:
        stream.close()  # the servicer's finally: the stream's hold is released


@pytest.fixture
def redis_url(redis_server: RedisServer) -> Iterator[str]:
    if not redis_server.running:  # a test killed it and failed before restarting it
        redis_server.restart()
    redis_server.client().flushdb()
    yield redis_server.url


@pytest.fixture
def view() -> dict[str, PoolSnapshot]:
    return {"now": PoolSnapshot("default", (backend(11),), time.monotonic() - 0.5)}


async def started(*replicas: Replica) -> None:
    for r in replicas:
        await r.ledger.start()
        assert r.ledger.active


async def closed(*replicas: Replica) -> None:
    for r in replicas:
        await r.ledger.close()


@aio
async def test_two_replicas_on_one_redis_admit_what_one_would(
    redis_url: str, view: dict[str, PoolSnapshot]
) -> None:
    # 10 usable blocks; each request needs 7: one fits, whichever replica judges it
    a, b = Replica(redis_url, view), Replica(redis_url, view)
    await started(a, b)
    try:
        assert (await a.admit())[0] == "pass:ok"
        assert (await b.admit())[0] == "reject:kv_exhausted"  # A's 7 blocks count in B
        a.end(a.stream)  # A's request is over: its release reaches Redis
        await asyncio.sleep(0.05)
        await b.ledger.sync("default", view_age_ms(view["now"]))
        view["now"] = PoolSnapshot("default", (backend(11),), time.monotonic())
        assert (await b.admit())[0] == "pass:ok"
    finally:
        await closed(a, b)


@aio
async def test_many_concurrent_admissions_across_replicas_never_exceed_the_pool(
    redis_url: str, view: dict[str, PoolSnapshot]
) -> None:
    # 100 usable blocks, 7 per request: at most 14 fit; 4 replicas × 12 requests at once
    view["now"] = PoolSnapshot("default", (backend(101),), time.monotonic() - 0.5)
    replicas = [Replica(redis_url, view) for _ in range(4)]
    await started(*replicas)
    try:
        got = await asyncio.gather(*(r.admit() for r in replicas for _ in range(12)))
        passed = [v for g, v in got if g == "pass:ok"]
        assert 7 * len(passed) <= 100
        assert len(passed) >= 10  # conflicts are judged again, not refused blindly
        import redis

        totals = redis.Redis.from_url(redis_url).hgetall(live_key("default"))
        assert sum(int(v) for v in totals.values()) == 7 * len(passed)
    finally:
        await closed(*replicas)


@aio
async def test_a_dead_replicas_reservations_stop_counting_after_its_ttl(
    redis_url: str, view: dict[str, PoolSnapshot]
) -> None:
    dead, alive = Replica(redis_url, view, ttl_s=0.6), Replica(redis_url, view)
    await started(dead, alive)
    try:
        assert (await dead.admit())[0] == "pass:ok"
        assert dead.ledger._task is not None
        dead.ledger._task.cancel()  # it crashed: no heartbeat, no release, no goodbye
        assert (await alive.admit())[0] == "reject:kv_exhausted"
        view["now"] = PoolSnapshot("default", (backend(11),), time.monotonic())
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            await alive.ledger.sync("default", view_age_ms(view["now"]))
            if not alive.ledger.has_others("default"):
                break
        assert (await alive.admit())[0] == "pass:ok"  # its capacity is back
    finally:
        await closed(alive)
        await dead.ledger.client.aclose()


@aio
async def test_only_entries_newer_than_the_view_count_by_redis_time(
    redis_url: str, view: dict[str, PoolSnapshot]
) -> None:
    a, b = Replica(redis_url, view), Replica(redis_url, view)
    await started(a, b)
    try:
        ok = await a.ledger.reserve(Reserve("default", "", 5, 0, view_age_ms=0))  # not live
        assert ok
        await asyncio.sleep(0.3)
        await b.ledger.sync("default", view_age_ms=100)  # a view taken after A's entry
        assert b.ledger.unseen("default") == {}
        await b.ledger.sync("default", view_age_ms=5_000)  # a view older than it
        assert b.ledger.unseen("default") == {"": 5}
        await a.ledger.sync("default", view_age_ms=5_000)  # a replica never counts itself
        assert a.ledger.unseen("default") == {}
    finally:
        await closed(a, b)


@aio
async def test_redis_killed_mid_run_turns_the_ledger_local_and_it_comes_back(
    redis_server: RedisServer, redis_url: str, view: dict[str, PoolSnapshot]
) -> None:
    a = Replica(redis_url, view)
    await started(a)
    errors = telemetry.LEDGER_ERRORS.labels(op="reserve")
    before = errors._value.get()
    try:
        assert (await a.admit())[0] == "pass:ok"
        redis_server.kill()
        a.end(a.stream)
        view["now"] = PoolSnapshot("default", (backend(11),), time.monotonic())
        assert (await a.admit())[0] == "pass:ok"  # judged with the local ledger
        assert not a.ledger.active
        assert (
            errors._value.get() + telemetry.LEDGER_ERRORS.labels(op="release")._value.get() > before
        )
        gauge = telemetry.LEDGER_BACKEND
        assert gauge.labels(backend="local")._value.get() == 1
        redis_server.restart()
        deadline = time.monotonic() + 10
        while not a.ledger.active and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.1)  # the heartbeat's job
        assert a.ledger.active and gauge.labels(backend="redis")._value.get() == 1
        import redis

        # the heartbeat rewrites this replica's live total (the request judged while down)
        # every beat: within a few beats of coming back, however loaded the machine
        want = {f"{a.ledger.replica}|": 7}
        client = redis.Redis.from_url(redis_url)
        got: dict[str, int] = {}
        while time.monotonic() < deadline + 5:
            got = {k.decode(): int(v) for k, v in client.hgetall(live_key("default")).items()}
            if got == want:
                break
            await asyncio.sleep(0.1)
        assert got == want
    finally:
        await closed(a)


@aio
async def test_while_redis_is_away_a_replica_counts_its_own_ledger_once_per_replica_alive(
    redis_server: RedisServer, redis_url: str, view: dict[str, PoolSnapshot]
) -> None:
    # 30 usable blocks, 7 per request: one ICE alone admits 4 (28 blocks)
    view["now"] = PoolSnapshot("default", (backend(31),), time.monotonic() - 0.5)
    a, b = Replica(redis_url, view), Replica(redis_url, view)
    await started(a, b)
    try:
        assert (await a.admit())[0] == "pass:ok"
        assert a.ledger.peers == 1  # B is alive
        redis_server.kill()
        await asyncio.sleep(1.5)  # A's heartbeat finds Redis gone: the ledger is local
        assert not a.ledger.active and a.ledger.fallback_factor == 2
        # A's 7 blocks count for B's share too: 14 + 7 ≤ 30 passes, 28 + 7 does not
        assert (await a.admit())[0] == "pass:ok"
        assert (await a.admit())[0] == "reject:kv_exhausted"
    finally:
        redis_server.restart()
        await closed(a, b)


@aio
async def test_a_redis_that_hangs_costs_each_request_its_deadline_then_the_ledger_turns_local() -> (
    None
):
    # a TCP server that accepts and never answers
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    stop = threading.Event()

    def accept() -> None:
        conns = []
        listener.settimeout(0.1)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                conns.append(listener.accept()[0])
        for c in conns:
            c.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        ledger = RedisLedger(f"redis://127.0.0.1:{port}/0", deadline_s=0.05)
        ledger.active = True  # as if it had answered before it hung
        r = Reserve("default", "", 7, 7, 0, slack=3, checked=("",))
        assert await ledger.reserve(r)  # past the deadline: the local ledger holds it
        assert ledger.active  # one slow call is a blip
        for _ in range(SLOW_CALLS_DOWN - 1):
            assert await ledger.reserve(r)
        assert not ledger.active  # several in a row: no request waits on it again
        await ledger.client.aclose()
    finally:
        stop.set()
        thread.join()
        listener.close()


@aio
async def test_a_stream_cancelled_while_its_reservation_is_on_the_wire_releases_its_hold(
    view: dict[str, PoolSnapshot],
) -> None:
    listener = socket.socket()  # a Redis that accepts and never answers
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    try:
        r = Replica(f"redis://127.0.0.1:{listener.getsockname()[1]}/0", view)
        r.ledger.deadline_s = 30.0
        r.ledger.active = True  # as if it had answered before it hung
        route = r.pipeline.router.resolve([])
        facts = RequestFacts(adapter=OPENAI_CHAT, priority="standard")
        stream = Stream(Backlog(), r.pipeline.views, AdmissionQueue())
        verdict = r.pipeline.on_body(route, facts, BODY.encode())
        assert verdict is not None
        task = asyncio.ensure_future(admit_shared(r.pipeline, route, facts, stream, verdict))
        await asyncio.sleep(0.3)
        assert r.pipeline.views.live["default"][""] == 7  # held, waiting on Redis
        task.cancel()  # Envoy closed the stream (the client left)
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert stream.hold is not None  # the servicer's finally releases what the stream holds
        r.end(stream)
        assert r.pipeline.views.live["default"][""] == 0
        await r.ledger.client.aclose()
    finally:
        listener.close()


@aio
async def test_an_unreachable_redis_at_start_starts_local(caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    ledger = RedisLedger(f"redis://127.0.0.1:{port}/0")
    await ledger.start()
    try:
        assert not ledger.active
        assert any("unreachable at start" in r.getMessage() for r in caplog.records)
    finally:
        await ledger.close()


def test_a_malformed_ledger_url_is_one_line_naming_it() -> None:
    with pytest.raises(LedgerURLError, match="want redis://"):
        check_ledger_url("http://example:6379")
    with pytest.raises(LedgerURLError, match="--ledger"):
        check_ledger_url("redis://host:notaport/0")
    assert check_ledger_url("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"
    got = subprocess.run(
        [sys.executable, "-m", "ext_proc.cli", "serve", "--ledger", "mysql://x"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert got.returncode == 2
    assert got.stderr.strip().count("\n") == 0 and "--ledger 'mysql://x'" in got.stderr
