"""The replicas bench's fault scenarios: a replica SIGKILLed (or SIGSTOPped) under load.

- ``failover``: any shape (standby, local, redis), N replicas: a steady load of tiny requests
  through Envoy, replica 0 (standby: the priority-0, active one) SIGKILLed (a crash) or
  SIGSTOPped (a hang) at ``kill_after_s``, the load kept ``after_s`` more, optionally the
  replica restarted (or continued) ``back_after_s`` after the fault; a ``FailoverResult``:
  the answers without ICE's verdict (Envoy failed open), the window from the first to the
  last of them, the errors (non-2xx) by status, and how long the replica took to judge
  again once it was back (its body-phase count on its metrics page).
- ``crash``: shape ``redis``, 2 replicas: a burst that fills the pool; once every request of
  it has its verdict (the admitted ones still streaming), the replica that passed most of it
  (``victim_of``: ICE's own pass counters, read before the kill) is SIGKILLed; then a probe
  every ``probe_gap_s`` until one is judged and passed, sized to fit only once the victim's
  reservations are gone (``probe_max_tokens``: usable − the victim's blocks + 1); a
  ``CrashResult``: how long after the kill, and after the burst's last stream ended, the pool
  admitted again (the dead replica's reservations leave the shared ledger by its TTL).

Invariants: each scenario's replicas and Envoy are stopped when it ends (``replicas_up``'s
``with`` block), the shared Redis flushed before the crash's start; a shape this checkout
lacks gives a result whose ``skipped`` says why, never an error; the times are the client's
(s after the kill, or after the burst's t0), never ICE's; ICE's metrics (``readings``) only
pick the victim and count the shared ledger's errors.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from ext_proc.lab.replicas.accounting import blocks_for
from ext_proc.lab.replicas.readings import LEDGER_ERRORS, _delta, _flush, _total, passes
from ext_proc.lab.replicas.setup import (
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
    prompt_text,
    send,
    steady,
)

__all__ = [
    "CrashResult",
    "FailoverResult",
    "crash",
    "failover",
    "probe_max_tokens",
    "victim_of",
]


# --- failover -----------------------------------------------------------------------------------
FAULTS = ("kill", "stop")


@dataclass
class FailoverResult:
    """The steady load across one replica's fault (times: s after the load's start; the
    summary's: s after the fault)."""

    answers: list[Answer]
    kill_s: float | None  # when the fault was made
    duration_s: float
    skipped: str | None = None
    shape: str = "standby"
    replicas: int = 2
    fault: str = "kill"  # kill: SIGKILL (a crash); stop: SIGSTOP (a hang)
    back_s: float | None = None  # the replica restarted (kill) or thawed (stop): serving again
    took_traffic_s: float | None = None  # its first judged request after that

    def summary(self) -> dict[str, Any]:
        kill = self.kill_s or 0.0
        unjudged = [a for a in self.answers if a.ok and not a.judged]
        ends = sorted((a.end_s or 0.0) - kill for a in unjudged)
        errors: dict[str, int] = {}
        for a in self.answers:
            if not a.ok:
                errors[str(a.status)] = errors.get(str(a.status), 0) + 1
        back = None
        if self.back_s is not None and self.took_traffic_s is not None:
            back = round(self.took_traffic_s - self.back_s, 3)
        return {
            "shape": self.shape,
            "replicas": self.replicas,
            "fault": self.fault,
            "requests": len(self.answers),
            "ok": sum(1 for a in self.answers if a.ok),
            "unjudged": len(unjudged),
            "unjudged_first_s": round(ends[0], 3) if ends else None,
            "unjudged_last_s": round(ends[-1], 3) if ends else None,
            "unjudged_window_s": round(ends[-1] - ends[0], 3) if ends else None,
            "errors": sum(errors.values()),
            "errors_by_status": dict(sorted(errors.items())),
            "kill_s": self.kill_s,
            "back_s": self.back_s,
            "took_traffic_after_back_s": back,
            "duration_s": self.duration_s,
            "skipped": self.skipped,
        }

    def record(self) -> dict[str, Any]:
        return {**self.summary(), "answers": [a.record() for a in self.answers]}


