"""The product's two other scores, and Retry-After from the drain rate (pure).

``cache_efficiency_ratio`` (0-1): how much of the prompt work the KV cache saves:
    Δprefix_cache_hits_tokens / Δprefix_cache_queries_tokens over the window (vLLM), else the
    engine's own ``cache_hit_rate`` gauge (SGLang); pool value = the mean over backends that
    report one, weighted by their Δqueries when known. None: no backend says.
    The design's trigger: < 0.45 → truncate history (a later layer).

``tokenize_latency_risk`` (0-1): the probability that a request's pre-generation stage
(tokenize + queue + prefill, i.e. time to first token) exceeds the route's target:
    the share of the window's TTFT observations above ``ttft_target_s`` (from the TTFT
    histogram's delta, linear within the bucket holding the target), pooled over backends.
    None: no request finished its first token in the window.

``retry_after_s``: how long until the pool frees what this request needs:
    drain_tokens_per_s = prompt_tokens_per_s + generation_tokens_per_s   (steady state: the
                         tokens that leave the cache per second equal those that enter it)
    tokens_per_request = drain_tokens_per_s / completions_per_s
    backlog_tokens     = waiting × tokens_per_request + need_tokens − free_tokens
    retry_after_s      = clamp(ceil(backlog_tokens / drain_tokens_per_s), min_s, max_s)
    summed over the pool's backends (rates, waiting and free tokens add up; backends whose
    engine sleeps are left out unless all do: their free blocks serve nobody). Without rates
    (no completions yet, or a fresh start) the profile's constant ``retry_after_s`` is used.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from ext_proc.signals.scrapes import Derived, Histogram
from ext_proc.signals.snapshot import PoolSnapshot
from ext_proc.signals.window import exceedance

__all__ = [
    "DrainInputs",
    "cache_efficiency_ratio",
    "drain_inputs",
    "pool_cache_efficiency",
    "retry_after_s",
    "tokenize_latency_risk",
]


def cache_efficiency_ratio(
    backends: Iterable[tuple[Derived | None, float | None, float | None]],
) -> float | None:
    """Pool ratio from (derived window, Δqueries weight or None, engine's hit-rate gauge)."""
    num = den = 0.0
    plain: list[float] = []
    for derived, weight, gauge in backends:
        ratio = derived.prefix_cache_hit_ratio if derived is not None else None
        if ratio is None:
            ratio = gauge
        if ratio is None:
            continue
        ratio = min(1.0, max(0.0, ratio))
        if weight:
            num += ratio * weight
            den += weight
        else:
            plain.append(ratio)
    if den > 0:
        return (num + sum(plain)) / (den + len(plain)) if plain else num / den
    return sum(plain) / len(plain) if plain else None


def pool_cache_efficiency(snapshot: PoolSnapshot) -> float | None:
    """``cache_efficiency_ratio`` of a pool's snapshot: each backend's window hit ratio,
    weighted by its prompt tokens/s, else its engine's gauge."""
    return cache_efficiency_ratio(
        (b.derived, b.derived.prompt_tokens_per_s if b.derived else None, b.cache_hit_rate)
        for b in snapshot.backends
    )


def tokenize_latency_risk(deltas: Iterable[Histogram | None], ttft_target_s: float) -> float | None:
    """Pooled share of TTFT observations above the target (None without observations)."""
    above = total = 0.0
    for delta in deltas:
        if delta is None or delta.count <= 0:
            continue
        share = exceedance(delta, ttft_target_s)
        if share is None:
            continue
        above += share * delta.count
        total += delta.count
    return above / total if total > 0 else None


@dataclass(frozen=True, slots=True)
class DrainInputs:
    """Pool totals the Retry-After estimate needs (rates per second, tokens)."""

    prompt_tokens_per_s: float
    generation_tokens_per_s: float
    completions_per_s: float
    waiting: float
    free_tokens: float


def retry_after_s(
    drain: DrainInputs | None, need_tokens: int, *, min_s: int, max_s: int, fallback_s: int
) -> int:
    """Seconds until the pool has drained enough for ``need_tokens`` (formula above)."""
    if drain is None:
        return fallback_s
    rate = drain.prompt_tokens_per_s + drain.generation_tokens_per_s
    if rate <= 0 or drain.completions_per_s <= 0:
        return fallback_s
    per_request = rate / drain.completions_per_s
    backlog = drain.waiting * per_request + need_tokens - drain.free_tokens
    seconds = math.ceil(max(0.0, backlog) / rate)
    return max(min_s, min(max_s, seconds))


def drain_inputs(snapshot: PoolSnapshot) -> DrainInputs | None:
    """Pool totals for ``retry_after_s``: rates summed over backends with a derived window
    (sleeping ones left out, unless every backend sleeps)."""
    prompt = gen = done = waiting = free = 0.0
    seen = False
    for b in snapshot.serving.backends:
        d = b.derived
        if d is None or d.completions_per_s is None:
            continue
        seen = True
        prompt += d.prompt_tokens_per_s or 0.0
        gen += d.generation_tokens_per_s or 0.0
        done += d.completions_per_s
        waiting += b.num_requests_waiting or 0.0
        if b.free_blocks is not None and b.block_size:
            free += b.free_blocks * b.block_size
    if not seen:
        return None
    return DrainInputs(prompt, gen, done, waiting, free)
