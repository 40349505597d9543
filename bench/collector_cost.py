"""The collector's CPU cost with real HTTP: N endpoints of a real-size vLLM page every interval.

    .venv/bin/python bench/collector_cost.py [--endpoints 64] [--interval 0.2] [--seconds 10]
                                             [--http ice|aiohttp] [--publish none|shm]

A separate process serves the page (tests/data/vllm_cpu/metrics_preempting.txt, ~50 KB, a
real vLLM 0.32 page) on N URLs, as a loaded server would: every answer is a new version of
the page (each sample of the n-th answer scaled by 1 + n/1000, so counters grow, histograms
gain observations and no two answers are equal). This process runs ICE's ``Collector``
(fetch, parse, history, derived windows, pool view) for one pool of N backends.

The figure is CPU time, not wall time (the machine may be shared): ``time.process_time()``
of this process (user + system, every thread; only the collector runs here) over the
measured seconds. Printed: that as a share of one core; per page (ms); and the share at the
nominal rate (ms per page × N / interval), which is the figure to compare with the target
(≤ 15 % of a core for 64 endpoints at 200 ms) when a busy machine lets the page server
answer fewer cycles than nominal.

``--http aiohttp`` fetches through an aiohttp ``ClientSession`` (what the collector used
before ``ext_proc.signals.httpget``); ``--publish shm`` also pickles each view into shared
memory, as the ``ice serve --workers N`` supervisor does. Also timed: how long a source takes
to be flagged stale after it stops answering (target: within two intervals).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import resource
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
from aiohttp import web

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ext_proc.lab.stack import free_port  # noqa: E402
from ext_proc.signals.collector import Collector, Fetch  # noqa: E402
from ext_proc.signals.pool import Pool  # noqa: E402
from ext_proc.signals.snapshot import PoolSnapshot  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from collector_parse import vary  # noqa: E402

PAGE = ROOT / "tests/data/vllm_cpu/metrics_preempting.txt"
VERSIONS = 200  # distinct answers per endpoint before the values start over (a reset)


def version(page: str, n: int) -> bytes:
    """The page with every sample scaled by 1 + n/1000 (collector_parse.vary)."""
    return vary(page, n).encode()


def _serve(port: int, page: str) -> None:
    versions = [version(page, n) for n in range(VERSIONS)]
    answered: dict[str, int] = {}
    state = {"down": False}

    async def metrics(request: web.Request) -> web.Response:
        n = request.match_info["n"]
        if state["down"] and n == "0":
            await asyncio.sleep(3600)
        count = answered[n] = answered.get(n, -1) + 1
        return web.Response(
            body=versions[count % VERSIONS], content_type="text/plain", charset="utf-8"
        )

    async def down(_request: web.Request) -> web.Response:
        state["down"] = True
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/{n}/metrics", metrics)
    app.router.add_post("/down", down)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def _aiohttp_fetch() -> tuple[Fetch, Callable[[], Awaitable[None]]]:
    """The collector's former fetch: one aiohttp ClientSession (connections kept alive)."""
    session: aiohttp.ClientSession | None = None

    async def fetch(url: str, timeout_s: float) -> str:
        nonlocal session
        if session is None:
            session = aiohttp.ClientSession()
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            if resp.status != 200:
                raise OSError(f"HTTP {resp.status}")
            return await resp.text(errors="replace")

    async def close() -> None:
        if session is not None:
            await session.close()

    return fetch, close


async def _staleness(
    port: int, url: str, interval: float, views: list[dict[str, PoolSnapshot]]
) -> None:
    """Stop endpoint 0 answering; print how long until a view flags it stale."""
    async with aiohttp.ClientSession() as s:
        await s.post(f"http://127.0.0.1:{port}/down")
    flagged_after = None  # the silent source's age when a view first flags it stale
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and flagged_after is None:
        view = views[-1].get("p")
        silent = [b for b in view.backends if b.url == url] if view else []
        if silent and silent[0].stale:
            flagged_after = silent[0].age_s
        await asyncio.sleep(0.01)
    if flagged_after is None:
        print("  a silent source was not flagged stale within 5 s")
    else:
        print(
            f"  a silent source flagged stale {flagged_after:.2f} s after its last good scrape "
            f"(interval {interval} s; two intervals = {2 * interval:.1f} s)"
        )


