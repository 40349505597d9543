"""What the replicas bench runs: a setting's rounds and the sweep (the fault scenarios, the
failover and the crash: ``faults``).

- ``settings(replicas, shapes)``: the (shape, N) pairs in run order (N outer, shape inner).
- ``run_round``: the burst through Envoy, the backend left to settle, then the latency
  probe; a ``RoundResult``: admitted (not 429), 429s, other non-2xx, unjudged answers, the
  peak of the blocks the admitted (200) requests held at once and the over-admission
  (``accounting``), vLLM's preemption delta (None on the dev backend), ICE's added latency
  p50 / p99 (ms); and, from ICE's own ``/metrics``, each replica's passes during the burst
  and (shape ``redis``) the shared ledger's errors over the round and how many replicas
  ended it on their local ledger.
- ``run_setting``: one setting's processes (``setup.replicas_up``; shape ``redis``: the shared
  Redis flushed first) and ``rounds`` rounds on them; a ``SettingResult``, whose ``skipped``
  says why a setting did not run (a shape this checkout lacks, a start that failed).
- ``sweep``: ``run_setting`` for each setting, one after the other.

Invariants: a setting's processes are stopped before the next setting starts (one stack at a
time; the backend and the Redis outlive them); every round ends with the backend settled
(the dev backend: 0.5 s, past ICE's next scrape; vLLM: nothing running or waiting), so the
next burst meets an idle pool, and each burst sends fresh prompt text (seeded by setting and
round); over-admission, 429s and latencies are computed from the answers and the backend's
counters, never from ICE's; ICE's own metrics only say which replica passed what and how its
shared ledger fared, read from replicas that are alive (a metric page that does not answer is
None, never a zero: ``readings``).
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ext_proc.lab.replicas.accounting import (
    Held,
    Stats,
    added_ms,
    over_admission,
    peak_blocks,
)
from ext_proc.lab.replicas.accounting import stats as stats_of
from ext_proc.lab.replicas.readings import (
    LEDGER_ERRORS,
    _delta,
    _flush,
    _preemptions,
    _total,
    passes,
    settle,
)
from ext_proc.lab.replicas.setup import (
    SHAPES,
    Backend,
    Replicas,
    ShapeUnavailable,
    metric_sum,
    replicas_up,
    shape_available,
)
from ext_proc.lab.replicas.traffic import (
    Answer,
    BurstPlan,
    burst,
    probe_latency,
)
from ext_proc.lab.stack import StackError

__all__ = [
    "METRICS",
    "RoundResult",
    "SettingResult",
    "held",
    "run_round",
    "run_setting",
    "settings",
    "sweep",
]

# The per-round numbers a setting's row shows (RoundResult.summary keys), in order.
METRICS = (
    "admitted",
    "shed_429",
    "other",
    "unjudged",
    "peak_blocks",
    "over_blocks",
    "preemptions",
    "added_p50_ms",
    "added_p99_ms",
    "ledger_errors",
)


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def settings(replicas: Sequence[int], shapes: Sequence[str]) -> list[tuple[str, int]]:
    """(shape, N) for each N of ``replicas`` and, within it, each shape of ``shapes``;
    ValueError for an unknown shape or N < 1."""
    for shape in shapes:
        if shape not in SHAPES:
            raise ValueError(f"unknown shape {shape!r}: want some of {','.join(SHAPES)}")
    for n in replicas:
        if n < 1:
            raise ValueError(f"replicas must be ≥ 1, not {n}")
    return [(shape, n) for n in replicas for shape in shapes]


def held(answers: Sequence[Answer], plan: BurstPlan, block_size: int) -> list[Held]:
    """The KV intervals of the answers that were served (2xx, with an end): each from its
    start to its end, with its blocks (``Answer.blocks``)."""
    return [
        Held(a.start_s, a.end_s, a.blocks(plan, block_size))
        for a in answers
        if 200 <= a.status < 300 and a.start_s is not None and a.end_s is not None
    ]


@dataclass
class RoundResult:
    """One burst and one latency probe on one setting."""

    round: int
    answers: list[Answer]
    peak_blocks: int
    over_blocks: int
    preemptions: int | None
    through_s: list[float] = field(default_factory=list)
    direct_s: list[float] = field(default_factory=list)
    probe_failed: int = 0
    # Per replica, its ICE's passes during the burst (ice_decisions_total{decision="pass"}
    # delta; None: its /metrics did not answer).
    passes: list[int | None] = field(default_factory=list)
    # Shape redis: the shared ledger's failed or late calls over the round (all replicas'
    # ice_ledger_errors_total), and how many replicas judged with their local ledger after it
    # (ice_ledger_backend{backend="local"}); None for the other shapes.
    ledger_errors: int | None = None
    ledger_local: int | None = None

    def summary(self) -> dict[str, Any]:
        return {
            "round": self.round,
            "requests": len(self.answers),
            "admitted": sum(1 for a in self.answers if a.admitted),
            "shed_429": sum(1 for a in self.answers if a.status == 429),
            "other": sum(1 for a in self.answers if a.status != 429 and not a.ok),
            "unjudged": sum(1 for a in self.answers if not a.judged),
            "peak_blocks": self.peak_blocks,
            "over_blocks": self.over_blocks,
            "preemptions": self.preemptions,
            "added_p50_ms": added_ms(self.through_s, self.direct_s, 0.5),
            "added_p99_ms": added_ms(self.through_s, self.direct_s, 0.99),
            "probe_requests": len(self.through_s),
            "probe_failed": self.probe_failed,
            "passes_by_replica": self.passes,
            "ledger_errors": self.ledger_errors,
            "ledger_local": self.ledger_local,
        }

    def record(self) -> dict[str, Any]:
        return {**self.summary(), "answers": [a.record() for a in self.answers]}


@dataclass
class SettingResult:
    """A setting's rounds, or why it did not run."""

    shape: str
    replicas: int
    rounds: list[RoundResult] = field(default_factory=list)
    skipped: str | None = None
    startup_s: float | None = None

    @property
    def name(self) -> str:
        return f"{self.shape} ×{self.replicas}"

    def stats(self) -> dict[str, Stats]:
        """Each of ``METRICS`` over the rounds."""
        summaries = [r.summary() for r in self.rounds]
        return {m: stats_of([s[m] for s in summaries]) for m in METRICS}

    def record(self) -> dict[str, Any]:
        return {
            "shape": self.shape,
            "replicas": self.replicas,
            "skipped": self.skipped,
            "startup_s": self.startup_s,
            "stats": {
                m: {k: v for k, v in st.__dict__.items() if k != "text"}
                for m, st in self.stats().items()
            }
            if self.rounds
            else {},
            "rounds": [r.record() for r in self.rounds],
        }


