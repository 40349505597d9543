"""What the shared ledger costs a request: the round trip of its reservation to a real Redis.

Starts a ``redis-server`` on loopback (``ext_proc.lab.redis_local``), then times, one call at
a time (what one request waits for), ``RedisLedger.reserve`` with the atomic check and
``sync``, with ``--others`` other replicas' live totals and ``--entries`` seen entries in the
pool (what the scripts sum), and a plain ``PING`` through the same client for the floor.

    .venv/bin/python bench/ledger_redis.py [--calls 5000] [--others 3] [--entries 64]

Prints p50/p90/p99 in ms. Timings are the client's (redis-py asyncio with hiredis when
installed), event loop included: what a worker's request path pays.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from ext_proc.lab.redis_local import start_redis
from ext_proc.placement.ledger_redis import RedisLedger, Reserve


def _quantiles(xs: list[float]) -> str:
    q = statistics.quantiles(xs, n=100)
    return f"p50 {q[49] * 1000:.3f} ms  p90 {q[89] * 1000:.3f} ms  p99 {q[98] * 1000:.3f} ms"


async def _run(url: str, calls: int, others: int, entries: int) -> None:
    peers = [RedisLedger(url, replica=f"peer{i}", deadline_s=1.0) for i in range(others)]
    me = RedisLedger(url, replica="me", deadline_s=1.0)
    for p in (*peers, me):
        await p.start()
    for i, p in enumerate(peers):  # others' live totals and seen entries
        for _ in range(max(1, entries // max(1, others))):
            await p.reserve(Reserve("default", "", 1, i + 1, view_age_ms=0))
    times: dict[str, list[float]] = {"ping": [], "reserve (checked)": [], "sync": []}
    for n in range(calls):
        t = time.perf_counter()
        await me.client.ping()
        times["ping"].append(time.perf_counter() - t)
        r = Reserve("default", "", 0, n % 7, 200, slack=10_000, checked=("",))
        t = time.perf_counter()
        await me.reserve(r)
        times["reserve (checked)"].append(time.perf_counter() - t)
        t = time.perf_counter()
        await me.sync("default", 200)
        times["sync"].append(time.perf_counter() - t)
    for name, xs in times.items():
        print(f"{name:20s} {_quantiles(xs)}")
    print(f"(others {others}, seen entries {entries}, calls {calls}, active {me.active})")
    for p in (*peers, me):
        await p.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=5000)
    ap.add_argument("--others", type=int, default=3, help="other replicas in the pool")
    ap.add_argument("--entries", type=int, default=64, help="their seen entries in the view")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, start_redis(Path(tmp)) as server:
        asyncio.run(_run(server.url, args.calls, args.others, args.entries))


if __name__ == "__main__":
    main()
