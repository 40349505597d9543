"""The collector: views by stale policy, backoff, log-once, DNS pools, timeouts, GPU joins and
local GPUs through a stand-in for pynvml (no network, no GPU)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType

import pytest
from prometheus_client import REGISTRY

from ext_proc.signals.collector import Collector
from ext_proc.signals.nvml import NvmlSource
from ext_proc.signals.pool import Pool
from ext_proc.signals.poolbuild import SATURATED_WAITING
from ext_proc.signals.snapshot import PoolSnapshot
from tests.builders import (
    GIB,
    H200,
    FakeNvml,
    FakeNVMLError,
    as_prometheus,
    promapi_answer,
)

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
    newest = max(s.window.newest.at_s for s in collector._sources.values() if s.window.newest)
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


def test_the_valves_rejections_and_the_sleep_state_reach_the_view() -> None:
    """vLLM 0.32's own valve and sleep mode, page to pool view, as the pipeline reads it."""
    valve = 'vllm:admission_rejections_total{model_name="m",reason="max_num_queued_reqs"} %d\n'
    sleep = 'vllm:engine_sleep_state{engine="0",model_name="m",sleep_state="awake"} %d\n'
    pages = Pages({A: PAGE + valve % 3 + sleep % 1, B: PAGE + sleep % 0})
    collector = Collector({"p": POOL}, lambda _v: None, fetch=pages)

    async def run() -> list[PoolSnapshot | None]:
        views = [await collector.collect_once(POOL)]
        for rejected in (5, 5):  # 3 → 5: rejected since the previous scrape; 5 → 5: not
            await asyncio.sleep(0.05)
            pages.pages[A] = PAGE + valve % rejected + sleep % 1
            views.append(await collector.collect_once(POOL))
        return views

    first, rose, flat = asyncio.run(run())
    assert first is not None and rose is not None and flat is not None
    a, b = rose.backends
    assert a.admission_rejected and a.derived is not None
    assert a.derived.admission_rejections_per_s is not None
    assert a.derived.admission_rejections_per_s > 0
    assert not first.backends[0].admission_rejected  # one scrape: unknown counts as no
    assert not flat.backends[0].admission_rejected
    assert (a.sleep_state, b.sleep_state, b.asleep, rose.asleep) == ("awake", "paused", True, False)


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


DCGM = (Path(__file__).parents[1] / "data" / "signals" / "dcgm_metrics.txt").read_text()


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

    data = Path(__file__).parents[1] / "data" / "vllm_cpu"
    samples = as_prometheus("vllm", data / "metrics_loaded.txt", "10.0.0.1:8000") + (
        as_prometheus("vllm", data / "metrics_idle.txt", "10.0.0.2:8000")
    )
    seen_queries: list[str] = []

    async def prometheus(url: str, timeout_s: float) -> str:
        query = parse_qs(urlsplit(url).query)["query"][0]
        seen_queries.append(query)
        names = re.search(r'__name__=~"([^"]+)"', query)
        assert names is not None
        wanted = set(names.group(1).split("|"))
        return json.dumps(promapi_answer([s for s in samples if s[0] in wanted]))

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


# -- gpu_join: pod ----------------------------------------------------------------------------


def _dcgm_page(gpus: list[dict[str, str]]) -> str:
    """A DCGM exporter page: framebuffer and PCIe TX of each GPU, with the given labels."""
    lines = ["# TYPE DCGM_FI_DEV_FB_USED gauge", "# TYPE DCGM_FI_PROF_PCIE_TX_BYTES gauge"]
    for i, labels in enumerate(gpus):
        text = ",".join(f'{k}="{v}"' for k, v in {"gpu": str(i), **labels}.items())
        lines += [
            f"DCGM_FI_DEV_FB_USED{{{text}}} 1024",
            f"DCGM_FI_PROF_PCIE_TX_BYTES{{{text}}} 1e9",
        ]
    return "\n".join(lines) + "\n"


POD_GPUS = _dcgm_page(
    [
        {"Hostname": "node-1", "pod": "vllm-0", "namespace": "llm"},
        {"Hostname": "node-1", "pod": "vllm-1", "namespace": "other"},
        {"Hostname": "node-1"},  # no pod label: a GPU no pod holds, or no pod mapping
        {"Hostname": "node-2", "exported_pod": "vllm-0", "exported_namespace": "llm"},
        {"Hostname": "node-2", "pod": "vllm-2"},  # no namespace label
    ]
)
DCGM_URL = "http://dcgm:9400/metrics"


