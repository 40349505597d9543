"""``ice serve --leader-elect`` (ext_proc/serve/lease.py, lease_elector.py) against the
Kubernetes client's real election: its ``LeaderElection`` loop decides, over an in-memory lock
that keeps the lock interface's contract (a write carries the version it read, as a Lease's
resourceVersion), the only stand-in, since no API server runs here. Health is grpc_health's
own asyncio servicer, set by ``serve_elected`` as the server sets it.

Then the client's own ``LeaseLock`` over a hand-written ``CoordinationV1Api`` that stores the
client's ``V1Lease`` models: what ICE writes into a Lease, what it reads back, the timeouts,
the release. Waits poll with generous deadlines; no test asserts how long a step took.
"""

from __future__ import annotations

import asyncio
import copy
import datetime
import json
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from grpc_health.v1 import health_pb2
from grpc_health.v1._async import HealthServicer
from kubernetes import client
from kubernetes.client.rest import ApiException
from kubernetes.leaderelection.leaderelectionrecord import LeaderElectionRecord

from ext_proc import cli
from ext_proc.serve import lease
from ext_proc.serve.lease import (
    ELECTED_SERVICES,
    LIVENESS_SERVICE,
    LeaseError,
    kubernetes_lock,
    release_lease,
    serve_elected,
)
from ext_proc.serve.lease_elector import LeaderElector, LeaseTimings

FAST = LeaseTimings(lease_duration_s=1, renew_deadline_s=0.6, retry_period_s=0.1)
# A lease that expires late: what happens before the expiry is ICE's doing, not the lease's.
SLOW_LEASE = LeaseTimings(lease_duration_s=10, renew_deadline_s=8, retry_period_s=0.1)
WAIT_S = 10.0
NAME, NAMESPACE = "ice-leader", "ice-system"


# --- the in-memory lock -------------------------------------------------------------------


class NotFound:
    """The client's error for a missing lock: its body is the API's JSON, code 404."""

    body = json.dumps({"kind": "Status", "code": 404})
    reason = "Not Found"


@dataclass
class Store:
    """One lock object: its record and version; identities whose writes are refused."""

    record: LeaderElectionRecord | None = None
    version: int = 0
    refused: set[str] = field(default_factory=set)
    broken_reads: int = 0  # this many reads raise (an unreachable API server)
    mutex: threading.Lock = field(default_factory=threading.Lock)

    def put(self, record: LeaderElectionRecord) -> None:
        with self.mutex:
            self.record = copy.copy(record)
            self.version += 1

    def holder(self) -> str | None:
        with self.mutex:
            return None if self.record is None else self.record.holder_identity


@dataclass
class MemoryLock:
    """The lock interface of kubernetes.leaderelection over a ``Store``."""

    store: Store
    identity: str
    name: str = NAME
    namespace: str = NAMESPACE
    read_version: int | None = None

    def get(self, name: str, namespace: str) -> tuple[bool, Any]:
        with self.store.mutex:
            if self.store.broken_reads > 0:
                self.store.broken_reads -= 1
                raise ConnectionError("api server unreachable")
            if self.store.record is None:
                return False, NotFound()
            self.read_version = self.store.version
            return True, copy.copy(self.store.record)

    def create(self, name: str, namespace: str, election_record: Any) -> bool:
        with self.store.mutex:
            if self.identity in self.store.refused or self.store.record is not None:
                return False
            self.store.record = copy.copy(election_record)
            self.store.version += 1
            self.read_version = self.store.version
            return True

    def update(self, name: str, namespace: str, updated_record: Any) -> bool:
        with self.store.mutex:
            if self.identity in self.store.refused or self.read_version != self.store.version:
                return False
            self.store.record = copy.copy(updated_record)
            self.store.version += 1
            self.read_version = self.store.version
            return True

    def release(self) -> bool:
        with self.store.mutex:
            if self.store.record is None or self.store.record.holder_identity != self.identity:
                return False
            self.store.record = LeaderElectionRecord(None, None, None, None)  # type: ignore[no-untyped-call]
            self.store.version += 1
            return True


# --- candidates: a health servicer each, set by serve_elected -------------------------------


@dataclass
class Candidate:
    identity: str
    health: HealthServicer
    elector: LeaderElector

    async def status(self, service: str) -> int:
        reply = await self.health.Check(health_pb2.HealthCheckRequest(service=service), None)
        return int(reply.status)

    async def serving(self) -> bool:
        """Both elected services SERVING (True) or both NOT_SERVING (False)."""
        got = {await self.status(s) for s in ELECTED_SERVICES}
        assert len(got) == 1, f"{self.identity}: the elected services disagree: {got}"
        return got == {health_pb2.HealthCheckResponse.SERVING}


