"""What the replicas bench runs: a setting's rounds, the sweep, the failover and the crash.

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
- ``failover``: shape ``standby``, 2 replicas: a steady load of tiny requests through Envoy,
  replica 0 (the priority-0, active one) SIGKILLed at ``kill_after_s``, the load kept
  ``after_s`` more; a ``FailoverResult``: the answers without ICE's verdict (Envoy failed
  open), the window from the first to the last of them, the errors (non-2xx) by status.
- ``crash``: shape ``redis``, 2 replicas: a burst that fills the pool; once every request of
  it has its verdict (the admitted ones still streaming), the replica that passed most of it
  (``victim_of``: ICE's own pass counters, read before the kill) is SIGKILLed; then a probe
  every ``probe_gap_s`` until one is judged and passed, sized to fit only once the victim's
  reservations are gone (``probe_max_tokens``: usable − the victim's blocks + 1); a
  ``CrashResult``: how long after the kill, and after the burst's last stream ended, the pool
  admitted again (the dead replica's reservations leave the shared ledger by its TTL).

Invariants: a setting's processes are stopped before the next setting starts (one stack at a
time; the backend and the Redis outlive them); every round ends with the backend settled
(the dev backend: 0.5 s, past ICE's next scrape; vLLM: nothing running or waiting), so the
next burst meets an idle pool, and each burst sends fresh prompt text (seeded by setting and
round); over-admission, 429s and latencies are computed from the answers and the backend's
counters, never from ICE's; ICE's own metrics only say which replica passed what and how its
shared ledger fared, read from replicas that are alive (a metric page that does not answer is
None, never a zero).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from ext_proc.lab.replicas.accounting import (
    Held,
    Stats,
    added_ms,
    blocks_for,
    over_admission,
    peak_blocks,
)
from ext_proc.lab.replicas.accounting import stats as stats_of
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
    CHAT,
    Answer,
    BurstPlan,
    burst,
    probe_latency,
    prompt_text,
    send,
    steady,
)
from ext_proc.lab.stack import StackError

__all__ = [
    "METRICS",
    "CrashResult",
    "FailoverResult",
    "RoundResult",
    "SettingResult",
    "crash",
    "failover",
    "held",
    "probe_max_tokens",
    "run_round",
    "run_setting",
    "settings",
    "sweep",
    "victim_of",
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
PREEMPTIONS = "vllm:num_preemptions_total"


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


def _preemptions(backend: Backend) -> float | None:
    """vLLM's preemption counter now (None on the dev backend, whose counter never moves)."""
    if backend.kind != "vllm":
        return None
    from ext_proc.lab.overload.metrics import metric_sum

    with urllib.request.urlopen(backend.metrics_url, timeout=5) as resp:
        return metric_sum(resp.read().decode(), PREEMPTIONS)


def settle(backend: Backend) -> None:
    """Until the backend is idle: vLLM with nothing running or waiting; the dev backend (whose
    gauges never move) 0.5 s, past the replicas' next scrape (ICE's unseen ledger clears)."""
    if backend.kind == "vllm":
        from ext_proc.lab.overload.metrics import wait_idle

        wait_idle(backend.metrics_url)
    time.sleep(0.5)


PASS = ("ice_decisions_total", {"decision": "pass"})
LEDGER_ERRORS = "ice_ledger_errors_total"


def passes(replicas: Replicas) -> list[float | None]:
    """Each replica's ``ice_decisions_total{decision="pass"}`` now (None: gone)."""
    name, labels = PASS
    return [metric_sum(url, name, **labels) for url in replicas.metrics_urls]


def _delta(before: float | None, after: float | None) -> int | None:
    return None if before is None or after is None else int(after - before)


def _total(values: Sequence[float | None]) -> float | None:
    have = [v for v in values if v is not None]
    return sum(have) if have else None


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


