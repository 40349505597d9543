"""Reading the runs: one line per run, the side-by-side table, totals per mode, the JSON report.

- ``one_line``: a finished run in one line (``compare``'s progress).
- ``ROWS`` / ``table``: the ``RunResult.summary`` keys shown and their labels; one column per
  run, sorted by (round, mode), so direct and ICE stand side by side.
- ``totals``: one line per mode over all rounds.
- ``report``: the whole record (burst parameters, each run's summary, Envoy's counters, shots,
  timeline) as JSON-ready data.

Invariants: pure: text and dicts from finished ``RunResult``s, no I/O; a cell with no value
(None, an empty list or dict) prints as ``-``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from ext_proc.lab.overload.burst import MODES, PRIORITIES, Planned
from ext_proc.lab.overload.run import RunResult

__all__ = ["ROWS", "one_line", "report", "table", "totals"]


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
