"""The collector: views by stale policy, backoff, log-once, DNS pools, timeouts (no network)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from pathlib import Path

import pytest

from ext_proc.policy.model import Pool
from ext_proc.signals.collector import SATURATED_WAITING, Collector
from ext_proc.signals.snapshot import PoolSnapshot

PAGE = (
    'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5\n'
    'vllm:num_requests_waiting{engine="0",model_name="m"} 2\n'
    'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="101"} 1\n'
)


class Pages:
    """Serves a page per URL; '!' + text raises OSError; 'hang' sleeps past any timeout."""

    def __init__(self, pages: dict[str, str]) -> None:
        self.pages = pages
        self.calls: list[str] = []
        self.finished_hangs = 0

    async def __call__(self, url: str, timeout_s: float) -> str:
        self.calls.append(url)
        page = self.pages[url]
        if page.startswith("!"):
            raise OSError(page[1:])
        if page == "hang":
            await asyncio.sleep(timeout_s * 20)
            self.finished_hangs += 1
        return page


A, B = "http://a/metrics", "http://b/metrics"
POOL = Pool(name="p", metrics_urls=(A, B), scrape_interval_s=0.1, stale_after_s=0.2, max_age_s=1.0)


def collect(
    pool: Pool, pages: Pages, times: int = 1
) -> tuple[Collector, list[dict[str, PoolSnapshot]]]:
    published: list[dict[str, PoolSnapshot]] = []
    collector = Collector({pool.name: pool}, published.append, fetch=pages)

    async def run() -> None:
        for _ in range(times):
            await collector.collect_once(pool)

    asyncio.run(run())
    return collector, published


def test_a_cycle_publishes_the_backends_that_answered() -> None:
    _, published = collect(POOL, Pages({A: PAGE, B: "!connection refused"}))
    view = published[-1]["p"]
    assert [b.url for b in view.backends] == [A]
    b = view.backends[0]
    assert (b.kv_cache_usage, b.num_requests_waiting, b.num_gpu_blocks, b.block_size) == (
        0.5,
        2,
        101,
        16,
    )
    assert view.stale  # B has never answered


def test_failing_source_backs_off_exponentially() -> None:
    pages = Pages({A: PAGE, B: "!down"})
    collector, _ = collect(POOL, pages)
    src = collector._sources[("p", B)]
    first_retry = src.retry_at
    asyncio.run(collector._scrape(POOL, B))
    assert src.failures == 2 and src.retry_at > first_retry
    # 0.1 × 2^(n−1), capped at MAX_BACKOFF_S = 5 s
    for _ in range(10):
        asyncio.run(collector._scrape(POOL, B))
    assert src.failures == 12


def test_failures_are_logged_once_per_change_of_state(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="ice.collector")
    pages = Pages({A: "!down", B: "!down"})
    collector = Collector({"p": POOL}, lambda _v: None, fetch=pages)
    for _ in range(5):
        asyncio.run(collector._scrape(POOL, A))
    assert len([r for r in caplog.records if "failed" in r.message]) == 1
    pages.pages[A] = PAGE
    asyncio.run(collector._scrape(POOL, A))
    assert len([r for r in caplog.records if "recovered" in r.message]) == 1


def views_at(stale: str, age: float) -> PoolSnapshot | None:
    pool = replace(POOL, stale=stale)  # type: ignore[arg-type]
    collector, _ = collect(pool, Pages({A: PAGE, B: PAGE}))
    newest = max(s.history[-1].at_s for s in collector._sources.values())
    return collector.view(pool, [A, B], newest + age)


def test_fresh_sources_are_not_stale() -> None:
    view = views_at("ignore", 0.05)
    assert view is not None and not view.stale and len(view.backends) == 2


def test_stale_after_two_intervals_ignore_drops_them() -> None:
    assert views_at("ignore", 0.25) is None  # stale_after_s 0.2: no fresh source, no view


def test_last_known_keeps_values_flagged_until_max_age() -> None:
    view = views_at("last_known", 0.5)
    assert view is not None and view.stale
    assert all(b.stale and b.kv_cache_usage == 0.5 for b in view.backends)
    assert views_at("last_known", 1.5) is None  # past max_age_s 1.0


def test_saturated_counts_a_stale_source_as_full() -> None:
    view = views_at("saturated", 5.0)
    assert view is not None and view.stale
    assert all(
        b.kv_cache_usage == 1.0 and b.num_requests_waiting == SATURATED_WAITING
        for b in view.backends
    )
    assert view.max_free_blocks == 0


def test_derived_rates_appear_after_two_scrapes() -> None:
    pages = Pages({A: PAGE + "vllm:request_success_total 10\n", B: "!down"})
    collector = Collector({"p": POOL}, lambda _v: None, fetch=pages)

    async def run() -> PoolSnapshot | None:
        await collector.collect_once(POOL)
        await asyncio.sleep(0.05)
        pages.pages[A] = PAGE + "vllm:request_success_total 15\n"
        return await collector.collect_once(POOL)

    view = asyncio.run(run())
    assert view is not None
    d = view.backends[0].derived
    assert d is not None and d.completions_per_s is not None and d.completions_per_s > 0


def test_dns_pool_scrapes_every_address_and_keeps_the_last_set_on_failure() -> None:
    answers: list[list[str] | OSError] = [["10.0.0.1", "10.0.0.2"], OSError("SERVFAIL")]

    async def resolve(name: str, port: int) -> list[str]:
        answer = answers.pop(0)
        if isinstance(answer, OSError):
            raise answer
        return answer

    pool = Pool(name="d", metrics_urls=(), dns_name="vllm.svc", dns_port=8000, dns_refresh_s=0.0)
    collector = Collector({"d": pool}, lambda _v: None, fetch=Pages({}), resolve=resolve)
    first = asyncio.run(collector.endpoints(pool))
    assert first == ["http://10.0.0.1:8000/metrics", "http://10.0.0.2:8000/metrics"]
    assert asyncio.run(collector.endpoints(pool)) == first  # lookup failed: last set kept


def test_a_hanging_source_is_cut_at_its_timeout() -> None:
    pool = replace(POOL, metrics_urls=(A,), scrape_timeout_s=0.05)
    pages = Pages({A: "hang"})
    _, published = collect(pool, pages)
    assert "p" not in published[-1]
    assert pages.finished_hangs == 0  # cancelled, not awaited


DCGM = (Path(__file__).parent / "data" / "signals" / "dcgm_metrics.txt").read_text()


@pytest.mark.parametrize(
    ("join", "backend_host", "expected"),
    [("pool", "a", 2), ("host", "gpu-node-07", 2), ("host", "a", 0)],
)
def test_gpu_sources_join_the_pool_view(join: str, backend_host: str, expected: int) -> None:
    url = f"http://{backend_host}:8000/metrics"
    pool = Pool(
        name="p", metrics_urls=(url,), gpu_metrics_urls=("http://dcgm/metrics",), gpu_join=join
    )
    _, published = collect(pool, Pages({url: PAGE, "http://dcgm/metrics": DCGM}))
    view = published[-1]["p"]
    assert len(view.gpus) == expected
    if expected:
        assert view.pcie_utilization is not None


def test_prometheus_pool_reads_each_backend_from_instant_queries() -> None:
    import json
    import re
    from urllib.parse import parse_qs, urlsplit

    from test_signals_promapi import _answer, _as_prometheus  # type: ignore[import-not-found]

    data = Path(__file__).parent / "data" / "vllm_cpu"
    samples = _as_prometheus("vllm", data / "metrics_loaded.txt", "10.0.0.1:8000") + (
        _as_prometheus("vllm", data / "metrics_idle.txt", "10.0.0.2:8000")
    )
    seen_queries: list[str] = []

    async def prometheus(url: str, timeout_s: float) -> str:
        query = parse_qs(urlsplit(url).query)["query"][0]
        seen_queries.append(query)
        names = re.search(r'__name__=~"([^"]+)"', query)
        assert names is not None
        wanted = set(names.group(1).split("|"))
        return json.dumps(_answer([s for s in samples if s[0] in wanted]))

    pool = Pool(
        name="p",
        metrics_urls=(),
        prometheus_url="http://prom:9090",
        prometheus_matchers='namespace="llm"',
    )
    published: list[dict[str, PoolSnapshot]] = []
    collector = Collector({"p": pool}, published.append, fetch=prometheus)
    view = asyncio.run(collector.collect_once(pool))
    assert view is not None
    assert sorted(b.url for b in view.backends) == ["10.0.0.1:8000", "10.0.0.2:8000"]
    loaded = next(b for b in view.backends if b.url == "10.0.0.1:8000")
    assert loaded.num_requests_waiting == 16 and loaded.num_gpu_blocks == 24
    assert all('namespace="llm"' in q for q in seen_queries)