def _flush(ledger_url: str) -> None:
    """Empty the shared ledger's Redis database; RuntimeError when it does not answer."""
    import redis

    try:
        with redis.Redis.from_url(ledger_url, socket_timeout=5) as client:
            client.flushdb()
    except redis.RedisError as e:
        raise RuntimeError(f"cannot flush the ledger's Redis at {ledger_url}: {e}") from e


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


# --- failover -----------------------------------------------------------------------------------
@dataclass
class FailoverResult:
    """The steady load across the active replica's SIGKILL (times: s after the kill)."""

    answers: list[Answer]
    kill_s: float | None  # s after the load's start
    duration_s: float
    skipped: str | None = None

    def summary(self) -> dict[str, Any]:
        kill = self.kill_s or 0.0
        unjudged = [a for a in self.answers if a.ok and not a.judged]
        ends = sorted((a.end_s or 0.0) - kill for a in unjudged)
        errors: dict[str, int] = {}
        for a in self.answers:
            if not a.ok:
                errors[str(a.status)] = errors.get(str(a.status), 0) + 1
        return {
            "requests": len(self.answers),
            "ok": sum(1 for a in self.answers if a.ok),
            "unjudged": len(unjudged),
            "unjudged_first_s": round(ends[0], 3) if ends else None,
            "unjudged_last_s": round(ends[-1], 3) if ends else None,
            "unjudged_window_s": round(ends[-1] - ends[0], 3) if ends else None,
            "errors": sum(errors.values()),
            "errors_by_status": dict(sorted(errors.items())),
            "kill_s": self.kill_s,
            "duration_s": self.duration_s,
            "skipped": self.skipped,
        }

    def record(self) -> dict[str, Any]:
        return {**self.summary(), "answers": [a.record() for a in self.answers]}


def failover(
    backend: Backend,
    workdir: Path,
    *,
    clients: int = 4,
    kill_after_s: float = 2.0,
    after_s: float = 5.0,
    gap_s: float = 0.05,
    ice_args: Sequence[str] = (),
) -> FailoverResult:
    """Shape standby, 2 replicas: the steady load, replica 0 SIGKILLed at ``kill_after_s``,
    ``after_s`` more of load."""
    duration = kill_after_s + after_s
    try:
        with replicas_up(workdir, backend, 2, "standby", ice_args=ice_args) as reps:
            answers, done = asyncio.run(
                steady(
                    reps.envoy_url,
                    backend.model,
                    clients=clients,
                    duration_s=duration,
                    gap_s=gap_s,
                    actions=[(kill_after_s, lambda: reps.kill(0))],
                )
            )
    except ShapeUnavailable as e:
        return FailoverResult([], None, duration, skipped=str(e))
    return FailoverResult(answers, done[0] if done else None, duration)


