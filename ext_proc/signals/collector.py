"""The collector: scrapes every pool's sources and publishes whole pool snapshots.

One collector runs per host (in the ``ice serve`` supervisor; in the worker itself when there
is one worker). Each cycle, per pool, every ``scrape_interval_s`` (±10 % jitter):
1. endpoints: the pool's static ``metrics_urls`` plus, for a DNS source, one URL per address
   of the name (re-resolved every ``refresh_s``; a failed lookup keeps the last set); the
   sources of endpoints that are gone (an address no longer resolved, a backend no longer in
   the Prometheus answers) are forgotten once no scrape of them is running;
2. fetch each endpoint concurrently with the pool's ``scrape_timeout_s`` (over kept-alive
   connections: ``ext_proc.signals.httpget``); a failing source is
   retried after an exponential backoff (interval × 2^failures, at most ``MAX_BACKOFF_S``),
   logged once per change of state and counted in ``ice_scrape_errors_total``;
3. parse (pure: ``ext_proc.signals.parse``), keep a per-source history of the last
   ``window_s`` seconds and its rates and quantiles (``ext_proc.signals.window.Window``,
   incremental: its cost does not grow with the window);
4. build the pool view (``PoolSnapshot``) and hand it to ``publish``.

Staleness, per source: a source whose last good scrape is older than ``stale_after_s``
(default 1.5 intervals: one missed cycle) is stale, so a silent source is flagged by the
view built two intervals after its last good scrape. The pool's ``stale`` policy says what a
stale source counts as: ``last_known`` (default: its last values, until ``max_age_s``, then
left out),
``ignore`` (left out at once; a pool with no fresh source has no view → pressure "unknown"),
``saturated`` (a full KV cache and a saturated queue: the safe choice when losing sight of a
backend should shed load). Detection is quick while the default action is
tolerant, so a scrape delayed by a busy backend flags the view without blinding ICE. The
view records that it contains stale data (header ``x-ice-stale``, metric ``ice_pool_stale``).

A pool may instead read its backends from a Prometheus server (``prometheus``): one instant
query per signal each interval, grouped into backends by ``group_by`` (``instance``); each
backend is then a source like a scraped one (history, staleness, derived rates).

GPU sources (the pool's ``gpu_metrics_urls``, DCGM exporters) are scraped alongside; a pool
with ``local_gpus: nvml`` (ICE beside the inference server) also reads this host's GPUs
through NVML, in a thread, every cycle. Without NVML (no package, library, driver) that
source fails like any other: logged once, counted, retried after backoff; the view then has
no GPU term. Which GPUs join the view (``gpu_join``), and the other pure parts of the view:
``ext_proc.signals.poolbuild``.

Invariant: the request path never calls into this module; it only reads published snapshots.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlencode

from ext_proc import telemetry
from ext_proc.signals.httpget import HttpGetter
from ext_proc.signals.nvml import NvmlReader, NvmlSource
from ext_proc.signals.parse import SourceParseError, parse_dcgm, parse_engine
from ext_proc.signals.pool import Pool
from ext_proc.signals.poolbuild import (
    LOCAL_GPUS,
    backend_from_scrape,
    backend_signals,
    pool_gpus,
    saturated,
)
from ext_proc.signals.promapi import build_queries, engine_backends
from ext_proc.signals.scrapes import GpuScrape
from ext_proc.signals.snapshot import BackendSignals, PoolSnapshot
from ext_proc.signals.window import Window

__all__ = ["LOCAL_GPUS", "MAX_BACKOFF_S", "Collector", "Fetch", "Resolve", "backend_from_scrape"]

log = logging.getLogger("ice.collector")

MAX_BACKOFF_S = 5.0

Fetch = Callable[[str, float], Awaitable[str]]
Resolve = Callable[[str, int], Awaitable[list[str]]]


@dataclass
class _Source:
    url: str
    window: Window  # the newest scrapes (engine sources) and their derived rates
    gpus: tuple[GpuScrape, ...] = ()  # a DCGM exporter's newest GPUs
    gpus_at_s: float = 0.0
    failures: int = 0
    retry_at: float = 0.0
    failing: str | None = None  # the logged failure reason, for log-once


class Collector:
    """Scrapes pools until ``stop``; publishes ``{pool: PoolSnapshot}`` after every cycle."""

    def __init__(
        self,
        pools: Mapping[str, Pool],
        publish: Callable[[dict[str, PoolSnapshot]], None],
        *,
        fetch: Fetch | None = None,
        resolve: Resolve | None = None,
        nvml: Callable[[], NvmlSource] | None = None,
    ) -> None:
        self._pools = pools
        self._publish = publish
        self._fetch = fetch
        self._resolve = resolve or _resolve_dns
        self._http: HttpGetter | None = None
        self._sources: dict[tuple[str, str], _Source] = {}
        self._dns: dict[str, tuple[float, list[str]]] = {}
        self._views: dict[str, PoolSnapshot] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}  # pool name → its scrape loop
        self._logged: dict[tuple[str, ...], str] = {}
        self._prom_backends: dict[str, set[str]] = {}
        self._inflight: dict[tuple[str, str], asyncio.Task[None]] = {}
        # pool → Prometheus backend → (namespace or "", pod), from the newest answers
        self._pods: dict[str, dict[str, tuple[str, str]]] = {}
        self._nvml = nvml or (lambda: NvmlSource(LOCAL_GPUS))
        self._local_gpus: dict[str, NvmlReader] = {}

    # --- life cycle ------------------------------------------------------------------------
    async def start(self) -> None:
        if self._fetch is None:
            self._http = HttpGetter()
            self._fetch = self._http.get
        for pool in self._pools.values():
            self._start_pool(pool)

    def _start_pool(self, pool: Pool) -> None:
        if pool.metrics_urls or pool.dns_name or pool.prometheus_url:
            task = asyncio.create_task(self._run(pool), name=f"collect-{pool.name}")
            self._tasks[pool.name] = task

    async def update(self, pools: Mapping[str, Pool]) -> None:
        """A reloaded policy's pools: an unchanged pool keeps its scrape loop and history; a
        removed one stops and leaves the published views; a new or changed one starts afresh
        (its history from its old settings is dropped)."""
        old = self._pools
        self._pools = pools
        for name, pool in old.items():
            if pools.get(name) == pool:
                continue
            task = self._tasks.pop(name, None)
            doomed = [t for (n, _), t in self._inflight.items() if n == name]
            for t in [*([task] if task else []), *doomed]:
                t.cancel()
            await asyncio.gather(*([task] if task else []), *doomed, return_exceptions=True)
            for key in [k for k in self._inflight if k[0] == name]:
                del self._inflight[key]
            for key in [k for k in self._sources if k[0] == name]:
                del self._sources[key]
            self._dns.pop(name, None)
            self._prom_backends.pop(name, None)
            self._pods.pop(name, None)
            reader = self._local_gpus.pop(name, None)
            if reader is not None:
                reader.close()
            self._views.pop(name, None)
        for name, pool in pools.items():
            if name not in self._tasks:
                self._start_pool(pool)
        self._publish(dict(self._views))

    async def stop(self) -> None:
        tasks = list(self._tasks.values())
        for task in [*tasks, *self._inflight.values()]:
            task.cancel()
        await asyncio.gather(*tasks, *self._inflight.values(), return_exceptions=True)
        self._tasks.clear()
        self._inflight.clear()
        for reader in self._local_gpus.values():
            reader.close()
        self._local_gpus.clear()
        if self._http is not None:
            await self._http.close()

    async def _run(self, pool: Pool) -> None:
        while True:
            started = time.monotonic()
            with contextlib.suppress(Exception):  # a cycle never kills the loop
                await self.collect_once(pool)
            interval = pool.scrape_interval_s * random.uniform(0.9, 1.1)
            await asyncio.sleep(max(0.0, interval - (time.monotonic() - started)))

    # --- one cycle ---------------------------------------------------------------------------
    async def endpoints(self, pool: Pool) -> list[str]:
        urls = list(pool.metrics_urls)
        if pool.dns_name:
            now = time.monotonic()
            cached = self._dns.get(pool.name)
            if cached is None or now - cached[0] >= pool.dns_refresh_s:
                try:
                    hosts = await self._resolve(pool.dns_name, pool.dns_port)
                    self._dns[pool.name] = (now, hosts)
                    self._recovered(("dns", pool.name), f"dns {pool.dns_name}")
                except OSError as e:
                    self._failed(("dns", pool.name), f"dns {pool.dns_name}", f"{e}", pool.name)
                    self._dns[pool.name] = (now, cached[1] if cached else [])
            for host in self._dns[pool.name][1]:
                h = f"[{host}]" if ":" in host else host
                urls.append(f"{pool.dns_scheme}://{h}:{pool.dns_port}{pool.dns_path}")
        return urls

    async def collect_once(self, pool: Pool) -> PoolSnapshot | None:
        """Start a scrape of every due endpoint of ``pool``, give them up to 90 % of an
        interval, then build and publish its view. A scrape still running then (a slow or
        hanging source) goes on in the background, bounded by ``scrape_timeout_s``, and never
        holds up the view: a silent source is flagged stale after ``stale_after_s`` however
        long its timeout."""
        urls = await self.endpoints(pool)
        now = time.monotonic()
        for url in urls:
            self._launch(pool, url, now, self._scrape(pool, url))
        for url in pool.gpu_metrics_urls:
            self._launch(pool, url, now, self._scrape(pool, url, gpu=True))
        if pool.prometheus_url:
            self._launch(pool, pool.prometheus_url, now, self._query_prometheus(pool))
        if pool.local_gpus == "nvml":
            self._launch(pool, LOCAL_GPUS, now, self._read_local_gpus(pool))
        running = [t for (name, _), t in self._inflight.items() if name == pool.name]
        if running:
            await asyncio.wait(running, timeout=pool.scrape_interval_s * 0.9)
        for key in [k for k, t in self._inflight.items() if t.done()]:
            del self._inflight[key]
        urls += sorted(self._prom_backends.get(pool.name, ()))
        self._prune(pool, urls)
        view = self.view(pool, urls, time.monotonic())
        if view is None:
            self._views.pop(pool.name, None)
        else:
            self._views[pool.name] = view
            telemetry.observe_pool(view.pool, view.kv_cache_usage)
        telemetry.POOL_STALE.labels(pool=pool.name).set(1.0 if view is None or view.stale else 0.0)
        self._publish(dict(self._views))
        return view

    def _launch(self, pool: Pool, url: str, now: float, scrape: Coroutine[Any, Any, None]) -> None:
        """Run ``scrape`` unless this source is backing off or already being scraped."""
        key = (pool.name, url)
        if key in self._inflight or self._source(pool, url).retry_at > now:
            scrape.close()
            return
        self._inflight[key] = asyncio.create_task(scrape)

    async def _query_prometheus(self, pool: Pool) -> None:
        """One instant query per signal; each backend (``group_by`` value) becomes a source."""
        assert self._fetch is not None
        src = self._source(pool, pool.prometheus_url)
        queries = list(build_queries(pool.kind).values())
        if pool.prometheus_matchers:
            queries = [q[:-1] + "," + pool.prometheus_matchers + "}" for q in queries]
        urls = [f"{pool.prometheus_url}/api/v1/query?{urlencode({'query': q})}" for q in queries]
        try:
            async with asyncio.timeout(pool.scrape_timeout_s):
                bodies = await asyncio.gather(
                    *(self._fetch(u, pool.scrape_timeout_s) for u in urls)
                )
            backends = engine_backends(
                pool.kind, bodies, time.monotonic(), group_by=pool.prometheus_group_by
            )
        except (OSError, TimeoutError, SourceParseError) as e:
            self._back_off(pool, src, ("prom", pool.name), f"query of {pool.prometheus_url}", e)
            return
        src.failures, src.retry_at = 0, 0.0
        self._recovered(("prom", pool.name), f"query of {pool.prometheus_url}")
        self._prom_backends[pool.name] = set(backends)
        self._pods[pool.name] = {key: pod for key, (_, pod) in backends.items() if pod}
        for key, (scrape, _) in backends.items():
            self._source(pool, key).window.append(scrape)

    async def _read_local_gpus(self, pool: Pool) -> None:
        """This host's GPUs through NVML, read in the reader's thread."""
        src = self._source(pool, LOCAL_GPUS)
        reader = self._local_gpus.get(pool.name)
        if reader is None:
            reader = self._local_gpus[pool.name] = NvmlReader(self._nvml())
        try:
            async with asyncio.timeout(pool.scrape_timeout_s):
                gpus = await asyncio.shield(reader.read())  # a slow read goes on
        except (OSError, TimeoutError) as e:  # NvmlUnavailable is an OSError
            self._back_off(pool, src, ("src", pool.name, LOCAL_GPUS), "NVML read", e)
            return
        src.failures, src.retry_at = 0, 0.0
        self._recovered(("src", pool.name, LOCAL_GPUS), "NVML read")
        src.gpus, src.gpus_at_s = tuple(gpus), time.monotonic()

    def _prune(self, pool: Pool, backends: list[str]) -> None:
        """Forget the sources of ``pool`` that are no longer among its endpoints (an address
        gone from its DNS name, a backend gone from its Prometheus answers), unless a scrape
        of one is still running: their history, backoff and log-once state. Without this, a
        long-lived collector in front of a churning Deployment keeps every pod it ever saw."""
        live = {*backends, *pool.gpu_metrics_urls, pool.prometheus_url, LOCAL_GPUS}
        for key in [k for k in self._sources if k[0] == pool.name and k[1] not in live]:
            if key in self._inflight:
                continue
            del self._sources[key]
            if self._logged.pop(("src", *key), None) is not None:
                log.info("%s left pool %s", key[1], pool.name)

    def _source(self, pool: Pool, url: str) -> _Source:
        key = (pool.name, url)
        src = self._sources.get(key)
        if src is None:
            src = self._sources[key] = _Source(url, Window(pool.window_s))
        return src

    async def _scrape(self, pool: Pool, url: str, *, gpu: bool = False) -> None:
        assert self._fetch is not None
        src = self._source(pool, url)
        try:
            async with asyncio.timeout(pool.scrape_timeout_s):
                text = await self._fetch(url, pool.scrape_timeout_s)
            if gpu:
                at = time.monotonic()
                src.gpus, src.gpus_at_s = tuple(parse_dcgm(url, text, at)), at
            else:
                scrape = parse_engine(pool.kind, url, text, time.monotonic())
        except (OSError, TimeoutError, SourceParseError) as e:
            self._back_off(pool, src, ("src", pool.name, url), f"scrape of {url}", e)
            return
        src.failures, src.retry_at = 0, 0.0
        self._recovered(("src", pool.name, url), f"scrape of {url}")
        if not gpu:
            src.window.append(scrape)

    def _back_off(
        self, pool: Pool, src: _Source, key: tuple[str, ...], what: str, error: Exception
    ) -> None:
        """Count a failure; retry after interval × 2^(failures − 1) (at most MAX_BACKOFF_S)."""
        src.failures += 1
        backoff = min(MAX_BACKOFF_S, pool.scrape_interval_s * 2 ** (src.failures - 1))
        src.retry_at = time.monotonic() + backoff * random.uniform(0.9, 1.1)
        name = type(error).__name__
        reason = f"{name}: {error!s:.160}" if str(error) else name
        self._failed(key, what, reason, pool.name)

    # --- log once per change of state ------------------------------------------------------------
    def _failed(self, key: tuple[str, ...], what: str, reason: str, pool: str) -> None:
        telemetry.SCRAPE_ERRORS.labels(pool=pool).inc()
        if self._logged.get(key) != reason:
            log.warning("%s failed: %s", what, reason)
            self._logged[key] = reason

    def _recovered(self, key: tuple[str, ...], what: str) -> None:
        if key in self._logged:
            log.info("%s recovered", what)
            del self._logged[key]

    # --- the pool view -------------------------------------------------------------------------
    def view(self, pool: Pool, urls: list[str], now: float) -> PoolSnapshot | None:
        """The pool's snapshot from each source's newest good scrape, by the stale policy."""
        backends: list[BackendSignals] = []
        stale_seen = False
        for url in urls:
            src = self._sources.get((pool.name, url))
            newest = src.window.newest if src is not None else None
            if src is None or newest is None:
                stale_seen = True
                if pool.stale == "saturated":
                    backends.append(saturated(url, None))
                continue
            age = now - newest.at_s
            backend = backend_signals(newest, src.window.derived(), age)
            if age <= pool.stale_after_s:
                backends.append(backend)
                continue
            stale_seen = True
            if pool.stale == "last_known" and age <= pool.max_age_s:
                backends.append(replace(backend, stale=True))
            elif pool.stale == "saturated":
                backends.append(saturated(url, backend))
        if not backends:
            return None
        return PoolSnapshot(
            pool=pool.name,
            backends=tuple(backends),
            taken_at_s=now,
            stale=stale_seen,
            gpus=self._gpus(pool, urls, now),
            pcie_bandwidth_bytes_s=pool.pcie_bandwidth_bytes_s,
        )

    def _gpus(self, pool: Pool, urls: list[str], now: float) -> tuple[GpuScrape, ...]:
        """The pool's GPUs from fresh GPU sources (``poolbuild.pool_gpus``)."""
        return pool_gpus(pool, urls, now, self._sources, self._pods.get(pool.name, {}))


async def _resolve_dns(name: str, port: int) -> list[str]:
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(name, port, type=0, proto=6)
    return sorted({str(info[4][0]) for info in infos})
