"""``ice serve``: the grpc.aio ext_proc server, its health service, workers and shutdown.

- Address: ``HOST:PORT``, ``[IPv6]:PORT`` or ``unix:PATH``. With ``--workers N`` (N > 1)
  worker i listens on ``PORT + i`` (or ``PATH.i``): Envoy spreads streams over the workers as
  one endpoint each, and a port clash fails loudly (SO_REUSEPORT is off).
- gRPC message limits are raised to ``max_body_bytes`` + 1 MiB so buffered bodies up to the
  limit (8 MiB by default, Envoy's buffer is set to match) pass.
- Health: NOT_SERVING until the worker can judge in every lane (its helper process has
  loaded the policy: 1–5 s here; it serves without it after ``HELPER_START_S``), then
  SERVING. SIGTERM/SIGINT: health turns NOT_SERVING, new streams are refused, in-flight streams get
  ``shutdown_grace_s`` to finish, then the process exits 0.
- Policy hot reload (``ext_proc.serve.reload``): the policy file is watched (every 0.5 s; a
  ConfigMap's ``..data`` swap too) and SIGHUP reloads it. A valid new policy replaces the old
  one in every worker in one assignment (a stream keeps the policy it opened with); a bad one
  is refused, logged with the field, counted, and the last good policy keeps serving. With
  one worker it watches the file; with several the supervisor watches, updates its collector
  (pools added or removed; unchanged pools keep their history) and sends each worker SIGHUP.
- Semantic truncation: when a profile enables it, one embedding worker per host
  (``ext_proc.truncate.host``) is started and ready before the workers serve; every worker
  talks to it over a Unix socket.
- One collector per host (``ext_proc.signals.collector``): in the worker itself when there is
  one worker, else in the supervisor, which publishes through shared memory
  (``ext_proc.signals.shm``) to every worker. The request path only reads snapshots.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import signal
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Protocol

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from ext_proc.admit.backlog import DEFAULT_MAX_INFLIGHT_BYTES, DEFAULT_MESSAGE_TIMEOUT_S, Backlog
from ext_proc.admit.pipeline import DEFAULT_MAX_BODY_BYTES, Pipeline
from ext_proc.admit.shared_ledger import view_age_ms
from ext_proc.placement.ledger_redis import DEFAULT_DEADLINE_S, DEFAULT_TTL_S, RedisLedger
from ext_proc.placement.ledger_shm import LedgerHandle, LedgerSegment
from ext_proc.policy.load import load_policy
from ext_proc.policy.settings import Policy
from ext_proc.serve import memtrim
from ext_proc.serve.collecting import (
    CollectorThread,
    multiprocess_registry,
    observer,
    start_metrics,
)
from ext_proc.serve.inforce import InForce, max_ages, reload_on
from ext_proc.serve.looplag import LoopLag
from ext_proc.serve.offload import DEFAULT_HEAVY_CONTAINERS, Offload
from ext_proc.serve.reload import Candidate, FileWatch, candidate, policy_sha256
from ext_proc.serve.servicer import ExtProcServicer
from ext_proc.signals.collector import Collector
from ext_proc.signals.shm import SnapshotReader, SnapshotWriter
from ext_proc.signals.snapshot import PoolSnapshot
from ext_proc.signals.store import SharedSnapshotStore, SnapshotStore
from ext_proc.truncate.client import EmbeddingClient

__all__ = ["ServeOptions", "serve", "worker_addresses"]

log = logging.getLogger("ice.server")

# How long a worker waits for its helper process before it serves without it
HELPER_START_S = 120.0


@dataclass(frozen=True, slots=True)
class ServeOptions:
    address: str = "127.0.0.1:50051"
    policy_path: str | None = None
    workers: int = 1
    metrics_address: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    shutdown_grace_s: float = 10.0
    heavy_containers: int = DEFAULT_HEAVY_CONTAINERS
    embedding_socket: str | None = None  # set by serve() when a profile truncates
    max_inflight_bytes: int = DEFAULT_MAX_INFLIGHT_BYTES
    message_timeout_s: float = DEFAULT_MESSAGE_TIMEOUT_S
    ledger_url: str | None = None  # redis://HOST:PORT/DB: the replicas' shared ledger
    ledger_deadline_s: float = DEFAULT_DEADLINE_S
    ledger_ttl_s: float = DEFAULT_TTL_S
    # --leader-elect (one worker): health SERVING only while holding the Lease (ext_proc.serve)
    leader_elect: bool = False
    lease_name: str = "ice-leader"
    lease_namespace: str | None = None  # None: env POD_NAMESPACE, the pod's


def _log_level() -> str:
    """The log level: ``ICE_LOG_LEVEL`` (DEBUG, INFO, WARNING, ...), INFO by default."""
    return os.environ.get("ICE_LOG_LEVEL", "INFO").upper()


def worker_addresses(address: str, workers: int) -> list[str]:
    """The listen address of each worker (see the module docstring)."""
    if workers <= 1:
        return [address]
    if address.startswith("unix:"):
        return [f"{address}.{i}" for i in range(workers)]
    host, _, port = address.rpartition(":")
    if not port.isdigit():
        raise ValueError(f"address {address!r} has no port")
    return [f"{host}:{int(port) + i}" for i in range(workers)]


async def _run_worker(
    opts: ServeOptions,
    address: str,
    shm_name: str | None = None,
    ledger_name: str | None = None,
    worker: int = 0,
) -> None:
    policy = load_policy(opts.policy_path)
    in_force = InForce(
        opts.policy_path, opts.max_body_bytes, opts.heavy_containers, opts.shutdown_grace_s, policy
    )
    snapshots = _snapshots(policy, in_force, shm_name)
    # with several workers, each sees the others' in-flight KV blocks (ext_proc.placement.poolview)
    handle = LedgerHandle(ledger_name, worker) if ledger_name is not None else None
    pipeline = Pipeline(policy, snapshots.lookup, max_body_bytes=opts.max_body_bytes, ledger=handle)
    remote = _shared_ledger(opts, pipeline, in_force, snapshots.lookup)
    if opts.embedding_socket:
        pipeline.similarity = EmbeddingClient(opts.embedding_socket)
    lag = LoopLag()  # the backlog reads it: headers waiting in the loop (looplag)
    server, health, servicer = _grpc_server(opts, address, pipeline, in_force, lag)
    running = _Running(server, health, servicer, pipeline, snapshots, handle, remote)
    elector = await running.start(opts)
    lag.start()
    print(f"ice worker {os.getpid()} serving ext_proc on {address}", flush=True)
    # The only worker watches the file itself; with several, the supervisor does and sends
    # each worker SIGHUP.
    await _until_stopped(in_force, FileWatch(opts.policy_path) if shm_name is None else None)
    log.info("shutting down: draining in-flight streams (grace %.1f s)", opts.shutdown_grace_s)
    lag.stop()
    await running.stop(opts.shutdown_grace_s, elector)


@dataclass(frozen=True, slots=True)
class _Snapshots:
    """Where a worker reads its pools' views: its own collector (the only worker) or the
    supervisor's, through shared memory."""

    lookup: Callable[[str], PoolSnapshot | None]
    collector: Collector | None = None
    reader: SnapshotReader | None = None