# --- crash --------------------------------------------------------------------------------------
@dataclass
class CrashResult:
    """A full pool, one replica SIGKILLed, and the wait until the pool admits again."""

    burst: list[Answer]
    probes: list[Answer]
    kill_s: float | None  # s after the burst's t0
    held_at_kill: int  # blocks of the burst's admitted requests still in flight at the kill
    timeout_s: float
    victim: int | None = None  # the replica killed: the one that passed most of the burst
    passes: list[int | None] = field(default_factory=list)  # each replica's passes of it
    victim_blocks: int = 0  # the victim's passes × a burst request's blocks
    probe_blocks: int = 0  # the probe's need: it fits only once the victim's blocks are gone
    # The survivors' shared-ledger errors from before the burst to the readmission, and how
    # many of them judged with their local ledger then (a fallback ignores the dead
    # replica's reservations, so it readmits early for another reason than the TTL).
    survivor_ledger_errors: int | None = None
    survivor_ledger_local: int | None = None
    # The victim's shared-ledger errors from before the burst to just before the kill: a
    # call that failed left its reservation out of Redis, so nothing of it waits for the TTL.
    victim_ledger_errors: int | None = None
    skipped: str | None = None

    def _readmitted(self) -> Answer | None:
        return next((a for a in self.probes if a.ok and a.judged), None)

    def summary(self) -> dict[str, Any]:
        kill = self.kill_s
        first = self._readmitted()
        ends = [a.end_s for a in self.burst if a.ok and a.end_s is not None]
        last_end = max(ends) if ends else None
        readmit = None if first is None or kill is None else (first.headers_s or 0.0) - kill
        after_end = (
            None
            if first is None or last_end is None
            else round((first.headers_s or 0.0) - last_end, 3)
        )
        return {
            "burst_admitted": sum(1 for a in self.burst if a.admitted),
            "burst_429": sum(1 for a in self.burst if a.status == 429),
            "passes_by_replica": self.passes,
            "victim": self.victim,
            "victim_blocks": self.victim_blocks,
            "probe_blocks": self.probe_blocks,
            "held_blocks_at_kill": self.held_at_kill,
            "kill_s": None if kill is None else round(kill, 3),
            "last_stream_end_after_kill_s": None
            if last_end is None or kill is None
            else round(last_end - kill, 3),
            "readmit_after_kill_s": None if readmit is None else round(readmit, 3),
            "readmit_after_last_end_s": after_end,
            "probes": len(self.probes),
            "probes_429": sum(1 for a in self.probes if a.status == 429),
            "probes_unjudged": sum(1 for a in self.probes if not a.judged),
            "victim_ledger_errors": self.victim_ledger_errors,
            "survivor_ledger_errors": self.survivor_ledger_errors,
            "survivor_ledger_local": self.survivor_ledger_local,
            "timeout_s": self.timeout_s,
            "skipped": self.skipped,
        }

    def record(self) -> dict[str, Any]:
        return {
            **self.summary(),
            "burst": [a.record() for a in self.burst],
            "probes": [a.record() for a in self.probes],
        }


