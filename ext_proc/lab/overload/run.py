"""One run: the planned burst sent open-loop to one target while vLLM's metrics are sampled.

- ``send``: one request at its planned time (with ``x-priority`` and, when planned, the
  tenant header ``x-tenant``); its ``Shot`` (``shots``) holds what it got.
- ``run_burst``: every request of the burst as its own task, plus a sampler (``metrics``);
  readings of the counters before and after give the run's deltas (``RunResult``), vLLM's
  admission rejections by reason among them.
- ``RunResult.summary``: the run's numbers, flat, under the keys ``results.ROWS`` names, and
  ``tenants`` (``tenant_breakdown``) and ``kinds`` (``kind_breakdown``), from the pure
  reductions over its shots (``shots``: ``drain_s``, ``goodput``, ``by_reason``,
  ``by_valve``, ``by_status``; what counts as a refusal).

A 503 inside a 200 stream counts in ``refused_503_in_stream`` too: ICE, which sees only the
response headers, cannot rewrite it. vLLM's own count of its valve's refusals
(``RunResult.admission_rejections``) holds whatever the 503 became on its way back.
``RunResult.label`` is the arm's name (``arms.arm_name``: the mode, and the valve of the
vLLM behind it) and the control's name.

Invariants: open loop: each request starts at ``t0 + at_s`` whatever the others do, on a
connection of its own (no pooling, no limit); a ``Shot`` never raises: a transport error is
recorded in ``Shot.error``; the sampler is stopped and awaited before its session closes, on
error and on Ctrl-C too.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from ext_proc.lab.overload.arms import arm_name, short_reason
from ext_proc.lab.overload.burst import (
    CHAT,
    PRIORITIES,
    TENANT_HEADER,
    TTFT_SLO_S,
    Planned,
    request_body,
)
from ext_proc.lab.overload.metrics import (
    Sample,
    admission_rejections,
    bucket_quantile,
    ext_proc_stats,
    fetch,
    ice_body_buckets,
    metric_sum,
    rejection_delta,
    sample_metrics,
    sample_peak,
)
from ext_proc.lab.overload.shots import (
    Shot,
    _refused,
    answered,
    by_reason,
    by_status,
    by_valve,
    drain_s,
    goodput,
    is_ok,
    kind_breakdown,
    quantile,
    tenant_breakdown,
)

__all__ = ["H_QUEUED_MS", "RunResult", "run_burst", "send", "sse_chunks"]

H_QUEUED_MS = "x-ice-queued-ms"  # ext_proc.admit.queue.H_QUEUED_MS: the wait ICE added


async def send(
    session: aiohttp.ClientSession, url: str, p: Planned, body: dict[str, Any], t0: float
) -> Shot:
    await asyncio.sleep(max(0.0, t0 + p.at_s - time.monotonic()))
    start = time.monotonic()
    shot = Shot(p.index, p.priority, p.at_s, tenant=p.tenant, start_s=start - t0, kind=p.kind)
    headers = {"x-priority": p.priority}
    if p.tenant is not None:
        headers[TENANT_HEADER] = p.tenant
    try:
        async with session.post(url, json=body, headers=headers) as resp:
            shot.headers_s = time.monotonic() - start
            shot.status = resp.status
            shot.retry_after = resp.headers.get("retry-after")
            shot.decision = resp.headers.get("x-ice-decision") or None
            shot.reason = resp.headers.get("x-ice-reason") or None
            shot.downgraded = resp.headers.get("x-downgraded") == "true"
            shot.queued_ms = _number(resp.headers.get(H_QUEUED_MS))
            if resp.status != 200:
                text = await resp.text()
                shot.ttft_s = time.monotonic() - start
                shot.error = text[:2000]
            else:
                async for chunk in sse_chunks(resp):
                    if shot.ttft_s is None:
                        shot.ttft_s = time.monotonic() - start
                    if isinstance(chunk.get("error"), dict):  # refused inside the stream
                        err = chunk["error"]
                        code = err.get("code")
                        shot.stream_code = int(code) if isinstance(code, int) else 0
                        shot.error = json.dumps(chunk)[:2000]
                        break
                    usage = chunk.get("usage")
                    if usage:
                        shot.completion_tokens = int(usage.get("completion_tokens") or 0)
                        shot.prompt_tokens = int(usage.get("prompt_tokens") or 0)
    except (aiohttp.ClientError, TimeoutError, ValueError) as e:
        shot.error = f"{type(e).__name__}: {e}"
    shot.latency_s = time.monotonic() - start
    return shot


async def sse_chunks(resp: aiohttp.ClientResponse) -> AsyncIterator[dict[str, Any]]:
    """The JSON chunks of an OpenAI-style event stream, up to ``data: [DONE]``."""
    async for raw in resp.content:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            return
        chunk = json.loads(data)
        if isinstance(chunk, dict):
            yield chunk


def _number(text: str | None) -> float | None:
    try:
        return float(text) if text else None
    except ValueError:
        return None


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
    ttft_slo_s: float = TTFT_SLO_S  # what goodput counts against
    variant: str = ""  # "" for the whole burst; e.g. "light alone" for a control run
    valve: str = ""  # the vLLM's admission valve (arms.Valve.name: "reqs=4"); "": none
    # vllm:admission_rejections_total over the run, by vLLM's reason label
    admission_rejections: dict[str, int] = field(default_factory=dict)
    # admission: forecast: the largest ice_forecast_peak_blocks sampled (None: not sampled)
    forecast_peak_max: float | None = None
    peaks: list[tuple[float, float]] = field(default_factory=list)  # (t_s, forecast peak)
    # tenant_shares: the most ice_tenant_blocks_held sampled, per tenant
    tenant_held_max: dict[str, float] = field(default_factory=dict)

    @property
    def arm(self) -> str:
        """The mode before its vLLM: ``ice``, ``valve:reqs=4``, ``ice+valve:reqs=4``."""
        return arm_name(self.mode, self.valve)

    @property
    def label(self) -> str:
        """The arm, and the variant when there is one: ``queue``, ``queue light alone``."""
        return f"{self.arm} {self.variant}" if self.variant else self.arm

    def valve_rejections(self) -> dict[str, int]:
        """The admission rejections by valve kind (``reqs``, ``tokens``): every reason for a
        run with a valve (zeros too), only those that happened for one without."""
        return {
            short_reason(reason): n
            for reason, n in sorted(self.admission_rejections.items())
            if n or self.valve
        }

    def summary(self) -> dict[str, Any]:
        ok = [s for s in self.shots if is_ok(s)]
        shed = [s for s in self.shots if s.status == 429]
        other = [s for s in self.shots if not is_ok(s) and not _refused(s)]
        ok_lat = [s.latency_s for s in ok]
        waits = [s.ttft_s for s in ok if s.ttft_s is not None]
        tokens = sum(s.completion_tokens for s in ok)
        queued = [s.queued_ms for s in self.shots if s.queued_ms is not None]
        drain = drain_s(self.shots)
        return {
            "mode": self.mode,
            "valve": self.valve,
            "arm": self.arm,
            "variant": self.variant,
            "label": self.label,
            "round": self.round,
            "requests": len(self.shots),
            "ok": len(ok),
            "shed_429": len(shed),
            "shed_by_reason": by_reason(self.shots),
            "refused_503": sum(1 for s in self.shots if answered(s) == 503),
            "refused_503_in_stream": sum(1 for s in self.shots if s.stream_code == 503),
            "refused_503_by_valve": by_valve(self.shots),
            "valve_rejections": self.valve_rejections(),
            "other": len(other),
            "other_by_status": by_status(self.shots),
            "downgraded": sum(1 for s in self.shots if s.downgraded),
            "queued": len(queued),
            "queued_ms_p50": quantile(queued, 0.5),
            "queued_ms_p95": quantile(queued, 0.95),
            "queued_ms_max": quantile(queued, 1.0),
            "preemptions": self.preemptions,
            "output_tokens": tokens,
            "wall_s": round(self.wall_s, 2),
            "drain_s": round(drain, 2),
            "output_tok_per_s": round(tokens / drain, 1) if drain > 0 else 0.0,
            "ttft_slo_s": self.ttft_slo_s,
            "slo_met": sum(1 for w in waits if w <= self.ttft_slo_s),
            "goodput_tok_per_s": round(goodput(self.shots, self.ttft_slo_s, drain), 1),
            "ok_p50_s": quantile(ok_lat, 0.5),
            "ok_p95_s": quantile(ok_lat, 0.95),
            "ok_max_s": quantile(ok_lat, 1.0),
            "all_p50_s": quantile([s.latency_s for s in self.shots], 0.5),
            "all_p95_s": quantile([s.latency_s for s in self.shots], 0.95),
            "wait_p50_s": quantile(waits, 0.5),
            "wait_p95_s": quantile(waits, 0.95),
            "wait_max_s": quantile(waits, 1.0),
            "vllm_queue_mean_s": None
            if self.queue_time_mean_s is None
            else round(self.queue_time_mean_s, 3),
            "shed_p50_s": quantile([s.latency_s for s in shed], 0.5),
            "shed_max_s": quantile([s.latency_s for s in shed], 1.0),
            "shed_retry_after": sorted({s.retry_after or "-" for s in shed}),
            "shed_by_priority": {
                p: sum(1 for s in shed if s.priority == p) for p in PRIORITIES if shed
            },
            "shed_reasons": sorted({s.reason or "-" for s in shed}),
            "waiting_max": self.waiting_max,
            "running_max": self.running_max,
            "kv_usage_max": round(self.kv_usage_max, 3),
            "forecast_peak_max": self.forecast_peak_max,
            "tenant_held_max": dict(sorted(self.tenant_held_max.items())),
            "vllm_requests": self.vllm_requests,
            "unjudged": self.ext_proc.get("failure_mode_allowed", 0),
            "ice_body_p50_s": bucket_quantile(self.ice_body_buckets, 0.5),
            "ice_body_max_s": bucket_quantile(self.ice_body_buckets, 1.0),
            "tenants": tenant_breakdown(self.shots, self.ttft_slo_s),
            "kinds": kind_breakdown(self.shots, self.ttft_slo_s, drain),
        }


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
    ttft_slo_s: float = TTFT_SLO_S,
    variant: str = "",
    valve: str = "",
) -> RunResult:
    """Send ``burst`` to ``target`` (a base URL) and watch vLLM's ``metrics_url`` meanwhile
    (and, given ``ice_metrics_url``, how long ICE took over each body). ``valve``: the name
    of the admission valve that vLLM was started with ("": none), for the label only."""
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
        peaks: list[tuple[float, float]] = []
        held: dict[str, float] = {}
        watchers = [sampler]
        if ice_metrics_url:
            watchers.append(
                asyncio.create_task(
                    sample_peak(probe, ice_metrics_url, t0, sample_s, stop, peaks, held)
                )
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
            await asyncio.gather(*watchers, return_exceptions=True)
        after = await fetch(probe, metrics_url)
        ice1 = ice_body_buckets(await fetch(probe, ice_metrics_url)) if ice_metrics_url else {}
    stats1 = ext_proc_stats(admin_port)
    refused0, refused1 = admission_rejections(before), admission_rejections(after)
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
        forecast_peak_max=max((p for _, p in peaks), default=None),
        tenant_held_max=held,
        peaks=peaks,
        ext_proc={k: stats1.get(k, 0) - stats0.get(k, 0) for k in stats1},
        shots=list(shots),
        samples=samples,
        ice_body_buckets={b: n - ice0.get(b, 0.0) for b, n in ice1.items()},
        ttft_slo_s=ttft_slo_s,
        variant=variant,
        valve=valve,
        admission_rejections=rejection_delta(refused0, refused1),
    )
