"""What the shared in-flight ledger costs a worker: ``publish()`` and ``others()``.

    .venv/bin/python bench/ledger_shm.py [--calls 200000] [--ring 1024] [--json]

For 2 and 8 workers (this process is worker 0; the other rings are filled by handles in this
process, or by a spawned process for the "live" case), prints p50/p99/max in µs, each call
timed with ``perf_counter_ns`` (the timer's own cost is measured and subtracted):

1. ``publish()``;
2. ``others()`` steady state: the same ``since_s`` (one snapshot), nothing appended since the
   last call: the common case, one word read per other ring;
3. ``others()`` live: a spawned process appends to ring 1 at ``--rate`` entries a second
   (16 endpoint keys) while worker 0 asks with the same ``since_s``, so calls copy and add the
   new entries; the ``since_s`` moves on every 200 ms, as snapshots do;
4. ``others()`` with a ``since_s`` never asked before (the first call after a new snapshot)
   with 64 entries per other ring newer than it, and with every entry of full rings newer
   than it (the worst case: each other worker passed ``--ring`` requests since the snapshot);
5. opening a ``LedgerHandle`` over full rings (it copies every entry of the other rings).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import time
from collections.abc import Callable
from multiprocessing.synchronize import Event

from ext_proc.placement.ledger_shm import LedgerHandle, LedgerSegment, endpoint_key

KEYS = [endpoint_key("chat", f"10.0.0.{i}:8000") for i in range(15)] + [endpoint_key("chat", "")]


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


def fill(seg: LedgerSegment, entries: int, at_s: float) -> None:
    """Append ``entries`` entries at ``at_s`` + i µs to every ring but worker 0's."""
    for w in range(1, seg.workers):
        with LedgerHandle(seg.name, w) as h:
            for i in range(entries):
                h.publish(KEYS[i % len(KEYS)], at_s + i * 1e-6, 1 + i % 7)


def _live_writer(name: str, rate: float, stop: Event) -> None:
    with LedgerHandle(name, 1) as h:
        i = 0
        period = 1.0 / rate
        next_at = time.monotonic()
        while not stop.is_set():
            now = time.monotonic()
            if now < next_at:
                time.sleep(next_at - now)
                continue
            h.publish(KEYS[i % len(KEYS)], now, 1 + i % 7)
            i += 1
            next_at += period


def bench(workers: int, ring: int, calls: int, rate: float, overhead: float) -> dict[str, object]:
    out: dict[str, object] = {}
    with LedgerSegment(workers, ring) as seg, LedgerHandle(seg.name, 0) as me:
        i = 0

        def publish() -> None:
            nonlocal i
            i += 1
            me.publish(KEYS[i % len(KEYS)], time.monotonic(), 3)

        out["publish"] = percentiles_us(time_each(publish, calls), overhead)

        fill(seg, ring, 1000.0)  # full rings
        me.others(0.0)
        out["others_steady"] = percentiles_us(time_each(lambda: me.others(0.0), calls), overhead)

        since = iter(range(10**9))
        newer_64 = 1000.0 + (ring - 64) * 1e-6 - 1e-7  # 64 entries of each ring are newer

        def miss(base: float) -> Callable[[], object]:
            return lambda: me.others(base - next(since) * 1e-12)  # a new since_s every call

        n_miss = max(200, calls // 100)
        out["others_new_since_64"] = percentiles_us(time_each(miss(newer_64), n_miss), overhead)
        out["others_new_since_all"] = percentiles_us(time_each(miss(999.0), n_miss), overhead)

        fresh_ns = []
        for _ in range(20):
            t0 = time.perf_counter_ns()
            with LedgerHandle(seg.name, 0) as h:
                fresh_ns.append(time.perf_counter_ns() - t0)
                assert h.others(999.0)
        out["others_fresh_handle"] = percentiles_us(fresh_ns, overhead)

    with LedgerSegment(workers, ring) as seg, LedgerHandle(seg.name, 0) as me:
        ctx = multiprocessing.get_context("spawn")
        stop = ctx.Event()
        proc = ctx.Process(target=_live_writer, args=(seg.name, rate, stop))
        proc.start()
        try:
            while not me.others(0.0):
                time.sleep(0.01)
            snapshot = [time.monotonic()]

            def live() -> None:
                now = time.monotonic()
                if now - snapshot[0] > 0.2:
                    snapshot[0] = now
                me.others(snapshot[0])

            started = time.monotonic()
            samples = time_each(live, calls)
            elapsed = time.monotonic() - started
            out["others_live"] = percentiles_us(samples, overhead)
            out["live_entries_per_s_seen"] = round(sum(me.others(started).values()) / 4 / elapsed)
            out["live_lost"] = me.lost
        finally:
            stop.set()
            proc.join(10)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--calls", type=int, default=200_000)
    ap.add_argument("--ring", type=int, default=1024)
    ap.add_argument("--rate", type=float, default=2000.0, help="live writer entries per second")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    overhead = statistics.median(time_each(lambda: None, 200_000))
    results: dict[str, object] = {"timer_overhead_us": overhead / 1000, "ring": args.ring}
    for workers in (2, 8):
        results[f"workers_{workers}"] = bench(workers, args.ring, args.calls, args.rate, overhead)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(
        f"ring {args.ring} entries per worker, {args.calls:,} timed calls per figure "
        f"(timer overhead {overhead / 1000:.3f} µs subtracted); µs p50 / p99 / max"
    )
    for workers in (2, 8):
        r = results[f"workers_{workers}"]
        assert isinstance(r, dict)
        print(f"{workers} workers:")
        for key, label in (
            ("publish", "publish()"),
            ("others_steady", "others() steady (same since_s, nothing new)"),
            ("others_live", f"others() live ({args.rate:g}/s appended by another process)"),
            ("others_new_since_64", "others() new since_s, 64 newer per ring"),
            ("others_new_since_all", f"others() new since_s, all {args.ring} newer per ring"),
            ("others_fresh_handle", "LedgerHandle() over full rings (copies them)"),
        ):
            f = r[key]
            print(f"  {label:<58} {f['p50_us']:8.2f} {f['p99_us']:8.2f} {f['max_us']:9.1f}")
        print(
            f"  live: ~{r['live_entries_per_s_seen']} entries/s seen (x4 blocks avg), "
            f"lost {r['live_lost']}"
        )


if __name__ == "__main__":
    main()