def probe_max_tokens(
    backend: Backend, plan: BurstPlan, victim_blocks: int, output_buffer: int = 128
) -> tuple[int, int]:
    """The crash probe's ``max_tokens`` and its blocks: a request that fits only once the
    victim's ``victim_blocks`` have left the ledger (it needs usable − victim_blocks + 1 of
    the pool, and never less than a burst request), its prompt the burst's; a few tokens
    under its last block's end (``margin``: ICE's estimate may read a few more prompt tokens
    than the backend counts). Capped by the backend's ``max_model_len`` less
    ``output_buffer`` (vLLM's tiny policy's), where the probe may then fit sooner."""
    bs = backend.block_size
    want = max(plan.blocks(bs), backend.usable_blocks - victim_blocks + 1)
    margin = max(1, min(8, bs // 2))
    tokens = max(plan.max_tokens, want * bs - plan.prompt_tokens - margin)
    if backend.max_model_len is not None:
        tokens = min(tokens, backend.max_model_len - plan.prompt_tokens - output_buffer)
    return tokens, blocks_for(plan.prompt_tokens, tokens, bs)


def victim_of(passed: Sequence[int | None]) -> int:
    """The replica that passed the most (the first of equals; 0 when none is known)."""
    known = [(p, -i) for i, p in enumerate(passed) if p is not None]
    return -max(known)[1] if known else 0


async def _crash_run(
    replicas: Replicas,
    backend: Backend,
    plan: BurstPlan,
    *,
    seed: int,
    probe_gap_s: float,
    timeout_s: float,
) -> CrashResult:
    answers = [Answer(i, plan.max_tokens) for i in range(plan.requests)]
    envoy_url = replicas.envoy_url
    urls = replicas.metrics_urls
    passed0 = await asyncio.to_thread(passes, replicas)
    errors0 = [await asyncio.to_thread(metric_sum, u, LEDGER_ERRORS) for u in urls]
    t0 = time.monotonic() + 0.05
    task = asyncio.create_task(
        burst(envoy_url, backend.kind, backend.model, plan, seed, answers, t0)
    )
    deadline = time.monotonic() + 30.0
    while any(a.headers_s is None and a.end_s is None for a in answers):
        if time.monotonic() > deadline:
            break
        await asyncio.sleep(0.02)
    passed1 = await asyncio.to_thread(passes, replicas)
    passed = [_delta(a, b) for a, b in zip(passed0, passed1, strict=True)]
    victim = victim_of(passed)
    victim_blocks = (passed[victim] or 0) * plan.blocks(backend.block_size)
    probe_tokens, probe_blocks = probe_max_tokens(backend, plan, victim_blocks)
    kill_s = time.monotonic() - t0
    in_flight = [a for a in answers if a.status == 200 and a.end_s is None]
    held_blocks = sum(a.blocks(plan, backend.block_size) for a in in_flight)
    victim_errors = await asyncio.to_thread(metric_sum, urls[victim], LEDGER_ERRORS)
    await asyncio.to_thread(replicas.kill, victim)
    probes: list[Answer] = []
    body = {
        "model": backend.model,
        "messages": [{"role": "user", "content": prompt_text(backend.kind, plan.prompt_words, 7)}],
        "max_tokens": probe_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
    }
    headers = {"x-priority": "standard"}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        while time.monotonic() - t0 - kill_s < timeout_s:
            probe = Answer(len(probes), probe_tokens)
            probes.append(probe)
            await send(session, envoy_url + CHAT, body, headers, t0, probe)
            if probe.ok and probe.judged:
                break
            await asyncio.sleep(probe_gap_s)
    survivors = [i for i in range(len(urls)) if i != victim]
    errors1 = {i: await asyncio.to_thread(metric_sum, urls[i], LEDGER_ERRORS) for i in survivors}
    local = [
        await asyncio.to_thread(metric_sum, urls[i], "ice_ledger_backend", backend="local")
        for i in survivors
    ]
    with contextlib.suppress(Exception):
        await asyncio.wait_for(task, timeout=120)
    return CrashResult(
        answers,
        probes,
        kill_s,
        held_blocks,
        timeout_s,
        victim=victim,
        passes=passed,
        victim_blocks=victim_blocks,
        probe_blocks=probe_blocks,
        victim_ledger_errors=_delta(errors0[victim], victim_errors),
        survivor_ledger_errors=_delta(
            _total([errors0[i] for i in survivors]), _total(list(errors1.values()))
        ),
        survivor_ledger_local=sum(1 for v in local if v == 1),
    )


def crash(
    backend: Backend,
    workdir: Path,
    plan: BurstPlan,
    *,
    ledger_url: str | None,
    probe_gap_s: float = 0.2,
    timeout_s: float = 30.0,
    ice_args: Sequence[str] = (),
    seed: int = 9_000_000,
) -> CrashResult:
    """Shape redis, 2 replicas: the burst; once every request has its verdict, the replica
    that passed most of it is SIGKILLed; then a probe (``probe_max_tokens``) every
    ``probe_gap_s`` (≤ ``timeout_s``) until the pool admits one (judged and passed)."""
    missing = shape_available("redis") or (
        "no Redis for the shared ledger" if ledger_url is None else None
    )
    if missing is not None or ledger_url is None:
        return CrashResult([], [], None, 0, timeout_s, skipped=f"shape redis: {missing}")
    try:
        _flush(ledger_url)
        with replicas_up(
            workdir, backend, 2, "redis", ledger_url=ledger_url, ice_args=ice_args
        ) as reps:
            return asyncio.run(
                _crash_run(
                    reps,
                    backend,
                    plan,
                    seed=seed,
                    probe_gap_s=probe_gap_s,
                    timeout_s=timeout_s,
                )
            )
    except ShapeUnavailable as e:
        return CrashResult([], [], None, 0, timeout_s, skipped=str(e))