@pytest.mark.parametrize(
    ("backend_pods", "joined"),
    [
        ({A: ("llm", "vllm-0")}, ["0", "3"]),
        ({A: ("", "vllm-0")}, ["0", "3"]),
        ({A: ("", "vllm-1"), B: ("llm", "vllm-0")}, ["0", "1", "3"]),
        ({A: ("other", "vllm-0")}, []),
        ({A: ("llm", "vllm-2")}, []),
        ({A: ("", "vllm-2")}, ["4"]),
        ({}, []),
    ],
    ids=[
        "pod-and-namespace",
        "pod-any-namespace",
        "two-backends",
        "namespace-differs",
        "gpu-without-namespace",
        "gpu-without-namespace-any",
        "no-pods-known",
    ],
)
def test_gpu_join_pod_takes_the_gpus_of_the_backends_pods(
    backend_pods: dict[str, tuple[str, str]], joined: list[str]
) -> None:
    pool = replace(
        POOL,
        gpu_metrics_urls=(DCGM_URL,),
        gpu_join="pod",
        backend_pods=MappingProxyType(backend_pods),
    )
    _, published = collect(pool, Pages({A: PAGE, B: PAGE, DCGM_URL: POD_GPUS}))
    view = published[-1]["p"]
    assert [g.gpu for g in view.gpus] == joined
    assert "2" not in [g.gpu for g in view.gpus]  # never the GPU without a pod label


def test_gpu_join_pod_reads_a_prometheus_pools_pods_from_its_labels() -> None:
    import json
    import re
    from urllib.parse import parse_qs, urlsplit

    data = Path(__file__).parents[1] / "data" / "vllm_cpu"
    samples = [
        (n, {**labels, "pod": pod, "namespace": "llm"}, v)
        for pod, instance in (("vllm-0", "10.0.0.1:8000"), ("vllm-9", "10.0.0.9:8000"))
        for n, labels, v in as_prometheus("vllm", data / "metrics_idle.txt", instance)
    ]

    async def fetch(url: str, timeout_s: float) -> str:
        if url == DCGM_URL:
            return POD_GPUS
        names = re.search(r'__name__=~"([^"]+)"', parse_qs(urlsplit(url).query)["query"][0])
        assert names is not None
        wanted = set(names.group(1).split("|"))
        return json.dumps(promapi_answer([s for s in samples if s[0] in wanted]))

    pool = Pool(
        name="p",
        metrics_urls=(),
        prometheus_url="http://prom:9090",
        gpu_metrics_urls=(DCGM_URL,),
        gpu_join="pod",
    )
    collector = Collector({"p": pool}, lambda _v: None, fetch=fetch)
    view = asyncio.run(collector.collect_once(pool))
    assert view is not None and len(view.backends) == 2
    assert [(g.gpu, g.pod) for g in view.gpus] == [("0", "vllm-0"), ("3", "vllm-0")]


# -- local GPUs through NVML ------------------------------------------------------------------


NVML_POOL = replace(POOL, metrics_urls=(A,), local_gpus="nvml", scrape_interval_s=1.0)


def collect_with_nvml(
    fake: FakeNvml, pool: Pool = NVML_POOL, cycles: int = 1
) -> tuple[Collector, PoolSnapshot | None]:
    """Cycles of a collector whose NVML is ``fake`` (retrying a failed source at once)."""
    collector = Collector(
        {pool.name: pool},
        lambda _v: None,
        fetch=Pages({A: PAGE}),
        nvml=lambda: NvmlSource("nvml", module=fake),
    )

    async def run() -> PoolSnapshot | None:
        view = None
        for _ in range(cycles):
            for src in collector._sources.values():
                src.retry_at = 0.0
            view = await collector.collect_once(pool)
        await collector.stop()
        return view

    return collector, asyncio.run(run())


def test_local_gpus_join_the_view_where_dcgm_values_would() -> None:
    _, view = collect_with_nvml(FakeNvml(devices=[H200]))
    assert view is not None
    (gpu,) = view.gpus
    assert (gpu.source, gpu.model_name, gpu.fb_used_bytes) == ("nvml", "NVIDIA H200", 100 * GIB)
    assert view.pcie_utilization == pytest.approx(2048 * 1024 / 32e9)  # PCIe term, as DCGM's
    assert view.gpu_memory_used_fraction == pytest.approx(100 / 141)


