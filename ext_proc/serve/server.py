"""``ice serve``: the grpc.aio ext_proc server, its health service, workers and shutdown.

- Address: ``HOST:PORT``, ``[IPv6]:PORT`` or ``unix:PATH``. With ``--workers N`` (N > 1)
  worker i listens on ``PORT + i`` (or ``PATH.i``): Envoy spreads streams over the workers as
  one endpoint each, and a port clash fails loudly (SO_REUSEPORT is off).
- gRPC message limits are raised to ``max_body_bytes`` + 1 MiB so buffered bodies up to the
  limit (8 MiB by default, Envoy's buffer is set to match) pass.
- SIGTERM/SIGINT: health turns NOT_SERVING, new streams are refused, in-flight streams get
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
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from ext_proc import telemetry
from ext_proc.admit.backlog import DEFAULT_MAX_INFLIGHT_BYTES, DEFAULT_MESSAGE_TIMEOUT_S, Backlog
from ext_proc.admit.pipeline import DEFAULT_MAX_BODY_BYTES, Pipeline
from ext_proc.admit.shared_ledger import view_age_ms
from ext_proc.placement.ledger_redis import DEFAULT_DEADLINE_S, DEFAULT_TTL_S, RedisLedger
from ext_proc.placement.ledger_shm import LedgerHandle, LedgerSegment
from ext_proc.policy.load import load_policy
from ext_proc.policy.model import Policy
from ext_proc.policy.pressure import pressure_of
from ext_proc.policy.scores import pool_cache_efficiency, tokenize_latency_risk
from ext_proc.serve import memtrim
from ext_proc.serve.helper import DEFAULT_HEAVY_CONTAINERS, Offload
from ext_proc.serve.inforce import InForce, max_ages, reload_on
from ext_proc.serve.reload import Candidate, FileWatch, candidate, policy_sha256
from ext_proc.serve.servicer import ExtProcServicer
from ext_proc.signals.collector import Collector
from ext_proc.signals.shm import SnapshotReader, SnapshotWriter
from ext_proc.signals.snapshot import PoolSnapshot
from ext_proc.signals.store import SharedSnapshotStore, SnapshotStore

__all__ = ["ServeOptions", "serve", "worker_addresses"]

log = logging.getLogger("ice.server")


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


def _split_host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]") or "0.0.0.0", int(port)


def _observer(current: Callable[[], Policy]) -> Callable[[dict[str, PoolSnapshot]], None]:
    """Export each published view's scores (default profile) as ICE's pool gauges."""

    def observe(views: dict[str, PoolSnapshot]) -> None:
        policy = current()
        default = policy.profiles[policy.default_profile]
        for snapshot in views.values():
            p = pressure_of(snapshot, default.pressure)
            if p is not None:
                telemetry.PRESSURE.labels(pool=snapshot.pool).set(p.score)
            ratio = pool_cache_efficiency(snapshot)
            if ratio is not None:
                telemetry.CACHE_EFFICIENCY.labels(pool=snapshot.pool).set(ratio)
            risk = tokenize_latency_risk(
                (b.derived.ttft_delta if b.derived else None for b in snapshot.backends),
                default.ttft_target_s,
            )
            if risk is not None:
                telemetry.TOKENIZE_RISK.labels(pool=snapshot.pool).set(risk)

    return observe


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
    collector: Collector | None = None
    reader: SnapshotReader | None = None
    lookup: Callable[[str], PoolSnapshot | None]
    if shm_name is None:  # the only worker: collect in-process
        store = SnapshotStore(max_ages(policy))
        observe = _observer(lambda: in_force.policy)

        def publish(views: dict[str, PoolSnapshot]) -> None:
            store.put_all(views)
            observe(views)

        collector = Collector(policy.pools, publish)
        lookup = store.get
        in_force.store, in_force.collector = store, collector
    else:  # the supervisor collects; read its views from shared memory
        reader = SnapshotReader(shm_name)
        shared = SharedSnapshotStore(reader, max_ages(policy))
        lookup = shared.get
        in_force.store = shared
    # with several workers, each sees the others' in-flight KV blocks (ext_proc.placement.poolview)
    handle = LedgerHandle(ledger_name, worker) if ledger_name is not None else None
    pipeline = Pipeline(policy, lookup, max_body_bytes=opts.max_body_bytes, ledger=handle)
    remote = _shared_ledger(opts, pipeline, in_force, lookup)
    if opts.embedding_socket:
        from ext_proc.truncate.client import EmbeddingClient

        pipeline.similarity = EmbeddingClient(opts.embedding_socket)
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
    backlog = Backlog(opts.max_inflight_bytes, opts.message_timeout_s)
    servicer = ExtProcServicer(pipeline, offload, backlog)
    in_force.servicer = servicer
    pb_grpc.add_ExternalProcessorServicer_to_server(servicer, server)
    health = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    server.add_insecure_port(address)
    if collector is not None:
        await collector.start()
    if remote is not None:
        await remote.start()
    await server.start()
    await health.set("", health_pb2.HealthCheckResponse.SERVING)
    await health.set(
        "envoy.service.ext_proc.v3.ExternalProcessor", health_pb2.HealthCheckResponse.SERVING
    )
    elector = None
    if opts.leader_elect:  # NOT_SERVING at once (no I/O in between), SERVING while leading
        from ext_proc.serve.lease import elect_serving

        elector = await elect_serving(
            health, lease_name=opts.lease_name, lease_namespace=opts.lease_namespace
        )
    print(f"ice worker {os.getpid()} serving ext_proc on {address}", flush=True)

    stop, hangup = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, hangup.set)
    # The only worker watches the file itself; with several, the supervisor does and sends
    # each worker SIGHUP.
    watch = FileWatch(opts.policy_path) if shm_name is None else None
    reloading = asyncio.create_task(reload_on(hangup, in_force, watch), name="policy-reload")
    await stop.wait()
    reloading.cancel()
    log.info("shutting down: draining in-flight streams (grace %.1f s)", opts.shutdown_grace_s)
    await health.enter_graceful_shutdown()
    if elector is not None:  # release the Lease: the standby takes over while this one drains
        await elector.aclose()
    servicer.queue.close()  # queued requests get their 429 now, not a pass when cut
    await server.stop(grace=opts.shutdown_grace_s)
    if collector is not None:
        await collector.stop()
    if reader is not None:
        reader.close()
    if handle is not None:
        handle.close()
    if remote is not None:
        await remote.close()
    if pipeline.similarity is not None:
        await pipeline.similarity.close()
    if servicer.offload is not None:
        servicer.offload.close()


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
        view_age_ms=age,
        pools=lambda: in_force.policy.pools,
    )
    pipeline.views.remote = remote
    return remote


def _worker_main(
    opts: ServeOptions,
    address: str,
    shm_name: str | None = None,
    ledger_name: str | None = None,
    worker: int = 0,
) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    asyncio.run(_run_worker(opts, address, shm_name, ledger_name, worker))


@dataclass
class _CollectorThread:
    """The supervisor's collector: an asyncio loop in a thread publishing to shared memory."""

    policy: Policy
    writer: SnapshotWriter

    def __post_init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.collector: Collector | None = None
        self._stopped = asyncio.Event()
        observe = _observer(lambda: self.policy)

        def publish(views: dict[str, PoolSnapshot]) -> None:
            self.writer.publish(views)
            observe(views)

        async def run() -> None:
            self.collector = Collector(self.policy.pools, publish)
            await self.collector.start()
            await self._stopped.wait()
            await self.collector.stop()

        self.thread = threading.Thread(
            target=self.loop.run_until_complete, args=(run(),), name="collector", daemon=True
        )

    def update(self, policy: Policy) -> None:
        """A reloaded policy: its pools from now on (unchanged ones keep their history)."""
        self.policy = policy
        if self.collector is not None:
            done = asyncio.run_coroutine_threadsafe(self.collector.update(policy.pools), self.loop)
            done.result(10)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self._stopped.set)


