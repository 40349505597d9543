"""The evaluator: a degradation ladder of small rules over one request and one snapshot.

Pure: no I/O, no clock, no protobuf. ``evaluate`` is given everything it judges.

The ladder, first match wins:
0. ``truncate_history`` → ``Truncate(budget)`` for chat requests of a profile with
   ``truncation`` when the input exceeds a budget (the smallest that applies):
   - ``pressure_budget``: truncation.budget_tokens[level] at the pool's current level;
   - ``cache_efficiency``: low_efficiency_budget_tokens while the pool's
     cache_efficiency_ratio < min_cache_efficiency;
   - ``context_budget``: when input > max_model_len − min_output_tokens (no useful output
     is left), the budget is max_model_len − output_buffer_tokens (or − min_output_tokens
     when the buffer is not smaller than max_model_len).
   Not when ``shed_by_priority`` would shed the request: shedding wins. The pipeline then
   runs the truncation plan and judges the shorter request with the rest of the ladder.
1. ``reject_oversized_input`` → 400 ``context_length_exceeded`` when the estimated input
   alone leaves no room for output: input_tokens ≥ max_model_len.
2. ``reject_beyond_kv_capacity`` → 400 ``kv_capacity_exceeded`` when the input plus one
   output token needs more KV blocks than the pool's largest backend has when idle.
3. ``shed_by_priority`` → 429 ``memory_pressure`` when the pool's level is at or above the
   profile's shedding level for the request's priority (``critical`` is never shed).
   Retry-After comes from the pool's drain rate (``policy/scores.py``), bounded by the
   profile's retry_after_min_s..retry_after_max_s.
4. ``shed_on_kv_shortfall`` → 429 ``kv_exhausted`` (never for ``critical``) when the input
   plus min_output_tokens needs more blocks than the fullest-free backend has free, or, with
   ``on_kv_shortfall: shed``, when the client's requested output does not fit them.
5. ``cap_output_tokens`` → ``Downgrade`` when the requested output exceeds
       limit = min(safe, cap[level], kv_fit)
   where safe = max(min(min_output_tokens, max_model_len - input),
                    max_model_len - input - output_buffer_tokens),
   cap[level] is the profile's cap for the current level (absent: no cap), and kv_fit is the
   largest output whose blocks, with the input's, fit the free blocks (``on_kv_shortfall:
   downgrade``, only for a limit the client set). When the client set no limit and the level
   has a cap, the cap is injected.
6. ``Pass``.

KV blocks of a request (``KvFit.blocks``): ceil((input + output) / block_size) for a
full-attention model, or the ``ext_proc.kv`` geometry's ``request_blocks`` (sliding-window
and hybrid layer groups) when the profile names the model's config; less the whole blocks of
the expected prefix-cache hit (input × the pool's recent hit ratio, at most input − 1). This
errs towards admitting: a hit on blocks no running request holds still takes them off
vLLM's free list. Free blocks are
floor((num_gpu_blocks − 1) × (1 − kv_cache_usage)) of the backend with the most, less the
blocks of the requests the worker passed since the view was taken (``Pipeline._room``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ext_proc.decision import Decision, Downgrade, Pass, Reject, Truncate
from ext_proc.policy.model import Priority, Profile
from ext_proc.policy.pressure import Pressure
from ext_proc.policy.scores import DrainInputs, retry_after_s
from ext_proc.schemas.base import RequestFeatures

__all__ = [
    "LADDER",
    "LADDER_AFTER_TRUNCATION",
    "TRUNCATABLE_SCHEMAS",
    "Case",
    "KvFit",
    "evaluate",
    "safe_output_tokens",
    "truncation_budget",
]

TRUNCATABLE_SCHEMAS = ("openai.chat", "anthropic.messages")


@dataclass(frozen=True, slots=True)
class KvFit:
    """The pool's KV room and how many blocks a request of (input, output) tokens needs."""

    free_blocks: int
    usable_blocks: int
    block_size: int
    blocks: Callable[[int, int], int]

    def output_fit(self, input_tokens: int, wanted: int) -> int:
        """The largest output ≤ ``wanted`` whose blocks fit ``free_blocks`` (0: none does)."""
        fits = self.free_blocks
        if self.blocks(input_tokens, wanted) <= fits:
            return wanted
        if self.blocks(input_tokens, 1) > fits:
            return 0
        lo, hi = 1, wanted  # blocks() is monotone in output: binary search
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.blocks(input_tokens, mid) <= fits:
                lo = mid
            else:
                hi = mid - 1
        return lo


@dataclass(frozen=True, slots=True)
class Case:
    """Everything a rule may look at."""

    features: RequestFeatures
    pressure: Pressure | None
    profile: Profile
    priority: Priority
    kv: KvFit | None = None
    drain: DrainInputs | None = None
    cache_efficiency: float | None = None

    def retry_after(self, need_tokens: int) -> int:
        """Retry-After for this request from the pool's drain rate (see policy/scores.py)."""
        p = self.profile
        return retry_after_s(
            self.drain,
            need_tokens,
            min_s=p.retry_after_min_s,
            max_s=p.retry_after_max_s,
            fallback_s=p.retry_after_s,
        )


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


