"""How long a request's output will be, from what the pool really generates (pure).

The distribution is the backend's ``vllm:request_generation_tokens`` histogram (output
tokens of every finished request, every client's, cumulative since the server started;
``BackendSignals.output_lengths``), read as Prometheus reads a histogram: the cumulative
count at each bucket's upper bound, linear inside a bucket, the first bucket starting at 0.

``remaining_total(h, q, generated, limit, floor)``: the total output (tokens per sequence)
a running request that has already generated ``generated`` tokens is expected to reach, at
the quantile ``q`` of the lengths *longer than what it has generated*:

    F(x)     the count of observations ≤ x (interpolated)
    N        the count of all observations
    p        the share of finished requests that ran to their output limit (vLLM's
             ``request_success_total`` by ``finished_reason``: length ÷ (length + stop +
             repetition); ``BackendSignals.limit_share``; 0 when unknown)
    target   = F(g) + q × (N − F(g) + N × p / (1 − p))
    T        = the x with F(x) = target (interpolated in its bucket);
               the limit when p > 0 and target > N, or p = 1
    total    = min(limit, max(floor, g, ceil(T)))

so a request that has outlived most of its peers is expected to run longer (the
conditional quantile rises with g). The limit term: a request either stops on its own, at a
length drawn from the histogram, or runs to its own limit, with probability p. Given that it
has generated g, P(total ≤ x) = (1 − p)(F(x) − F(g)) / [(1 − p)(N − F(g)) + p N] for x
below its limit; solving for q gives the target above, and when the target passes N the
quantile lies in the mass at the limit. Where clients' limits are what their requests
really generate (p → 1) every request is expected to reach its limit; where requests stop
on their own (p = 0) the histogram alone decides. The histogram also holds the lengths of
the requests that ran to their limit, so the stopping lengths it stands for err long (more
blocks held, not fewer). ``limit`` is the request's own output limit (what the
backend will never exceed), ``floor`` what it must generate (``min_tokens``; the limit
itself with ``ignore_eos``). With fewer than ``min_observations`` observations the total is
the limit: ICE then holds the request as ``admission: reserve`` would. Past the history —
every observation at or below g, or T in the +Inf bucket — the request is expected to run
as long again as it has (T = 2 × max(g, the largest finite bucket bound below the target):
the remaining length of a heavy tail grows with its age), capped at the limit; jumping to
the limit there held every long-running request at its whole limit (a bench run: forecast
peaks of 33–41 blocks on a 23-block pool while vLLM used at most 23). ``caution``
c ∈ [0, 1] (raised by preemptions, ``ext_proc.placement.forecast_book``) raises the
quantile towards 1:

    q' = q + c × (1 − q)

so right after a preemption (c = 1) a request is expected to run as long as the longest
the pool has run (the target is N: the top of the highest bucket holding an observation),
or to its limit when requests do run to their limits (p > 0: the target passes N). Moving
the total itself to the limit held a request without one at ``max_model_len`` − prompt:
one preemption shut the gate to every such request for several half-lives.
"""

from __future__ import annotations

import math

from ext_proc.signals.scrapes import Histogram

__all__ = ["cdf_at", "remaining_total"]


def cdf_at(h: Histogram, x: float) -> float:
    """F(x): observations ≤ x, linear inside a bucket (the first starts at 0)."""
    lower, below = 0.0, 0.0
    for bound, count in zip(h.bounds, h.counts, strict=True):
        if x <= bound:
            if math.isinf(bound) or bound <= lower:
                return below
            return below + (count - below) * max(0.0, x - lower) / (bound - lower)
        lower, below = bound, count
    return below


def _inverse(h: Histogram, target: float) -> float | None:
    """The x with F(x) = target; None when it lies in the +Inf bucket."""
    lower, below = 0.0, 0.0
    for bound, count in zip(h.bounds, h.counts, strict=True):
        if count >= target and count > below:
            if math.isinf(bound):
                return None
            return lower + (bound - lower) * (target - below) / (count - below)
        lower, below = bound, count
    return None


def _last_bound(h: Histogram) -> float:
    """The largest finite bucket bound that holds an observation (0: none)."""
    out, below = 0.0, 0.0
    for bound, count in zip(h.bounds, h.counts, strict=True):
        if math.isinf(bound):
            break
        if count > below:
            out = bound
        below = count
    return out


def remaining_total(
    h: Histogram | None,
    q: float,
    generated: int,
    limit: int,
    floor: int = 0,
    min_observations: int = 20,
    caution: float = 0.0,
    limit_share: float = 0.0,
) -> int:
    """The total output (tokens per sequence) a running request is expected to reach (see
    the module docstring); ``limit_share``: p."""
    total = limit
    p = min(1.0, max(0.0, limit_share))
    q = q + min(1.0, max(0.0, caution)) * (1.0 - q)  # caution raises the quantile
    if h is not None and h.counts and h.counts[-1] >= min_observations and p < 1.0:
        n = h.counts[-1]
        f_g = cdf_at(h, generated)
        target = f_g + q * (n - f_g + n * p / (1.0 - p))
        if p > 0.0 and target > n:  # in the mass at the limit
            x: float | None = float(limit)
        else:
            x = _inverse(h, target) if n - f_g > 0 else None
        if x is None:  # past the history: as long again
            x = 2.0 * max(generated, _last_bound(h))
        total = min(limit, max(floor, generated, math.ceil(x - 1e-9)))
    return max(0, total)
