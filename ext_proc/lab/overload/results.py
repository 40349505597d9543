"""Reading the runs: one line per run, the side-by-side table, the spread per arm, the JSON.

- ``one_line``: a finished run in one line (``compare``'s progress).
- ``ROWS`` / ``table``: the ``RunResult.summary`` keys shown and their labels; one column per
  run, sorted by (round, control or not, valve, mode), so the arms of a round stand side by
  side.
- ``SPREAD_COLS`` / ``totals``: one row per arm (``RunResult.label``: the mode, the valve of
  its vLLM, and the control's name for a control run) over all rounds, each cell ``spread``
  of that metric over the rounds: ``median [min–max]`` (one value when all agree; ``(n=k)``
  when only k runs had one); a dict-valued metric (429s by reason, 503s by valve, vLLM's
  admission rejections, other answers by status) is one column per key (a run without the
  key counts 0). A footer states the TTFT SLO and the goodput formula.
- ``tenant_table`` / ``kind_table``: one row per (arm, tenant) / (arm, size class of the
  mixed workload), spread over the rounds the same way ("" without tenants / classes).
- ``spreads``: the same spreads as data (median, min, max, n) for every numeric summary key.
- ``report``: the whole record (workload parameters and plan, each run's summary, Envoy's
  counters, shots, timeline, the spreads) as JSON-ready data.

Invariants: pure: text and dicts from finished ``RunResult``s, no I/O; a cell with no value
(None, an empty list or dict) prints as ``-``; the median of an even count is the mean of the
middle two; the rows and columns of the valve (``OPTIONAL``) are left out when no run has a
value there, so runs without a valve print the tables they printed before valves existed.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from ext_proc.lab.overload.arms import valve_sort_key
from ext_proc.lab.overload.burst import MODES, PRIORITIES, Planned
from ext_proc.lab.overload.run import RunResult
from ext_proc.lab.overload.workload import describe

__all__ = [
    "KIND_COLS",
    "OPTIONAL",
    "ROWS",
    "SPREAD_COLS",
    "TENANT_COLS",
    "kind_table",
    "one_line",
    "report",
    "spread",
    "spreads",
    "table",
    "tenant_table",
    "totals",
]


def one_line(r: RunResult) -> str:
    s = r.summary()
    queued = f", {s['queued']} queued (p95 {_num(s['queued_ms_p95'])} ms)" if s["queued"] else ""
    reasons = " ".join(f"{k}:{v}" for k, v in s["shed_by_reason"].items())
    valves = " ".join(f"{k}:{v}" for k, v in s["refused_503_by_valve"].items())
    refused = f", {s['refused_503']} × 503 ({valves})" if s["refused_503"] else ""
    return (
        f"{s['ok']} ok, {s['shed_429']} × 429{f' ({reasons})' if reasons else ''}{refused}"
        f"{queued}, "
        f"preemptions {s['preemptions']}, {s['output_tokens']} output tokens in "
        f"{s['drain_s']} s, goodput {s['goodput_tok_per_s']} tok/s (TTFT ≤ {s['ttft_slo_s']} s), "
        f"ok p95 {s['ok_p95_s']} s, wait max {s['wait_max_s']} s"
    )


ROWS: tuple[tuple[str, str], ...] = (
    ("requests", "requests"),
    ("ok", "200 completed"),
    ("shed_429", "429 shed"),
    ("shed_by_reason", "429 by reason"),
    ("refused_503", "503 refused"),
    ("refused_503_by_valve", "503 by valve (body)"),
    ("refused_503_in_stream", "503 inside a 200 stream"),
    ("valve_rejections", "vLLM admission rejections (delta)"),
    ("other", "other errors"),
    ("other_by_status", "other by status"),
    ("downgraded", "downgraded by ICE"),
    ("queued", "queued by ICE"),
    ("queued_ms_p50", "queued ms p50"),
    ("queued_ms_p95", "queued ms p95"),
    ("queued_ms_max", "queued ms max"),
    ("preemptions", "vLLM preemptions (delta)"),
    ("output_tokens", "completed output tokens"),
    ("wall_s", "burst wall time (s)"),
    ("drain_s", "drain time (s)"),
    ("output_tok_per_s", "output tokens / s (drain)"),
    ("slo_met", "200 with TTFT ≤ SLO"),
    ("goodput_tok_per_s", "goodput tokens / s"),
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
    ("waiting_max", "vLLM waiting max"),
    ("running_max", "vLLM running max"),
    ("kv_usage_max", "vLLM KV usage max"),
    ("forecast_peak_max", "ICE forecast peak max (blocks)"),
    ("tenant_held_max", "ICE tenant blocks held max"),
    ("unjudged", "ICE fail-open (unjudged)"),
    ("ice_body_p50_s", "ICE time per body p50 (s, ≤ bucket)"),
    ("ice_body_max_s", "ICE time per body max (s, ≤ bucket)"),
)

# The per-mode spread table's columns (summary key, heading); a dict-valued key is one column
# per key of the dict, headed "<heading> <key>".
SPREAD_COLS: tuple[tuple[str, str], ...] = (
    ("requests", "requests"),
    ("ok", "200"),
    ("shed_429", "429"),
    ("shed_by_reason", "429"),
    ("refused_503", "503"),
    ("refused_503_by_valve", "503"),
    ("refused_503_in_stream", "503 in stream"),
    ("valve_rejections", "valve Δ"),
    ("other_by_status", "other"),
    ("downgraded", "downgraded"),
    ("queued", "queued"),
    ("queued_ms_p95", "queued ms p95"),
    ("queued_ms_max", "queued ms max"),
    ("preemptions", "preemptions"),
    ("wait_p50_s", "TTFT p50 s"),
    ("wait_p95_s", "TTFT p95 s"),
    ("ok_p50_s", "e2e p50 s"),
    ("ok_p95_s", "e2e p95 s"),
    ("ok_max_s", "e2e max s"),
    ("drain_s", "drain s"),
    ("output_tok_per_s", "tok/s"),
    ("goodput_tok_per_s", "goodput tok/s"),
    ("unjudged", "fail-open"),
)

# Summary keys whose rows (``table``) and columns (``totals``) are left out when no run has a
# value there (None, 0, an empty dict): the valve's, and in ``totals`` ICE's downgrades.
OPTIONAL = frozenset(
    {
        "refused_503",
        "refused_503_by_valve",
        "refused_503_in_stream",
        "valve_rejections",
        "downgraded",
    }
)
_OPTIONAL_ROWS = OPTIONAL - {"downgraded"}  # an existing row of the per-run table

# The per-class table's columns (key of ``run.kind_breakdown``, heading).
KIND_COLS: tuple[tuple[str, str], ...] = (
    ("requests", "requests"),
    ("ok", "200"),
    ("shed_429", "429"),
    ("refused_503", "503"),
    ("ttft_p50_s", "TTFT p50 s"),
    ("ttft_p95_s", "TTFT p95 s"),
    ("e2e_p95_s", "e2e p95 s"),
    ("goodput_tok_per_s", "goodput tok/s"),
)

# The per-tenant table's columns (key of ``run.tenant_breakdown``, heading).
TENANT_COLS: tuple[tuple[str, str], ...] = (
    ("requests", "requests"),
    ("ok", "200"),
    ("shed_429", "429"),
    ("queued", "queued"),
    ("queued_ms_p95", "queued ms p95"),
    ("ttft_p95_s", "TTFT p95 s"),
    ("goodput_tok_per_s", "goodput tok/s"),
)


def _abbrev(keys: Sequence[str]) -> dict[str, str]:
    """Each key cut to the shortest prefix (≥ 4 characters) that keeps them all apart."""
    for n in range(4, max((len(k) for k in keys), default=4) + 1):
        cut = {k: k[:n] for k in keys}
        if len(set(cut.values())) == len(cut):
            return cut
    return {k: k for k in keys}


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, list):
        return ",".join(str(v) for v in value) or "-"
    if isinstance(value, dict):
        short = _abbrev(list(value))
        return " ".join(f"{short[k]}:{v}" for k, v in value.items()) or "-"
    return str(value)


def _num(value: float) -> str:
    """A number as short as it reads: ``3``, ``0.25``, ``12.3`` (3 decimals at most)."""
    return f"{round(float(value), 3):g}"


def spread(values: Sequence[float | None], runs: int | None = None) -> str:
    """``median [min–max]`` of the values that are not None; one value when they all agree;
    ``(n=k)`` after it when only k of ``runs`` (default: all values) had one; ``-`` for none."""
    have = [v for v in values if v is not None]
    if not have:
        return "-"
    lo, hi = min(have), max(have)
    text = _num(lo) if lo == hi else f"{_num(statistics.median(have))} [{_num(lo)}–{_num(hi)}]"
    runs = len(values) if runs is None else runs
    return text if len(have) == runs else f"{text} (n={len(have)})"


def _order(results: Sequence[RunResult]) -> list[str]:
    """The labels of ``results``: whole bursts first, then controls; the arms without a valve
    first, then by valve (``arms.valve_sort_key``); modes as in ``MODES``."""
    seen = {
        r.label: (r.variant != "", r.variant, valve_sort_key(r.valve), _mode_rank(r.mode))
        for r in results
    }
    return sorted(seen, key=lambda label: seen[label])


def _empty(value: Any) -> bool:
    return value is None or value in (0, {}, [])


def _shown(
    summaries: Sequence[dict[str, Any]], cols: Sequence[tuple[str, str]], optional: frozenset[str]
) -> list[tuple[str, str]]:
    """``cols`` less the ``optional`` keys that no summary has a value for."""
    return [
        (key, head)
        for key, head in cols
        if key not in optional or not all(_empty(s.get(key)) for s in summaries)
    ]


def _mode_rank(mode: str) -> int:
    return MODES.index(mode) if mode in MODES else len(MODES)


def _columns(
    summaries: Sequence[dict[str, Any]], cols: Sequence[tuple[str, str]]
) -> list[tuple[str, str, str | None]]:
    """(heading, summary key, dict key or None) per column, dict-valued keys expanded."""
    out: list[tuple[str, str, str | None]] = []
    for key, head in cols:
        values = [s.get(key) for s in summaries]
        if any(isinstance(v, dict) for v in values):
            keys = dict.fromkeys(k for v in values if isinstance(v, dict) for k in v)
            out += [(f"{head} {k}", key, k) for k in keys]
        else:
            out.append((head, key, None))
    return out


def _value(summary: dict[str, Any], key: str, sub: str | None) -> float | None:
    value = summary.get(key)
    if sub is not None:
        return float((value or {}).get(sub, 0))
    return None if value is None else float(value)


def _markdown(heads: Sequence[str], rows: Sequence[Sequence[str]], left: int = 1) -> str:
    """A markdown table: the first ``left`` columns left-aligned, the others right-aligned."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(heads)]

    def line(cells: Sequence[str]) -> str:
        padded = [
            c.ljust(w) if i < left else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "| " + " | ".join(padded) + " |"

    rule = "|" + "|".join(
        "-" * (w + 2) if i < left else "-" * (w + 1) + ":" for i, w in enumerate(widths)
    )
    return "\n".join([line(heads), rule + "|", *(line(r) for r in rows)])


def table(
    results: Sequence[RunResult],
    rows: Sequence[tuple[str, str]] = ROWS,
    heads: Sequence[str] | None = None,
) -> str:
    """Rows: the metrics (``rows``: summary key, label); columns: each run (round, mode), the
    modes of a round side by side; ``heads`` overrides the column titles (``r1 direct``...)."""
    ordered = sorted(
        results,
        key=lambda r: (
            r.round,
            r.variant != "",
            r.variant,
            valve_sort_key(r.valve),
            _mode_rank(r.mode),
        ),
    )
    summaries = [r.summary() for r in ordered]
    heads = list(heads) if heads is not None else [f"r{s['round']} {s['label']}" for s in summaries]
    rows = _shown(summaries, rows, _OPTIONAL_ROWS)
    label_w = max(len(label) for _, label in rows)
    body = [[label, *(_cell(s[key]) for s in summaries)] for key, label in rows]
    return _markdown([" " * label_w, *heads], body)


def totals(results: Sequence[RunResult], cols: Sequence[tuple[str, str]] = SPREAD_COLS) -> str:
    """One row per arm over all rounds, each cell ``spread`` over its runs; then the SLO."""
    if not results:
        return ""
    all_summaries = [r.summary() for r in results]
    columns = _columns(all_summaries, _shown(all_summaries, cols, OPTIONAL))
    rows = []
    for label in _order(results):
        runs = [s for s in all_summaries if s["label"] == label]
        cells = [spread([_value(s, key, sub) for s in runs]) for _, key, sub in columns]
        rows.append([label, str(len(runs)), *cells])
    slos = sorted({r.ttft_slo_s for r in results})
    footer = (
        f"cells: median [min–max] over the runs of each mode; goodput = Σ completion tokens of "
        f"the 200s with TTFT ≤ {'/'.join(_num(v) for v in slos)} s (the SLO) / drain time "
        "(from the burst's start to the end of its last request)"
    )
    if any(key == "valve_rejections" for _, key, _ in columns):
        footer += (
            "; 503 <valve>: vLLM's 503s by the valve their body names; valve Δ <valve>: "
            "vllm:admission_rejections_total over the run"
        )
    return _markdown(["mode", "runs", *(h for h, _, _ in columns)], rows) + "\n" + footer


def tenant_table(
    results: Sequence[RunResult], cols: Sequence[tuple[str, str]] = TENANT_COLS
) -> str:
    """One row per (mode, tenant), each cell ``spread`` over the runs; "" without tenants.
    ``queued ms p95`` is over the tenant's queued requests (the wait ICE added)."""
    return _breakdown_table(results, "tenants", "tenant", cols)


def kind_table(results: Sequence[RunResult], cols: Sequence[tuple[str, str]] = KIND_COLS) -> str:
    """One row per (arm, size class of the mixed workload), each cell ``spread`` over the
    runs; "" for the burst. Goodput is the class's tokens within the SLO over the run's drain
    time, so the classes of a run add up to its goodput."""
    return _breakdown_table(results, "kinds", "class", cols)


def _breakdown_table(
    results: Sequence[RunResult], key: str, head: str, cols: Sequence[tuple[str, str]]
) -> str:
    rows = []
    for label in _order(results):
        breakdowns = [r.summary()[key] for r in results if r.label == label]
        for name in dict.fromkeys(t for b in breakdowns for t in b):
            mine = [b[name] for b in breakdowns if name in b]
            cells = [spread([m[col] for m in mine]) for col, _ in cols]
            rows.append([label, name, str(len(mine)), *cells])
    if not rows:
        return ""
    return _markdown(["mode", head, "runs", *(h for _, h in cols)], rows, left=2)


# The dict-valued summary keys ``spreads`` expands (``key.sub``).
_DICT_KEYS = ("shed_by_reason", "refused_503_by_valve", "valve_rejections", "other_by_status")


def spreads(results: Sequence[RunResult]) -> dict[str, dict[str, Any]]:
    """Per label: its run count and, for each numeric summary key (dict-valued ones as
    ``key.sub``), the median, min and max over its runs that had a value, and their count."""
    out: dict[str, dict[str, Any]] = {}
    for label in _order(results):
        runs = [r.summary() for r in results if r.label == label]
        numeric = dict.fromkeys(
            k for s in runs for k, v in s.items() if isinstance(v, int | float) and k != "round"
        )
        keys: list[tuple[str, str, str | None]] = [(k, k, None) for k in numeric]
        for key in _DICT_KEYS:
            keys += [(f"{key}.{sub}", key, sub) for _, _, sub in _columns(runs, [(key, key)])]
        entry: dict[str, Any] = {"runs": len(runs)}
        for name, key, sub in keys:
            have = [v for v in (_value(s, key, sub) for s in runs) if v is not None]
            entry[name] = (
                {
                    "median": statistics.median(have),
                    "min": min(have),
                    "max": max(have),
                    "n": len(have),
                }
                if have
                else None
            )
        out[label] = entry
    return out


def report(
    results: Sequence[RunResult], burst: Sequence[Planned], args: dict[str, Any]
) -> dict[str, Any]:
    tenants = dict.fromkeys(b.tenant for b in burst if b.tenant is not None)
    return {
        "burst": {
            **args,
            "priorities": {p: sum(1 for b in burst if b.priority == p) for p in PRIORITIES},
            "tenants": {t: sum(1 for b in burst if b.tenant == t) for t in tenants},
            "sizes": describe(burst) if burst else {},
            "plan": [asdict(b) for b in burst],
        },
        "spread": spreads(results),
        "runs": [
            {
                "summary": r.summary(),
                "ext_proc": r.ext_proc,
                "shots": [asdict(s) for s in r.shots],
                "timeline": [asdict(s) for s in r.samples],
                "forecast_peaks": [list(p) for p in r.peaks],
            }
            for r in results
        ],
    }
