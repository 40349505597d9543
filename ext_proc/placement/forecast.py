"""The forecast of one endpoint's KV blocks over time (``admission: forecast``).

Each request ICE passed to an endpoint is a ``Trajectory``: its prompt blocks at admission
(all its sequences, prefix sharing counted: ``KvFit.need(shape, 0)``), its sequences, its
output limit and floor, and when it was passed. At time t it has generated

    g(t) = min(limit, floor(r × max(0, t − s − d)))        tokens per sequence

where s is when it starts running (when it was passed, or, for a request admitted to start
within the wait, ``forecast.start_within_s``, the predicted end that frees its room:
``Trajectory.runs_s``), r is the endpoint's decode rate per running sequence and d the delay
to its first token (``ForecastBook.outlook``; r unknown: 0, so nothing is assumed generated
and every request keeps its whole predicted output ahead). It holds

    b(t) = prompt_blocks + seqs × (ceil((P + g) / bs) − ceil(P / bs))     blocks

with P its prompt tokens per sequence (``Trajectory.tokens``, where a sequence's blocks are
ceil(tokens / bs): one prompt, full attention; otherwise P is taken as filling its last
block, b = prompt_blocks + seqs × ceil(g / bs), an upper bound), room = the free slots of
each sequence's last block, and has ``left`` = T − g(t) tokens per sequence ahead, T its
expected total (``ext_proc.policy.output_dist.remaining_total``: the quantile of the pool's output
lengths given g, capped at the limit). A request held whole (``admission: reserve``, or a
forecast one while the length distribution is not trusted yet) has left = 0 and b = its
whole need.

**The peak** (Past-Future, LightLLM, ASPLOS 2025): the running requests sorted by ``left``,
longest first; just before request i finishes (after left_i more decode steps) the
requests 1..i still run, each grown by left_i tokens per sequence, and the others are gone:

    peak = max over i of [ Σ_{j ≤ i} b_j + seqs_j × ceil(max(0, left_i − room_j) / bs) ]

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

from bisect import bisect_left, bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import accumulate
from operator import itemgetter

from ext_proc.placement.length_kinds import Kind, limit_bucket, scaled
from ext_proc.policy.kvfit import Shape
from ext_proc.policy.output_dist import remaining_total
from ext_proc.policy.settings import ForecastSpec, Profile
from ext_proc.signals.scrapes import Histogram

__all__ = ["MEMO_KEPT", "Outlook", "Peaks", "Trajectory", "peak_of", "slot_tokens"]

MEMO_KEPT = 65536  # totals one memo keeps before it starts again
FAST_FROM = 32  # requests from which a one-sequence ``Peaks.with_new`` reads its index


@dataclass(slots=True, eq=False)
class Trajectory:
    """One passed request as the forecast sees it (see the module docstring)."""

    start_s: float
    prompt_blocks: int
    seqs: int
    limit: int  # output tokens per sequence the backend may run
    floor: int = 0  # output it must run (min_tokens)
    whole: int | None = None  # blocks held whole for its whole life (reserve); None: forecast
    # prompt tokens of each sequence where its blocks are ceil(tokens / block_size) (one
    # prompt, full attention): its last block's free slots count; None: taken as full
    tokens: int | None = None
    # when it is predicted to start running (admitted to start within the wait: it waits in
    # the backend's queue until then, its prompt blocks counted from ``start_s`` as an upper
    # bound); None: at ``start_s``
    runs_s: float | None = None
    kind: str = ""  # its profile's name: with its limit bucket, its kind (placement.length_kinds)

    @property
    def running_from(self) -> float:
        """s in g(t): when it starts running."""
        return self.start_s if self.runs_s is None else self.runs_s

    def waiting_at(self, t: float) -> bool:
        """Admitted by ``t`` and planned to be still in the backend's queue then."""
        return self.runs_s is not None and self.start_s <= t < self.runs_s


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
    limit_share: float = 0.0  # p: finished requests that ran to their limit (outlen)
    # the profile judged, and f_k of a kind (``ext_proc.placement.length_kinds``; None: all 1)
    profile: str = ""
    # not compared: two outlooks of the same readings are equal whatever they memoised
    factor: Callable[[Kind], float] | None = field(default=None, compare=False)
    # T by (kind, f_k, generated, limit, floor), shared by the outlooks of equal length
    # readings (``ForecastBook.outlook``); None: not memoised
    memo: dict[tuple[str, int, float, int, int, int], int] | None = field(
        default=None, compare=False
    )
    _refined: dict[Kind, Histogram | None] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    _factors: dict[Kind, float] = field(default_factory=dict, init=False, repr=False, compare=False)

    def factor_of(self, kind: Kind) -> float:
        """f_k of ``kind`` (1 without refinement), read once per outlook."""
        if self.factor is None or self.lengths is None:
            return 1.0
        got = self._factors.get(kind)
        if got is None:
            got = self._factors[kind] = self.factor(kind)
        return got

    def lengths_of(self, kind: Kind) -> Histogram | None:
        """The length distribution of ``kind``: the backend's, bounds × f_k."""
        if self.factor is None or self.lengths is None:
            return self.lengths
        got = self._refined.get(kind)
        if got is None:
            got = self._refined[kind] = scaled(self.lengths, self.factor_of(kind))
        return got

    def total(self, generated: int, limit: int, floor: int, profile: str | None = None) -> int:
        """T: the expected total output per sequence of a request of ``profile`` (None: the
        one judged) with output limit ``limit`` that has generated ``generated``."""
        kind = (self.profile if profile is None else profile, limit_bucket(limit))
        memo = self.memo
        if memo is not None:
            key = (kind[0], kind[1], self.factor_of(kind), generated, limit, floor)
            got = memo.get(key)
            if got is not None:
                return got
        total = remaining_total(
            self.lengths_of(kind),
            self.spec.quantile,
            generated,
            limit,
            floor,
            self.spec.min_observations,
            self.caution,
            self.limit_share,
        )
        if memo is not None:
            if len(memo) >= MEMO_KEPT:
                memo.clear()
            memo[key] = total
        return total

    def generated(self, t: Trajectory, now_s: float) -> int:
        """g(t): output tokens per sequence ``t`` has generated by ``now_s``."""
        rate = self.rate or 0.0
        return min(t.limit, int(rate * max(0.0, now_s - t.running_from - self.delay_s)))

    def end_s(self, t: Trajectory, now_s: float) -> float | None:
        """When ``t`` is predicted to finish: s + d + T / r, with T its expected total
        given what it has generated by ``now_s``; None when held whole or r is unknown."""
        if t.whole is not None or not self.rate:
            return None
        total = self.total(self.generated(t, now_s), t.limit, t.floor, t.kind)
        return t.running_from + self.delay_s + total / self.rate

    def state(self, t: Trajectory, now_s: float) -> tuple[int, int, int]:
        """(blocks held now, output tokens per sequence still ahead, free slots in each
        sequence's last block) of ``t``."""
        if t.whole is not None:
            return t.whole, 0, 0
        g = self.generated(t, now_s)
        left = max(0, self.total(g, t.limit, t.floor, t.kind) - g)
        blocks, room = self.held(t, g)
        return blocks, left, room

    def held(self, t: Trajectory, g: int) -> tuple[int, int]:
        """(blocks, free slots in each sequence's last block) of ``t`` (not held whole)
        when it has generated ``g`` tokens per sequence: b(t) and room of the module
        docstring."""
        bs = self.block_size
        if t.tokens is None:
            return t.prompt_blocks + t.seqs * _up(g, bs), 0
        x = t.tokens + g
        return t.prompt_blocks + t.seqs * (_up(x, bs) - _up(t.tokens, bs)), -x % bs


