"""The host's collector and the metrics ``ice serve`` exports, beside the request path.

- ``observer``: each published view's scores (default profile) as ICE's pool gauges, and each
  backend's latency predictions (``observe_slo``, docs/slo.md), for the collector in the only
  worker and the supervisor's alike;
- ``CollectorThread``: the supervisor's collector (``--workers N``), an asyncio loop in a
  thread publishing to shared memory (``ext_proc.signals.shm``);
- ``start_metrics`` and ``multiprocess_registry``: the Prometheus endpoint, and with several
  workers the registry that merges theirs with the supervisor's collector metrics.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ext_proc import telemetry
from ext_proc.policy.pressure import pressure_of
from ext_proc.policy.scores import pool_cache_efficiency, tokenize_latency_risk
from ext_proc.policy.settings import Policy
from ext_proc.signals.collector import Collector
from ext_proc.signals.shm import SnapshotWriter
from ext_proc.signals.snapshot import BackendSignals, PoolSnapshot

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

__all__ = [
    "CollectorThread",
    "multiprocess_registry",
    "observe_slo",
    "observer",
    "start_metrics",
]


def observer(current: Callable[[], Policy]) -> Callable[[dict[str, PoolSnapshot]], None]:
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
            for backend in snapshot.backends:
                observe_slo(snapshot.pool, backend)

    return observe


def observe_slo(pool: str, backend: BackendSignals) -> None:
    """The backend's latency predictions as gauges (docs/slo.md; each only when known)."""
    labels = {"pool": pool, "backend": backend.url}
    sp = backend.speed
    if sp is None:
        return
    mean, hit = sp.computed_prompt_tokens, backend.hit_ratio or 0.0
    if mean is not None and hit < 1.0:
        ttft = backend.predicted_ttft_s(mean / (1.0 - hit))  # a mean request's prompt
        if ttft is not None:
            telemetry.SLO_PREDICTED_TTFT.labels(**labels).set(ttft)
    tpot = backend.predicted_tpot_s
    if tpot is not None:
        telemetry.SLO_PREDICTED_TPOT.labels(**labels).set(tpot)
    if sp.ttft_error_ratio is not None:
        telemetry.SLO_TTFT_ERROR.labels(**labels).set(sp.ttft_error_ratio)


@dataclass
class CollectorThread:
    """The supervisor's collector: an asyncio loop in a thread publishing to shared memory."""

    policy: Policy
    writer: SnapshotWriter

    def __post_init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.collector: Collector | None = None
        self._stopped = asyncio.Event()
        observe = observer(lambda: self.policy)

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


def _split_host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]") or "0.0.0.0", int(port)


def start_metrics(address: str, registry: object | None = None) -> None:
    """Serve Prometheus metrics on ``address`` (``HOST:PORT``), from ``registry`` if given."""
    from prometheus_client import start_http_server

    host, port = _split_host_port(address)
    if registry is None:
        start_http_server(port, addr=host)
    else:
        start_http_server(port, addr=host, registry=registry)  # type: ignore[arg-type]


def multiprocess_registry(metrics_dir: str) -> CollectorRegistry:
    """The workers' metrics (written under ``metrics_dir``) with the supervisor's collector
    metrics (the supervisor collects the pools)."""
    from prometheus_client import CollectorRegistry, multiprocess

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=metrics_dir)  # type: ignore[no-untyped-call]
    for metric in telemetry.COLLECTOR_METRICS:
        registry.register(metric)
    return registry
