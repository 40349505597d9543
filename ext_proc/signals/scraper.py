"""A simple background scraper of each pool's backend ``/metrics`` (the I/O shell).

Job: every ``scrape_interval_s`` (with ±10% jitter) fetch each backend's page, parse it
(``parse_vllm_metrics``, pure) and publish a new ``PoolSnapshot`` into the ``SnapshotStore``.
The request path only calls ``SnapshotStore.get``, which is a dict lookup and a clock read.

Invariants:
- A backend whose scrape fails is left out of that snapshot; when every backend fails the
  previous snapshot stays, ages, and turns stale after the pool's ``max_age_s``.
- Failures are logged once per change of state (failing → ok → failing), never per scrape,
  and counted in ``ice_scrape_errors_total``.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping

import aiohttp

from ext_proc import telemetry
from ext_proc.policy.model import Pool
from ext_proc.signals.snapshot import BackendSignals, PoolSnapshot
from ext_proc.signals.vllm import MetricsParseError, parse_vllm_metrics

__all__ = ["Fetch", "Scraper", "SnapshotStore"]

log = logging.getLogger("ice.scraper")

Fetch = Callable[[str, float], Awaitable[str]]


class SnapshotStore:
    """The newest snapshot of each pool; readers never wait."""

    def __init__(self, max_age_s: Mapping[str, float]) -> None:
        self._snapshots: dict[str, PoolSnapshot] = {}
        self._max_age_s = dict(max_age_s)

    def put(self, snapshot: PoolSnapshot) -> None:
        self._snapshots[snapshot.pool] = snapshot

    def get(self, pool: str, now_s: float | None = None) -> PoolSnapshot | None:
        """The pool's newest snapshot, or None when there is none or it is stale."""
        snap = self._snapshots.get(pool)
        if snap is None or not snap.backends:
            return None
        now = time.monotonic() if now_s is None else now_s
        if now - snap.taken_at_s > self._max_age_s.get(pool, 2.0):
            return None
        return snap


class Scraper:
    """Scrapes every pool on its own interval until ``stop``."""

    def __init__(
        self,
        pools: Mapping[str, Pool],
        store: SnapshotStore,
        fetch: Fetch | None = None,
        on_snapshot: Callable[[PoolSnapshot], None] | None = None,
    ) -> None:
        self._on_snapshot = on_snapshot
        self._pools = pools
        self._store = store
        self._fetch = fetch
        self._session: aiohttp.ClientSession | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._failing: dict[str, str] = {}

    async def start(self) -> None:
        if self._fetch is None:
            self._session = aiohttp.ClientSession()
            self._fetch = self._http_fetch
        for pool in self._pools.values():
            if pool.metrics_urls:
                self._tasks.append(asyncio.create_task(self._run(pool), name=f"scrape-{pool.name}"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        if self._session is not None:
            await self._session.close()

    async def _http_fetch(self, url: str, timeout_s: float) -> str:
        assert self._session is not None
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with self._session.get(url, timeout=timeout) as resp:
            if resp.status != 200:
                raise OSError(f"HTTP {resp.status}")
            return await resp.text(errors="replace")

    async def scrape_once(self, pool: Pool) -> PoolSnapshot:
        """Scrape every backend of ``pool`` concurrently and publish what answered."""
        results = await asyncio.gather(
            *(self._scrape_backend(url, pool) for url in pool.metrics_urls)
        )
        backends = tuple(r for r in results if r is not None)
        snapshot = PoolSnapshot(pool=pool.name, backends=backends, taken_at_s=time.monotonic())
        if backends:
            self._store.put(snapshot)
            telemetry.observe_pool(snapshot)
            if self._on_snapshot is not None:
                self._on_snapshot(snapshot)
        return snapshot

    async def _scrape_backend(self, url: str, pool: Pool) -> BackendSignals | None:
        assert self._fetch is not None
        try:
            async with asyncio.timeout(pool.scrape_timeout_s):
                text = await self._fetch(url, pool.scrape_timeout_s)
            signals = parse_vllm_metrics(url, text)
        except (OSError, TimeoutError, aiohttp.ClientError, MetricsParseError) as e:
            reason = type(e).__name__ if not str(e) else f"{type(e).__name__}: {e!s:.160}"
            telemetry.SCRAPE_ERRORS.labels(pool=pool.name).inc()
            if self._failing.get(url) != reason:
                log.warning("scrape of %s failed: %s", url, reason)
                self._failing[url] = reason
            return None
        if url in self._failing:
            log.info("scrape of %s recovered", url)
            del self._failing[url]
        return signals

    async def _run(self, pool: Pool) -> None:
        while True:
            started = time.monotonic()
            await self.scrape_once(pool)
            interval = pool.scrape_interval_s * random.uniform(0.9, 1.1)
            await asyncio.sleep(max(0.0, interval - (time.monotonic() - started)))
