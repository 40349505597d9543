"""Predicted time to first token and time per output token of one backend (pure).

Job: ``speed(window)`` reads a backend's scrapes over the pool's window (oldest first) once,
when the collector derives the backend's rates, into a ``Speed``; ``predicted_ttft_s`` and
``predicted_tpot_s`` then answer for one request in O(1). Nothing here decides: the figures
are shown (``ice signals``, the ``ice_slo_*`` gauges), measured (``ttft_error_ratio``) and
read by ``admission: slo`` (``ext_proc.placement.slo_book``, ``ext_proc.policy.slo_admit``).
docs/slo.md states every formula with its inputs, units and defaults.

An interval is a pair of consecutive scrapes ``a → b``; a difference ``Δx = x_b − x_a`` of a
cumulative sum or count counts only when neither fell (a fall is a restart: that interval
says nothing). Formulas:

- Prefill speed ``r = ΣΔ computed_tokens_sum ÷ ΣΔ prefill_time_sum`` (tokens a second) over
  the window's intervals, from vLLM's per-request histograms
  ``vllm:request_prefill_kv_computed_tokens`` and ``vllm:request_prefill_time_seconds``
  (both recorded when a request finishes, so both sums count the same requests). Without
  them (SGLang, older vLLM): ``ΣΔ prompt_tokens × (1 − h) ÷ ΣΔ(ttft_sum − queue_time_sum)``,
  ``h`` the window's prefix-cache hit ratio (0 unknown).
- Mean computed prompt ``c̄ = ΣΔ computed_tokens_sum ÷ ΣΔ computed_tokens_count`` (fallback:
  ``ΣΔ prompt_tokens × (1 − h) ÷ ΣΔ ttft_count``).
- The rest of a first token's time, ``o = max(0, ΣΔttft_sum ÷ ΣΔttft_count −
  ΣΔqueue_sum ÷ ΣΔqueue_count − ΣΔprefill_sum ÷ ΣΔprefill_count)`` seconds (vLLM with its
  prefill histograms only; None otherwise, taken as 0): what a request spends neither queued
  nor in prefill (the API server's rendering and tokenizing, the wait for the running step).
- Predicted TTFT of a request of ``p`` prompt tokens:
  ``(waiting × c̄ + ahead_tokens + p × (1 − h)) ÷ r + o`` seconds, ``waiting`` vLLM's
  ``num_requests_waiting`` now and ``ahead_tokens`` prompt tokens ICE sent there that have
  not started (0 when not known).
- Decode step line: each interval with ``Δitl_count > 0`` and both running gauges gives a
  point ``(x, y) = ((running_a + running_b) ÷ 2, Δitl_sum ÷ Δitl_count)``; unweighted least
  squares ``β = Σ(x − x̄)(y − ȳ) ÷ Σ(x − x̄)²``, ``α = ȳ − β x̄``. With one point, equal
  ``x``, or ``β < 0``: ``β = 0``, ``α = ȳ``. Predicted TPOT with ``n`` sequences running:
  ``max(0, α + β n)``.
- Own error: walking the intervals in order, the prediction at ``a`` for a mean request
  (``p × (1 − h) = c̄``), with ``r``, ``c̄`` and ``o`` from the intervals before it only, against the
  mean TTFT the backend reported over ``a → b`` (``Δttft_sum ÷ Δttft_count``):
  ``ttft_error_ratio`` = mean of ``|pred − obs| ÷ obs`` over the intervals that have both.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence

from ext_proc.signals.scrapes import EngineScrape, Histogram, Speed

__all__ = [
    "MAX_BATCHED_TOKENS",
    "predicted_tpot_s",
    "predicted_ttft_s",
    "predicted_ttft_step_s",
    "speed",
]

# vLLM's max_num_batched_tokens when ICE is not told (``vllm serve``'s default on an H100)
MAX_BATCHED_TOKENS = 8192

_Get = Callable[[EngineScrape], Histogram | None]


def _sum(get: _Get) -> Callable[[EngineScrape], float | None]:
    return lambda s: h.sum if (h := get(s)) is not None else None


def _count(get: _Get) -> Callable[[EngineScrape], float | None]:
    return lambda s: h.count if (h := get(s)) is not None else None


def _delta(a: EngineScrape, b: EngineScrape, get: Callable[[EngineScrape], float | None]) -> float:
    """``get(b) − get(a)``; raises ``_NoDelta`` when either is missing or it fell."""
    va, vb = get(a), get(b)
    if va is None or vb is None or vb < va:
        raise _NoDelta
    return vb - va


class _NoDelta(Exception):
    """An interval that cannot say one difference (a field missing, or a restart)."""


_PREFILL_S = _sum(lambda s: s.prefill_time_s)
_COMPUTED = _sum(lambda s: s.prefill_computed_tokens)
_COMPUTED_N = _count(lambda s: s.prefill_computed_tokens)
_TTFT_S = _sum(lambda s: s.ttft_s)
_TTFT_N = _count(lambda s: s.ttft_s)
_QUEUE_S = _sum(lambda s: s.queue_time_s)
_QUEUE_N = _count(lambda s: s.queue_time_s)
_PREFILL_N = _count(lambda s: s.prefill_time_s)
_ITL_S = _sum(lambda s: s.itl_s)
_ITL_N = _count(lambda s: s.itl_s)
_ITER_T = _sum(lambda s: s.iteration_tokens)
_ITER_N = _count(lambda s: s.iteration_tokens)


def _prefill(a: EngineScrape, b: EngineScrape, hit: float) -> tuple[float, float, float]:
    """(computed tokens, prefill seconds, requests) of one interval (``_NoDelta``: none)."""
    if a.prefill_time_s is not None and a.prefill_computed_tokens is not None:
        return (_delta(a, b, _COMPUTED), _delta(a, b, _PREFILL_S), _delta(a, b, _COMPUTED_N))
    tokens = _delta(a, b, lambda s: s.prompt_tokens) * (1.0 - hit)
    seconds = _delta(a, b, _TTFT_S) - _delta(a, b, _QUEUE_S)
    return tokens, max(0.0, seconds), _delta(a, b, _TTFT_N)


class _Overhead:
    """The window's sums for ``o``: TTFT, queue and prefill seconds and their counts."""

    __slots__ = ("sums",)

    def __init__(self) -> None:
        self.sums = [0.0] * 6

    def add(self, a: EngineScrape, b: EngineScrape) -> None:
        """One interval's, when it says all six (vLLM with its prefill histograms)."""
        fields = (_TTFT_S, _TTFT_N, _QUEUE_S, _QUEUE_N, _PREFILL_S, _PREFILL_N)
        try:
            got = [_delta(a, b, f) for f in fields]
        except _NoDelta:
            return
        self.sums = [x + y for x, y in zip(self.sums, got, strict=True)]

    @property
    def seconds(self) -> float | None:
        """``o = max(0, mean TTFT − mean queue time − mean prefill time)``; None: a mean is
        missing."""
        ttft, ttft_n, queue, queue_n, prefill, prefill_n = self.sums
        if min(ttft_n, queue_n, prefill_n) <= 0:
            return None
        return max(0.0, ttft / ttft_n - queue / queue_n - prefill / prefill_n)


