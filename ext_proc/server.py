"""``ice serve``: the grpc.aio ext_proc server, its health service, workers and shutdown.

- Address: ``HOST:PORT``, ``[IPv6]:PORT`` or ``unix:PATH``. With ``--workers N`` (N > 1)
  worker i listens on ``PORT + i`` (or ``PATH.i``): Envoy spreads streams over the workers as
  one endpoint each, and a port clash fails loudly (SO_REUSEPORT is off).
- gRPC message limits are raised to ``max_body_bytes`` + 1 MiB so buffered bodies up to the
  limit (8 MiB by default, Envoy's buffer is set to match) pass.
- SIGTERM/SIGINT: health turns NOT_SERVING, new streams are refused, in-flight streams get
  ``shutdown_grace_s`` to finish, then the process exits 0.
- Each worker runs its own background scraper; the request path only reads snapshots.
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
from dataclasses import dataclass

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from ext_proc import telemetry
from ext_proc.offload import DEFAULT_HEAVY_CONTAINERS, Offload
from ext_proc.pipeline import DEFAULT_MAX_BODY_BYTES, Pipeline
from ext_proc.policy.load import load_policy
from ext_proc.policy.pressure import pressure_of
from ext_proc.servicer import ExtProcServicer
from ext_proc.signals.scraper import Scraper, SnapshotStore
from ext_proc.signals.snapshot import PoolSnapshot

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


async def _run_worker(opts: ServeOptions, address: str) -> None:
    policy = load_policy(opts.policy_path)
    store = SnapshotStore({name: pool.max_age_s for name, pool in policy.pools.items()})
    default_model = policy.profiles[policy.default_profile].pressure

    def on_snapshot(snapshot: PoolSnapshot) -> None:
        p = pressure_of(snapshot, default_model)
        if p is not None:
            telemetry.PRESSURE.labels(pool=snapshot.pool).set(p.score)

    scraper = Scraper(policy.pools, store, on_snapshot=on_snapshot)
    pipeline = Pipeline(policy, store.get, max_body_bytes=opts.max_body_bytes)
    limit = opts.max_body_bytes + 1024 * 1024
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", limit),
            ("grpc.so_reuseport", 0),
        ]
    )
    offload = Offload(opts.policy_path, opts.max_body_bytes, opts.heavy_containers)
    pb_grpc.add_ExternalProcessorServicer_to_server(ExtProcServicer(pipeline, offload), server)
    health = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    server.add_insecure_port(address)
    await scraper.start()
    await server.start()
    await health.set("", health_pb2.HealthCheckResponse.SERVING)
    await health.set(
        "envoy.service.ext_proc.v3.ExternalProcessor", health_pb2.HealthCheckResponse.SERVING
    )
    print(f"ice worker {os.getpid()} serving ext_proc on {address}", flush=True)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("shutting down: draining in-flight streams (grace %.1f s)", opts.shutdown_grace_s)
    await health.enter_graceful_shutdown()
    await server.stop(grace=opts.shutdown_grace_s)
    await scraper.stop()
    offload.close()


def _worker_main(opts: ServeOptions, address: str) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    asyncio.run(_run_worker(opts, address))


def _start_metrics(address: str, registry: object | None = None) -> None:
    from prometheus_client import start_http_server

    host, port = _split_host_port(address)
    if registry is None:
        start_http_server(port, addr=host)
    else:
        start_http_server(port, addr=host, registry=registry)  # type: ignore[arg-type]


def serve(opts: ServeOptions) -> int:
    """Run ICE until SIGTERM/SIGINT; returns the exit status."""
    load_policy(opts.policy_path)  # fail fast, before any worker starts
    addresses = worker_addresses(opts.address, opts.workers)
    if len(addresses) == 1:
        if opts.metrics_address:
            _start_metrics(opts.metrics_address)
        _worker_main(opts, addresses[0])
        return 0
    return _supervise(opts, addresses)


def _supervise(opts: ServeOptions, addresses: list[str]) -> int:
    """Run one process per worker address; restart a worker that dies; forward signals."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    with tempfile.TemporaryDirectory(prefix="ice-metrics-") as metrics_dir:
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
        if opts.metrics_address:
            from prometheus_client import CollectorRegistry, multiprocess

            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry, path=metrics_dir)  # type: ignore[no-untyped-call]
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
        for addr in addresses:
            procs[addr] = ctx.Process(target=_worker_main, args=(opts, addr), name=f"ice-{addr}")
            procs[addr].start()
        while not stopping:
            time.sleep(0.2)
            for addr, p in list(procs.items()):
                if not p.is_alive() and not stopping:
                    log.error("worker %s exited with %s; restarting", addr, p.exitcode)
                    if p.pid is not None:
                        from prometheus_client import multiprocess

                        multiprocess.mark_process_dead(p.pid, metrics_dir)  # type: ignore[no-untyped-call]
                    procs[addr] = ctx.Process(target=_worker_main, args=(opts, addr))
                    procs[addr].start()
        deadline = time.monotonic() + opts.shutdown_grace_s + 5
        for p in procs.values():
            p.join(max(0.1, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
        return 0
