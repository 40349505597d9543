"""What reading the shared-memory snapshot costs a worker, and what publishing costs the collector.

    .venv/bin/python bench/snapshot_read.py [--calls 1000000] [--publish-hz 5] [--json]

The object is realistic: a dict of 4 pools × 16 backends of small frozen dataclasses (built
here, shaped like ``PoolSnapshot``/``BackendSignals``). Prints:

1. ``get()`` in the steady state, µs per call, p50/p99/max over ``--calls`` calls each timed
   with ``perf_counter_ns`` (the timer's own cost, measured the same way, is printed and
   subtracted), and the mean of an untimed loop; meanwhile a spawned collector process
   publishes a fresh object ``--publish-hz`` times a second, as in production, so the
   figures include the reads that unpickled a new generation;
2. ``get()`` right after a publication (copy + crc + unpickle), p50/p99;
3. ``publish()`` (pickle + copy + crc + flip), p50/p99, and the pickle's size.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.synchronize import Event

from ext_proc.signals.shm import SnapshotReader, SnapshotWriter


@dataclass(frozen=True, slots=True)
class Backend:
    url: str
    kv_cache_usage: float | None
    num_requests_running: float | None
    num_requests_waiting: float | None
    num_gpu_blocks: int | None
    block_size: int | None


@dataclass(frozen=True, slots=True)
class Pool:
    pool: str
    backends: tuple[Backend, ...]
    taken_at_s: float


def snapshot(tick: int, pools: int = 4, backends: int = 16) -> dict[str, Pool]:
    now = time.monotonic()
    return {
        f"pool-{p}": Pool(
            pool=f"pool-{p}",
            backends=tuple(
                Backend(
                    url=f"http://10.0.{p}.{b}:8000/metrics",
                    kv_cache_usage=((tick + b) % 100) / 100,
                    num_requests_running=float((tick + b) % 32),
                    num_requests_waiting=float(b % 4),
                    num_gpu_blocks=8192 + b,
                    block_size=16,
                )
                for b in range(backends)
            ),
            taken_at_s=now,
        )
        for p in range(pools)
    }


def _collector(name: str, hz: float, stop: Event) -> None:
    """Publishes a fresh snapshot ``hz`` times a second into the writer's segment."""
    with SnapshotWriter(name, capacity_bytes=1 << 20) as writer:
        tick = 0
        while not stop.wait(1.0 / hz):
            tick += 1
            writer.publish(snapshot(tick))


def percentiles_us(samples_ns: list[int], overhead_ns: float = 0.0) -> dict[str, float]:
    samples_ns.sort()
    n = len(samples_ns)

    def at(q: float) -> float:
        return max(0.0, samples_ns[min(n - 1, int(q * n))] - overhead_ns) / 1000

    return {"p50_us": at(0.50), "p99_us": at(0.99), "max_us": at(1.0)}


def time_each(fn: Callable[[], object], calls: int) -> list[int]:
    clock = time.perf_counter_ns
    out = [0] * calls
    for i in range(calls):
        t0 = clock()
        fn()
        out[i] = clock() - t0
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--calls", type=int, default=1_000_000)
    ap.add_argument("--publish-hz", type=float, default=5.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    results: dict[str, object] = {}
    payload = snapshot(0)

    # 3. publish() and 2. the first get() after it, in one process.
    with SnapshotWriter(None, capacity_bytes=1 << 20) as writer:
        reader = SnapshotReader(writer.name)
        publish_ns, refresh_ns = [], []
        for tick in range(2000):
            obj = snapshot(tick)
            t0 = time.perf_counter_ns()
            writer.publish(obj)
            t1 = time.perf_counter_ns()
            reader.get()
            t2 = time.perf_counter_ns()
            publish_ns.append(t1 - t0)
            refresh_ns.append(t2 - t1)
        assert reader.get() == obj
        results["pickle_bytes"] = writer.last_publish_bytes
        results["publish"] = percentiles_us(publish_ns)
        results["get_after_publish"] = percentiles_us(refresh_ns)
        reader.close()

    # 1. get() in the steady state, against a collector process publishing at --publish-hz.
    ctx = multiprocessing.get_context("spawn")
    name = f"ice-bench-{time.monotonic_ns() % 10**9}-snap"
    stop = ctx.Event()
    proc = ctx.Process(target=_collector, args=(name, args.publish_hz, stop))
    proc.start()
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                reader = SnapshotReader(name)
                break
            except (FileNotFoundError, ValueError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.01)
        while reader.get() is None:
            time.sleep(0.01)
        overhead = statistics.median(time_each(lambda: None, 200_000))
        gen0 = reader.generation
        start = time.perf_counter()
        samples = time_each(reader.get, args.calls)
        timed_s = time.perf_counter() - start
        get = reader.get
        start = time.perf_counter()
        for _ in range(args.calls):
            get()
        loop_s = time.perf_counter() - start
        steady: dict[str, float] = percentiles_us(samples, overhead)
        steady["mean_timed_us"] = max(0.0, statistics.fmean(samples) - overhead) / 1000
        steady["mean_untimed_loop_us"] = loop_s / args.calls * 1e6
        steady["timer_overhead_us"] = overhead / 1000
        steady["generations_seen"] = float(reader.generation - gen0)
        steady["seconds"] = timed_s + loop_s
        results["get_steady"] = steady
        results["reader_torn_reads"] = reader.torn_reads
        results["reader_stale_returns"] = reader.stale_returns
        assert isinstance(reader.get(), dict)
        reader.close()
    finally:
        stop.set()
        proc.join(10)

    results["object"] = (
        f"dict of {len(payload)} pools x {len(payload['pool-0'].backends)} backends "
        f"(frozen slots dataclasses)"
    )
    results["calls"] = args.calls
    if args.json:
        print(json.dumps(results, indent=2))
        return
    s = results["get_steady"]
    assert isinstance(s, dict)
    print(f"object: {results['object']}, pickle {results['pickle_bytes']} bytes (protocol 5)")
    print(
        f"get() steady state, {args.calls:,} calls, collector publishing at "
        f"{args.publish_hz:g} Hz ({s['generations_seen']:.0f} new generations during the run):"
    )
    print(
        f"  p50 {s['p50_us']:.3f} µs  p99 {s['p99_us']:.3f} µs  max {s['max_us']:.1f} µs "
        f"mean {s['mean_timed_us']:.3f} µs (timer overhead {s['timer_overhead_us']:.3f} µs "
        f"subtracted); untimed loop mean {s['mean_untimed_loop_us']:.3f} µs"
    )
    for key, label in (("get_after_publish", "get() after a publish"), ("publish", "publish()")):
        r = results[key]
        assert isinstance(r, dict)
        print(f"{label}: p50 {r['p50_us']:.1f} µs  p99 {r['p99_us']:.1f} µs  max {r['max_us']:.1f}")
    print(
        f"reader torn reads {results['reader_torn_reads']}, stale returns "
        f"{results['reader_stale_returns']}"
    )


if __name__ == "__main__":
    main()