def _snapshots(policy: Policy, in_force: InForce, shm_name: str | None) -> _Snapshots:
    if shm_name is None:  # the only worker: collect in-process
        store = SnapshotStore(max_ages(policy))
        observe = observer(lambda: in_force.policy)

        def publish(views: dict[str, PoolSnapshot]) -> None:
            store.put_all(views)
            observe(views)

        collector = Collector(policy.pools, publish)
        in_force.store, in_force.collector = store, collector
        return _Snapshots(store.get, collector=collector)
    # the supervisor collects; read its views from shared memory
    reader = SnapshotReader(shm_name)
    shared = SharedSnapshotStore(reader, max_ages(policy))
    in_force.store = shared
    return _Snapshots(shared.get, reader=reader)


def _grpc_server(
    opts: ServeOptions, address: str, pipeline: Pipeline, in_force: InForce, lag: LoopLag
) -> tuple[grpc.aio.Server, HealthServicer, ExtProcServicer]:
    """The worker's gRPC server on ``address``: the ext_proc servicer and gRPC health."""
    limit = opts.max_body_bytes + 1024 * 1024
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", limit),
            ("grpc.so_reuseport", 0),
        ]
    )
    offload = Offload(opts.policy_path, opts.max_body_bytes, opts.heavy_containers)
    offload.warm()
    memtrim.tune()
    backlog = Backlog(opts.max_inflight_bytes, opts.message_timeout_s, lag=lag.lag)
    servicer = ExtProcServicer(pipeline, offload, backlog)
    in_force.servicer = servicer
    pb_grpc.add_ExternalProcessorServicer_to_server(servicer, server)
    health = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    server.add_insecure_port(address)
    return server, health, servicer


class _Elector(Protocol):
    """``--leader-elect``'s elector (``ext_proc.serve.lease``): closed at shutdown."""

    async def aclose(self) -> None: ...


