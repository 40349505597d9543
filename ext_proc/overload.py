"""One overload burst against a real vLLM, sent straight to it and through Envoy + ICE.

```
burst ─┬─ direct ──────────────────────────────────────► vllm serve (tiny model, 24 KV blocks)
       └─ via ICE ─► Envoy (envoy/envoy.yaml) ─ext_proc─► ICE (ext_proc/vllm_tiny_policy.yaml)
                       └───────────────────────────────► same vllm serve
```

Job: the reusable half of ``bench/overload.py`` (its command line), also used by ``ice demo``
(the vLLM walkthrough) and ``tests/e2e/test_vllm_overload.py``:

- ``overload_setup``: start ``vllm serve`` (``ext_proc.vllm_local``: CPU, the tiny model,
  24 KV blocks of 128 tokens), ICE with a policy (default ``POLICY``, rendered to scrape that
  vLLM and to count tokens with its tokenizer) and real Envoy in front; free ports unless
  given; yields a ``Setup``.
- ``plan_burst`` / ``run_burst`` / ``compare``: an open-loop burst (each request starts at its
  planned time, never waiting for another), priorities interleaved by weight; the same burst
  once straight to vLLM and once through Envoy + ICE.
- ``RunResult.summary``, ``table``, ``totals``, ``report``: per-run numbers (vLLM's
  preemption delta and queue time, 429s, latencies, sampled peaks of waiting / running / KV
  usage, Envoy's fail-open count) and their side-by-side table.

Invariants:

- every process ``overload_setup`` starts (vLLM's whole process group, ICE, Envoy) is stopped
  when its ``with`` block exits, on error and on Ctrl-C too;
- each run of ``compare`` starts with vLLM idle (nothing running or waiting on two samples in
  a row) and uses fresh prompt text (seeded per round and mode), so no run inherits another's
  queue or prefix cache; the plan (sizes, priorities, schedule) is the same for both modes;
- a ``Shot`` never raises: a transport error is recorded in ``Shot.error``;
- importing needs only ICE's own dependencies: vLLM runs in its own venv as a subprocess.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from prometheus_client.parser import text_string_to_metric_families

from ext_proc import vllm_local as vl
from ext_proc.stack import ENVOY_DIR, Stack, free_port, render_envoy_config

__all__ = [
    "CHAT",
    "MAX_TOKENS",
    "MIX",
    "MODES",
    "POLICY",
    "PRIORITIES",
    "PROMPT_TOKENS",
    "REQUESTS",
    "ROWS",
    "SPACING_MS",
    "VLLM_ARGS",
    "VLLM_NICE",
    "Planned",
    "RunResult",
    "Sample",
    "Setup",
    "Shot",
    "bucket_quantile",
    "compare",
    "ext_proc_stats",
    "fetch",
    "ice_body_buckets",
    "interleave",
    "metric_sum",
    "one_line",
    "overload_setup",
    "parse_mix",
    "plan_burst",
    "render_policy",
    "report",
    "request_body",
    "run_burst",
    "table",
    "totals",
    "wait_idle",
    "warm_up",
]

POLICY = Path(__file__).resolve().parent / "vllm_tiny_policy.yaml"
CHAT = "/v1/chat/completions"
PRIORITIES = ("critical", "standard", "sheddable")
MODES = ("direct", "ice")

# ~870 filler words → 887 prompt tokens = 7 blocks of 128 at admission; + 200 output = 9
# blocks: three admitted requests outgrow the 23 usable blocks (ext_proc.vllm_local).
PROMPT_TOKENS = 870
MAX_TOKENS = 200
REQUESTS = 24
SPACING_MS = 250.0
MIX = "standard=3,sheddable=2,critical=1"
VLLM_ARGS: tuple[str, ...] = ()
VLLM_NICE = 0


# --- the burst ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Planned:
    """One request of the burst: when it starts (s after the first), its priority and size."""

    index: int
    at_s: float
    priority: str
    prompt_tokens: int
    max_tokens: int


def parse_mix(spec: str) -> dict[str, int]:
    """``"standard=3,sheddable=2"`` → ``{"standard": 3, "sheddable": 2}``."""
    out: dict[str, int] = {}
    for part in spec.split(","):
        name, _, weight = part.strip().partition("=")
        if name not in PRIORITIES or not weight.isdigit() or int(weight) < 1:
            raise ValueError(f"bad --mix part {part!r}: want PRIORITY=N, N ≥ 1, of {PRIORITIES}")
        out[name] = int(weight)
    return out


def interleave(weights: dict[str, int], count: int) -> list[str]:
    """``count`` names spread evenly by weight (smooth weighted round robin, deterministic)."""
    total = sum(weights.values())
    credit = dict.fromkeys(weights, 0)
    out: list[str] = []
    for _ in range(count):
        for name, w in weights.items():
            credit[name] += w
        pick = max(credit, key=lambda n: credit[n])
        credit[pick] -= total
        out.append(pick)
    return out


def plan_burst(
    requests: int, prompt_tokens: int, max_tokens: int, spacing_ms: float, mix: str
) -> list[Planned]:
    priorities = interleave(parse_mix(mix), requests)
    return [
        Planned(i, i * spacing_ms / 1000.0, priorities[i], prompt_tokens, max_tokens)
        for i in range(requests)
    ]


def request_body(p: Planned, model: str, seed: int) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": vl.filler_text(p.prompt_tokens, seed)}],
        "max_tokens": p.max_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


# --- one request, one run -----------------------------------------------------------------------


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


def _q(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank quantile (q = 1.0: the maximum), rounded to ms; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, int(-(-q * len(ordered) // 1)) - 1))
    return round(ordered[rank], 3)


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


# --- the stack ----------------------------------------------------------------------------------


def render_policy(template: Path, out: Path, vllm_port: int, model_dir: Path) -> Path:
    """``template`` with its pools scraping ``vllm_port`` and its tokenizers at ``model_dir``."""
    policy: dict[str, Any] = yaml.safe_load(template.read_text())
    for pool in policy.get("pools", {}).values():
        pool["metrics_urls"] = [f"http://127.0.0.1:{vllm_port}/metrics"]
    for spec in (policy.get("tokenizers") or {}).values():
        if "model_dir" in spec:
            spec["model_dir"] = str(model_dir)
    out.write_text(yaml.safe_dump(policy, sort_keys=False))
    return out


@dataclass
class Setup:
    """A real vLLM and, in front of it, Envoy with ICE."""

    vllm_url: str
    envoy_url: str
    admin_port: int
    model: str
    stack: Stack
    vllm: vl.VllmServer
    ice_address: str = ""
    policy: Path = POLICY  # the rendered policy ICE runs with
    ice_metrics_url: str | None = None  # ICE's own /metrics

    @property
    def metrics_url(self) -> str:
        return f"{self.vllm_url}/metrics"

    def log_tails(self, lines: int = 20) -> str:
        out = []
        for name, path in [*self.stack.logs.items(), ("vllm", self.vllm.log_path)]:
            with contextlib.suppress(OSError):
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                out.append(f"--- {name} ---\n" + "\n".join(tail))
        return "\n".join(out)


@contextlib.contextmanager
def overload_setup(
    workdir: Path,
    *,
    policy: Path = POLICY,
    vllm_args: Sequence[str] = VLLM_ARGS,
    vllm_nice: int = VLLM_NICE,
    vllm_port: int | None = None,
    ice_address: str | None = None,
    envoy_port: int | None = None,
    admin_port: int | None = None,
    warm: bool = True,
) -> Iterator[Setup]:
    """Start vLLM (tiny model, 24 blocks), ICE with ``policy`` and Envoy; stop all on exit.

    Ports not given are free ones. Logs (``vllm.log``, ``ice.log``, ``envoy.log``) and the
    rendered policy go to ``workdir``. ``warm``: one short request each way first, then wait
    until vLLM is idle.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    vl.ensure_model(vl.DEFAULT_MODEL_DIR)
    cfg = vl.ServeConfig(port=vllm_port or vl.free_port(), extra_args=tuple(vllm_args))
    with (
        vl.start_server(cfg, log_path=workdir / "vllm.log") as server,
        Stack(workdir) as stack,
    ):
        if vllm_nice:
            # Every thread of vLLM's process group (API server, engine core, worker).
            os.setpriority(os.PRIO_PGRP, server.proc.pid, vllm_nice)
        rendered = render_policy(policy, workdir / "policy.yaml", cfg.port, cfg.model_dir)
        ice_address = ice_address or f"127.0.0.1:{free_port()}"
        ice_metrics = f"127.0.0.1:{free_port()}"
        ice = stack.start_ice(ice_address, policy=rendered, metrics_address=ice_metrics)
        envoy_port = envoy_port or free_port()
        admin_port = admin_port or free_port()
        config = render_envoy_config(
            ENVOY_DIR / "envoy.yaml",
            admin_port=admin_port,
            listeners={"ingress": envoy_port},
            clusters={"ice": ice, "backend": [f"127.0.0.1:{cfg.port}"]},
        )
        stack.start_envoy(config, admin_port)
        setup = Setup(
            vllm_url=server.base_url,
            envoy_url=f"http://127.0.0.1:{envoy_port}",
            admin_port=admin_port,
            model=cfg.served_model_name,
            stack=stack,
            vllm=server,
            ice_address=ice_address,
            policy=rendered,
            ice_metrics_url=f"http://{ice_metrics}/metrics",
        )
        if warm:
            warm_up(setup)
        yield setup