def run_round(
    backend: Backend,
    replicas: Replicas,
    plan: BurstPlan,
    round_no: int,
    seed: int,
    probe_requests: int,
) -> RoundResult:
    """The burst through ``replicas``' Envoy, the backend settled, the latency probe
    (``probe_requests``; 0: none)."""
    redis_shape = replicas.shape == "redis"
    urls = replicas.metrics_urls
    before = _preemptions(backend)
    passed0 = passes(replicas)
    errors0 = _total([metric_sum(u, LEDGER_ERRORS) for u in urls]) if redis_shape else None
    answers = asyncio.run(burst(replicas.envoy_url, backend.kind, backend.model, plan, seed))
    passed1 = passes(replicas)
    settle(backend)
    after = _preemptions(backend)
    intervals = held(answers, plan, backend.block_size)
    result = RoundResult(
        round=round_no,
        answers=answers,
        peak_blocks=peak_blocks(intervals),
        over_blocks=over_admission(intervals, backend.usable_blocks),
        preemptions=_delta(before, after),
        passes=[_delta(a, b) for a, b in zip(passed0, passed1, strict=True)],
    )
    if redis_shape:
        errors1 = _total([metric_sum(u, LEDGER_ERRORS) for u in urls])
        result.ledger_errors = _delta(errors0, errors1)
        local = [metric_sum(u, "ice_ledger_backend", backend="local") for u in urls]
        result.ledger_local = sum(1 for v in local if v == 1)
    if probe_requests > 0:
        through, direct, failed = probe_latency(
            replicas.envoy_url, backend.url, backend.model, probe_requests
        )
        result.through_s, result.direct_s, result.probe_failed = through, direct, failed
    return result


def run_setting(
    backend: Backend,
    shape: str,
    n: int,
    plan: BurstPlan,
    *,
    rounds: int,
    probe_requests: int,
    workdir: Path,
    ledger_url: str | None = None,
    ice_args: Sequence[str] = (),
    seed: int = 0,
    progress: Callable[[str], None] | None = _progress,
) -> SettingResult:
    """``rounds`` rounds on a fresh setting (shape, ``n`` replicas); skipped (with the
    reason) when the shape is unavailable or its processes do not start."""
    out = SettingResult(shape, n)
    missing = shape_available(shape)
    if missing is None and shape == "redis" and ledger_url is None:
        missing = "no Redis for the shared ledger"
    if missing is not None:
        out.skipped = f"shape {shape}: {missing}"
        if progress is not None:
            progress(f"[replicas] {out.name}: skipped ({out.skipped})")
        return out
    started = time.monotonic()
    try:
        if shape == "redis" and ledger_url is not None:
            _flush(ledger_url)
        with replicas_up(
            workdir,
            backend,
            n,
            shape,
            ledger_url=ledger_url if shape == "redis" else None,
            ice_args=ice_args,
        ) as reps:
            out.startup_s = round(time.monotonic() - started, 2)
            for r in range(1, rounds + 1):
                result = run_round(backend, reps, plan, r, seed + 1000 * r, probe_requests)
                out.rounds.append(result)
                if progress is not None:
                    s = result.summary()
                    progress(
                        f"[replicas] {out.name} round {r}: admitted {s['admitted']}, "
                        f"429 {s['shed_429']}, peak {s['peak_blocks']} blocks, over "
                        f"{s['over_blocks']}, added p50 {s['added_p50_ms']} ms, passes by "
                        f"replica {s['passes_by_replica']}"
                    )
    except ShapeUnavailable as e:
        out.skipped = str(e)
    except (StackError, RuntimeError, OSError) as e:
        out.skipped = f"did not run: {type(e).__name__}: {e}"
    if out.skipped and progress is not None:
        progress(f"[replicas] {out.name}: skipped ({out.skipped})")
    return out


def sweep(
    backend: Backend,
    pairs: Sequence[tuple[str, int]],
    plan: BurstPlan,
    *,
    rounds: int,
    probe_requests: int,
    workdir: Path,
    ledger_url: str | None = None,
    ice_args: Sequence[str] = (),
    progress: Callable[[str], None] | None = _progress,
) -> list[SettingResult]:
    """``run_setting`` for each (shape, N) of ``pairs``, one after the other, each in a
    workdir of its own (``<shape>-<N>``)."""
    return [
        run_setting(
            backend,
            shape,
            n,
            plan,
            rounds=rounds,
            probe_requests=probe_requests,
            workdir=workdir / f"{shape}-{n}",
            ledger_url=ledger_url,
            ice_args=ice_args,
            seed=100_000 * (k + 1),
            progress=progress,
        )
        for k, (shape, n) in enumerate(pairs)
    ]