def slot_tokens(shape: Shape, profile: Profile) -> int | None:
    """The prompt tokens per sequence whose last block's free slots the forecast counts
    (``Trajectory.tokens``): one prompt, no stored-context window, full attention (no
    ``kv_model`` geometry); None otherwise (the last block is taken as full)."""
    if len(shape.groups) != 1 or shape.window or profile.kv_model is not None:
        return None
    return shape.groups[0][0]


def _up(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


def _grow(left: int, room: int, bs: int) -> int:
    """Blocks one sequence with ``room`` free slots in its last block adds over ``left``
    more tokens: ceil(max(0, left − room) / bs)."""
    return _up(max(0, left - room), bs)


class _Index:
    """What ``Peaks.with_new`` reads in O(bs log n) instead of O(n): the prefix maxima of
    the points; per free-slot count ρ, the positions of the requests with that room and their
    running sum of sequences (Σ_{j<k} seqs_j [room_j ≥ m] is a bisect per ρ ≥ m); per
    m = left mod bs, the positions of the requests with that remainder and, per number of
    sequences s of a newcomer (built when first asked), the suffix maxima of
    point_i + s × ceil(left_i / bs) over them: a newcomer of s sequences with room ρ adds
    s × (ceil(left_i / bs) − [0 < m ≤ ρ]) blocks at point i."""

    __slots__ = ("by_room", "classes", "prefix_max", "tails")

    def __init__(self, peaks: Peaks) -> None:
        bs, n = peaks._bs, len(peaks._points)
        self.prefix_max = list(accumulate(peaks._points, max))
        rooms = [r for r, _ in peaks._rooms]
        seqs = [s for _, s in peaks._rooms]
        self.by_room = [
            (r, (pos, list(accumulate([seqs[i] for i in pos], initial=0))))
            for r, pos in _groups(rooms, n)
        ]
        self.classes = _groups([-left % bs for left in peaks._lefts], n)
        self.tails: dict[int, list[list[int]]] = {}  # s → per class, the suffix maxima

    def tail(self, peaks: Peaks, s: int) -> list[list[int]]:
        """Per class (``classes``' order), the suffix maxima of point_i + s × c_i."""
        got = self.tails.get(s)
        if got is None:
            got = self.tails[s] = []
            points, lefts, bs = peaks._points, peaks._lefts, peaks._bs
            for _, pos in self.classes:
                vals = [points[i] - s * (lefts[i] // bs) for i in pos]  # c_i = −(−left // bs)
                got.append(list(accumulate(reversed(vals), max))[::-1])
        return got


def _groups(keys: list[int], n: int) -> list[tuple[int, list[int]]]:
    """The positions 0..n−1 grouped by ``keys[i]``, each group ascending, by key."""
    order = sorted(range(n), key=keys.__getitem__)  # stable: positions ascend in a group
    ranked = [keys[i] for i in order]
    out, lo = [], 0
    while lo < n:
        hi = bisect_right(ranked, ranked[lo], lo)
        out.append((ranked[lo], order[lo:hi]))
        lo = hi
    return out


class Peaks:
    """The running requests of one endpoint, sorted for the peak; ``with_new`` gives the
    peak with one more request in O(bs log n) (``_Index``; the module docstring's formula)."""

    __slots__ = (
        "_bs",
        "_fixed",
        "_index",
        "_lefts",
        "_points",
        "_rooms",
        "_seqs",
        "_sums",
        "now_blocks",
        "peak",
    )

    def __init__(self, states: list[tuple[int, int, int, int]], block_size: int, fixed: int = 0):
        """``states``: (blocks now, left tokens, seqs, free slots of its last block) per
        request; ``fixed``: blocks held by others (left 0)."""
        bs = self._bs = block_size
        ordered = sorted(states, key=itemgetter(1), reverse=True)  # stable: ties in order
        self._lefts = [-x[1] for x in ordered]  # negated, ascending: for bisect
        self._sums = list(accumulate([x[0] for x in ordered]))  # Σ b over 1..i
        self._seqs = list(accumulate([x[2] for x in ordered]))  # Σ seqs over 1..i
        self._rooms = [(x[3], x[2]) for x in ordered]  # (free slots, seqs) of each
        self._index: _Index | None = None  # built by the first fast ``with_new``
        # the peak candidate at i: Σ_{j ≤ i} b_j + seqs_j × _grow(left_i, room_j), each
        # grow ceil(left_i / bs), less one for a sequence whose free slots hold the last
        # partial block's m = left_i mod bs: a Fenwick tree of the sequences by free slots,
        # reversed (a prefix is "room ≥ m"), O(log bs) each
        tree = [0] * (bs + 1)
        top = bs
        points: list[int] = []
        for (_, left, seqs, room), h, s in zip(ordered, self._sums, self._seqs, strict=True):
            i = top - room
            while i <= top:
                tree[i] += seqs
                i += i & -i
            m = left % bs
            fewer = 0
            i = top - m if m else 0
            while i > 0:
                fewer += tree[i]
                i -= i & -i
            points.append(h + s * -(-left // bs) - fewer)
        self._points = points
        h = self._sums[-1] if ordered else 0
        self.now_blocks = h + fixed
        self.peak = (max(self._points) if self._points else 0) + fixed
        self._fixed = fixed

    @property
    def fixed(self) -> int:
        """Blocks held by others (left 0), counted in every point."""
        return self._fixed

    def __len__(self) -> int:
        return len(self._points)

    def with_new(self, blocks: int, left: int, seqs: int, room: int = 0) -> int:
        """The peak with one more request of ``blocks`` now, ``left`` tokens per sequence
        ahead, ``seqs`` sequences and ``room`` free slots in each one's last block."""
        if len(self._points) < FAST_FROM:
            return self.with_new_slow(blocks, left, seqs, room)
        index = self._index
        if index is None:
            index = self._index = _Index(self)
        k = bisect_left(self._lefts, -left + 1)  # requests 0..k-1 have left ≥ left
        bs = self._bs
        best = index.prefix_max[k - 1] if k else 0
        grown = 0
        if k:
            # Σ_{j<k} seqs_j × _grow(left, room_j) = S_k × ceil(left / bs) − those whose room
            # holds m = left mod bs > 0
            grown = self._seqs[k - 1] * _up(left, bs)
            m = left % bs
            if m:
                for r, (pos, cum) in index.by_room:
                    if r >= m:
                        grown -= cum[bisect_left(pos, k)]
            grown += self._sums[k - 1]
        best = max(best, grown + blocks + seqs * _grow(left, room, bs))
        tails = index.tail(self, seqs)
        for (m, pos), vals in zip(index.classes, tails, strict=True):  # those ending first
            j = bisect_left(pos, k)
            if j < len(pos):
                best = max(best, vals[j] - seqs * (0 < m <= room) + blocks)
        return best + self._fixed

    def with_new_slow(self, blocks: int, left: int, seqs: int, room: int = 0) -> int:
        """``with_new`` in O(n), the formula term by term (any number of sequences)."""
        k = bisect_left(self._lefts, -left + 1) if self._lefts else 0
        # requests 0..k-1 have left ≥ left (ties: the new one after them)
        best = max(self._points[:k], default=0)
        bs = self._bs
        h = self._sums[k - 1] if k else 0
        grown = sum(n * _grow(left, r, bs) for r, n in self._rooms[:k])
        best = max(best, h + grown + blocks + seqs * _grow(left, room, bs))
        for i in range(k, len(self._points)):
            best = max(best, self._points[i] + blocks + seqs * _grow(-self._lefts[i], room, bs))
        return best + self._fixed


def peak_of(states: list[tuple[int, int, int, int]], block_size: int) -> int:
    """The peak of ``states`` (blocks now, left tokens, seqs, free slots of the last block):
    the module docstring's formula, for tests and ``ice signals``."""
    return Peaks(states, block_size).peak