def reject_beyond_kv_capacity(case: Case) -> Decision | None:
    kv = case.kv
    if kv is None:
        return None
    need = kv.blocks(case.features.input_tokens, 1)
    if need <= kv.usable_blocks:
        return None
    return Reject(
        pressure=case.pressure,
        status=400,
        reason="kv_capacity_exceeded",
        message=(
            f"The input (about {case.features.input_tokens} tokens) needs {need} KV-cache blocks "
            f"of {kv.block_size} tokens; the largest backend holds {kv.usable_blocks} blocks "
            f"even when idle."
        ),
        param="messages",
    )


def shed_on_kv_shortfall(case: Case) -> Decision | None:
    kv = case.kv
    mode = case.profile.on_kv_shortfall
    if kv is None or mode == "ignore" or case.priority == "critical":
        return None
    f = case.features
    min_out = case.profile.min_output_tokens
    safe = safe_output_tokens(case.profile, f.input_tokens)
    if safe is not None:
        min_out = min(min_out, safe)
    need = kv.blocks(f.input_tokens, min_out)
    if need <= kv.free_blocks:
        if mode != "shed" or f.max_tokens is None:
            return None
        # the output the request can really get: never more than the context budget
        wanted = f.max_tokens if safe is None else min(f.max_tokens, safe)
        need = kv.blocks(f.input_tokens, wanted)
        if need <= kv.free_blocks:
            return None
    retry = case.retry_after(need * kv.block_size)
    return Reject(
        pressure=case.pressure,
        status=429,
        reason="kv_exhausted",
        message=(
            f"The request needs {need} KV-cache blocks; the least-loaded backend has "
            f"{kv.free_blocks} free. Retry after {retry} s."
        ),
        retry_after_s=retry,
    )


def shed_by_priority(case: Case) -> Decision | None:
    p = case.pressure
    if p is None or case.priority == "critical":
        return None
    shed_level = case.profile.shed_at.get(case.priority)
    if shed_level is None or p.level < shed_level:
        return None
    f = case.features
    retry = case.retry_after(f.input_tokens + (f.max_tokens or case.profile.min_output_tokens))
    return Reject(
        pressure=p,
        status=429,
        reason="memory_pressure",
        message=(
            f"The inference backend is under {p.level.label} memory pressure "
            f"(score {p.score:.0f}/100); {case.priority}-priority requests are shed. "
            f"Retry after {retry} s."
        ),
        retry_after_s=retry,
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
    limit, reason = min(candidates, key=lambda c: c[0]) if candidates else (f.max_tokens, "")
    kv = case.kv
    if kv is not None and case.profile.on_kv_shortfall == "downgrade":
        wanted = min(limit, f.max_tokens)
        fit = kv.output_fit(f.input_tokens, wanted)
        if 0 < fit < wanted:
            limit, reason = fit, "kv_free_blocks"
    if f.max_tokens <= limit:
        return None
    return Downgrade(pressure=case.pressure, max_tokens=limit, original=f.max_tokens, reason=reason)


def truncation_budget(case: Case) -> tuple[int, str] | None:
    """The budget the input exceeds, and why (None: no truncation); see the ladder above."""
    spec = case.profile.truncation
    f = case.features
    if spec is None or f.schema not in TRUNCATABLE_SCHEMAS:
        return None
    found: list[tuple[int, str]] = []
    if case.pressure is not None:
        budget = spec.budget_tokens.get(case.pressure.level)
        if budget is not None and f.input_tokens > budget:
            found.append((budget, "pressure_budget"))
    low = spec.low_efficiency_budget_tokens
    eff = case.cache_efficiency
    low_eff = eff is not None and eff < spec.min_cache_efficiency
    if low is not None and low_eff and f.input_tokens > low:
        found.append((low, "cache_efficiency"))
    p = case.profile
    if p.max_model_len is not None and f.input_tokens > p.max_model_len - p.min_output_tokens:
        reserve = (
            p.output_buffer_tokens
            if p.output_buffer_tokens < p.max_model_len
            else p.min_output_tokens
        )
        found.append((max(1, p.max_model_len - reserve), "context_budget"))
    return min(found) if found else None


def truncate_history(case: Case) -> Decision | None:
    picked = truncation_budget(case)
    if picked is None or shed_by_priority(case) is not None:
        return None
    return Truncate(pressure=case.pressure, budget_tokens=picked[0], reason=picked[1])


LADDER_AFTER_TRUNCATION: tuple[Rule, ...] = (
    reject_oversized_input,
    reject_beyond_kv_capacity,
    shed_by_priority,
    shed_on_kv_shortfall,
    cap_output_tokens,
)

LADDER: tuple[Rule, ...] = (
    truncate_history,
    reject_oversized_input,
    reject_beyond_kv_capacity,
    shed_by_priority,
    shed_on_kv_shortfall,
    cap_output_tokens,
)


def evaluate(
    features: RequestFeatures,
    pressure: Pressure | None,
    profile: Profile,
    priority: Priority,
    kv: KvFit | None = None,
    drain: DrainInputs | None = None,
    ladder: tuple[Rule, ...] = LADDER,
    cache_efficiency: float | None = None,
) -> Decision:
    """Judge one request; the first rule of the ladder that decides wins, else ``Pass``."""
    case = Case(features, pressure, profile, priority, kv, drain, cache_efficiency)
    for rule in ladder:
        decision = rule(case)
        if decision is not None:
            return decision
    return Pass(pressure=pressure)
