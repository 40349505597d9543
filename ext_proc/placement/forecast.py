"""The forecast of one endpoint's KV blocks over time (``admission: forecast``).

Each request ICE passed to an endpoint is a ``Trajectory``: its prompt blocks at admission
(all its sequences, prefix sharing counted: ``KvFit.need(shape, 0)``), its sequences, its
output limit and floor, and when it was passed. At time t it has generated

    g(t) = min(limit, floor(r × max(0, t − start − d)))        tokens per sequence

where r is the endpoint's decode rate per running sequence and d the delay to its first
token (``ForecastBook.outlook``; r unknown: 0, so nothing is assumed generated and every
request keeps its whole predicted output ahead). It holds

    b(t) = prompt_blocks + seqs × ceil(g(t) / block_size)           blocks

(an upper bound: each sequence's output fills its own blocks after the prompt's), and has
``left`` = T − g(t) tokens per sequence ahead, T its expected total
(``ext_proc.policy.outlen.remaining_total``: the quantile of the pool's output lengths given
g, capped at the limit). A request held whole (``admission: reserve``, or a forecast one
while the length distribution is not trusted yet) has left = 0 and b = its whole need.

**The peak** (Past-Future, LightLLM, ASPLOS 2025): the running requests sorted by ``left``,
longest first; just before request i finishes (after left_i more decode steps) the
requests 1..i still run, each grown by left_i tokens per sequence, and the others are gone:

    peak = max over i of [ Σ_{j ≤ i} b_j + (Σ_{j ≤ i} seqs_j) × ceil(left_i / block_size) ]

(i = the last gives at least Σ b_j, today's blocks). A new request is admitted when the
peak with it stays within the endpoint's budget:

    budget = floor(U × (1 − margin)) − other
    other  = max(0, (U − F) − Σ_j b_j(now) − held by other ICE workers)

U the usable blocks, F the free blocks of the view: ``other`` is the work ICE did not pass
(another gateway, direct clients), taken as staying as it is. The other workers' and
replicas' live holds (their published totals) count as requests with left = 0.

Invariant: pure arithmetic over the trajectories given; ``PoolViews`` owns the store and
the clock.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

from ext_proc.policy.model import ForecastSpec
from ext_proc.policy.outlen import remaining_total
from ext_proc.signals.model import Histogram

__all__ = ["Outlook", "Peaks", "Trajectory", "peak_of"]


@dataclass(slots=True, eq=False)
class Trajectory:
    """One passed request as the forecast sees it (see the module docstring)."""

    start_s: float
    prompt_blocks: int
    seqs: int
    limit: int  # output tokens per sequence the backend may run
    floor: int = 0  # output it must run (min_tokens)
    whole: int | None = None  # blocks held whole for its whole life (reserve); None: forecast


@dataclass(frozen=True, slots=True)
class Outlook:
    """What the forecast of one endpoint reads of its view: the decode rate per running
    sequence (tokens/s; None unknown), the output lengths, the caution preemptions raised,
    the block size and the profile's forecast settings."""

    rate: float | None
    lengths: Histogram | None
    caution: float
    block_size: int
    spec: ForecastSpec
    delay_s: float = 0.0  # until the first output token (the window's TTFT p50)

    def total(self, generated: int, limit: int, floor: int) -> int:
        return remaining_total(
            self.lengths,
            self.spec.quantile,
            generated,
            limit,
            floor,
            self.spec.min_observations,
            self.caution,
        )

    def state(self, t: Trajectory, now_s: float) -> tuple[int, int]:
        """(blocks held now, output tokens per sequence still ahead) of ``t``."""
        if t.whole is not None:
            return t.whole, 0
        rate = self.rate or 0.0
        g = min(t.limit, int(rate * max(0.0, now_s - t.start_s - self.delay_s)))
        left = max(0, self.total(g, t.limit, t.floor) - g)
        return t.prompt_blocks + t.seqs * -(-g // self.block_size), left


def _up(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


class Peaks:
    """The running requests of one endpoint, sorted for the peak; ``with_new`` gives the
    peak with one more request in O(n) (the module docstring's formula)."""

    __slots__ = ("_bs", "_fixed", "_lefts", "_points", "_seqs", "_sums", "now_blocks", "peak")

    def __init__(self, states: list[tuple[int, int, int]], block_size: int, fixed: int = 0):
        """``states``: (blocks now, left tokens, seqs) per request; ``fixed``: blocks held
        by others (left 0)."""
        self._bs = block_size
        ordered = sorted(states, key=lambda s: -s[1])
        self._lefts: list[int] = []  # negated, ascending: for bisect
        self._sums: list[int] = []  # Σ b over 1..i
        self._seqs: list[int] = []  # Σ seqs over 1..i
        self._points: list[int] = []  # the peak candidate at i
        h = s = 0
        for blocks, left, seqs in ordered:
            h += blocks
            s += seqs
            self._lefts.append(-left)
            self._sums.append(h)
            self._seqs.append(s)
            self._points.append(h + s * _up(left, block_size))
        self.now_blocks = h + fixed
        self.peak = (max(self._points) if self._points else 0) + fixed
        self._fixed = fixed

    def with_new(self, blocks: int, left: int, seqs: int) -> int:
        """The peak with one more request of ``blocks`` now, ``left`` tokens per sequence
        ahead and ``seqs`` sequences."""
        k = bisect_left(self._lefts, -left + 1) if self._lefts else 0
        # requests 0..k-1 have left ≥ left (ties: the new one after them)
        best = max(self._points[:k], default=0)
        h = self._sums[k - 1] if k else 0
        s = self._seqs[k - 1] if k else 0
        bs = self._bs
        best = max(best, h + blocks + (s + seqs) * _up(left, bs))
        for i in range(k, len(self._points)):
            best = max(best, self._points[i] + blocks + seqs * _up(-self._lefts[i], bs))
        return best + self._fixed


def peak_of(states: list[tuple[int, int, int]], block_size: int) -> int:
    """The peak of ``states`` (blocks now, left tokens, seqs): the module docstring's
    formula, for tests and ``ice signals``."""
    return Peaks(states, block_size).peak