@dataclass(frozen=True, slots=True)
class _Running:
    """A worker's parts, started in order and stopped in order at shutdown."""

    server: grpc.aio.Server
    health: HealthServicer
    servicer: ExtProcServicer
    pipeline: Pipeline
    snapshots: _Snapshots
    handle: LedgerHandle | None
    remote: RedisLedger | None

    async def start(self, opts: ServeOptions) -> _Elector | None:
        """Start serving; with ``--leader-elect``, the elector that flips gRPC health."""
        if self.snapshots.collector is not None:
            await self.snapshots.collector.start()
        if self.remote is not None:
            await self.remote.start()
        await self.server.start()
        for name in ("", "envoy.service.ext_proc.v3.ExternalProcessor"):
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        if self.servicer.offload is not None:  # every lane can judge before SERVING
            await self.servicer.offload.ready(HELPER_START_S)
        await self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        await self.health.set(
            "envoy.service.ext_proc.v3.ExternalProcessor", health_pb2.HealthCheckResponse.SERVING
        )
        if not opts.leader_elect:
            return None
        # NOT_SERVING at once (no I/O in between), SERVING while leading
        # lazy: the Kubernetes client is imported only by a worker started with --leader-elect
        from ext_proc.serve.lease import elect_serving

        return await elect_serving(
            self.health, lease_name=opts.lease_name, lease_namespace=opts.lease_namespace
        )

    async def stop(self, grace_s: float, elector: _Elector | None) -> None:
        await self.health.enter_graceful_shutdown()
        if elector is not None:  # release the Lease: the standby takes over while this one drains
            await elector.aclose()
        self.servicer.queue.close()  # queued requests get their 429 now, not a pass when cut
        await self.server.stop(grace=grace_s)
        if self.snapshots.collector is not None:
            await self.snapshots.collector.stop()
        if self.snapshots.reader is not None:
            self.snapshots.reader.close()
        if self.handle is not None:
            self.handle.close()
        if self.remote is not None:
            await self.remote.close()
        if isinstance(self.pipeline.similarity, EmbeddingClient):
            await self.pipeline.similarity.close()
        if self.servicer.offload is not None:
            self.servicer.offload.close()


async def _until_stopped(in_force: InForce, watch: FileWatch | None) -> None:
    """Reload the policy on SIGHUP (and on ``watch``'s changes) until SIGTERM or SIGINT."""
    stop, hangup = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, hangup.set)
    reloading = asyncio.create_task(reload_on(hangup, in_force, watch), name="policy-reload")
    await stop.wait()
    reloading.cancel()


def _shared_ledger(
    opts: ServeOptions,
    pipeline: Pipeline,
    in_force: InForce,
    lookup: Callable[[str], PoolSnapshot | None],
) -> RedisLedger | None:
    """The replicas' shared ledger (``--ledger``), set on the pipeline's views; None without."""
    if not opts.ledger_url:
        return None
    live = pipeline.views.live  # carried across policy reloads (the same dict)

    def age(pool: str) -> int | None:
        snapshot = lookup(pool)
        return None if snapshot is None else view_age_ms(snapshot)

    remote = RedisLedger(
        opts.ledger_url,
        deadline_s=opts.ledger_deadline_s,
        ttl_s=opts.ledger_ttl_s,
        own_totals=lambda: live,
        own_tenants=pipeline.views.tenants.totals,  # carried across reloads too
        view_age_ms=age,
        pools=lambda: in_force.policy.pools,
    )
    pipeline.views.remote = pipeline.views.tenants.remote = remote
    return remote


