"""One run: the planned burst sent open-loop to one target while vLLM's metrics are sampled.

- ``send``: one request at its planned time; its ``Shot`` holds the status, the times to the
  headers, to the first token and to the end, the usage, and ICE's answer headers (decision,
  reason, ``retry-after``, ``x-downgraded``).
- ``run_burst``: every request of the burst as its own task, plus a sampler (``metrics``);
  readings of the counters before and after give the run's deltas (``RunResult``).
- ``RunResult.summary``: the run's numbers, flat, under the keys ``results.ROWS`` names.

Invariants: open loop: each request starts at ``t0 + at_s`` whatever the others do, on a
connection of its own (no pooling, no limit); a ``Shot`` never raises: a transport error is
recorded in ``Shot.error``; the sampler is stopped and awaited before its session closes, on
error and on Ctrl-C too; quantiles are nearest-rank, rounded to ms, None without values.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from ext_proc.lab.overload.burst import CHAT, PRIORITIES, Planned, request_body
from ext_proc.lab.overload.metrics import (
    Sample,
    bucket_quantile,
    ext_proc_stats,
    fetch,
    ice_body_buckets,
    metric_sum,
    sample_metrics,
)

__all__ = ["RunResult", "Shot", "run_burst", "send"]


@dataclass
class Shot:
    """What one request of a run got."""

    index: int
    priority: str
    at_s: float
    status: int = 0
    latency_s: float = 0.0
    # Time to the response headers: the gateway's verdict plus vLLM's API server taking the
    # request (tokenising, queueing it in the engine); for a 429, the whole answer.
    headers_s: float | None = None
    # Time to the first streamed token (the wait in vLLM's queue plus prefill), or to the 429.
    ttft_s: float | None = None
    completion_tokens: int = 0
    prompt_tokens: int = 0
    retry_after: str | None = None
    decision: str | None = None
    reason: str | None = None
    downgraded: bool = False  # ICE lowered max_tokens (x-downgraded: true)
    error: str | None = None


async def send(
    session: aiohttp.ClientSession, url: str, p: Planned, body: dict[str, Any], t0: float
) -> Shot:
    await asyncio.sleep(max(0.0, t0 + p.at_s - time.monotonic()))
    shot = Shot(p.index, p.priority, p.at_s)
    start = time.monotonic()
    try:
        async with session.post(url, json=body, headers={"x-priority": p.priority}) as resp:
            shot.headers_s = time.monotonic() - start
            shot.status = resp.status
            shot.retry_after = resp.headers.get("retry-after")
            shot.decision = resp.headers.get("x-ice-decision") or None
            shot.reason = resp.headers.get("x-ice-reason") or None
            shot.downgraded = resp.headers.get("x-downgraded") == "true"
            if resp.status != 200:
                text = await resp.text()
                shot.ttft_s = time.monotonic() - start
                shot.error = text[:2000]
            else:
                async for raw in resp.content:
                    line = raw.strip()
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        break
                    if shot.ttft_s is None:
                        shot.ttft_s = time.monotonic() - start
                    chunk = json.loads(data)
                    usage = chunk.get("usage")
                    if usage:
                        shot.completion_tokens = int(usage.get("completion_tokens") or 0)
                        shot.prompt_tokens = int(usage.get("prompt_tokens") or 0)
    except (aiohttp.ClientError, TimeoutError, ValueError) as e:
        shot.error = f"{type(e).__name__}: {e}"
    shot.latency_s = time.monotonic() - start
    return shot


@dataclass
class RunResult:
    mode: str
    round: int
    wall_s: float
    preemptions: int
    queue_time_mean_s: float | None
    vllm_requests: int
    waiting_max: int
    running_max: int
    kv_usage_max: float
    ext_proc: dict[str, int]
    shots: list[Shot]
    samples: list[Sample] = field(default_factory=list)
    # ICE's ice_processing_seconds{phase="request_body"} over the run: bucket bound → count
    ice_body_buckets: dict[float, float] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        ok = [s for s in self.shots if s.status == 200 and s.error is None]
        shed = [s for s in self.shots if s.status == 429]
        other = [s for s in self.shots if s not in ok and s not in shed]
        ok_lat = [s.latency_s for s in ok]
        waits = [s.ttft_s for s in ok if s.ttft_s is not None]
        tokens = sum(s.completion_tokens for s in ok)
        return {
            "mode": self.mode,
            "round": self.round,
            "requests": len(self.shots),
            "ok": len(ok),
            "shed_429": len(shed),
            "other": len(other),
            "downgraded": sum(1 for s in self.shots if s.downgraded),
            "preemptions": self.preemptions,
            "output_tokens": tokens,
            "wall_s": round(self.wall_s, 2),
            "output_tok_per_s": round(tokens / self.wall_s, 1) if self.wall_s else 0.0,
            "ok_p50_s": _q(ok_lat, 0.5),
            "ok_p95_s": _q(ok_lat, 0.95),
            "ok_max_s": _q(ok_lat, 1.0),
            "all_p50_s": _q([s.latency_s for s in self.shots], 0.5),
            "all_p95_s": _q([s.latency_s for s in self.shots], 0.95),
            "wait_p50_s": _q(waits, 0.5),
            "wait_p95_s": _q(waits, 0.95),
            "wait_max_s": _q(waits, 1.0),
            "vllm_queue_mean_s": None
            if self.queue_time_mean_s is None
            else round(self.queue_time_mean_s, 3),
            "shed_p50_s": _q([s.latency_s for s in shed], 0.5),
            "shed_max_s": _q([s.latency_s for s in shed], 1.0),
            "shed_retry_after": sorted({s.retry_after or "-" for s in shed}),
            "shed_by_priority": {
                p: sum(1 for s in shed if s.priority == p) for p in PRIORITIES if shed
            },
            "shed_reasons": sorted({s.reason or "-" for s in shed}),
            "waiting_max": self.waiting_max,
            "running_max": self.running_max,
            "kv_usage_max": round(self.kv_usage_max, 3),
            "vllm_requests": self.vllm_requests,
            "unjudged": self.ext_proc.get("failure_mode_allowed", 0),
            "ice_body_p50_s": bucket_quantile(self.ice_body_buckets, 0.5),
            "ice_body_max_s": bucket_quantile(self.ice_body_buckets, 1.0),
        }


def _q(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank quantile (q = 1.0: the maximum), rounded to ms; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, int(-(-q * len(ordered) // 1)) - 1))
    return round(ordered[rank], 3)


async def run_burst(
    *,
    mode: str,
    round_no: int,
    target: str,
    metrics_url: str,
    burst: Sequence[Planned],
    model: str,
    seed: int,
    sample_s: float = 0.1,
    admin_port: int | None = None,
    ice_metrics_url: str | None = None,
) -> RunResult:
    """Send ``burst`` to ``target`` (a base URL) and watch vLLM's ``metrics_url`` meanwhile
    (and, given ``ice_metrics_url``, how long ICE took over each body)."""
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    timeout = aiohttp.ClientTimeout(total=600)
    async with (
        aiohttp.ClientSession(connector=connector, timeout=timeout) as session,
        aiohttp.ClientSession() as probe,
    ):
        before = await fetch(probe, metrics_url)
        stats0 = ext_proc_stats(admin_port)
        ice0 = ice_body_buckets(await fetch(probe, ice_metrics_url)) if ice_metrics_url else {}
        base = metric_sum(before, "vllm:num_preemptions_total")
        samples: list[Sample] = []
        stop = asyncio.Event()
        t0 = time.monotonic() + 0.05
        sampler = asyncio.create_task(
            sample_metrics(probe, metrics_url, t0, sample_s, stop, base, samples)
        )
        bodies = [request_body(p, model, seed + p.index) for p in burst]
        try:
            shots = await asyncio.gather(
                *(
                    send(session, target + CHAT, p, b, t0)
                    for p, b in zip(burst, bodies, strict=True)
                )
            )
            wall = time.monotonic() - t0
        finally:  # also on Ctrl-C: the sampler ends before its session closes
            stop.set()
            await asyncio.gather(sampler, return_exceptions=True)
        after = await fetch(probe, metrics_url)
        ice1 = ice_body_buckets(await fetch(probe, ice_metrics_url)) if ice_metrics_url else {}
    stats1 = ext_proc_stats(admin_port)
    q_sum = metric_sum(after, "vllm:request_queue_time_seconds_sum") - metric_sum(
        before, "vllm:request_queue_time_seconds_sum"
    )
    q_count = metric_sum(after, "vllm:request_queue_time_seconds_count") - metric_sum(
        before, "vllm:request_queue_time_seconds_count"
    )
    return RunResult(
        mode=mode,
        round=round_no,
        wall_s=wall,
        preemptions=int(metric_sum(after, "vllm:num_preemptions_total") - base),
        queue_time_mean_s=q_sum / q_count if q_count else None,
        vllm_requests=int(q_count),
        waiting_max=max((s.waiting for s in samples), default=0),
        running_max=max((s.running for s in samples), default=0),
        kv_usage_max=max((s.kv_usage for s in samples), default=0.0),
        ext_proc={k: stats1.get(k, 0) - stats0.get(k, 0) for k in stats1},
        shots=list(shots),
        samples=samples,
        ice_body_buckets={b: n - ice0.get(b, 0.0) for b, n in ice1.items()},
    )