def _start_metrics(address: str, registry: object | None = None) -> None:
    from prometheus_client import start_http_server

    host, port = _split_host_port(address)
    if registry is None:
        start_http_server(port, addr=host)
    else:
        start_http_server(port, addr=host, registry=registry)  # type: ignore[arg-type]


def serve(opts: ServeOptions) -> int:
    """Run ICE until SIGTERM/SIGINT; returns the exit status."""
    policy = load_policy(opts.policy_path)  # fail fast, before any worker starts
    addresses = worker_addresses(opts.address, opts.workers)
    embedding = None
    if policy.truncation_enabled:
        from ext_proc.truncate.host import EmbeddingService

        logging.basicConfig(
            level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s"
        )
        embedding = EmbeddingService(policy.embedding)
        embedding.start()
        opts = replace(opts, embedding_socket=embedding.socket_path)
    try:
        if len(addresses) == 1:
            if opts.metrics_address:
                _start_metrics(opts.metrics_address)
            _worker_main(opts, addresses[0])
            return 0
        return _supervise(opts, addresses)
    finally:
        if embedding is not None:
            embedding.stop()


def _supervise(opts: ServeOptions, addresses: list[str]) -> int:
    """Run one process per worker address; restart a worker that dies; forward signals."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    policy = load_policy(opts.policy_path)
    with (
        tempfile.TemporaryDirectory(prefix="ice-metrics-") as metrics_dir,
        SnapshotWriter(None) as writer,
        LedgerSegment(len(addresses)) as ledger,
    ):
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
        collecting = _CollectorThread(policy, writer)
        collecting.thread.start()
        sha = policy_sha256(opts.policy_path)
        watch = FileWatch(opts.policy_path)
        hangups = 0
        if opts.metrics_address:
            from prometheus_client import CollectorRegistry, multiprocess

            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry, path=metrics_dir)  # type: ignore[no-untyped-call]
            for metric in telemetry.collector_metrics():  # the supervisor collects the pools
                registry.register(metric)
            _start_metrics(opts.metrics_address, registry)
        ctx = multiprocessing.get_context("spawn")
        procs: dict[str, multiprocessing.process.BaseProcess] = {}
        stopping = False

        def on_signal(signum: int, _frame: object) -> None:
            nonlocal stopping
            stopping = True
            for p in procs.values():
                if p.pid is not None and p.is_alive():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(p.pid, signal.SIGTERM)

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)

        def on_hangup(_signum: int, _frame: object) -> None:
            nonlocal hangups
            hangups += 1

        signal.signal(signal.SIGHUP, on_hangup)
        # worker i appends its in-flight KV blocks to ring i of the shared ledger (a
        # restarted worker gets its index back)
        shared = {addr: (writer.name, ledger.name, i) for i, addr in enumerate(addresses)}
        for addr in addresses:
            procs[addr] = ctx.Process(
                target=_worker_main, args=(opts, addr, *shared[addr]), name=f"ice-{addr}"
            )
            procs[addr].start()
        while not stopping:
            time.sleep(0.2)
            if hangups or watch.changed():
                hangups = 0
                sha = _supervisor_reload(opts, collecting, sha, procs.values())
            for addr, p in list(procs.items()):
                if not p.is_alive() and not stopping:
                    log.error("worker %s exited with %s; restarting", addr, p.exitcode)
                    if p.pid is not None:
                        from prometheus_client import multiprocess

                        multiprocess.mark_process_dead(p.pid, metrics_dir)  # type: ignore[no-untyped-call]
                    procs[addr] = ctx.Process(target=_worker_main, args=(opts, addr, *shared[addr]))
                    procs[addr].start()
        deadline = time.monotonic() + opts.shutdown_grace_s + 5
        for p in procs.values():
            p.join(max(0.1, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
        collecting.stop()
        collecting.thread.join(5)
        return 0


def _supervisor_reload(
    opts: ServeOptions,
    collecting: _CollectorThread,
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
