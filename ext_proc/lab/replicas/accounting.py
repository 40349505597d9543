"""The arithmetic of the replicas bench: KV blocks of a request, their peak, the overshoot.

- ``blocks_for(prompt_tokens, output_tokens, block_size)``: the blocks a request reserves in
  ICE's ledger under ``kv_hold: done``: ceil((prompt + output) / block_size), the formula of
  ``ext_proc.policy.evaluate`` (``KvFit.need`` for one sequence, no prefix-cache hit).
- ``Held``: one admitted request's KV blocks and the interval it held them (from when the
  client sent it to when its answer ended, seconds after the burst's start).
- ``peak_blocks(held)``: the most blocks held at once: a sweep over the intervals' ends; at a
  tie an end comes before a start (a request that ends at t has freed its blocks for one that
  starts at t), and an interval of zero length holds nothing.
- ``over_admission(held, usable)``: max(0, peak − usable): how many blocks more than the pool
  holds the admitted requests would have needed at once. ``usable`` is the pool's
  ``num_gpu_blocks − 1`` (vLLM keeps one null block), as ICE counts it.
- ``Stats`` / ``stats(values)``: median, min and max of a metric over rounds (None: no value),
  and ``text()``: ``median [min–max]`` (``ext_proc.lab.overload.results.spread``).
- ``nearest_rank(values, q)``: the nearest-rank quantile, unrounded (the overload lab's
  ``quantile`` rounds to ms, too coarse for a tiny request's latency);
- ``added_ms(through, direct, q)``: the q quantile of the latencies through Envoy + ICE less
  that of the latencies straight to the backend, in milliseconds.

Invariants: pure functions of their arguments (no clock, no I/O); ``peak_blocks`` is 0 for no
interval and never negative; ``over_admission`` is never negative.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ext_proc.lab.overload.results import spread

__all__ = [
    "Held",
    "Stats",
    "added_ms",
    "blocks_for",
    "nearest_rank",
    "over_admission",
    "peak_blocks",
    "stats",
]


def blocks_for(prompt_tokens: int, output_tokens: int, block_size: int) -> int:
    """ceil((prompt_tokens + output_tokens) / block_size): one sequence's whole need."""
    if block_size < 1:
        raise ValueError(f"block_size must be ≥ 1, not {block_size}")
    return math.ceil((prompt_tokens + output_tokens) / block_size)


@dataclass(frozen=True)
class Held:
    """``blocks`` held from ``start_s`` to ``end_s`` (seconds after the burst's start)."""

    start_s: float
    end_s: float
    blocks: int


def peak_blocks(held: Iterable[Held]) -> int:
    """The most blocks the intervals hold at one time (ends before starts at a tie)."""
    events: list[tuple[float, int, int]] = []
    for h in held:
        if h.end_s > h.start_s and h.blocks > 0:
            events.append((h.start_s, 1, h.blocks))  # 1 sorts after 0: ends first at a tie
            events.append((h.end_s, 0, -h.blocks))
    peak = now = 0
    for _, _, delta in sorted(events):
        now += delta
        peak = max(peak, now)
    return peak


def over_admission(held: Iterable[Held], usable_blocks: int) -> int:
    """max(0, ``peak_blocks(held)`` − ``usable_blocks``)."""
    return max(0, peak_blocks(held) - usable_blocks)


@dataclass(frozen=True)
class Stats:
    """A metric over rounds: median, min, max (None for all: no round had a value)."""

    median: float | None
    min: float | None
    max: float | None
    n: int
    text: str  # "median [min–max]", one value when all agree, "-" for none


def stats(values: Sequence[float | None]) -> Stats:
    """The ``Stats`` of ``values`` (a round without a value: None, left out but counted in
    ``text``'s ``(n=k)``)."""
    have = [v for v in values if v is not None]
    text = spread(list(values))
    if not have:
        return Stats(None, None, None, 0, text)
    return Stats(statistics.median(have), min(have), max(have), len(have), text)


def nearest_rank(values: Sequence[float], q: float) -> float | None:
    """The nearest-rank ``q`` quantile of ``values`` (q = 1.0: the maximum), unrounded;
    None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1))
    return ordered[rank]


def added_ms(through: Sequence[float], direct: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile of ``through`` less that of ``direct`` (both in seconds), in ms,
    rounded to 0.01 ms; None when either has no value."""
    a, b = nearest_rank(through, q), nearest_rank(direct, q)
    if a is None or b is None:
        return None
    return round((a - b) * 1000, 2)
