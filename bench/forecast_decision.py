"""What one ``admission: forecast`` decision costs with 100 / 1,000 / 10,000 requests in
flight at one endpoint (issue 46, item 6), before and after the standing forecast.

One decision is what the ladder asks of the forecast for one request: the endpoint's fit
(``ForecastBook.fit``: the peak of its trajectories, the budget) and the new request's charge
(``KvFit.charge``). The endpoint: blocks of 16 tokens, the requests in flight started over the
last 30 s at 40 tokens/s a sequence (a first token after 0.2 s), prompts lognormal (median 800
tokens, up to 8,000), output limits 256 / 1,024 / 4,096 / 8,192 (none asked), 5 % of them two
samples; the backend's output lengths a lognormal histogram (median 300) of 5,000 requests,
quantile 0.5. The candidate is drawn from the same mix.

Arms, each in its own process:
- ``before``: the package at ``--before-rev`` (default: the commit before the standing
  forecast), exported with ``git archive`` into a temporary folder;
- ``exact``: this code with the standing forecast off (every decision reads every trajectory
  at its time; the quantiles memoised);
- ``after``: this code.

Two ways of running:
- ``still``: the same requests in flight at every decision (the 5 ms fit memo cleared, so
  each decision computes);
- ``churn``: after each decision the candidate is passed (added) and the oldest request
  ends (removed), one decision a millisecond (``--pace-ms``): the standing forecast is
  built again after its changes and when its span ends, and those builds are in the figures;
- ``finish`` (not run unless asked, ``--modes finish``): as ``churn``, and the request that
  ends is observed (``ForecastBook.finished``): under ``refine`` the kinds' factors move
  with every one, and the standing forecast is built again at the next decision.

Usage: .venv/bin/python bench/forecast_decision.py [--sizes 100,1000,10000]
       [--decisions 2000] [--pace-ms 1] [--before-rev REV]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BS = 16
RATE = 40.0  # tokens a second a sequence
LIMITS = (256, 1024, 4096, 8192)


def _histogram() -> object:
    from ext_proc.signals.scrapes import Histogram

    rnd = random.Random(7)
    sample = [min(20000.0, rnd.lognormvariate(math.log(300), 1.0)) for _ in range(5000)]
    bounds = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, math.inf)
    counts = tuple(float(sum(x <= b for x in sample)) for b in bounds)
    return Histogram(bounds, counts, float(len(sample)), sum(sample))


def _request(rnd: random.Random) -> tuple[int, int, int]:
    """(prompt tokens, output limit, sequences) of one request of the mix."""
    prompt = int(min(8000, max(16, rnd.lognormvariate(math.log(800), 0.8))))
    return prompt, rnd.choice(LIMITS), 2 if rnd.random() < 0.05 else 1


def _trajectory(rnd: random.Random, start_s: float) -> object:
    from ext_proc.placement.forecast import Trajectory

    prompt, limit, seqs = _request(rnd)
    blocks = -(-prompt // BS) * seqs
    return Trajectory(start_s, blocks, seqs, limit, tokens=prompt, kind="p")


def _arm(
    arm: str, sizes: list[int], decisions: int, mode: str, pace_ms: float
) -> dict[str, object]:
    from ext_proc.placement import forecast, forecast_book
    from ext_proc.placement.forecast_book import ForecastBook
    from ext_proc.policy.kvfit import KvFit, Shape
    from ext_proc.policy.settings import ForecastSpec, Profile
    from ext_proc.signals.scrapes import Derived
    from ext_proc.signals.snapshot import BackendSignals

    if arm == "exact":
        forecast_book.STANDING_FROM = 1 << 60  # type: ignore[attr-defined]
        forecast.FAST_FROM = 1 << 60  # type: ignore[attr-defined]
    profile = Profile(name="p", admission="forecast", forecast=ForecastSpec(quantile=0.5))
    out: dict[str, object] = {}
    for n in sizes:
        rnd = random.Random(n)
        book = ForecastBook()
        now = time.monotonic()
        live = [_trajectory(rnd, now - rnd.uniform(0.0, 30.0)) for _ in range(n)]
        for t in live:
            book.add("pool", "e", t)
        usable = n * 120
        backend = BackendSignals(
            url="u",
            kv_cache_usage=0.7,
            num_requests_running=float(n),
            num_gpu_blocks=usable + 1,
            block_size=BS,
            output_lengths=_histogram(),  # type: ignore[arg-type]
            preemptions=0.0,
            itl_mean_s=1.0 / RATE,
            derived=Derived(window_s=10.0, ttft_p50_s=0.2),
        )

        def blocks(i: int, o: int) -> int:
            return -(-(i + o) // BS)

        base = KvFit(
            free_blocks=usable * 3 // 10, usable_blocks=usable, block_size=BS, blocks=blocks
        )
        count = decisions if arm == "after" else max(20, min(decisions, 2_000_000 // n))
        took: list[float] = []
        cpu: list[float] = []
        for _ in range(count + 5):
            prompt, limit, seqs = _request(rnd)
            shape = Shape(((prompt, 1),), seqs)
            book._last.clear()  # the 5 ms memo of one request's judgements: every decision computes
            t0, c0 = time.perf_counter(), time.thread_time()
            fit = book.fit(profile, "pool", "e", 1, backend, base, 0, 0)
            fit.charge(shape, limit)
            took.append(time.perf_counter() - t0)
            cpu.append(time.thread_time() - c0)
            if mode in ("churn", "finish"):
                gone = live.pop(0)
                book.remove("pool", "e", gone)
                if mode == "finish":  # its length observed: under refine the factors move
                    book.finished("pool", "e", gone)
                t = _trajectory(rnd, time.monotonic())
                live.append(t)
                book.add("pool", "e", t)
                if pace_ms:
                    time.sleep(pace_ms / 1000.0)
        took, cpu = sorted(took[5:]), sorted(cpu[5:])  # the first ones build memos
        p99 = min(len(took) - 1, int(len(took) * 0.99))
        out[str(n)] = {
            "decisions": len(took),
            "median_ms": statistics.median(took) * 1000,
            "p99_ms": took[p99] * 1000,
            "mean_ms": statistics.fmean(took) * 1000,
            "cpu_median_ms": statistics.median(cpu) * 1000,
            "cpu_p99_ms": cpu[p99] * 1000,
        }
    return out


def _before_tree(rev: str, into: str) -> None:
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev, "ext_proc"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", into], input=archive, check=True)


def _default_rev() -> str:
    added = subprocess.run(
        [
            "git",
            "-C",
            str(ROOT),
            "log",
            "--diff-filter=A",
            "--format=%H",
            "--",
            "ext_proc/placement/forecast_standing.py",
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    return f"{added[-1]}~1" if added else "HEAD"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="100,1000,10000")
    ap.add_argument("--decisions", type=int, default=2000)
    ap.add_argument("--pace-ms", type=float, default=1.0)
    ap.add_argument("--before-rev", default=None)
    ap.add_argument("--modes", default="still,churn")
    ap.add_argument("--arms", default="before,exact,after")
    ap.add_argument("--arm", help=argparse.SUPPRESS)
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.arm:
        print(json.dumps(_arm(args.arm, sizes, args.decisions, args.mode, args.pace_ms)))
        return
    rev = args.before_rev or _default_rev()
    results: dict[tuple[str, str], dict[str, dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as before:
        _before_tree(rev, before)
        for mode in args.modes.split(","):
            for arm in args.arms.split(","):
                env = dict(os.environ, PYTHONPATH=before if arm == "before" else str(ROOT))
                cmd = [
                    sys.executable,
                    __file__,
                    "--arm",
                    arm,
                    "--mode",
                    mode,
                    "--sizes",
                    args.sizes,
                    "--decisions",
                    str(args.decisions),
                    "--pace-ms",
                    str(args.pace_ms),
                ]
                got = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
                results[(mode, arm)] = json.loads(got.stdout.strip().splitlines()[-1])
    arms = args.arms.split(",")
    print(f"before = {rev}; blocks of {BS}; one decision = fit + charge")
    print("ms: wall median / p99 [mean] (CPU of the thread: median / p99)")
    print("| mode | in flight | " + " | ".join(arms) + " |")
    print("|---|---|" + "---|" * len(arms))
    for mode in args.modes.split(","):
        for n in sizes:
            cells = []
            for arm in arms:
                r = results[(mode, arm)][str(n)]
                cells.append(
                    f"{r['median_ms']:.3f} / {r['p99_ms']:.3f} [{r['mean_ms']:.3f}] "
                    f"({r['cpu_median_ms']:.3f} / {r['cpu_p99_ms']:.3f})"
                )
            print(f"| {mode} | {n:,} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