def scrape_errors(pool: str) -> float:
    return REGISTRY.get_sample_value("ice_scrape_errors_total", {"pool": pool}) or 0.0


def test_without_nvml_the_pool_works_without_gpus_logged_once_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="ice.collector")
    pool = replace(NVML_POOL, name="no-nvml")
    fake = FakeNvml(devices=[H200], init_error=FakeNVMLError("Driver Not Loaded"))
    before = scrape_errors("no-nvml")
    _, view = collect_with_nvml(fake, pool, cycles=3)
    assert view is not None and len(view.backends) == 1 and view.gpus == ()
    assert view.pcie_utilization is None  # the score has no PCIe term
    failed = [r.message for r in caplog.records if "NVML read failed" in r.message]
    assert failed == ["NVML read failed: NvmlUnavailable: NVML unavailable: Driver Not Loaded"]
    assert scrape_errors("no-nvml") - before == 3  # every attempt counts
    assert fake.calls.count("init") == 3  # tried again after each backoff


def test_nvml_that_comes_up_later_is_read_and_logged_as_recovered(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="ice.collector")
    fake = FakeNvml(devices=[H200], init_error=FakeNVMLError("Driver Not Loaded"))
    pool = replace(NVML_POOL, name="late-nvml")
    collector = Collector(
        {pool.name: pool},
        lambda _v: None,
        fetch=Pages({A: PAGE}),
        nvml=lambda: NvmlSource("nvml", module=fake),
    )

    async def run() -> PoolSnapshot | None:
        await collector.collect_once(pool)
        fake.init_error = None
        collector._sources[(pool.name, "nvml")].retry_at = 0.0
        view = await collector.collect_once(pool)
        await collector.stop()
        return view

    view = asyncio.run(run())
    assert view is not None and [g.uuid for g in view.gpus] == ["GPU-aaaa"]
    assert any(r.message == "NVML read recovered" for r in caplog.records)


def test_the_real_nvml_on_this_machine_never_breaks_the_pool() -> None:
    """Without a GPU (CI) the pool's view has its backends and no GPUs."""
    pool = replace(NVML_POOL, name="real-nvml")
    collector = Collector({pool.name: pool}, lambda _v: None, fetch=Pages({A: PAGE}))

    async def run() -> PoolSnapshot | None:
        view = await collector.collect_once(pool)
        await collector.stop()
        return view

    view = asyncio.run(run())
    assert view is not None and len(view.backends) == 1
    assert all(g.source == "nvml" for g in view.gpus)


def test_sources_of_vanished_dns_addresses_are_forgotten(caplog: pytest.LogCaptureFixture) -> None:
    one, two = "http://10.0.0.1:8000/metrics", "http://10.0.0.2:8000/metrics"
    answers = [["10.0.0.1", "10.0.0.2"], ["10.0.0.1"]]

    async def resolve(name: str, port: int) -> list[str]:
        return answers.pop(0) if len(answers) > 1 else answers[0]

    pool = Pool(
        name="d",
        metrics_urls=(),
        dns_name="vllm.svc",
        dns_port=8000,
        dns_refresh_s=0.0,
        scrape_interval_s=0.1,
    )
    pages = Pages({one: PAGE, two: "!connection refused"})
    collector = Collector({"d": pool}, lambda _v: None, fetch=pages, resolve=resolve)

    async def run() -> list[PoolSnapshot | None]:
        views = [await collector.collect_once(pool)]
        assert ("d", two) in collector._sources  # scraped, failing
        views.append(await collector.collect_once(pool))  # 10.0.0.2 no longer resolves
        return views

    with caplog.at_level(logging.INFO, logger="ice.collector"):
        first, second = asyncio.run(run())
    assert first is not None and [b.url for b in first.backends] == [one]
    assert second is not None and [b.url for b in second.backends] == [one]
    assert sorted(url for _, url in collector._sources) == [one]
    assert ("src", "d", two) not in collector._logged
    assert f"{two} left pool d" in caplog.text
    assert pages.calls.count(two) == 1
