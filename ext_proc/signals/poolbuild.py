"""The pure parts of a pool's view: each backend's signals, the stale stand-in, the GPUs.

Job: ``backend_signals`` / ``backend_from_scrape`` turn a backend's newest ``EngineScrape``
(and the rates derived from its history) into the evaluator's ``BackendSignals``;
``saturated`` is what a stale source counts as under ``stale: saturated``; ``pool_gpus``
picks the pool's GPUs from its fresh GPU sources, joined by ``gpu_join``. The collector
(``ext_proc.signals.collector``) owns the sources and calls these with what they need.

GPU sources (the pool's ``gpu_metrics_urls``, DCGM exporters) are scraped alongside; their
GPUs join the view by ``gpu_join``: ``pool`` (all of them), ``host`` (those whose
``Hostname`` label is the host of one of the pool's backends) or ``pod`` (those whose ``pod``
label names one of the backends' pods, and whose ``namespace`` label matches where the
backend's namespace is known; a GPU without a pod label is not joined). Backends' pods come
from the pool's ``backend_pods`` (static URLs) or from the ``pod``/``namespace`` labels of a
Prometheus source's series; DNS backends are addresses and have none. A pool with
``local_gpus: nvml`` (ICE beside the inference server) also reads this host's GPUs through
NVML (source ``LOCAL_GPUS``); they always join. A GPU source counts while its newest good
read is at most ``max_age_s`` old.

Invariants: pure (no I/O, no clock, no state of its own: ``now`` and the sources are passed
in). A token-granular cache (SGLang: a capacity in tokens, no block count) is reported as
blocks of one token. A saturated stand-in keeps a stale source's last values but for a full
KV cache and ``SATURATED_WAITING`` waiting requests, and is marked stale.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Protocol
from urllib.parse import urlsplit

from ext_proc.signals.pool import Pool
from ext_proc.signals.scrapes import Derived, EngineScrape, GpuScrape
from ext_proc.signals.snapshot import BackendSignals
from ext_proc.signals.window import derive

__all__ = [
    "LOCAL_GPUS",
    "SATURATED_WAITING",
    "GpuSource",
    "backend_from_scrape",
    "backend_signals",
    "gpu_join",
    "limit_share",
    "pool_gpus",
    "saturated",
]

SATURATED_WAITING = 1e6  # a stale source under `stale: saturated` reports this queue
LOCAL_GPUS = "nvml"  # the source name of a pool's local GPUs (logs, GpuScrape.source)


class GpuSource(Protocol):
    """What the GPU join reads of a source: its newest GPUs and when they were read."""

    gpus: tuple[GpuScrape, ...]
    gpus_at_s: float


def backend_from_scrape(
    scrape: EngineScrape, history: list[EngineScrape], window_s: float
) -> BackendSignals:
    """The evaluator's view of one backend from its newest scrape and recent history."""
    return backend_signals(scrape, derive(history, window_s) if len(history) >= 2 else None)


def backend_signals(
    scrape: EngineScrape, derived: Derived | None, age_s: float = 0.0
) -> BackendSignals:
    blocks, block_size = scrape.num_gpu_blocks, scrape.block_size
    if blocks is None and scrape.kv_capacity_tokens is not None:
        blocks, block_size = scrape.kv_capacity_tokens, 1  # token-granular caches (SGLang)
    return BackendSignals(
        url=scrape.source,
        kv_cache_usage=scrape.kv_cache_usage,
        num_requests_running=scrape.num_requests_running,
        num_requests_waiting=scrape.num_requests_waiting,
        num_gpu_blocks=blocks,
        block_size=block_size,
        derived=derived,
        cache_hit_rate=scrape.cache_hit_rate,
        prefix_caching=scrape.prefix_caching,
        sleep_state=scrape.sleep_state,
        output_lengths=scrape.output_lengths,
        itl_mean_s=(
            scrape.itl_s.sum / scrape.itl_s.count
            if scrape.itl_s is not None and scrape.itl_s.count > 0 and scrape.itl_s.sum > 0
            else None
        ),
        preemptions=scrape.preemptions,
        limit_share=limit_share(scrape.finished_by_reason),
        age_s=age_s,
    )


def limit_share(finished: tuple[tuple[str, float], ...]) -> float | None:
    """length ÷ (length + stop + repetition) of vLLM's finished requests by reason: the share
    that ran to their output limit (aborted and failed ones say nothing of their length);
    None when none finished yet, or the page does not split them."""
    by = dict(finished)
    ended = by.get("length", 0.0) + by.get("stop", 0.0) + by.get("repetition", 0.0)
    return by.get("length", 0.0) / ended if ended > 0 else None


def saturated(url: str, last: BackendSignals | None) -> BackendSignals:
    base = last or BackendSignals(url=url)
    return replace(base, kv_cache_usage=1.0, num_requests_waiting=SATURATED_WAITING, stale=True)


def pool_gpus(
    pool: Pool,
    urls: list[str],
    now: float,
    sources: Mapping[tuple[str, str], GpuSource],
    prometheus_pods: Mapping[str, tuple[str, str]],
) -> tuple[GpuScrape, ...]:
    """The pool's GPUs from fresh GPU sources: DCGM exporters' joined by
    ``pool.gpu_join``, then the local ones (NVML). ``sources``: by (pool, url);
    ``prometheus_pods``: the pool's Prometheus backends → (namespace or "", pod)."""
    if not pool.gpu_metrics_urls and not pool.local_gpus:
        return ()
    joins = gpu_join(pool, urls, prometheus_pods)
    found: list[GpuScrape] = []
    for url in (*pool.gpu_metrics_urls, *((LOCAL_GPUS,) if pool.local_gpus else ())):
        src = sources.get((pool.name, url))
        if src is None or not src.gpus or now - src.gpus_at_s > pool.max_age_s:
            continue
        found.extend(src.gpus if url == LOCAL_GPUS else filter(joins, src.gpus))
    return tuple(found)


def gpu_join(
    pool: Pool, urls: list[str], prometheus_pods: Mapping[str, tuple[str, str]]
) -> Callable[[GpuScrape], bool]:
    """Whether a DCGM exporter's GPU belongs to the pool (see the module docstring)."""
    if pool.gpu_join == "host":
        hosts = {urlsplit(u).hostname for u in urls}
        return lambda g: g.host in hosts
    if pool.gpu_join == "pod":
        namespaces: dict[str, set[str]] = {}  # backend pod → its namespaces ("": unknown)
        for url in urls:
            ref = pool.backend_pods.get(url) or prometheus_pods.get(url)
            if ref is not None:
                namespaces.setdefault(ref[1], set()).add(ref[0])

        def joined(g: GpuScrape) -> bool:
            spaces = namespaces.get(g.pod) if g.pod else None
            return spaces is not None and ("" in spaces or g.namespace in spaces)

        return joined
    return lambda g: True
