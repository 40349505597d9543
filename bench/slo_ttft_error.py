"""Per-request error of ICE's predicted time to first token on the GPU-shaped pool.

Starts the GPU-shaped pool (docs/gpu-pool.md: vLLM 0.32's server and scheduler over the fake
executor, modelled H100 steps dilated ``--dilation`` k), sends it one of the pool's workloads
(``--workload``, Poisson at ``--load`` × the sustainable rate, the plan ``bench/gpu_pool.py``
sends) straight to vLLM, and scrapes ``/metrics`` every ``--scrape-s`` (default 0.1 s × k,
ICE's dilated scrape interval) into the collector's own window (``--window-s``, ICE's default
10 s). For every request, **at the moment it is sent**, it records what ICE would see: the
newest scrape's signals (waiting, running, the window's speeds) and the prompt tokens sent
since that scrape (ICE's ``ahead``, ``ext_proc.placement.slo_book``), and afterwards the
request's own TTFT (time to its first streamed chunk) and its prompt tokens (``usage``).

Each request's prediction is then made by each formula of ``ext_proc.signals.slo``
(``per_request``: ``predicted_ttft_s``, the speed per request; ``per_step``:
``predicted_ttft_step_s``, the engine step line) and compared with what it measured:

    MAPE = mean over the requests with a first token of |predicted − measured| ÷ measured

and the signed mean (positive: predicts long). ``--gate per_step|per_request`` sends only the
requests whose prediction by that formula is within ``--ttft-slo-s`` (the SLO rule 1 of
``admission: slo``, without ICE's block forecast), to measure the error where ``slo``
admits. ``--json`` keeps every record; ``--replay FILE`` recomputes the figures from one.
Times are wall (dilated); errors are ratios, so k cancels.

    .venv/bin/python bench/slo_ttft_error.py --workload chat --load 1.5 --requests 80 --seed 1
    .venv/bin/python bench/slo_ttft_error.py --replay .scratch/ttft-chat.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ext_proc.lab import vllm_local as vl
from ext_proc.lab.gpupool import PoolSpec, serve_config
from ext_proc.lab.gpupool.dilate import wall_plan
from ext_proc.lab.gpupool.workloads import KINDS, TEMPLATE_TOKENS, plan_gpu, sustainable_rate
from ext_proc.lab.overload.burst import CHAT, Planned, request_body
from ext_proc.lab.overload.run import sse_chunks
from ext_proc.signals.parse import parse_engine
from ext_proc.signals.poolbuild import backend_signals
from ext_proc.signals.scrapes import Speed
from ext_proc.signals.slo import predicted_ttft_s, predicted_ttft_step_s
from ext_proc.signals.snapshot import BackendSignals
from ext_proc.signals.window import Window

FORMULAS = ("per_request", "per_step")


@dataclass
class Record:
    """What ICE would have seen when one request was sent, and what it then measured."""

    index: int
    sent_at_s: float
    prompt_tokens_planned: int
    waiting: float | None = None
    running: float | None = None
    kv_usage: float | None = None
    completions_per_s: float | None = None
    num_blocks: int | None = None
    hit: float = 0.0
    ahead_tokens: float = 0.0
    ahead_requests: int = 0
    scrape_age_s: float | None = None
    speed: dict[str, Any] | None = None
    sent: bool = True
    status: int | None = None
    ttft_s: float | None = None
    prompt_tokens: int | None = None


def predict(r: Record, formula: str, max_batched_tokens: int) -> float | None:
    """``r``'s predicted TTFT (s) by ``formula`` from what was recorded at its send."""
    if r.speed is None:
        return None
    sp = Speed(**r.speed)
    p = r.prompt_tokens or r.prompt_tokens_planned
    ahead = r.ahead_tokens * (1.0 - r.hit)
    if formula == "per_request":
        return predicted_ttft_s(sp, r.waiting, p, r.hit, ahead)
    return predicted_ttft_step_s(
        sp,
        r.waiting,
        r.running,
        p,
        r.hit,
        ahead,
        max_batched_tokens,
        ahead_requests=r.ahead_requests,
        completions_per_s=r.completions_per_s,
    )


def report(records: list[Record], slo_s: float, max_batched_tokens: int) -> dict[str, Any]:
    """MAPE and signed error per formula, and the admitted share within ``slo_s``."""
    got = [r for r in records if r.sent and r.status == 200 and r.ttft_s]
    out: dict[str, Any] = {
        "requests": len(records),
        "sent": sum(1 for r in records if r.sent),
        "with_first_token": len(got),
        "within_slo": sum(1 for r in got if (r.ttft_s or 0.0) <= slo_s),
    }
    for formula in FORMULAS:
        pairs = [
            (pred, r.ttft_s)
            for r in got
            if r.ttft_s and (pred := predict(r, formula, max_batched_tokens)) is not None
        ]
        if not pairs:
            out[formula] = None
            continue
        out[formula] = {
            "n": len(pairs),
            "mape": round(sum(abs(p - o) / o for p, o in pairs) / len(pairs), 4),
            "signed": round(sum((p - o) / o for p, o in pairs) / len(pairs), 4),
            "mean_predicted_s": round(sum(p for p, _ in pairs) / len(pairs), 4),
            "mean_measured_s": round(sum(o for _, o in pairs) / len(pairs), 4),
        }
    return out


async def _scraper(
    session: aiohttp.ClientSession,
    base: str,
    every_s: float,
    window: Window,
    latest: list[tuple[BackendSignals, float]],
    stop: asyncio.Event,
) -> None:
    while not stop.is_set():
        try:
            async with session.get(base + "/metrics") as resp:
                text = await resp.text()
            s = parse_engine("vllm", base, text, time.monotonic())
            window.append(s)
            b = backend_signals(s, window.derived())
            latest[:] = [(b, s.at_s)]
        except (aiohttp.ClientError, TimeoutError, ValueError):
            pass
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every_s)


