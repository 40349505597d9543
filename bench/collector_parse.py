"""CPU cost of parsing the collector's pages: 64 vLLM pages every 200 ms (320 pages/s).

    .venv/bin/python bench/collector_parse.py [--pages 64] [--rate 5] [--engines 1,4]
                                              [--rounds 7] [--json]

Pages: the recorded vLLM 0.32 page ``tests/data/vllm_cpu/metrics_preempting.txt`` (614
lines, ~50 KB, one engine; most of it histogram buckets ICE does not read). ``--engines N``
replicates every ``vllm:`` series of engine 0 for engines 1..N-1 (a data-parallel server),
so N=4 is a ~170 KB page. Each of the 64 pages gets its own values (every sample scaled by
1 + i/1000), as 64 backends would; their label sets are equal, as for 64 replicas of one model.

Modes, each parsing all pages into an ``EngineScrape``:
- ``no-prefilter``: prometheus_client's parser over the whole page, then the same combining
  step (what parsing costs without the pre-filter);
- ``prefilter+prometheus_client``: ``parse_engine(..., reference=True)``;
- ``prefilter+fast`` (the default path): ``parse_engine(...)``; ``cold`` clears the label-set
  cache before every page (the first scrape of a new backend), ``warm`` is the steady state.

CPU time is ``time.process_time()`` for one round over all pages; the figure is the median
of ``--rounds`` rounds (min in brackets). "% core" = ms per page × pages × rate / 10.
On a shared machine, other load inflates every figure alike; compare modes within one run.
Also printed: ``window.derive`` over a 10 s history of 50 scrapes (one backend, one tick),
and what the collector does instead per backend and tick: ``Window.append`` + ``derived()``.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ext_proc.signals import parse as P  # noqa: E402
from ext_proc.signals.window import Window, derive  # noqa: E402

PAGE = ROOT / "tests" / "data" / "vllm_cpu" / "metrics_preempting.txt"
_ENGINE0 = re.compile(r'engine="0"')


def build_page(base: str, engines: int) -> str:
    """The base page with every ``vllm:`` series of engine 0 repeated for more engines,
    right after the original line (inside its family, as an exporter writes them)."""
    out: list[str] = []
    for line in base.splitlines():
        out.append(line)
        if line.startswith("vllm:") and 'engine="0"' in line:
            out += [_ENGINE0.sub(f'engine="{e}"', line) for e in range(1, engines)]
    return "\n".join(out) + "\n"


def vary(page: str, i: int) -> str:
    """Every sample value scaled by 1 + i/1000 (one backend's own numbers)."""
    factor = 1.0 + i / 1000.0
    lines = []
    for line in page.splitlines():
        if line and not line.startswith("#"):
            head, _, value = line.rpartition(" ")
            lines.append(f"{head} {float(value) * factor!r}")
        else:
            lines.append(line)
    return "\n".join(lines) + "\n"


def _no_prefilter(text: str) -> object:
    samples = [
        (s.name, s.labels, float(s.value))
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]
    return P.engine_from_samples("vllm", "b", 0.0, samples)


def measure(
    pages: list[str], parse: Callable[[str], object], rounds: int, cold: bool
) -> dict[str, float]:
    per_round: list[float] = []
    for _ in range(rounds):
        start = time.process_time()
        for text in pages:
            if cold:
                P._labels.cache_clear()
            parse(text)
        per_round.append((time.process_time() - start) * 1000.0 / len(pages))
    return {"median_ms": statistics.median(per_round), "min_ms": min(per_round)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    base = PAGE.read_text()
    report: dict[str, Any] = {"pages": args.pages, "rate_per_s": args.rate, "runs": []}
    pages_per_s = args.pages * args.rate
    for engines in args.engines:
        page = build_page(base, engines)
        pages = [vary(page, i) for i in range(args.pages)]
        kept = len(P._FILTERS["vllm"].sample.findall("\n" + page))
        modes: list[tuple[str, Callable[[str], object], bool, int]] = [
            ("no-prefilter", _no_prefilter, False, max(1, args.rounds // 3)),
            (
                "prefilter+prometheus_client",
                lambda t: P.parse_engine("vllm", "b", t, 0.0, reference=True),
                False,
                args.rounds,
            ),
            (
                "prefilter+fast (cold)",
                lambda t: P.parse_engine("vllm", "b", t, 0.0),
                True,
                args.rounds,
            ),
            (
                "prefilter+fast (warm)",
                lambda t: P.parse_engine("vllm", "b", t, 0.0),
                False,
                args.rounds,
            ),
        ]
        for name, fn, cold, rounds in modes:
            fn(pages[0])  # import, compile and cache warm-up
            m = measure(pages, fn, rounds, cold)
            report["runs"].append(
                {
                    "engines": engines,
                    "page_bytes": len(page.encode()),
                    "page_lines": page.count("\n"),
                    "kept_lines": kept,
                    "mode": name,
                    **m,
                    "core_pct": m["median_ms"] * pages_per_s / 10.0,
                }
            )
    history = [P.parse_engine("vllm", "b", vary(base, i), i * 0.2) for i in range(50)]
    start = time.process_time()
    n = 2000
    for _ in range(n):
        derive(history, 10.0)
    report["derive_ms"] = (time.process_time() - start) * 1000.0 / n
    # what the collector does per backend and cycle: append the newest scrape, derive
    window = Window(10.0)
    for scrape in history:
        window.append(scrape)
    stream = [replace(history[i % 50], at_s=10.0 + 0.2 * i) for i in range(n)]
    start = time.process_time()
    for scrape in stream:
        window.append(scrape)
        window.derived()
    report["window_ms"] = (time.process_time() - start) * 1000.0 / n
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pages", type=int, default=64)
    ap.add_argument("--rate", type=float, default=5.0, help="scrapes per page per second")
    ap.add_argument("--engines", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    report = run(args)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"{args.pages} pages × {args.rate:g}/s = {args.pages * args.rate:g} pages/s")
    head = f"{'engines':>7} {'KB':>6} {'lines':>6} {'kept':>5}  {'mode':<28}"
    print(f"{head} {'ms/page [min]':>16} {'% core':>7}")
    for r in report["runs"]:
        print(
            f"{r['engines']:>7} {r['page_bytes'] / 1000:>6.1f} {r['page_lines']:>6} "
            f"{r['kept_lines']:>5}  {r['mode']:<28} "
            f"{r['median_ms']:>7.3f} [{r['min_ms']:.3f}] {r['core_pct']:>7.1f}"
        )
    print(f"derive over 50 scrapes (10 s window): {report['derive_ms'] * 1000:.0f} µs per call")
    print(
        "Window.append + derived (the collector's way, same window): "
        f"{report['window_ms'] * 1000:.0f} µs per scrape"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