def warm_up(setup: Setup) -> None:
    """One short request each way (first-request costs; ICE's first verdict), then idle."""
    body = json.dumps(
        {
            "model": setup.model,
            "messages": [{"role": "user", "content": "warm up"}],
            "max_tokens": 4,
        }
    ).encode()
    for base in (setup.vllm_url, setup.envoy_url):
        req = urllib.request.Request(
            base + CHAT, data=body, headers={"content-type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=60) as resp:
            resp.read()
    wait_idle(setup.metrics_url)


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def compare(
    setup: Setup,
    burst: Sequence[Planned],
    *,
    rounds: int,
    sample_s: float = 0.1,
    modes: Sequence[str] = MODES,
    progress: Callable[[str], None] | None = _to_stderr,
) -> list[RunResult]:
    """``rounds`` × (the burst direct, the burst through ICE); order alternates per round.

    ``progress`` gets one line per finished run (default: stderr; None: silent).
    """
    results: list[RunResult] = []
    for r in range(rounds):
        order = list(modes) if r % 2 == 0 else list(modes)[::-1]
        for mode in order:
            wait_idle(setup.metrics_url)
            target = setup.vllm_url if mode == "direct" else setup.envoy_url
            seed = 100_000 * (r + 1) + (0 if mode == "direct" else 50_000)
            result = asyncio.run(
                run_burst(
                    mode=mode,
                    round_no=r + 1,
                    target=target,
                    metrics_url=setup.metrics_url,
                    burst=burst,
                    model=setup.model,
                    seed=seed,
                    sample_s=sample_s,
                    admin_port=setup.admin_port if mode == "ice" else None,
                    ice_metrics_url=setup.ice_metrics_url if mode == "ice" else None,
                )
            )
            results.append(result)
            if progress is not None:
                progress(f"[overload] round {r + 1} {mode}: {one_line(result)}")
    wait_idle(setup.metrics_url)
    return results


# --- report -------------------------------------------------------------------------------------


def one_line(r: RunResult) -> str:
    s = r.summary()
    return (
        f"{s['ok']} ok, {s['shed_429']} × 429, preemptions {s['preemptions']}, "
        f"{s['output_tokens']} output tokens in {s['wall_s']} s, ok p95 {s['ok_p95_s']} s, "
        f"wait max {s['wait_max_s']} s"
    )


ROWS: tuple[tuple[str, str], ...] = (
    ("requests", "requests"),
    ("ok", "200 completed"),
    ("shed_429", "429 shed"),
    ("other", "other errors"),
    ("downgraded", "downgraded by ICE"),
    ("preemptions", "vLLM preemptions (delta)"),
    ("output_tokens", "completed output tokens"),
    ("wall_s", "burst wall time (s)"),
    ("output_tok_per_s", "output tokens / s"),
    ("ok_p50_s", "200 latency p50 (s)"),
    ("ok_p95_s", "200 latency p95 (s)"),
    ("ok_max_s", "200 latency max (s)"),
    ("all_p50_s", "all latency p50 (s)"),
    ("all_p95_s", "all latency p95 (s)"),
    ("wait_p50_s", "200 time to 1st token p50 (s)"),
    ("wait_p95_s", "200 time to 1st token p95 (s)"),
    ("wait_max_s", "longest wait for 1st token (s)"),
    ("vllm_queue_mean_s", "vLLM mean queue time (s)"),
    ("shed_p50_s", "429 latency p50 (s)"),
    ("shed_max_s", "429 latency max (s)"),
    ("shed_retry_after", "429 Retry-After"),
    ("shed_by_priority", "429 by priority"),
    ("shed_reasons", "429 reasons"),
    ("waiting_max", "vLLM waiting max"),
    ("running_max", "vLLM running max"),
    ("kv_usage_max", "vLLM KV usage max"),
    ("unjudged", "ICE fail-open (unjudged)"),
    ("ice_body_p50_s", "ICE time per body p50 (s, ≤ bucket)"),
    ("ice_body_max_s", "ICE time per body max (s, ≤ bucket)"),
)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, list):
        return ",".join(str(v) for v in value) or "-"
    if isinstance(value, dict):
        return " ".join(f"{k[:4]}:{v}" for k, v in value.items()) or "-"
    return str(value)


def table(
    results: Sequence[RunResult],
    rows: Sequence[tuple[str, str]] = ROWS,
    heads: Sequence[str] | None = None,
) -> str:
    """Rows: the metrics (``rows``: summary key, label); columns: each run (round, mode),
    direct and ICE side by side; ``heads`` overrides the column titles (``r1 direct``...)."""
    summaries = [r.summary() for r in sorted(results, key=lambda r: (r.round, r.mode))]
    heads = list(heads) if heads is not None else [f"r{s['round']} {s['mode']}" for s in summaries]
    cells = [[_cell(s[key]) for s in summaries] for key, _ in rows]
    label_w = max(len(label) for _, label in rows)
    widths = [max(len(h), *(len(row[i]) for row in cells)) for i, h in enumerate(heads)]
    lines = [
        "| "
        + " | ".join([" " * label_w, *(h.rjust(w) for h, w in zip(heads, widths, strict=True))])
        + " |",
        "|" + "|".join(["-" * (label_w + 2), *("-" * (w + 1) + ":" for w in widths)]) + "|",
    ]
    for (_, label), row in zip(rows, cells, strict=True):
        padded = [c.rjust(w) for c, w in zip(row, widths, strict=True)]
        lines.append("| " + " | ".join([label.ljust(label_w), *padded]) + " |")
    return "\n".join(lines)


def totals(results: Sequence[RunResult]) -> str:
    """One line per mode over all rounds: preemptions, 429s, output tokens, worst wait."""
    lines = []
    for mode in MODES:
        runs = [r.summary() for r in results if r.mode == mode]
        if not runs:
            continue
        pre = [s["preemptions"] for s in runs]
        shed_max = [s["shed_max_s"] for s in runs if s["shed_max_s"] is not None]
        lines.append(
            f"{mode:>6}: preemptions {'/'.join(map(str, pre))} (sum {sum(pre)}), "
            f"429s {sum(s['shed_429'] for s in runs)}, "
            f"output tokens {sum(s['output_tokens'] for s in runs)}, "
            f"longest wait {max((s['wait_max_s'] or 0.0) for s in runs)} s, "
            f"slowest 429 {f'{max(shed_max)} s' if shed_max else '-'}"
        )
    return "\n".join(lines)


def report(
    results: Sequence[RunResult], burst: Sequence[Planned], args: dict[str, Any]
) -> dict[str, Any]:
    return {
        "burst": {
            **args,
            "priorities": {p: sum(1 for b in burst if b.priority == p) for p in PRIORITIES},
        },
        "runs": [
            {
                "summary": r.summary(),
                "ext_proc": r.ext_proc,
                "shots": [asdict(s) for s in r.shots],
                "timeline": [asdict(s) for s in r.samples],
            }
            for r in results
        ],
    }
