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
expected total (``ext_proc.policy.outlen.remaining_total``: the quantile of the pool's output
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

from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass, field

from ext_proc.placement.lengths import Kind, limit_bucket, scaled
from ext_proc.policy.kvfit import Shape
from ext_proc.policy.model import ForecastSpec, Profile
from ext_proc.policy.outlen import remaining_total
from ext_proc.signals.model import Histogram

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
    kind: str = ""  # its profile's name: with its limit bucket, its kind (placement.lengths)

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
    # the profile judged, and f_k of a kind (``ext_proc.placement.lengths``; None: all 1)
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


class _Counts:
    """Sequences by the free slots of their last block (0..block_size − 1): a Fenwick tree,
    so that "sequences with at least m free slots" costs O(log block_size)."""

    __slots__ = ("_tree",)

    def __init__(self, block_size: int) -> None:
        self._tree = [0] * (block_size + 1)

    def add(self, room: int, seqs: int) -> None:
        i = len(self._tree) - 1 - room  # reversed: a prefix is "room ≥ m"
        while i < len(self._tree):
            self._tree[i] += seqs
            i += i & -i

    def at_least(self, m: int) -> int:
        i, total = len(self._tree) - 1 - m, 0
        while i > 0:
            total += self._tree[i]
            i -= i & -i
        return total


def _grow(left: int, room: int, bs: int) -> int:
    """Blocks one sequence with ``room`` free slots in its last block adds over ``left``
    more tokens: ceil(max(0, left − room) / bs)."""
    return _up(max(0, left - room), bs)


class _Index:
    """What ``Peaks.with_new`` reads for a one-sequence request in O(bs log n) instead of
    O(n): the prefix maxima of the points; per free-slot count ρ, the positions of the
    requests with that room and their running sum of sequences (Σ_{j<k} seqs_j [room_j ≥ m]
    is a bisect per ρ ≥ m); per m = left mod bs, the positions of the requests with that
    remainder and the suffix maxima of point_i + ceil(left_i / bs) over them (a one-sequence
    newcomer with room ρ adds ceil(left_i / bs) − [0 < m ≤ ρ] blocks at point i)."""

    __slots__ = ("by_class", "by_room", "prefix_max")

    def __init__(self, peaks: Peaks) -> None:
        bs = peaks._bs
        self.prefix_max: list[int] = []
        best = 0
        rooms: dict[int, tuple[list[int], list[int]]] = {}
        classes: dict[int, tuple[list[int], list[int]]] = {}
        for i, point in enumerate(peaks._points):
            best = max(best, point)
            self.prefix_max.append(best)
            room, seqs = peaks._rooms[i]
            pos, cum = rooms.setdefault(room, ([], [0]))
            pos.append(i)
            cum.append(cum[-1] + seqs)
            left = -peaks._lefts[i]
            pos, vals = classes.setdefault(left % bs, ([], []))
            pos.append(i)
            vals.append(point + _up(left, bs))
        for _, vals in classes.values():  # suffix maxima, in place
            for j in range(len(vals) - 2, -1, -1):
                vals[j] = max(vals[j], vals[j + 1])
        self.by_room = sorted(rooms.items())
        self.by_class = sorted(classes.items())


class Peaks:
    """The running requests of one endpoint, sorted for the peak; ``with_new`` gives the
    peak with one more request: O(bs log n) for one sequence (``_Index``), O(n) for more
    (the module docstring's formula)."""

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
        ordered = sorted(states, key=lambda s: -s[1])
        self._lefts: list[int] = []  # negated, ascending: for bisect
        self._sums: list[int] = []  # Σ b over 1..i
        self._seqs: list[int] = []  # Σ seqs over 1..i
        self._rooms: list[tuple[int, int]] = []  # (free slots, seqs) of 1..i
        self._points: list[int] = []  # the peak candidate at i
        self._index: _Index | None = None  # built by the first one-sequence ``with_new``
        counts = _Counts(bs)
        h = s = 0
        for blocks, left, seqs, room in ordered:
            h += blocks
            s += seqs
            counts.add(room, seqs)
            self._lefts.append(-left)
            self._sums.append(h)
            self._seqs.append(s)
            self._rooms.append((room, seqs))
            # Σ_{j ≤ i} seqs_j × _grow(left, room_j): each is ceil(left / bs), less one for
            # a sequence whose free slots hold the last partial block's m = left mod bs
            m = left % bs
            fewer = counts.at_least(m) if m else 0
            self._points.append(h + s * _up(left, bs) - fewer)
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
        if seqs != 1 or len(self._points) < FAST_FROM:
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
        best = max(best, grown + blocks + _grow(left, room, bs))
        for m, (pos, vals) in index.by_class:  # the requests that end first: i ≥ k
            j = bisect_left(pos, k)
            if j < len(pos):
                best = max(best, vals[j] - (0 < m <= room) + blocks)
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