def _line(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """(α, β) of the least-squares line through ``points`` (module docstring's rules)."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx <= 0.0:
        return my, 0.0
    beta = sum((x - mx) * (y - my) for x, y in points) / sxx
    if beta < 0.0:
        return my, 0.0
    return my - beta * mx, beta


class _Sums:
    """Running sums of the step line's points, for its line so far in O(1)."""

    __slots__ = ("n", "sx", "sxx", "sxy", "sy")

    def __init__(self) -> None:
        self.n = self.sx = self.sy = self.sxx = self.sxy = 0.0

    def add(self, x: float, y: float) -> None:
        self.n += 1
        self.sx, self.sy = self.sx + x, self.sy + y
        self.sxx, self.sxy = self.sxx + x * x, self.sxy + x * y

    @property
    def line(self) -> tuple[float | None, float | None]:
        """(a, b) as ``_line`` gives them (None, None: no point yet)."""
        if self.n == 0:
            return None, None
        mx, my = self.sx / self.n, self.sy / self.n
        sxx = self.sxx - self.n * mx * mx
        if sxx <= 1e-12 * max(1.0, self.sxx):
            return my, 0.0
        beta = (self.sxy - self.n * mx * my) / sxx
        if beta < 0.0:
            return my, 0.0
        return my - beta * mx, beta


def _error(before: Speed, a: EngineScrape, b: EngineScrape) -> float | None:
    """|predicted − observed| ÷ observed of a mean request's TTFT over ``a → b``, predicted
    at ``a`` from ``before`` (the intervals before it); None: no prediction or observation."""
    try:
        count = _delta(a, b, _TTFT_N)
        observed = _delta(a, b, _TTFT_S) / count if count > 0 else 0.0
    except _NoDelta:
        return None
    mean = before.computed_prompt_tokens
    if mean is None or observed <= 0.0:
        return None
    predicted = predicted_ttft_step_s(
        before, a.num_requests_waiting, a.num_requests_running, mean, 0.0
    )
    return None if predicted is None else abs(predicted - observed) / observed


def _steps(a: EngineScrape, b: EngineScrape) -> tuple[float | None, float | None]:
    """(mean inter-token latency, mean tokens per engine step) over ``a → b`` (None: the
    interval does not say)."""
    try:
        steps = _delta(a, b, _ITL_N)
        step_s = _delta(a, b, _ITL_S) / steps if steps > 0 else None
    except _NoDelta:
        return None, None
    try:
        engine_steps = _delta(a, b, _ITER_N)
        tokens = _delta(a, b, _ITER_T) / engine_steps if engine_steps > 0 else None
    except _NoDelta:
        tokens = None
    return step_s, tokens


def speed(window: Sequence[EngineScrape], hit_ratio: float | None) -> Speed:
    """The backend's prefill speed, decode step line and TTFT error over ``window`` (its
    scrapes oldest first); ``hit_ratio``: the window's prefix-cache hit ratio (None: 0)."""
    hit = min(1.0, max(0.0, hit_ratio or 0.0))
    tokens = seconds = requests = 0.0
    errors: list[float] = []
    points: list[tuple[float, float]] = []
    overhead = _Overhead()
    sums = _Sums()
    for a, b in itertools.pairwise(window):
        # the prediction at a, from what the intervals before it said
        before = Speed(
            prefill_tokens_per_s=tokens / seconds if seconds > 0 and tokens > 0 else None,
            computed_prompt_tokens=tokens / requests if requests > 0 else None,
            ttft_overhead_s=overhead.seconds,
            token_step_fixed_s=sums.line[0],
            token_step_per_token_s=sums.line[1],
        )
        try:
            t, s, n = _prefill(a, b, hit)
            tokens, seconds, requests = tokens + t, seconds + s, requests + n
        except _NoDelta:
            pass
        overhead.add(a, b)
        error = _error(before, a, b)
        if error is not None:
            errors.append(error)
        step_s, tokens_per_step = _steps(a, b)
        if step_s is None:
            continue
        if tokens_per_step is not None:
            sums.add(tokens_per_step, step_s)
        if a.num_requests_running is not None and b.num_requests_running is not None:
            points.append(((a.num_requests_running + b.num_requests_running) / 2.0, step_s))
    alpha, beta = _line(points) if points else (None, None)
    step_fixed, per_token = sums.line  # the step line over every interval, as each used it
    return Speed(
        prefill_tokens_per_s=tokens / seconds if seconds > 0 and tokens > 0 else None,
        computed_prompt_tokens=tokens / requests if requests > 0 else None,
        step_base_s=alpha,
        step_per_running_s=beta,
        step_points=len(points),
        ttft_overhead_s=overhead.seconds,
        ttft_error_ratio=sum(errors) / len(errors) if errors else None,
        ttft_error_points=len(errors),
        token_step_fixed_s=step_fixed,
        token_step_per_token_s=per_token if per_token else None,
        token_step_points=int(sums.n),
    )


def predicted_ttft_s(
    sp: Speed,
    waiting: float | None,
    prompt_tokens: float,
    hit_ratio: float | None,
    ahead_tokens: float = 0.0,
) -> float | None:
    """Seconds until a request of ``prompt_tokens`` gets its first token on this backend:
    ``(waiting × c̄ + ahead_tokens + prompt_tokens × (1 − h)) ÷ r + o`` (None: no speed
    known; ``o`` 0 when unknown)."""
    rate = sp.prefill_tokens_per_s
    if rate is None or rate <= 0.0:
        return None
    hit = min(1.0, max(0.0, hit_ratio or 0.0))
    queued = (waiting or 0.0) * (sp.computed_prompt_tokens or 0.0)
    work = queued + max(0.0, ahead_tokens) + max(0.0, prompt_tokens) * (1.0 - hit)
    return work / rate + (sp.ttft_overhead_s or 0.0)


def predicted_ttft_step_s(
    sp: Speed,
    waiting: float | None,
    running: float | None,
    prompt_tokens: float,
    hit_ratio: float | None,
    ahead_tokens: float = 0.0,
    max_batched_tokens: int = MAX_BATCHED_TOKENS,
    *,
    ahead_requests: float = 0.0,
    completions_per_s: float | None = None,
) -> float | None:
    """Seconds until a request of ``prompt_tokens`` gets its first token, by the engine's
    step line (docs/slo.md, "Predicted time to first token"):

        W = waiting × c̄ + ahead_tokens + p × (1 − h)      prefill tokens up to its own
        d = running,   k = max(1, ceil(W ÷ max(1, B − d)))          steps of B tokens
        q = (waiting + ahead_requests + 1) ÷ λ  when waiting > 0, else 0   (room to start)
        TTFT = o + q + (a + b d) ÷ 2 + k a + b (W + k d)

    (``a``, ``b``: ``token_step_fixed_s``, ``token_step_per_token_s``; ``λ``:
    ``completions_per_s``, unknown or 0: q = 0); without that line, ``predicted_ttft_s``
    (the speed per request) + q."""
    waits = waiting or 0.0
    room = 0.0
    if waits > 0 and completions_per_s:
        room = (waits + max(0.0, ahead_requests) + 1.0) / completions_per_s
    a, b = sp.token_step_fixed_s, sp.token_step_per_token_s
    if a is None or b is None or b <= 0.0:
        base = predicted_ttft_s(sp, waiting, prompt_tokens, hit_ratio, ahead_tokens)
        return None if base is None else base + room
    hit = min(1.0, max(0.0, hit_ratio or 0.0))
    queued = waits * (sp.computed_prompt_tokens or 0.0)
    work = queued + max(0.0, ahead_tokens) + max(0.0, prompt_tokens) * (1.0 - hit)
    d = max(0.0, running or 0.0)
    steps = max(1, math.ceil(work / max(1.0, max_batched_tokens - d)))
    running_step = (a + b * d) / 2.0
    return (sp.ttft_overhead_s or 0.0) + room + running_step + steps * a + b * (work + steps * d)


def predicted_tpot_s(sp: Speed, running: float) -> float | None:
    """Seconds per output token with ``running`` sequences decoding: ``max(0, α + β n)``."""
    if sp.step_base_s is None or sp.step_per_running_s is None:
        return None
    return max(0.0, sp.step_base_s + sp.step_per_running_s * running)
