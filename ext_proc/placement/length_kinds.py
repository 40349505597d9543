"""Output lengths by kind of request, from what ICE sees finish (``admission: forecast``).

The forecast's length distribution is the backend's (``vllm:request_generation_tokens``:
every client's finished requests, per model; ``ext_proc.policy.output_dist``). A pool serves
kinds of request that run to different lengths: a summarising profile and a chat one, a
client that sends ``max_tokens: 64`` and one that sends none. ICE refines the backend's
distribution per **kind** = (profile name, limit bucket), from the requests it passed that
finished, with a scale factor.

- **Limit bucket** of a request: the first of ``LIMIT_BOUNDS`` (64, 256, 1,024, 4,096,
  16,384 tokens) at or above the output limit the backend runs it to (its ``max_tokens``,
  or the backend's default for one without: vLLM chat, ``max_model_len`` − prompt), else
  the last bucket (above 16,384): index 0..5.
- **What ICE sees finish.** ICE does not read responses. When a forecast request's stream
  ends, its output is taken as the trajectory's g at that moment, at the endpoint's decode
  rate then (``Outlook.generated``: ĝ = min(limit, floor(r × max(0, end − s − d))), the
  forecast's own clock). r is one figure for every request running at an endpoint, so its
  error is shared by every kind; a ratio of means cancels it, a length would not.
- **The factor** of kind k in pool P, over the last ``window`` finished requests of P:

      f_k = clamp( mean(ĝ of k) ÷ mean(ĝ of P), 1/8, ∞ )

  when k has at least ``min_observations`` of them and mean(ĝ of P) > 0; else 1. A kind
  that runs half as long as the pool's average gets f = 0.5.
- **Refined distribution** of k: the backend's histogram with every bucket bound × f_k
  (``scaled``): the lengths of a kind are the pool's, stretched (a lognormal stays one, its
  median × f). The limit share and everything else in ``outlen`` stay the backend's.

The floor of 1/8 keeps a kind whose streams mostly end before the first token's predicted
delay (ĝ = 0) from being held at nothing. With a single kind every f is 1: the refinement
changes nothing until kinds differ.

Invariant: per pool, ``_sums[k]`` and ``_counts[k]`` are the sum and number of the window's
observations of kind k, and the window holds at most ``window`` observations.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from ext_proc.signals.scrapes import Histogram

__all__ = [
    "LIMIT_BOUNDS",
    "LIMIT_LABELS",
    "MIN_FACTOR",
    "Kind",
    "ObservedLengths",
    "limit_bucket",
    "scaled",
]

LIMIT_BOUNDS = (64, 256, 1024, 4096, 16384)
LIMIT_LABELS = (*(str(b) for b in LIMIT_BOUNDS), "+Inf")  # a bucket's upper bound, as a label
MIN_FACTOR = 0.125

Kind = tuple[str, int]  # (profile name, limit bucket)


def limit_bucket(limit: int) -> int:
    """The bucket (0..len(LIMIT_BOUNDS)) of an output limit: the first bound ≥ it."""
    for i, bound in enumerate(LIMIT_BOUNDS):
        if limit <= bound:
            return i
    return len(LIMIT_BOUNDS)


def scaled(h: Histogram, factor: float) -> Histogram:
    """``h`` with every finite bound × ``factor`` (counts unchanged)."""
    if factor == 1.0:
        return h
    bounds = tuple(b if math.isinf(b) else b * factor for b in h.bounds)
    return Histogram(bounds, h.counts, h.count, h.sum * factor)


@dataclass
class _Pool:
    window: deque[tuple[Kind, int]] = field(default_factory=deque)
    sums: dict[Kind, int] = field(default_factory=dict)
    counts: dict[Kind, int] = field(default_factory=dict)
    total: int = 0


class ObservedLengths:
    """The last ``window`` finished requests' ĝ per pool, by kind (module docstring)."""

    def __init__(self, window: int = 1024) -> None:
        self.window = window
        self._pools: dict[str, _Pool] = {}

    def observe(self, pool: str, kind: Kind, generated: int) -> None:
        """A request of ``kind`` finished in ``pool`` having generated ``generated`` (ĝ)."""
        if self.window <= 0:
            return
        p = self._pools.setdefault(pool, _Pool())
        p.window.append((kind, generated))
        p.sums[kind] = p.sums.get(kind, 0) + generated
        p.counts[kind] = p.counts.get(kind, 0) + 1
        p.total += generated
        while len(p.window) > self.window:
            old, g = p.window.popleft()
            p.total -= g
            p.sums[old] -= g
            p.counts[old] -= 1
            if not p.counts[old]:
                del p.counts[old], p.sums[old]

    def factor(self, pool: str, kind: Kind, min_observations: int) -> float:
        """f_k (module docstring); 1 without enough observations."""
        p = self._pools.get(pool)
        if p is None or p.total <= 0:
            return 1.0
        n = p.counts.get(kind, 0)
        if n < max(1, min_observations):
            return 1.0
        mine = p.sums[kind] / n
        everyone = p.total / len(p.window)
        return max(MIN_FACTOR, mine / everyone)

    def kinds(self, pool: str) -> dict[Kind, int]:
        """The window's kinds in ``pool`` and how many of each (for ``ice signals``, tests)."""
        p = self._pools.get(pool)
        return dict(p.counts) if p is not None else {}
