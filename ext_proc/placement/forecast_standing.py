"""The standing forecast of one endpoint: what ``ForecastBook.fit`` reads between decisions
where the endpoint runs many requests (``admission: forecast`` at a GPU pool's scale).

The fit at a decision's time reads every trajectory: n states, a length quantile each, a
sort (O(n log n)). A ``Standing`` is built once for a span [t0, t1] and serves every
decision within it; a one-sequence request then costs O(bs log n) (``Peaks.with_new``).

- **Upper states over the span.** g(t) is nondecreasing in time, so for any now in the span
  g0 = g(t0) ≤ g(now) ≤ g1 = g(t1); T(g) is nondecreasing in g (``ext_proc.policy.output_dist``:
  the target rises with F(g)). A trajectory's blocks L decode steps after now are
  b(g + L) for L ≤ T(g) − g, at most b(g1 + L) for L ≤ T(g1) − g0. Its upper state is

      (b̂, ℓ̂, ŝ, room̂) = (b(g1), max(0, T(g1) − g0), seqs, room(g1))

  and, placed by Envoy (a share p = 1/endpoints of it counts), b̂ = ⌈b(g0) p⌉ +
  ⌈seqs p⌉ × (b(g1) − b(g0)) / seqs, ŝ = ⌈seqs p⌉ (⌈(x + y) p⌉ ≤ ⌈x p⌉ + ⌈y p⌉). The peak
  (the highest point of the stepped decode, a sum of the requests' steps) and the peak with
  a newcomer are then at most those of the upper states: never below the exact ones.
- **Blocks now** (Σ b_j in ``other``, where more blocks now mean a larger budget) are read at
  t0: Σ ⌈b(g0) p⌉, never above the exact sum.
- **The span.** t1 = t0 + ``TICK_TOKENS`` / r (r the decode rate; r unknown: nothing is
  generated and states do not move with time, ``MAX_SPAN_S``): each request is read at most
  ``TICK_TOKENS`` tokens ahead of where it is, and predicted from there. When the last build
  took longer than a quarter of that (a loaded machine, a large endpoint), the span is 4
  times the build's time, and the tokens ahead r × that: else a build outlasting the span
  would leave every decision building again.
- **Changes within the span.** A request passed after t0 counts flat at its upper final
  blocks, b̂ + ŝ × ⌈max(0, ℓ̂ − room̂) / bs⌉, at every point of the peak (the peak of a sum is
  at most the sum of the peaks), and its blocks at t0 join the blocks now. A request that
  ended stays in the peak (a peak without a request is not higher) and leaves the blocks
  now. After ``rebuild_after(n)`` such changes the standing is built again.
- **Kinds' factors** (``forecast.refine``) move with every finished request (a ratio of
  means over the last 1,024). Stretching a kind's lengths by ρ = f'/f gives
  x_{f'}(g) = ρ × x_f(g / ρ) (F_{f'}(x) = F_f(x / ρ), and every branch of
  ``remaining_total`` scales alike), so for every f' within [f / (1 + ε), f × (1 + ε)]
  T_{f'}(g) ≤ min(limit, max(floor, g, ⌈(1 + ε) × T_f(⌈(1 + ε) g⌉)⌉ + 1))
  (``banded_total``; + 1 for the float rounding; x_f nondecreasing). A kind whose f is 1
  (a single kind, or too few observations) is read exactly and any move builds again.
- **Built again** also at t1, when the outlook's readings change (r, d, the length
  histogram, the limit share, the profile, the block size), when a kind's factor leaves
  its band, when the caution rises above the standing's (a caution that falls within the
  span only lowers the exact totals), and when a trajectory is recounted
  (``ForecastBook.changed``).

The bound: the standing's peak exceeds the exact one by at most what each running request
adds in ``TICK_TOKENS`` more tokens, or r × the span (⌈tokens / bs⌉ blocks a sequence), and
in its prediction from there (T(g1) instead of T(g); with kinds refined, (1 + ε) T at
(1 + ε) g, + 1), plus the final blocks of the requests passed since t0 (at most
``rebuild_after(n)``).
Decisions move only towards refusing.

Invariant: ``low`` maps each member and counted newcomer to its blocks at t0, and
``blocks_now`` is their sum; ``flat`` is the sum of the counted newcomers' final blocks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ext_proc.placement.forecast import Outlook, Peaks, Trajectory
from ext_proc.placement.length_kinds import Kind, limit_bucket

__all__ = [
    "FACTOR_BAND",
    "MAX_SPAN_S",
    "TICK_TOKENS",
    "Standing",
    "banded_total",
    "rebuild_after",
    "upper_state",
]

TICK_TOKENS = 16  # tokens a request may generate within one standing's span
FACTOR_BAND = 1.0 / 32  # ε: a kind's factor may move by × (1 + ε)^±1 within one standing
MAX_SPAN_S = 1.0  # the span when the decode rate is unknown


def rebuild_after(members: int) -> int:
    """Changes (requests passed or ended) a standing of ``members`` takes before it is
    built again: 1/64 of them, at least 16."""
    return max(16, members // 64)


def upper_state(
    look: Outlook, t: Trajectory, part: float, t0: float, t1: float
) -> tuple[tuple[int, int, int, int], int]:
    """(the upper state over [t0, t1], the blocks at t0) of ``t`` counted at ``part`` (the
    module docstring)."""
    seqs = math.ceil(t.seqs * part)
    if t.whole is not None:
        b = math.ceil(t.whole * part)
        return (b, 0, seqs, 0), b
    g0, g1 = look.generated(t, t0), look.generated(t, t1)
    left = max(0, banded_total(look, g1, t.limit, t.floor, t.kind) - g0)
    b0, _ = look.held(t, g0)
    b1, room1 = look.held(t, g1)
    low = math.ceil(b0 * part)
    high = b1 if part >= 1.0 else low + seqs * ((b1 - b0) // t.seqs)
    return (high, left, seqs, room1), low


def banded_total(look: Outlook, g: int, limit: int, floor: int, profile: str) -> int:
    """T of a request of ``profile`` with output limit ``limit`` at ``g``, for every factor
    f' of its kind within the band of the outlook's f (the module docstring): T itself when
    f is 1, else min(limit, max(floor, g, ⌈(1 + ε) × T_f(⌈(1 + ε) g⌉)⌉ + 1))."""
    if look.factor_of((profile, limit_bucket(limit))) == 1.0:
        return look.total(g, limit, floor, profile)
    e = 1.0 + FACTOR_BAND
    shifted = look.total(math.ceil(g * e), limit, floor, profile)
    return min(limit, max(floor, g, math.ceil(shifted * e) + 1))


def _readings(look: Outlook) -> tuple[object, ...]:
    return (
        look.rate,
        look.delay_s,
        id(look.lengths),
        look.limit_share,
        look.block_size,
        look.spec,
        look.profile,
        look.factor is None,
    )


@dataclass(slots=True, eq=False)
class Standing:
    """One endpoint's standing forecast over [t0, t1] (the module docstring)."""

    look: Outlook
    t0: float
    t1: float
    peaks: Peaks  # of the upper states, no fixed blocks
    low: dict[int, int]  # id(trajectory) → its blocks at t0 (members and counted newcomers)
    blocks_now: int
    factors: dict[Kind, float]  # f_k of the members' kinds when built
    part: dict[str, float]  # endpoint → the share its trajectories count at
    flat: int = 0
    changes: int = 0
    pending: list[tuple[Trajectory, float]] = field(default_factory=list)
    build_s: float = 0.0  # how long its build took (the next one's span is 4 times that)

    @classmethod
    def build(
        cls,
        look: Outlook,
        members: list[tuple[Trajectory, float]],
        now: float,
        parts: dict[str, float],
        least_s: float = 0.0,
    ) -> Standing:
        """The standing of ``members`` (trajectory, share) from ``now``, for a span of at
        least ``least_s``."""
        span = TICK_TOKENS / look.rate if look.rate else MAX_SPAN_S
        t1 = now + max(min(span, MAX_SPAN_S), least_s)
        states, low, factors = [], {}, {}
        rate, delay, bs = look.rate or 0.0, look.delay_s, look.block_size
        totals: dict[tuple[str, int, int, int], int] = {}
        limits: set[tuple[str, int]] = set()  # (profile, output limit) of the members read
        for t, part in members:
            if t.whole is not None or part < 1.0:
                state, low[id(t)] = upper_state(look, t, part, now, t1)
                limits.add((t.kind, t.limit))
                states.append(state)
                continue
            # upper_state of a trajectory counted whole, inline (the build's hot loop)
            s = t.start_s if t.runs_s is None else t.runs_s
            g0 = min(t.limit, int(rate * max(0.0, now - s - delay)))
            g1 = min(t.limit, int(rate * max(0.0, t1 - s - delay)))
            key = (t.kind, t.limit, t.floor, g1)
            total = totals.get(key)
            if total is None:
                total = totals[key] = banded_total(look, g1, t.limit, t.floor, t.kind)
            if t.tokens is None:
                low[id(t)] = t.prompt_blocks + t.seqs * -(-g0 // bs)
                states.append(
                    (t.prompt_blocks + t.seqs * -(-g1 // bs), max(0, total - g0), t.seqs, 0)
                )
                continue
            first = -(-t.tokens // bs)
            x = t.tokens + g1
            low[id(t)] = t.prompt_blocks + t.seqs * (-(-(t.tokens + g0) // bs) - first)
            high = t.prompt_blocks + t.seqs * (-(-x // bs) - first)
            states.append((high, max(0, total - g0), t.seqs, -x % bs))
        for profile, limit in limits | {(k[0], k[1]) for k in totals}:
            kind = (profile, limit_bucket(limit))
            if kind not in factors:
                factors[kind] = look.factor_of(kind)
        peaks = Peaks(states, bs)
        return cls(look, now, t1, peaks, low, sum(low.values()), factors, parts)

    def fresh(self, look: Outlook, now: float, members: int) -> bool:
        """Whether decisions at ``now`` under ``look`` may read this standing."""
        limit = min(rebuild_after(members), rebuild_after(len(self.low)))
        if not self.t0 <= now <= self.t1 or self.changes > limit:
            return False
        if look.caution > self.look.caution or _readings(look) != _readings(self.look):
            return False
        e = 1.0 + FACTOR_BAND
        for kind, f in self.factors.items():
            now_f = look.factor_of(kind)
            if now_f != f and (f == 1.0 or not f / e <= now_f <= f * e):
                return False
        return True

    def added(self, t: Trajectory, endpoint: str) -> None:
        """``t`` was passed to ``endpoint`` (one this standing counts) after t0. Past
        ``rebuild_after`` changes the standing is built again before it is read: what is
        passed then is not kept (an endpoint no longer judged keeps nothing growing)."""
        self.changes += 1
        if self.changes > rebuild_after(len(self.low)):
            self.pending.clear()
            return
        self.pending.append((t, self.part[endpoint]))

    def removed(self, t: Trajectory) -> None:
        """``t`` ended: it leaves the blocks now (and the newcomers not yet counted)."""
        self.changes += 1
        blocks = self.low.pop(id(t), None)
        if blocks is not None:
            self.blocks_now -= blocks
        else:
            self.pending = [(p, s) for p, s in self.pending if p is not t]

    def extra(self) -> int:
        """The newcomers' final blocks, counted flat (those passed since the last call are
        read now)."""
        bs, look = self.look.block_size, self.look
        for t, part in self.pending:
            kind = (t.kind, limit_bucket(t.limit))
            if kind not in self.factors:  # a new kind's factor is watched from now on
                self.factors[kind] = look.factor_of(kind)
            (b, left, seqs, room), blocks = upper_state(look, t, part, self.t0, self.t1)
            self.flat += b + seqs * -(-max(0, left - room) // bs)
            self.low[id(t)] = blocks
            self.blocks_now += blocks
        self.pending.clear()
        return self.flat
