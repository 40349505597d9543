"""The replicas bench's output: the plan, the markdown table, the scenarios' lines, the JSON.

- ``plan_text``: the pool, the request's size and blocks, how many fit, the settings (with
  why a setting cannot run in this checkout) and a time estimate (``estimate_s``).
- ``table``: one markdown row per setting, each metric ``median [min–max]`` over its rounds
  (``accounting.stats``); a skipped setting's row says why.
- ``failover_text`` / ``crash_text``: a scenario's numbers, one line each.
- ``document``: everything as JSON-ready data (the parameters, the plan, each setting's
  rounds with every answer, the scenarios).

Invariants: pure functions of the results (no I/O); every setting of the run has a row, in
run order, skipped ones included.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from ext_proc.lab.replicas.faults import CrashResult, FailoverResult
from ext_proc.lab.replicas.scenarios import SettingResult
from ext_proc.lab.replicas.traffic import BurstPlan

__all__ = ["COLUMNS", "crash_text", "document", "estimate_s", "failover_text", "plan_text", "table"]

# (RoundResult.summary key, column header)
COLUMNS = (
    ("admitted", "admitted"),
    ("shed_429", "429"),
    ("other", "other non-2xx"),
    ("unjudged", "unjudged"),
    ("peak_blocks", "peak blocks"),
    ("over_blocks", "over-admission (blocks)"),
    ("preemptions", "preemptions"),
    ("added_p50_ms", "ICE added p50 ms"),
    ("added_p99_ms", "ICE added p99 ms"),
    ("ledger_errors", "ledger errors"),
)


def estimate_s(
    pairs: Sequence[tuple[str, int]],
    rounds: int,
    plan: BurstPlan,
    probe_requests: int,
    *,
    vllm: bool,
    stream_s: float,
) -> float:
    """A rough duration: per setting ~2 s per replica and 2 s for Envoy and the warm-up; per
    round the stream time, 1 s to settle and ~8 ms per probe pair; 50 s for a vLLM start."""
    per_round = stream_s + 1.0 + probe_requests * 0.008
    total = sum(2.0 * n + 2.0 + rounds * per_round for _, n in pairs)
    return total + (50.0 if vllm else 0.0)


def plan_text(
    backend_kind: str,
    block_size: int,
    num_gpu_blocks: int,
    plan: BurstPlan,
    pairs: Sequence[tuple[str, int]],
    unavailable: dict[str, str],
    rounds: int,
    probe_requests: int,
) -> str:
    """What the bench will do (``--dry-run`` prints it, a run prints it first)."""
    need = plan.blocks(block_size)
    usable = num_gpu_blocks - 1
    delay = (
        f", streamed with x-dev-stream-delay-ms {plan.stream_delay_ms:g}"
        if backend_kind == "dev" and plan.stream_delay_ms
        else ", streamed"
    )
    lines = [
        f"backend {backend_kind}: pool {num_gpu_blocks} blocks of {block_size} tokens "
        f"({usable} usable)",
        f"burst: {plan.requests} requests at once, {plan.prompt_words} prompt words "
        f"(~{plan.prompt_tokens} tokens) + max_tokens {plan.max_tokens}{delay}: "
        f"{need} blocks each, {usable // need if need else 0} fit the pool at once",
        f"{rounds} rounds per setting; latency probe {probe_requests} tiny requests each way",
        "settings: "
        + ", ".join(
            f"{shape} ×{n}"
            + (f" (unavailable: {unavailable[shape]})" if shape in unavailable else "")
            for shape, n in pairs
        ),
    ]
    return "\n".join(lines)


def table(results: Sequence[SettingResult]) -> str:
    """The markdown table: a row per setting, ``median [min–max]`` over its rounds."""
    head = ["setting", "rounds", *(title for _, title in COLUMNS)]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        if r.skipped or not r.rounds:
            why = r.skipped or "no round ran"
            cells = [r.name, "0", f"skipped: {why}", *([""] * (len(COLUMNS) - 1))]
        else:
            st = r.stats()
            cells = [r.name, str(len(r.rounds)), *(st[key].text for key, _ in COLUMNS)]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def failover_text(result: FailoverResult) -> str:
    s = result.summary()
    what = f"{s['shape']} ×{s['replicas']}, {s['fault']}"
    if s["skipped"]:
        return f"failover ({what}): skipped ({s['skipped']})"
    window = (
        "none"
        if s["unjudged"] == 0
        else f"{s['unjudged_first_s']}–{s['unjudged_last_s']} s after the fault "
        f"({s['unjudged_window_s']} s)"
    )
    back = s["took_traffic_after_back_s"]
    again = "" if s["back_s"] is None else f"; judging again {back} s after it was back"
    return (
        f"failover ({what} of replica 0 at {s['kill_s']} s): {s['requests']} requests, "
        f"{s['ok']} ok, {s['unjudged']} answered unjudged (window {window}), {s['errors']} "
        f"errors {s['errors_by_status'] or ''}".rstrip()
        + again
    )


def _spread(values: Sequence[float | None], unit: str = "") -> str:
    """``median [min–max]`` of the values that are there ("–": none)."""
    got = sorted(round(v, 2) for v in values if v is not None)
    if not got:
        return "–"
    mid = statistics.median(got)
    text = f"{mid:g}{unit}"
    return text if got[0] == got[-1] else f"{text} [{got[0]:g}–{got[-1]:g}]"


def failover_table(results: Sequence[FailoverResult]) -> str:
    """A markdown row per (shape, replicas, fault), each figure ``median [min–max]`` over its
    runs; times in s after the fault (the unjudged window's end) or after the replica was
    back (judging again)."""
    rows = [
        "| shape | replicas | fault | runs | requests | unjudged | last unjudged (s after) "
        "| errors | judging again after back (s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    groups: dict[tuple[str, int, str], list[dict[str, Any]]] = {}
    for r in results:
        s = r.summary()
        groups.setdefault((s["shape"], s["replicas"], s["fault"]), []).append(s)
    for (shape, n, fault), runs in groups.items():
        done = [s for s in runs if not s["skipped"]]
        if not done:
            rows.append(f"| {shape} | {n} | {fault} | 0 | skipped: {runs[0]['skipped']} |||||")
            continue
        rows.append(
            f"| {shape} | {n} | {fault} | {len(done)} | "
            f"{_spread([s['requests'] for s in done])} | "
            f"{_spread([s['unjudged'] for s in done])} | "
            f"{_spread([s['unjudged_last_s'] for s in done])} | "
            f"{_spread([s['errors'] for s in done])} | "
            f"{_spread([s['took_traffic_after_back_s'] for s in done])} |"
        )
    return "\n".join(rows)


def crash_text(result: CrashResult) -> str:
    s = result.summary()
    if s["skipped"]:
        return f"crash (redis ×2): skipped ({s['skipped']})"
    again = (
        f"no admission within {s['timeout_s']} s"
        if s["readmit_after_kill_s"] is None
        else f"admits again {s['readmit_after_kill_s']} s after the kill, "
        f"{s['readmit_after_last_end_s']} s after the burst's last stream ended"
    )
    return (
        f"crash (redis ×2, replica {s['victim']} SIGKILLed at {s['kill_s']} s holding "
        f"{s['victim_blocks']} of {s['held_blocks_at_kill']} blocks in flight): burst "
        f"{s['burst_admitted']} admitted (passes by replica {s['passes_by_replica']}), "
        f"{s['burst_429']} 429; probe of {s['probe_blocks']} blocks; last stream "
        f"ended {s['last_stream_end_after_kill_s']} s after the kill; {again}; "
        f"{s['probes']} probes ({s['probes_429']} 429, {s['probes_unjudged']} unjudged); "
        f"ledger errors: victim {s['victim_ledger_errors']}, survivor "
        f"{s['survivor_ledger_errors']} (on its local ledger at the end: "
        f"{s['survivor_ledger_local']})"
    )


def document(
    params: dict[str, Any],
    results: Sequence[SettingResult],
    failover: Sequence[FailoverResult] = (),
    crash: CrashResult | None = None,
) -> dict[str, Any]:
    """Everything, JSON-ready."""
    return {
        "params": params,
        "settings": [r.record() for r in results],
        "table": table(results) if results else None,
        "failover": [f.record() for f in failover],
        "failover_table": failover_table(failover) if failover else None,
        "crash": None if crash is None else crash.record(),
    }
