"""What a run watches: vLLM's ``/metrics``, ICE's processing-time histogram, Envoy's counters.

- ``fetch`` / ``metric_sum``: one page; one sample name summed over its labels
  (``ext_proc.lab.vllm_local.metric_values``).
- ``sample_metrics``: a ``Sample`` (KV usage, waiting, running, preemptions since a baseline)
  every ``every_s`` until ``stop`` is set.
- ``ice_body_buckets`` / ``bucket_quantile``: ICE's ``ice_processing_seconds`` buckets of the
  ``request_body`` phase, and the bucket bound that holds a quantile.
- ``admission_rejections`` / ``rejection_delta``: vLLM's ``vllm:admission_rejections_total``
  by its ``reason`` label (its admission valve's 503s; ``arms``), summed over the other
  labels; and a run's rejections, from the readings before and after it.
- ``ext_proc_stats``: Envoy's ``http.ingress.ext_proc.*`` counters from its admin port.
- ``wait_idle``: block until vLLM has nothing running or waiting on two samples in a row.

Invariants: read-only (nothing here sends vLLM a request to serve); counters are cumulative, so a
run's numbers are differences of readings taken before and after it (``run.run_burst``);
``sample_metrics`` skips a scrape that fails in transport or times out and ends once ``stop`` is
set; ``wait_idle`` raises ``RuntimeError`` past its timeout rather than wait forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
import urllib.request
from dataclasses import dataclass

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from ext_proc.lab import vllm_local as vl

__all__ = [
    "ADMISSION_REJECTIONS",
    "Sample",
    "admission_rejections",
    "bucket_quantile",
    "ext_proc_stats",
    "fetch",
    "ice_body_buckets",
    "metric_sum",
    "rejection_delta",
    "sample_metrics",
    "wait_idle",
]


@dataclass
class Sample:
    t_s: float
    kv_usage: float
    waiting: int
    running: int
    preemptions: int


def metric_sum(page: str, name: str) -> float:
    return sum(vl.metric_values(page, name))


async def fetch(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(url, timeout=aiohttp.ClientTimeout(total=5)) as resp:
        return await resp.text()


async def sample_metrics(
    session: aiohttp.ClientSession,
    url: str,
    t0: float,
    every_s: float,
    stop: asyncio.Event,
    base_preemptions: float,
    out: list[Sample],
) -> None:
    while not stop.is_set():
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            page = await fetch(session, url)
            out.append(
                Sample(
                    round(time.monotonic() - t0, 2),
                    max(vl.metric_values(page, "vllm:kv_cache_usage_perc") or [0.0]),
                    int(metric_sum(page, "vllm:num_requests_waiting")),
                    int(metric_sum(page, "vllm:num_requests_running")),
                    int(metric_sum(page, "vllm:num_preemptions_total") - base_preemptions),
                )
            )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every_s)


async def sample_peak(
    session: aiohttp.ClientSession,
    url: str,
    t0: float,
    every_s: float,
    stop: asyncio.Event,
    out: list[tuple[float, float]],
    held_max: dict[str, float] | None = None,
) -> None:
    """ICE's ``ice_forecast_peak_blocks`` (its largest endpoint) every ``every_s`` into
    ``out`` as (seconds since ``t0``, blocks) (admission: forecast; nothing when the gauge
    is absent); and into ``held_max`` the most ``ice_tenant_blocks_held`` sampled per
    tenant (a pool with ``tenant_shares``)."""
    while not stop.is_set():
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            page = await fetch(session, url)
            values = vl.metric_values(page, "ice_forecast_peak_blocks")
            if values:
                out.append((round(time.monotonic() - t0, 2), max(values)))
            if held_max is not None:
                for tenant, blocks in tenant_blocks_held(page).items():
                    held_max[tenant] = max(held_max.get(tenant, 0.0), blocks)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every_s)


def tenant_blocks_held(page: str) -> dict[str, float]:
    """``ice_tenant_blocks_held`` by ``tenant`` on ICE's page (summed over pools)."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            if sample.name == "ice_tenant_blocks_held":
                tenant = sample.labels.get("tenant", "-")
                out[tenant] = out.get(tenant, 0.0) + float(sample.value)
    return out


ADMISSION_REJECTIONS = "vllm:admission_rejections_total"


def admission_rejections(page: str) -> dict[str, float]:
    """``vllm:admission_rejections_total`` by ``reason`` on a page (``{}``: a vLLM without
    the valve's counter)."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            if sample.name == ADMISSION_REJECTIONS:
                reason = sample.labels.get("reason", "-")
                out[reason] = out.get(reason, 0.0) + float(sample.value)
    return out


def rejection_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, int]:
    """The rejections by reason between two ``admission_rejections`` readings: every reason
    of ``after`` (a reason first seen after counts from 0)."""
    return {reason: int(n - before.get(reason, 0.0)) for reason, n in after.items()}


def ice_body_buckets(page: str) -> dict[float, float]:
    """Cumulative counts of ICE's ``ice_processing_seconds`` body-phase buckets on a page."""
    out: dict[float, float] = {}
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            if (
                sample.name == "ice_processing_seconds_bucket"
                and sample.labels.get("phase") == "request_body"
            ):
                le = float(sample.labels["le"])
                out[le] = out.get(le, 0.0) + float(sample.value)
    return out


def bucket_quantile(cumulative: dict[float, float], q: float) -> float | None:
    """The upper bound of the bucket that holds the nearest-rank ``q`` quantile (q = 1.0: the
    bucket of the slowest message; inf when it is past the last bound); None without data."""
    bounds = sorted(cumulative)
    total = cumulative[bounds[-1]] if bounds else 0.0
    if total <= 0:
        return None
    rank = max(1.0, math.ceil(q * total))
    return next(b for b in bounds if cumulative[b] >= rank)


def ext_proc_stats(admin_port: int | None) -> dict[str, int]:
    """Envoy's ``http.ingress.ext_proc.*`` counters (empty when there is no Envoy)."""
    if admin_port is None:
        return {}
    url = f"http://127.0.0.1:{admin_port}/stats?filter=http.ingress.ext_proc"
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    out: dict[str, int] = {}
    for line in text.splitlines():
        name, _, value = line.partition(": ")
        if value.strip().isdigit():
            out[name.rsplit(".", 1)[-1]] = int(value)
    return out


def wait_idle(metrics_url: str, timeout_s: float = 120.0) -> None:
    """Until vLLM reports nothing running or waiting on two samples in a row."""
    deadline = time.monotonic() + timeout_s
    quiet = 0
    while quiet < 2:
        with urllib.request.urlopen(metrics_url, timeout=5) as resp:
            page = resp.read().decode()
        busy = metric_sum(page, "vllm:num_requests_running") + metric_sum(
            page, "vllm:num_requests_waiting"
        )
        quiet = quiet + 1 if busy == 0 else 0
        if time.monotonic() > deadline:
            raise RuntimeError(f"vLLM still busy after {timeout_s} s")
        time.sleep(0.2)