async def candidate(identity: str, lock: Any, timings: LeaseTimings, **kw: Any) -> Candidate:
    health = HealthServicer()
    elector = await serve_elected(health, lock, timings=timings, **kw)
    return Candidate(identity, health, elector)


async def until(what: str, check: Callable[[], Awaitable[bool]], timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        await asyncio.sleep(0.02)


async def leaders(cands: list[Candidate]) -> list[str]:
    return [c.identity for c in cands if await c.serving()]


async def stop_all(cands: list[Candidate]) -> None:
    for c in cands:
        await c.elector.aclose()


# --- the election -----------------------------------------------------------------------------


def test_two_candidates_exactly_one_leads_and_serves() -> None:
    async def main() -> None:
        store = Store()
        cands = [await candidate(i, MemoryLock(store, i), FAST) for i in ("ice-a", "ice-b")]
        try:
            for c in cands:  # standby first, alive throughout
                assert await c.status(LIVENESS_SERVICE) == health_pb2.HealthCheckResponse.SERVING

            async def one_leader() -> bool:
                return len(await leaders(cands)) == 1

            await until("one candidate SERVING", one_leader)
            (leader,) = await leaders(cands)
            assert store.holder() == leader
            # Over two lease durations the leader renews and nobody else serves.
            end = time.monotonic() + 2 * FAST.lease_duration_s
            while time.monotonic() < end:
                assert await leaders(cands) == [leader]
                await asyncio.sleep(0.02)
            assert [c.elector.leading for c in cands] == [c.identity == leader for c in cands]
            for c in cands:
                assert await c.status(LIVENESS_SERVICE) == health_pb2.HealthCheckResponse.SERVING
        finally:
            await stop_all(cands)

    asyncio.run(main())


def test_a_leader_whose_renewals_fail_stands_by_and_the_other_takes_over() -> None:
    # Lease 2 s: the leader must have stepped down (after the 0.6 s renew deadline) well
    # before the other may take the expired lease.
    timings = LeaseTimings(lease_duration_s=2, renew_deadline_s=0.6, retry_period_s=0.1)

    async def main() -> None:
        store = Store()
        a = await candidate("ice-a", MemoryLock(store, "ice-a"), timings)

        async def a_leads() -> bool:
            return await a.serving()

        await until("ice-a leading", a_leads)
        b = await candidate("ice-b", MemoryLock(store, "ice-b"), timings)
        cands = [a, b]
        try:
            store.refused.add("ice-a")  # the API server refuses ice-a's renewals from now on
            both_seen = False

            async def b_took_over() -> bool:
                nonlocal both_seen
                now = await leaders(cands)
                both_seen = both_seen or len(now) == 2
                return now == ["ice-b"]

            await until("ice-b leading, ice-a standing by", b_took_over)
            assert not both_seen, "both replicas SERVING at once"
            assert store.holder() == "ice-b"
            assert not a.elector.leading
        finally:
            await stop_all(cands)

    asyncio.run(main())


def test_a_leader_that_sees_another_holder_stands_by_before_its_renew_deadline() -> None:
    async def main() -> None:
        store = Store()
        a = await candidate("ice-a", MemoryLock(store, "ice-a"), SLOW_LEASE)
        try:

            async def leading() -> bool:
                return await a.serving()

            async def standing_by() -> bool:
                return not await a.serving()

            await until("ice-a leading", leading)
            now = str(datetime.datetime.now())
            store.put(LeaderElectionRecord("intruder", "10", now, now))  # type: ignore[no-untyped-call]
            # The client alone would keep trying for its 8 s renew deadline.
            await until("ice-a standing by", standing_by, timeout_s=SLOW_LEASE.renew_deadline_s / 2)
            assert store.holder() == "intruder", "the standby leaves a valid lease alone"
        finally:
            await a.elector.aclose()

    asyncio.run(main())


def test_stop_releases_the_lease_so_the_standby_takes_over_before_it_expires() -> None:
    async def main() -> None:
        store = Store()
        locks = {i: MemoryLock(store, i) for i in ("ice-a", "ice-b")}
        cands = [
            await candidate(i, lock, SLOW_LEASE, release=lock.release) for i, lock in locks.items()
        ]
        try:

            async def one_leader() -> bool:
                return len(await leaders(cands)) == 1

            await until("one leader", one_leader)
            (name,) = await leaders(cands)
            (leader,) = [c for c in cands if c.identity == name]
            (other,) = [c for c in cands if c.identity != name]
            await leader.elector.aclose()
            assert not await leader.serving(), "NOT_SERVING when stop returns"
            assert store.holder() != name

            async def other_leads() -> bool:
                return await other.serving()

            # The lease (10 s) has not expired: the release let the standby in.
            await until(
                "the standby leading", other_leads, timeout_s=SLOW_LEASE.lease_duration_s / 2
            )
            assert store.holder() == other.identity
            await asyncio.sleep(0.3)
            assert not await leader.serving(), "a stopped elector never leads again"
        finally:
            await stop_all(cands)

    asyncio.run(main())


def test_an_unreachable_api_server_delays_the_election_and_never_ends_it() -> None:
    async def main() -> None:
        store = Store(broken_reads=5)
        a = await candidate("ice-a", MemoryLock(store, "ice-a"), FAST)
        try:

            async def leading() -> bool:
                return await a.serving()

            await until("ice-a leading once the reads work", leading)
            assert store.broken_reads == 0
        finally:
            await a.elector.aclose()

    asyncio.run(main())


def test_a_write_that_raises_is_a_failed_renewal() -> None:
    class Flaky(MemoryLock):
        broken = False

        def update(self, name: str, namespace: str, updated_record: Any) -> bool:
            if self.broken:
                raise TimeoutError("read timed out")
            return super().update(name, namespace, updated_record)

    async def main() -> None:
        lock = Flaky(Store(), "ice-a")
        a = await candidate("ice-a", lock, FAST)
        try:

            async def leading() -> bool:
                return await a.serving()

            async def standing_by() -> bool:
                return not await a.serving()

            await until("leading", leading)
            lock.broken = True
            await until("standing by", standing_by)
            lock.broken = False
            await until("leading again", leading)
        finally:
            await a.elector.aclose()

    asyncio.run(main())


@pytest.mark.parametrize(
    ("lease_s", "renew_s", "retry_s"),
    [(15, 10, 0), (0.5, 0.3, 0.1), (1.5, 0.6, 0.1), (15, 2.4, 2), (10, 9, 1)],
    ids=["no-retry", "lease-under-1s", "fractional-lease", "renew-under-jitter", "no-margin"],
)
def test_timings_are_checked(lease_s: float, renew_s: float, retry_s: float) -> None:
    with pytest.raises(ValueError):
        LeaseTimings(lease_duration_s=lease_s, renew_deadline_s=renew_s, retry_period_s=retry_s)


def test_default_timings_are_client_gos() -> None:
    t = LeaseTimings()
    assert (t.lease_duration_s, t.renew_deadline_s, t.retry_period_s) == (15, 10, 2)


# --- the client's LeaseLock over a CoordinationV1Api of our own ------------------------------


def api_error(status: int, reason: str) -> ApiException:
    e = ApiException(status=status, reason=reason)
    e.body = json.dumps({"kind": "Status", "code": status, "reason": reason})
    return e


class Coordination:
    """The three Lease calls of ``CoordinationV1Api``, storing ``V1Lease`` models: a replace
    must carry the stored resourceVersion (else 409), a read of a missing Lease is a 404."""

    def __init__(self) -> None:
        self.leases: dict[tuple[str, str], client.V1Lease] = {}
        self.timeouts: list[object] = []
        self.forbidden = False
        self.mutex = threading.Lock()

    def _call(self, kw: dict[str, Any]) -> None:
        self.timeouts.append(kw.get("_request_timeout"))
        if self.forbidden:
            raise api_error(403, "Forbidden")

    def read_namespaced_lease(self, name: str, namespace: str, **kw: Any) -> client.V1Lease:
        with self.mutex:
            self._call(kw)
            if (namespace, name) not in self.leases:
                raise api_error(404, "NotFound")
            return copy.deepcopy(self.leases[(namespace, name)])

    def create_namespaced_lease(self, namespace: str, body: client.V1Lease, **kw: Any) -> Any:
        with self.mutex:
            self._call(kw)
            meta = body.metadata
            name = meta["name"] if isinstance(meta, dict) else meta.name
            if (namespace, name) in self.leases:
                raise api_error(409, "AlreadyExists")
            stored = client.V1Lease(
                metadata=client.V1ObjectMeta(name=name, namespace=namespace, resource_version="1"),
                spec=copy.deepcopy(body.spec),
            )
            self.leases[(namespace, name)] = stored
            return copy.deepcopy(stored)

    def replace_namespaced_lease(
        self, name: str, namespace: str, body: client.V1Lease, **kw: Any
    ) -> Any:
        with self.mutex:
            self._call(kw)
            stored = self.leases[(namespace, name)]
            if body.metadata.resource_version != stored.metadata.resource_version:
                raise api_error(409, "Conflict")
            new = copy.deepcopy(body)
            new.metadata.resource_version = str(int(stored.metadata.resource_version) + 1)
            self.leases[(namespace, name)] = new
            return copy.deepcopy(new)

    def spec(self) -> client.V1LeaseSpec:
        with self.mutex:
            return copy.deepcopy(self.leases[(NAMESPACE, NAME)].spec)


@pytest.fixture
def api() -> Iterator[Coordination]:
    yield Coordination()


def test_lease_lock_writes_the_lease_and_hands_it_over_on_release(api: Coordination) -> None:
    timings = LeaseTimings(lease_duration_s=3, renew_deadline_s=1, retry_period_s=0.1)

    async def main() -> None:
        locks = {i: kubernetes_lock(NAME, NAMESPACE, i, timeout_s=0.5, api=api) for i in "ab"}
        cands = [
            await candidate(i, lock, timings, release=lambda lock=lock: release_lease(lock))
            for i, lock in locks.items()
        ]
        try:

            async def one_leader() -> bool:
                return len(await leaders(cands)) == 1

            await until("one leader", one_leader)
            (name,) = await leaders(cands)
            spec = api.spec()
            assert spec.holder_identity == name
            assert spec.lease_duration_seconds == 3
            assert isinstance(spec.lease_duration_seconds, int)
            for t in (spec.acquire_time, spec.renew_time):
                assert isinstance(t, datetime.datetime)
                assert t.utcoffset() == datetime.timedelta(0), "the wire's instant is UTC"
                age_s = (datetime.datetime.now(datetime.UTC) - t).total_seconds()
                assert -5 < age_s < 5
            first = api.leases[(NAMESPACE, NAME)].metadata.resource_version
            await asyncio.sleep(0.5)
            assert api.leases[(NAMESPACE, NAME)].metadata.resource_version != first, "renewed"
            assert api.spec().acquire_time == spec.acquire_time, "a renewal keeps acquireTime"
            assert set(api.timeouts) == {0.5}, "every call is timed out"

            (leader,) = [c for c in cands if c.identity == name]
            (other,) = [c for c in cands if c.identity != name]
            await leader.elector.aclose()

            async def other_leads() -> bool:
                return await other.serving()

            await until("the standby leading", other_leads, timeout_s=timings.lease_duration_s)
            assert api.spec().holder_identity == other.identity
        finally:
            await stop_all(cands)

    asyncio.run(main())


def test_release_leaves_a_lease_it_does_not_hold(api: Coordination) -> None:
    now = datetime.datetime.now(datetime.UTC)
    api.leases[(NAMESPACE, NAME)] = client.V1Lease(
        metadata=client.V1ObjectMeta(name=NAME, namespace=NAMESPACE, resource_version="7"),
        spec=client.V1LeaseSpec(
            holder_identity="ice-b", lease_duration_seconds=15, acquire_time=now, renew_time=now
        ),
    )
    lock = kubernetes_lock(NAME, NAMESPACE, "ice-a", timeout_s=1, api=api)
    assert release_lease(lock) is False
    assert api.spec().holder_identity == "ice-b"
    mine = kubernetes_lock(NAME, NAMESPACE, "ice-b", timeout_s=1, api=api)
    assert release_lease(mine) is True
    spec = api.spec()
    assert spec.holder_identity is None
    assert spec.lease_duration_seconds == 1
    # What the client's election reads back: no holder, so any candidate takes it at once.
    found, record = mine.get(NAME, NAMESPACE)
    assert found and record.holder_identity is None


def test_a_forbidden_lease_keeps_a_candidate_standing_by(api: Coordination) -> None:
    """RBAC missing: a 403 is not a 404, so the election never creates the Lease."""

    async def main() -> None:
        api.forbidden = True
        a = await candidate("a", kubernetes_lock(NAME, NAMESPACE, "a", timeout_s=1, api=api), FAST)
        try:
            await asyncio.sleep(0.5)
            assert not await a.serving()
            assert api.leases == {}
            api.forbidden = False

            async def leading() -> bool:
                return await a.serving()

            await until("leading once allowed", leading)
        finally:
            await a.elector.aclose()

    asyncio.run(main())


# --- outside a pod ----------------------------------------------------------------------------


def test_outside_a_pod_leader_election_fails_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT", raising=False)
    with pytest.raises(LeaseError) as e:
        lease.load_kubernetes()
    assert "\n" not in str(e.value)
    assert "--leader-elect" in str(e.value)


def test_ice_serve_leader_elect_exits_2_outside_a_pod(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert cli.main(["serve", "--leader-elect", "--address", "127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--leader-elect" in err, err


def test_ice_serve_leader_elect_refuses_several_workers(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["serve", "--leader-elect", "--workers", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--workers" in err, err


def test_the_serve_flags_reach_serve_options(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []
    monkeypatch.setattr(lease, "load_kubernetes", lambda: None)
    monkeypatch.setattr("ext_proc.serve.server.serve", lambda opts: seen.append(opts) or 0)
    argv = ["serve", "--leader-elect", "--lease-name", "mine", "--lease-namespace", "ns"]
    assert cli.main(argv) == 0
    (opts,) = seen
    assert (opts.leader_elect, opts.lease_name, opts.lease_namespace) == (True, "mine", "ns")
    assert cli.main(["serve"]) == 0
    assert (seen[1].leader_elect, seen[1].lease_name, seen[1].lease_namespace) == (
        False,
        "ice-leader",
        None,
    )


def test_identity_and_namespace_come_from_the_downward_api(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    monkeypatch.setenv("POD_NAME", "ice-7d9f-abcde")
    assert lease.pod_identity() == "ice-7d9f-abcde"
    monkeypatch.delenv("POD_NAME")
    assert lease.pod_identity()  # the host name
    monkeypatch.setattr(lease, "SA_NAMESPACE", tmp_path / "namespace")
    monkeypatch.setenv("POD_NAMESPACE", "ice-system")
    assert lease.pod_namespace("explicit") == "explicit"
    assert lease.pod_namespace(None) == "ice-system"
    monkeypatch.delenv("POD_NAMESPACE")
    (tmp_path / "namespace").write_text("from-sa\n")
    assert lease.pod_namespace(None) == "from-sa"
    (tmp_path / "namespace").unlink()
    with pytest.raises(LeaseError):
        lease.pod_namespace(None)


# --- ice serve's worker with --leader-elect --------------------------------------------------


def test_a_serving_worker_answers_health_by_its_lease_and_releases_it_at_sigterm(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ext_proc/serve/server.py's worker as ``ice serve --leader-elect`` runs it, with the Lease
    the in-memory lock (the only stand-in): its gRPC health, read over the network, follows
    the election; SIGTERM releases the lease to the rival."""
    import os
    import signal

    import grpc
    from grpc_health.v1 import health_pb2_grpc

    from ext_proc.lab.stack import free_port
    from ext_proc.serve import server

    store = Store()
    seen: dict[str, Any] = {}

    async def elect_serving(health: Any, **kw: Any) -> LeaderElector:
        seen.update(kw)
        lock = MemoryLock(store, "worker")
        return await serve_elected(health, lock, timings=FAST, release=lock.release)

    monkeypatch.setattr(lease, "elect_serving", elect_serving)
    address = f"127.0.0.1:{free_port()}"
    opts = server.ServeOptions(
        address=address,
        shutdown_grace_s=0.5,
        leader_elect=True,
        lease_name="mine",
        lease_namespace="ns",
    )

    async def main() -> None:
        rival_lock = MemoryLock(store, "rival")
        rival = await candidate("rival", rival_lock, FAST, release=rival_lock.release)

        async def rival_leads() -> bool:
            return await rival.serving()

        await until("the rival leading", rival_leads)
        worker = asyncio.create_task(server._run_worker(opts, address))
        async with grpc.aio.insecure_channel(address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)

            async def status(service: str) -> int | None:
                try:
                    reply = await stub.Check(
                        health_pb2.HealthCheckRequest(service=service), timeout=1
                    )
                except grpc.aio.AioRpcError:
                    return None
                return int(reply.status)

            async def up() -> bool:
                return await status(LIVENESS_SERVICE) == health_pb2.HealthCheckResponse.SERVING

            async def elected() -> bool:
                got = {await status(s) for s in ELECTED_SERVICES}
                return got == {health_pb2.HealthCheckResponse.SERVING}

            await until("the worker answering health", up, timeout_s=60)
            assert seen == {"lease_name": "mine", "lease_namespace": "ns"}
            for s in ELECTED_SERVICES:  # a standby: alive, not serving
                assert await status(s) == health_pb2.HealthCheckResponse.NOT_SERVING
            await rival.elector.aclose()  # the rival releases: the worker takes over
            await until("the worker leading", elected)
            assert store.holder() == "worker"
            os.kill(os.getpid(), signal.SIGTERM)  # the worker's loop handles it
            await asyncio.wait_for(worker, timeout=30)
        assert store.holder() is None, "released at SIGTERM"

    asyncio.run(main())
