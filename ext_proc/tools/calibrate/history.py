"""A pool's history on a time grid, its outcome events and the "hurt" labels (pure, numpy).

Job: both sources (``pages``, ``prom``) reduce what they read to one ``Track`` per backend
on a common grid of times; ``build_history`` combines the tracks into the pool's per-step
``History``; ``outcome_events`` marks the steps where something went wrong and ``hurt_labels``
labels each step by whether such a step follows within the horizon.

Per backend (``Track``, arrays of the grid's length, NaN = no value at that time):
    kv            KV-cache used fraction 0-1 (``vllm:kv_cache_usage_perc``, mean over engines)
    waiting       waiting requests (``vllm:num_requests_waiting``, summed over engines)
    preemptions   the cumulative counter ``vllm:num_preemptions_total``
    ttft_count    cumulative count of ``vllm:time_to_first_token_seconds``
    ttft_over     cumulative count of first tokens later than the TTFT target (``over_target``)

Pool, per step i at time t_i (``History``):
    kv[i]         plain mean of the backends' kv (block weights are not in a range query)
    waiting[i]    mean waiting requests per backend (the queue term's q_i, docs/decision-ladder.md)
    pcie[i]       PCIe utilisation 0-1 (mean over GPUs of max(tx, rx) / bandwidth), or NaN
    preempted[i]  preemptions during (t_{i-1}, t_i]: Σ_backends increase of the counter
    ttft_total[i], ttft_over[i]   first tokens during (t_{i-1}, t_i], and those over target

Counter increases: x_i − x_{i−1}; a decrease is a reset (the increase is x_i); a missing
value on either side counts 0; step 0 has no increase.

Events (``outcome_events``), step i is an event when any of:
    preempted[i] > 0
    waiting[i] > queue_limit                            (waiting per backend)
    ttft_total[i] > 0 and ttft_over[i] / ttft_total[i] > ttft_share

Label (``hurt_labels``): hurt[i] = 1 when some event step j has t_i < t_j ≤ t_i + horizon_s;
steps with t_i + horizon_s > t_last (their future is not in the history) are not labelled
(``known`` false). Invariant: the grid ascends strictly.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "Events",
    "History",
    "InputError",
    "Track",
    "build_history",
    "counter_increase",
    "empty_track",
    "hurt_labels",
    "outcome_events",
    "over_target",
]

Array = NDArray[np.float64]


class InputError(ValueError):
    """Bad input to ``ice calibrate`` (the CLI prints it on one line and exits 2)."""


@dataclass(frozen=True, slots=True)
class Track:
    """One backend on the grid (see the module docstring for each field)."""

    kv: Array
    waiting: Array
    preemptions: Array
    ttft_count: Array
    ttft_over: Array


def empty_track(n: int) -> Track:
    """A backend with no value anywhere on a grid of ``n`` times."""
    return Track(*(np.full(n, np.nan) for _ in range(5)))


@dataclass(frozen=True, slots=True)
class History:
    """The pool per step; times in Unix seconds, ascending."""

    t: Array
    kv: Array
    waiting: Array
    pcie: Array | None
    preempted: Array
    ttft_total: Array
    ttft_over: Array
    backends: tuple[str, ...] = ()

    def __len__(self) -> int:
        return int(self.t.shape[0])


@dataclass(frozen=True, slots=True)
class Events:
    """Which steps are events, and by which outcome (a step can have several)."""

    any: NDArray[np.bool_]
    preemption: NDArray[np.bool_]
    queue: NDArray[np.bool_]
    ttft: NDArray[np.bool_]


def over_target(bounds: Sequence[float], counts: Sequence[float], target: float) -> float:
    """Observations of a cumulative histogram above ``target``: count − F(target), F
    interpolated linearly inside the bucket holding ``target`` (the first bucket starts at 0,
    as ``histogram_quantile`` assumes); beyond the last finite bound F is that bound's count.

    Example: bounds (1, 2, +inf), counts (4, 8, 10), target 1.5 → F = 4 + 0.5 × 4 = 6 → 4."""
    total = counts[-1]
    lower, below = 0.0, 0.0
    for bound, cum in zip(bounds, counts, strict=True):
        if math.isinf(bound):
            break
        if target < bound:
            frac = (target - lower) / (bound - lower) if bound > lower else 1.0
            return max(0.0, total - (below + max(0.0, frac) * (cum - below)))
        lower, below = bound, cum
    return max(0.0, total - below)


def counter_increase(x: Array) -> Array:
    """Per-step increase of a cumulative counter (resets: the new value; NaN: 0)."""
    out = np.zeros_like(x, dtype=np.float64)
    if x.shape[0] < 2:
        return out
    prev, cur = x[:-1], x[1:]
    d = np.where(cur < prev, cur, cur - prev)
    out[1:] = np.where(np.isnan(d), 0.0, d)
    return out


def _nanmean_rows(rows: Sequence[Array], n: int) -> Array:
    if not rows:
        return np.full(n, np.nan)
    stack = np.vstack(rows)
    have = ~np.isnan(stack)
    count = have.sum(axis=0)
    total = np.where(have, stack, 0.0).sum(axis=0)
    return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def build_history(t: Array, tracks: Mapping[str, Track], pcie: Array | None = None) -> History:
    """The pool's per-step history from its backends' tracks on the grid ``t``."""
    n = int(t.shape[0])
    if n > 1 and not bool(np.all(np.diff(t) > 0)):
        raise ValueError("the time grid must ascend strictly")
    names = tuple(sorted(tracks))
    ts = [tracks[k] for k in names]
    zero = np.zeros(n)
    return History(
        t=t.astype(np.float64),
        kv=_nanmean_rows([tr.kv for tr in ts], n),
        waiting=_nanmean_rows([tr.waiting for tr in ts], n),
        pcie=pcie if pcie is not None and bool(np.any(~np.isnan(pcie))) else None,
        preempted=sum((counter_increase(tr.preemptions) for tr in ts), zero.copy()),
        ttft_total=sum((counter_increase(tr.ttft_count) for tr in ts), zero.copy()),
        ttft_over=sum((counter_increase(tr.ttft_over) for tr in ts), zero.copy()),
        backends=names,
    )


def outcome_events(h: History, *, queue_limit: float, ttft_share: float) -> Events:
    """The event steps of ``h`` (thresholds in the module docstring)."""
    pre = h.preempted > 0
    with np.errstate(invalid="ignore"):
        queue = np.nan_to_num(h.waiting, nan=-math.inf) > queue_limit
        share = np.where(h.ttft_total > 0, h.ttft_over / np.maximum(h.ttft_total, 1e-300), 0.0)
    ttft = (h.ttft_total > 0) & (share > ttft_share)
    return Events(any=pre | queue | ttft, preemption=pre, queue=queue, ttft=ttft)


def hurt_labels(
    t: Array, event: NDArray[np.bool_], horizon_s: float
) -> tuple[NDArray[np.int8], NDArray[np.bool_]]:
    """(hurt, known): hurt[i] = 1 when an event step follows within (t_i, t_i + horizon_s];
    known[i] false for the steps whose horizon runs past the history's last time."""
    n = int(t.shape[0])
    if n == 0:
        return np.zeros(0, dtype=np.int8), np.zeros(0, dtype=np.bool_)
    te = t[event]
    if te.shape[0] == 0:
        nxt = np.full(n, np.inf)
    else:
        k = np.searchsorted(te, t, side="right")  # first event strictly after t_i
        nxt = np.where(k < te.shape[0], te[np.minimum(k, te.shape[0] - 1)], np.inf)
    hurt = (nxt <= t + horizon_s).astype(np.int8)
    known = t + horizon_s <= t[-1] + 1e-9
    return hurt, known