@dataclass
class _Watch:
    """When the faulted replica judged again: its body-phase count, polled."""

    t0: float = 0.0
    back_s: float | None = None
    took_traffic_s: float | None = None
    baseline: float = 0.0


def _bodies(url: str) -> float | None:
    return metric_sum(url, "ice_processing_seconds_count", phase="request_body")


def failover(
    backend: Backend,
    workdir: Path,
    *,
    shape: str = "standby",
    replicas: int = 2,
    fault: str = "kill",
    clients: int = 4,
    kill_after_s: float = 2.0,
    after_s: float = 5.0,
    gap_s: float = 0.05,
    back_after_s: float | None = None,
    ice_args: Sequence[str] = (),
    ledger_url: str | None = None,
) -> FailoverResult:
    """``replicas`` of ``shape`` under the steady load; replica 0 (standby: the active one)
    SIGKILLed (``fault`` kill) or SIGSTOPped (stop) at ``kill_after_s``, the load kept
    ``after_s`` more. ``back_after_s``: that long after the fault the replica is restarted
    (kill) or continued (stop), and the result says when it judged a request again."""
    if fault not in FAULTS:
        raise ValueError(f"fault {fault!r}: one of {FAULTS}")
    duration = kill_after_s + after_s
    watch = _Watch()
    try:
        with replicas_up(
            workdir, backend, replicas, shape, ledger_url=ledger_url, ice_args=ice_args
        ) as reps:
            actions = _fault_actions(reps, fault, kill_after_s, back_after_s, watch)
            answers, done = asyncio.run(
                _steady_watched(reps, backend, clients, duration, gap_s, actions, watch)
            )
    except ShapeUnavailable as e:
        return FailoverResult([], None, duration, skipped=str(e), shape=shape, fault=fault)
    return FailoverResult(
        answers,
        done[0] if done else None,
        duration,
        shape=shape,
        replicas=replicas,
        fault=fault,
        back_s=watch.back_s,
        took_traffic_s=watch.took_traffic_s,
    )


def _fault_actions(
    reps: Replicas, fault: str, at_s: float, back_after_s: float | None, watch: _Watch
) -> list[tuple[float, Any]]:
    def make() -> None:
        watch.baseline = _bodies(reps.metrics_urls[0]) or 0.0
        (reps.kill if fault == "kill" else reps.freeze)(0)

    def back() -> None:
        if fault == "kill":
            reps.restart(0)
            watch.baseline = 0.0  # a new process counts from zero
        else:
            reps.thaw(0)
        watch.back_s = time.monotonic() - watch.t0

    actions: list[tuple[float, Any]] = [(at_s, make)]
    if back_after_s is not None:
        actions.append((at_s + back_after_s, back))
    return actions


async def _steady_watched(
    reps: Replicas,
    backend: Backend,
    clients: int,
    duration_s: float,
    gap_s: float,
    actions: list[tuple[float, Any]],
    watch: _Watch,
) -> tuple[list[Answer], list[float]]:
    """The steady load, and a poll (every 50 ms) of the faulted replica once it is back."""
    watch.t0 = time.monotonic()

    async def poll() -> None:
        while time.monotonic() - watch.t0 < duration_s:
            await asyncio.sleep(0.05)
            if watch.back_s is None or watch.took_traffic_s is not None:
                continue
            seen = await asyncio.to_thread(_bodies, reps.metrics_urls[0])
            if seen is not None and seen > watch.baseline:
                watch.took_traffic_s = time.monotonic() - watch.t0

    load = steady(
        reps.envoy_url,
        backend.model,
        clients=clients,
        duration_s=duration_s,
        gap_s=gap_s,
        actions=actions,
        t0=watch.t0,
    )
    (answers, done), _ = await asyncio.gather(load, poll())
    return answers, done


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