async def _run(args: argparse.Namespace, port: int) -> None:
    endpoints, interval = args.endpoints, args.interval
    urls = tuple(f"http://127.0.0.1:{port}/{i}/metrics" for i in range(endpoints))
    pool = Pool(
        name="p",
        metrics_urls=urls,
        scrape_interval_s=interval,
        scrape_timeout_s=1.0,
        stale_after_s=1.5 * interval,
    )
    views: list[dict[str, PoolSnapshot]] = []
    publish: Callable[[dict[str, PoolSnapshot]], None] = views.append
    writer = None
    if args.publish == "shm":
        from ext_proc.signals.shm import SnapshotWriter

        writer = SnapshotWriter()

        def publish(v: dict[str, PoolSnapshot]) -> None:
            views.append(v)
            writer.publish(v)

    fetch, close = _aiohttp_fetch() if args.http == "aiohttp" else (None, None)
    collector = Collector({"p": pool}, publish, fetch=fetch)
    await collector.start()
    await asyncio.sleep(args.warmup)  # connections, label caches, a full window of history
    cpu0, wall0, cycles0 = time.process_time(), time.monotonic(), len(views)
    use0 = resource.getrusage(resource.RUSAGE_SELF)
    await asyncio.sleep(args.seconds)
    cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
    use = resource.getrusage(resource.RUSAGE_SELF)
    faults = use.ru_minflt - use0.ru_minflt
    system_share = (use.ru_stime - use0.ru_stime) / max(1e-9, cpu)
    cycles = len(views) - cycles0
    pages = max(1, cycles * endpoints)
    ms_per_page = 1e3 * cpu / pages
    print(
        f"{endpoints} endpoints × {1 / interval:g}/s, {PAGE.stat().st_size / 1024:.0f} KB page, "
        f"http {args.http}, publish {args.publish}"
    )
    print(
        f"  cycles {cycles} in {wall:.1f} s ({cycles / wall:.2f}/s); "
        f"{faults / pages:.1f} minor page faults per page; {100 * system_share:.0f}% of the "
        "CPU time in the kernel"
    )
    print(
        f"  collector CPU {100 * cpu / wall:.1f}% of one core ({ms_per_page:.3f} ms per page); "
        f"at the nominal {endpoints / interval:g} pages/s: "
        f"{ms_per_page * endpoints / interval / 10:.1f}% of one core"
    )
    if not args.port:  # with a shared server, leave its endpoints answering
        await _staleness(port, urls[0], interval, views)
    await collector.stop()
    if close is not None:
        await close()
    if writer is not None:
        writer.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--endpoints", type=int, default=64)
    ap.add_argument("--interval", type=float, default=0.2)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--warmup", type=float, default=3.0, help="seconds before measuring")
    ap.add_argument("--http", choices=("ice", "aiohttp"), default="ice")
    ap.add_argument("--publish", choices=("none", "shm"), default="none")
    ap.add_argument(
        "--port",
        type=int,
        help="scrape a page server already running on this port (see --serve) instead of "
        "starting one; skips the staleness check. Two collectors (e.g. two checkouts) "
        "measured side by side against one server see the same machine load.",
    )
    ap.add_argument("--serve", type=int, metavar="PORT", help="only run the page server")
    args = ap.parse_args()
    if args.serve:
        _serve(args.serve, PAGE.read_text())
        return
    if args.port:
        asyncio.run(_run(args, args.port))
        return
    port = free_port()
    server = multiprocessing.get_context("spawn").Process(
        target=_serve, args=(port, PAGE.read_text()), daemon=True
    )
    server.start()
    time.sleep(2.0)
    try:
        asyncio.run(_run(args, port))
    finally:
        server.terminate()


if __name__ == "__main__":
    main()
