"""The collector's CPU cost with real HTTP: N endpoints of a real-size vLLM page every interval.

    .venv/bin/python bench/collector_cost.py [--endpoints 64] [--interval 0.2] [--seconds 10]

A separate process serves the page (tests/data/vllm_cpu/metrics_preempting.txt, ~50 KB, a
real vLLM 0.32 page) on N URLs; this process runs ICE's ``Collector`` (fetch, parse, history,
derived windows, pool view) for one pool of N backends and reports the collector's CPU time
(user + system of this process) per wall second, i.e. the share of one core. It also times
how long a source takes to be flagged stale after it stops answering (target: within two
intervals).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import resource
import time
from pathlib import Path

from aiohttp import web

from ext_proc.policy.model import Pool
from ext_proc.signals.collector import Collector
from ext_proc.signals.snapshot import PoolSnapshot
from ext_proc.stack import free_port

PAGE = Path(__file__).resolve().parent.parent / "tests/data/vllm_cpu/metrics_preempting.txt"


def _serve(port: int, page: str) -> None:
    state = {"down": False}

    async def metrics(request: web.Request) -> web.Response:
        if state["down"] and request.match_info["n"] == "0":
            await asyncio.sleep(3600)
        return web.Response(text=page, content_type="text/plain")

    async def down(_request: web.Request) -> web.Response:
        state["down"] = True
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/{n}/metrics", metrics)
    app.router.add_post("/down", down)
    web.run_app(app, host="127.0.0.1", port=port, print=None)


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def _run(port: int, endpoints: int, interval: float, seconds: float) -> None:
    urls = tuple(f"http://127.0.0.1:{port}/{i}/metrics" for i in range(endpoints))
    pool = Pool(
        name="p",
        metrics_urls=urls,
        scrape_interval_s=interval,
        scrape_timeout_s=1.0,
        stale_after_s=1.5 * interval,
    )
    views: list[dict[str, PoolSnapshot]] = []
    collector = Collector({"p": pool}, views.append)
    await collector.start()
    await asyncio.sleep(2.0)  # warm up: connections, label caches
    cpu0, wall0, cycles0 = _cpu_s(), time.monotonic(), len(views)
    await asyncio.sleep(seconds)
    cpu, wall, cycles = _cpu_s() - cpu0, time.monotonic() - wall0, len(views) - cycles0
    print(f"{endpoints} endpoints × {1 / interval:.0f}/s, {PAGE.stat().st_size / 1024:.0f} KB page")
    print(f"  cycles {cycles} in {wall:.1f} s ({cycles / wall:.2f}/s)")
    print(
        f"  collector CPU {100 * cpu / wall:.1f}% of one core "
        f"({1e3 * cpu / max(1, cycles * endpoints):.2f} ms per page)"
    )
    # staleness: stop endpoint 0 answering, see how long until the view flags it
    import aiohttp

    async with aiohttp.ClientSession() as s:
        await s.post(f"http://127.0.0.1:{port}/down")
    src = collector._sources[("p", urls[0])]
    deadline = time.monotonic() + 5
    flagged_at = None
    while time.monotonic() < deadline and flagged_at is None:
        view = views[-1].get("p")
        last_good = src.history[-1].at_s
        if (
            view is not None
            and view.taken_at_s - last_good > 0.05
            and any(b.stale and b.url == urls[0] for b in view.backends)
        ):
            flagged_at = view.taken_at_s
        await asyncio.sleep(0.01)
    if flagged_at is None:
        print("  a silent source was not flagged stale within 5 s")
    else:
        print(
            f"  a silent source flagged stale {flagged_at - src.history[-1].at_s:.2f} s after its "
            f"last good scrape (interval {interval} s; two intervals = {2 * interval:.1f} s)"
        )
    await collector.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--endpoints", type=int, default=64)
    ap.add_argument("--interval", type=float, default=0.2)
    ap.add_argument("--seconds", type=float, default=10.0)
    args = ap.parse_args()
    port = free_port()
    server = multiprocessing.get_context("spawn").Process(
        target=_serve, args=(port, PAGE.read_text()), daemon=True
    )
    server.start()
    time.sleep(1.5)
    try:
        asyncio.run(_run(port, args.endpoints, args.interval, args.seconds))
    finally:
        server.terminate()


if __name__ == "__main__":
    main()