async def _send(
    session: aiohttp.ClientSession,
    base: str,
    p: Planned,
    body: dict[str, Any],
    t0: float,
    latest: list[tuple[BackendSignals, float]],
    sends: list[tuple[float, int]],
    gate: tuple[str, float, int] | None,
) -> Record:
    await asyncio.sleep(max(0.0, t0 + p.at_s - time.monotonic()))
    now = time.monotonic()
    tokens = p.prompt_tokens + TEMPLATE_TOKENS
    r = Record(p.index, round(now - t0, 4), tokens)
    if latest:
        b, taken = latest[0]
        mine = [t for at, t in sends if at > taken]
        r.waiting, r.running, r.kv_usage = (
            b.num_requests_waiting,
            b.num_requests_running,
            b.kv_cache_usage,
        )
        r.hit = min(1.0, max(0.0, b.hit_ratio or 0.0))
        r.completions_per_s = b.derived.completions_per_s if b.derived is not None else None
        r.num_blocks = b.num_gpu_blocks
        r.ahead_tokens, r.ahead_requests = float(sum(mine)), len(mine)
        r.scrape_age_s = round(now - taken, 4)
        r.speed = asdict(b.speed) if b.speed is not None else None
    if gate is not None:
        formula, slo_s, batched = gate
        pred = predict(r, formula, batched)
        if pred is not None and pred > slo_s:
            r.sent = False
            return r
    sends.append((now, tokens))
    start = time.monotonic()
    try:
        async with session.post(base + CHAT, json=body) as resp:
            r.status = resp.status
            async for chunk in sse_chunks(resp):
                if r.ttft_s is None:
                    r.ttft_s = time.monotonic() - start
                usage = chunk.get("usage")
                if usage:
                    r.prompt_tokens = int(usage.get("prompt_tokens") or 0) or None
    except (aiohttp.ClientError, TimeoutError, ValueError):
        pass
    return r


async def _run(args: argparse.Namespace, base: str, plan: list[Planned]) -> list[Record]:
    window = Window(args.window_s)
    latest: list[tuple[BackendSignals, float]] = []
    sends: list[tuple[float, int]] = []
    stop = asyncio.Event()
    gate = (args.gate, args.ttft_slo_s * args.dilation, args.max_batched_tokens)
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with (
        aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(600)) as s,
        aiohttp.ClientSession() as probe,
    ):
        scraper = asyncio.create_task(
            _scraper(probe, base, args.scrape_s or 0.1 * args.dilation, window, latest, stop)
        )
        # a warm window before the first request: the speeds need finished requests
        t0 = time.monotonic() + 0.05
        bodies = [request_body(p, "tiny", 1_000_000 * args.seed + p.index) for p in plan]
        try:
            records = await asyncio.gather(
                *(
                    _send(s, base, p, b, t0, latest, sends, gate if args.gate else None)
                    for p, b in zip(plan, bodies, strict=True)
                )
            )
        finally:
            stop.set()
            await scraper
    return list(records)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", choices=KINDS, default="chat")
    ap.add_argument("--load", type=float, default=1.5)
    ap.add_argument("--requests", type=int, default=80)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--dilation", type=float, default=10.0)
    ap.add_argument("--kv-memory", default="1GiB")
    ap.add_argument("--max-model-len", type=int, default=8000)
    ap.add_argument("--ttft-slo-s", type=float, default=2.0, help="modelled seconds")
    ap.add_argument("--window-s", type=float, default=10.0, help="ICE's default window")
    ap.add_argument("--scrape-s", type=float, default=None, help="default 0.1 s × k")
    ap.add_argument("--max-batched-tokens", type=int, default=8192)
    ap.add_argument("--gate", choices=FORMULAS, default=None)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--replay", type=Path, default=None)
    ap.add_argument("--start-timeout-s", type=float, default=600.0)
    args = ap.parse_args()
    if args.replay:
        data = json.loads(args.replay.read_text())
        records = [Record(**r) for r in data["records"]]
        slo_s = data["header"]["ttft_slo_s"] * data["header"]["dilation"]
        print(json.dumps(report(records, slo_s, args.max_batched_tokens), indent=2))
        return 0
    from ext_proc.kv import parse_size

    spec = PoolSpec(
        kv_memory_bytes=parse_size(args.kv_memory),
        max_model_len=args.max_model_len,
        dilation=args.dilation,
    )
    base_plan = plan_gpu(args.workload, args.requests, 1.0, seed=args.seed,
                         max_model_len=spec.max_model_len)  # fmt: skip
    rate = args.load * sustainable_rate(spec, base_plan)
    plan = plan_gpu(
        args.workload, args.requests, rate, seed=args.seed, max_model_len=spec.max_model_len
    )
    header = {**vars(args), "rate_per_s": rate, "num_blocks": spec.num_blocks}
    header = {k: str(v) if isinstance(v, Path) else v for k, v in header.items()}
    print(json.dumps(header), file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = serve_config(spec, Path(tmp))
        with vl.start_server(cfg, log_path=Path(tmp) / "vllm.log",
                             timeout_s=args.start_timeout_s) as server:  # fmt: skip
            records = asyncio.run(_run(args, server.base_url, wall_plan(plan, args.dilation)))
    slo_s = args.ttft_slo_s * args.dilation
    result = report(records, slo_s, args.max_batched_tokens)
    print(json.dumps(result, indent=2))
    if args.json:
        payload = {"header": header, "report": result, "records": [asdict(r) for r in records]}
        args.json.write_text(json.dumps(payload) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
