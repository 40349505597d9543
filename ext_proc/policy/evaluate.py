"""The evaluator: a degradation ladder of small rules over one request and one snapshot.

Pure: no I/O, no clock, no protobuf. ``evaluate`` is given everything it judges.

The ladder, first match wins:
1. ``reject_oversized_input`` → 400 ``context_length_exceeded`` when the estimated input
   alone leaves no room for output: input_tokens ≥ max_model_len.
2. ``shed_by_priority`` → 429 ``memory_pressure`` when the pool's level is at or above the
   profile's shedding level for the request's priority (``critical`` is never shed).
3. ``cap_output_tokens`` → ``Downgrade`` when the requested output exceeds
       limit = min(safe, cap[level])
   where safe = max(min(min_output_tokens, max_model_len - input),
                    max_model_len - input - output_buffer_tokens)
   and cap[level] is the profile's cap for the current level (absent: no cap). When the
   client set no limit and the level has a cap, the cap is injected.
4. ``Pass``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ext_proc.decision import Decision, Downgrade, Pass, Reject
from ext_proc.policy.model import Priority, Profile
from ext_proc.policy.pressure import Pressure
from ext_proc.schemas.base import RequestFeatures

__all__ = ["LADDER", "Case", "evaluate", "safe_output_tokens"]


@dataclass(frozen=True, slots=True)
class Case:
    """Everything a rule may look at."""

    features: RequestFeatures
    pressure: Pressure | None
    profile: Profile
    priority: Priority


Rule = Callable[[Case], Decision | None]


def safe_output_tokens(profile: Profile, input_tokens: int) -> int | None:
    """The largest output that fits the context with the profile's buffer (None: no limit)."""
    if profile.max_model_len is None:
        return None
    room = profile.max_model_len - input_tokens
    floor = min(profile.min_output_tokens, room)
    return max(floor, room - profile.output_buffer_tokens)


def reject_oversized_input(case: Case) -> Decision | None:
    limit = case.profile.max_model_len
    if limit is None or case.features.input_tokens < limit:
        return None
    return Reject(
        pressure=case.pressure,
        status=400,
        reason="context_length_exceeded",
        message=(
            f"This model's maximum context length is {limit} tokens; the input is about "
            f"{case.features.input_tokens} tokens, which leaves no room for output."
        ),
        param="messages",
    )


def shed_by_priority(case: Case) -> Decision | None:
    p = case.pressure
    if p is None or case.priority == "critical":
        return None
    shed_level = case.profile.shed_at.get(case.priority)
    if shed_level is None or p.level < shed_level:
        return None
    return Reject(
        pressure=p,
        status=429,
        reason="memory_pressure",
        message=(
            f"The inference backend is under {p.level.label} memory pressure "
            f"(score {p.score:.0f}/100); {case.priority}-priority requests are shed. "
            f"Retry after {case.profile.retry_after_s} s."
        ),
        retry_after_s=case.profile.retry_after_s,
    )


def cap_output_tokens(case: Case) -> Decision | None:
    f = case.features
    safe = safe_output_tokens(case.profile, f.input_tokens)
    cap = case.profile.max_tokens_cap.get(case.pressure.level) if case.pressure else None
    if f.max_tokens is None:
        if cap is None:
            return None
        limit = cap if safe is None else min(cap, safe)
        return Downgrade(
            pressure=case.pressure, max_tokens=limit, original=None, reason="pressure_cap"
        )
    candidates = [
        (v, why) for v, why in ((safe, "context_budget"), (cap, "pressure_cap")) if v is not None
    ]
    if not candidates:
        return None
    limit, reason = min(candidates, key=lambda c: c[0])
    if f.max_tokens <= limit:
        return None
    return Downgrade(pressure=case.pressure, max_tokens=limit, original=f.max_tokens, reason=reason)


LADDER: tuple[Rule, ...] = (reject_oversized_input, shed_by_priority, cap_output_tokens)


def evaluate(
    features: RequestFeatures,
    pressure: Pressure | None,
    profile: Profile,
    priority: Priority,
    ladder: tuple[Rule, ...] = LADDER,
) -> Decision:
    """Judge one request; the first rule of the ladder that decides wins, else ``Pass``."""
    case = Case(features=features, pressure=pressure, profile=profile, priority=priority)
    for rule in ladder:
        decision = rule(case)
        if decision is not None:
            return decision
    return Pass(pressure=pressure)