def _worker_main(
    opts: ServeOptions,
    address: str,
    shm_name: str | None = None,
    ledger_name: str | None = None,
    worker: int = 0,
) -> None:
    logging.basicConfig(level=_log_level(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    asyncio.run(_run_worker(opts, address, shm_name, ledger_name, worker))


def serve(opts: ServeOptions) -> int:
    """Run ICE until SIGTERM/SIGINT; returns the exit status."""
    policy = load_policy(opts.policy_path)  # fail fast, before any worker starts
    addresses = worker_addresses(opts.address, opts.workers)
    embedding = None
    if policy.truncation_enabled:
        from ext_proc.truncate.host import EmbeddingService  # lazy: torch, where one truncates

        logging.basicConfig(
            level=_log_level(), format="%(asctime)s %(name)s %(levelname)s %(message)s"
        )
        embedding = EmbeddingService(policy.embedding)
        embedding.start()
        opts = replace(opts, embedding_socket=embedding.socket_path)
    try:
        if len(addresses) == 1:
            if opts.metrics_address:
                start_metrics(opts.metrics_address)
            _worker_main(opts, addresses[0])
            return 0
        return _supervise(opts, addresses)
    finally:
        if embedding is not None:
            embedding.stop()


def _supervise(opts: ServeOptions, addresses: list[str]) -> int:
    """Run one process per worker address; restart a worker that dies; forward signals."""
    logging.basicConfig(level=_log_level(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    policy = load_policy(opts.policy_path)
    with (
        tempfile.TemporaryDirectory(prefix="ice-metrics-") as metrics_dir,
        SnapshotWriter(None) as writer,
        LedgerSegment(len(addresses)) as ledger,
    ):
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
        collecting = CollectorThread(policy, writer)
        collecting.thread.start()
        sha = policy_sha256(opts.policy_path)
        watch = FileWatch(opts.policy_path)
        if opts.metrics_address:
            start_metrics(opts.metrics_address, multiprocess_registry(metrics_dir))
        # worker i appends its in-flight KV blocks to ring i of the shared ledger (a
        # restarted worker gets its index back)
        shared = {addr: (writer.name, ledger.name, i) for i, addr in enumerate(addresses)}
        workers = _Workers(opts, metrics_dir, shared)
        signal.signal(signal.SIGTERM, workers.on_signal)
        signal.signal(signal.SIGINT, workers.on_signal)
        signal.signal(signal.SIGHUP, workers.on_hangup)
        workers.start()
        while not workers.stopping:
            time.sleep(0.2)
            if workers.hangups or watch.changed():
                workers.hangups = 0
                sha = _supervisor_reload(opts, collecting, sha, workers.procs.values())
            workers.restart_dead()
        workers.join(opts.shutdown_grace_s + 5)
        collecting.stop()
        collecting.thread.join(5)
        return 0


class _Workers:
    """The supervisor's worker processes, one per address, and the signals it got."""

    def __init__(
        self, opts: ServeOptions, metrics_dir: str, shared: dict[str, tuple[str, str, int]]
    ) -> None:
        self.opts, self.metrics_dir, self.shared = opts, metrics_dir, shared
        self.ctx = multiprocessing.get_context("spawn")
        self.procs: dict[str, multiprocessing.process.BaseProcess] = {}
        self.stopping = False
        self.hangups = 0

    def on_signal(self, _signum: int, _frame: object) -> None:
        """SIGTERM or SIGINT: stop, and pass SIGTERM on to every live worker."""
        self.stopping = True
        for p in self.procs.values():
            if p.pid is not None and p.is_alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGTERM)

    def on_hangup(self, _signum: int, _frame: object) -> None:
        self.hangups += 1

    def start(self) -> None:
        for addr in self.shared:
            self.procs[addr] = self.ctx.Process(
                target=_worker_main, args=(self.opts, addr, *self.shared[addr]), name=f"ice-{addr}"
            )
            self.procs[addr].start()

    def restart_dead(self) -> None:
        for addr, p in list(self.procs.items()):
            if not p.is_alive() and not self.stopping:
                log.error("worker %s exited with %s; restarting", addr, p.exitcode)
                if p.pid is not None:
                    from prometheus_client import multiprocess

                    multiprocess.mark_process_dead(p.pid, self.metrics_dir)  # type: ignore[no-untyped-call]
                self.procs[addr] = self.ctx.Process(
                    target=_worker_main, args=(self.opts, addr, *self.shared[addr])
                )
                self.procs[addr].start()

    def join(self, within_s: float) -> None:
        """Wait up to ``within_s`` in all for the workers to exit; kill those still alive."""
        deadline = time.monotonic() + within_s
        for p in self.procs.values():
            p.join(max(0.1, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()


def _supervisor_reload(
    opts: ServeOptions,
    collecting: CollectorThread,
    sha: str,
    workers: Iterable[multiprocessing.process.BaseProcess],
) -> str:
    """The file changed (or SIGHUP): the collector takes the new pools when the policy is
    valid, and every worker is told (SIGHUP) to check and swap it itself: a refused file is
    then refused, logged and counted by each worker. Returns the sha256 now in force here."""
    got = candidate(opts.policy_path, collecting.policy, sha)
    if isinstance(got, Candidate):
        collecting.update(got.policy)
        sha = got.sha256
        log.info("policy %s: collector updated; telling the workers", sha[:12])
    elif isinstance(got, str):
        log.error("policy reload refused: %s", got)
    for p in workers:
        if p.pid is not None and p.is_alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGHUP)
    return sha
