"""The forecast at scale (``ext_proc.placement.forecast_standing``, ``Peaks.with_new``'s
index): against a reference written here, the straightforward computation the fit made at
every decision before (every trajectory read at the decision's time, the peak by stepping
the decode), the index's peak with a newcomer is the same, and a standing forecast's
decisions never admit what the reference refuses (its free blocks never more, its peak
never less), as requests come and go and the decode rate moves."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from unittest.mock import patch

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ext_proc.placement import forecast, forecast_book
from ext_proc.placement.forecast import Outlook, Peaks, Trajectory
from ext_proc.placement.forecast_book import ForecastBook
from ext_proc.placement.forecast_standing import (
    FACTOR_BAND,
    TICK_TOKENS,
    banded_total,
    rebuild_after,
)
from ext_proc.placement.length_kinds import limit_bucket, scaled
from ext_proc.policy.kvfit import KvFit, Shape
from ext_proc.policy.output_dist import remaining_total
from ext_proc.policy.settings import ForecastSpec, Profile
from ext_proc.signals.scrapes import Derived, Histogram
from ext_proc.signals.snapshot import BackendSignals

INF = math.inf
BS = 16
LENGTHS = Histogram(bounds=(10, 50, 100, 200, INF), counts=(20, 60, 90, 100, 100), count=100, sum=0)
QUANTILE, MARGIN = 0.5, 0.05

# --- the reference ------------------------------------------------------------------------


def stepped_peak(states: list[tuple[int, int, int, int]], bs: int) -> int:
    """Step the decode: at step L the requests with left ≥ L hold b + seqs × ceil((L −
    room) / bs) (their last block's free slots filled first); the highest step."""
    horizon = max((s[1] for s in states), default=0)
    best = 0
    for step in range(horizon + 1):
        held = sum(
            b + seqs * -(-max(0, step - room) // bs)
            for b, left, seqs, room in states
            if left >= step
        )
        best = max(best, held)
    return best


@dataclass
class World:
    """What the reference reads: the trajectories (with where they run), the backend's
    readings and the view."""

    here: list[Trajectory]
    anywhere: list[Trajectory]
    endpoints: int
    rate: float | None
    delay_s: float
    base: KvFit


def reference_states(w: World, now: float) -> list[tuple[int, int, int, int]]:
    """Every trajectory read at ``now``: (blocks, left, seqs, room), Envoy-placed ones at
    1/endpoints."""
    out = []
    share = 1.0 / max(1, w.endpoints)
    for part, ts in ((1.0, w.here), (share, w.anywhere)):
        for t in ts:
            if t.whole is not None:
                b, left, room = t.whole, 0, 0
            else:
                s = t.start_s if t.runs_s is None else t.runs_s
                g = min(t.limit, int((w.rate or 0.0) * max(0.0, now - s - w.delay_s)))
                total = remaining_total(LENGTHS, QUANTILE, g, t.limit, t.floor)
                left = max(0, total - g)
                assert t.tokens is not None
                x = t.tokens + g
                b = t.prompt_blocks + t.seqs * (-(-x // BS) - -(-t.tokens // BS))
                room = -x % BS
            out.append((math.ceil(b * part), left, math.ceil(t.seqs * part), room))
    return out


def reference_decision(
    w: World, now: float, unseen: int, others: int, prompt: int, seqs: int, limit: int
) -> tuple[int, int, int]:
    """(free blocks, the newcomer's charge, the peak): the fit's formulas, term by term."""
    states = reference_states(w, now)
    blocks_now = sum(s[0] for s in states) + others
    peak = stepped_peak(states, BS) + others
    u, f = w.base.usable_blocks, w.base.free_blocks
    other = max(0, (u - f) - blocks_now)
    budget = math.floor(u * (1.0 - MARGIN)) - other
    free = max(0, budget - peak)
    gap = max(0, free - max(0, f - unseen))
    shape = Shape(((prompt, 1),), seqs)
    start = w.base.need(shape, 1) if limit > 0 else w.base.need(shape, 0)
    total = remaining_total(LENGTHS, QUANTILE, 0, limit, 0)
    new = (w.base.need(shape, 0), total, seqs, -prompt % BS)
    added = stepped_peak([*states, new], BS) + others - peak
    return free, max(added, start + gap), peak


# --- the peak with a newcomer, from the index ---------------------------------------------


def state(bs: int) -> st.SearchStrategy[tuple[int, int, int, int]]:
    return st.tuples(
        st.integers(0, 40), st.integers(0, 300), st.integers(1, 4), st.integers(0, bs - 1)
    )


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from([1, 2, 16, 128]).flatmap(
        lambda bs: st.tuples(
            st.lists(state(bs), max_size=14), state(bs), st.integers(0, 9), st.just(bs)
        )
    )
)
def test_the_indexed_peak_with_a_newcomer_is_the_stepped_decodes(
    case: tuple[list[tuple[int, int, int, int]], tuple[int, int, int, int], int, int],
) -> None:
    states, new, fixed, bs = case
    with patch.object(forecast, "FAST_FROM", 0):
        peaks = Peaks(states, bs, fixed)
        assert peaks.peak == stepped_peak(states, bs) + fixed
        assert peaks.with_new(*new) == stepped_peak([*states, new], bs) + fixed
        # the index is built once and serves the next newcomers too
        again = (new[0] + 1, new[1] // 2, new[2], new[3])
        assert peaks.with_new(*again) == stepped_peak([*states, again], bs) + fixed


def test_the_index_is_read_from_its_threshold() -> None:
    # below FAST_FROM the term-by-term formula answers; from it, the index (one example by
    # hand: A 2 blocks 100 ahead, B 3 blocks 10 ahead, C 1 block 50 ahead: 11)
    states = [(2, 100, 1, 0), (3, 10, 1, 0)]
    with patch.object(forecast, "FAST_FROM", 0):
        fast = Peaks(states, 16)
        assert fast.with_new(1, 50, 1) == 11
        assert fast._index is not None
    slow = Peaks(states, 16)
    assert slow.with_new(1, 50, 1) == 11
    assert slow._index is None


# --- a standing forecast against the reference --------------------------------------------


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def monotonic(self) -> float:
        return self.now


@contextmanager
def standing_from(n: int, clock: Clock) -> Iterator[None]:
    with (
        patch.object(forecast_book, "STANDING_FROM", n),
        patch.object(forecast, "FAST_FROM", 0),
        patch.object(forecast_book, "time", clock),
    ):
        yield


def trajectory(rnd: random.Random, now: float) -> Trajectory:
    tokens = rnd.randint(1, 100)
    seqs = rnd.choice((1, 1, 1, 2))
    t = Trajectory(
        start_s=now - rnd.uniform(0.0, 8.0),
        prompt_blocks=-(-tokens // BS) * seqs,
        seqs=seqs,
        limit=rnd.randint(1, 300),
        floor=rnd.choice((0, 0, 0, 40)),
        tokens=tokens,
        kind="p",
    )
    if rnd.random() < 0.1:
        t.whole = t.prompt_blocks + seqs * -(-t.limit // BS)
    if rnd.random() < 0.1:
        t.runs_s = now + rnd.uniform(0.0, 1.0)
    return t


def backend(rate: float | None, delay_s: float) -> BackendSignals:
    return BackendSignals(
        url="u",
        kv_cache_usage=0.5,
        num_requests_running=2,
        num_gpu_blocks=401,
        block_size=BS,
        output_lengths=LENGTHS,
        preemptions=0.0,
        itl_mean_s=None if rate is None else 1.0 / rate,
        derived=Derived(window_s=10.0, ttft_p50_s=delay_s),
    )


def blocks16(i: int, o: int) -> int:
    return -(-(i + o) // BS)


PROFILE = Profile(
    name="p", admission="forecast", forecast=ForecastSpec(quantile=QUANTILE, margin=MARGIN)
)


@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 10**9),
    n=st.integers(1, 12),
    endpoints=st.sampled_from([1, 2]),
    rates=st.tuples(st.sampled_from([None, 5.0, 40.0]), st.sampled_from([None, 5.0, 40.0])),
    delay_s=st.sampled_from([0.0, 0.2]),
    churn=st.integers(0, 6),
    after=st.floats(0.0, 1.0),
    free=st.integers(0, 400),
)
def test_a_standing_forecast_never_admits_what_the_reference_refuses(
    seed: int,
    n: int,
    endpoints: int,
    rates: tuple[float | None, float | None],
    delay_s: float,
    churn: int,
    after: float,
    free: int,
) -> None:
    rnd = random.Random(seed)
    t0 = 1000.0
    clock = Clock(t0)
    base = KvFit(free_blocks=free, usable_blocks=400, block_size=BS, blocks=blocks16)
    w = World([], [], endpoints, rates[0], delay_s, base)
    book = ForecastBook()
    for _ in range(n):
        t = trajectory(rnd, t0)
        where = rnd.choice(("e", "e", ""))
        (w.here if where == "e" else w.anywhere).append(t)
        book.add("pool", where, t)
    others, unseen = rnd.randint(0, 20), rnd.randint(0, free)
    with standing_from(1, clock):
        # the first decision builds the standing forecast at t0
        book.fit(PROFILE, "pool", "e", endpoints, backend(w.rate, delay_s), base, unseen, others)
        # requests come and go, the clock moves within the span (or past it), the rate may
        # change; then a decision
        for _ in range(churn):
            if rnd.random() < 0.5 and (w.here or w.anywhere):
                ts = w.here if w.here else w.anywhere
                gone = ts.pop(rnd.randrange(len(ts)))
                book.remove("pool", "e" if ts is w.here else "", gone)
            else:
                clock.now += rnd.uniform(0.0, 0.05)
                t = trajectory(rnd, clock.now)
                t.start_s = clock.now
                w.here.append(t)
                book.add("pool", "e", t)
        w.rate = rates[1]
        span = TICK_TOKENS / w.rate if w.rate else 1.0
        clock.now = max(clock.now, t0 + after * span * 1.2)
        book._last.clear()
        fit = book.fit(
            PROFILE, "pool", "e", endpoints, backend(w.rate, delay_s), base, unseen, others
        )
        for _ in range(3):
            prompt, seqs, limit = rnd.randint(1, 200), rnd.choice((1, 1, 2)), rnd.randint(0, 300)
            exact_free, exact_charge, _ = reference_decision(
                w, clock.now, unseen, others, prompt, seqs, limit
            )
            charge = fit.charge(Shape(((prompt, 1),), seqs), limit)
            assert fit.free_blocks <= exact_free
            if charge <= fit.free_blocks:  # admitted: the reference admits it too
                assert exact_charge <= exact_free


def test_a_fresh_standing_forecast_decides_as_the_reference() -> None:
    # built at the decision's time with the decode rate unknown (nothing moves with time)
    # and nothing since: the same free blocks and charges as the reference
    rnd = random.Random(5)
    clock = Clock(1000.0)
    base = KvFit(free_blocks=200, usable_blocks=400, block_size=BS, blocks=blocks16)
    w = World([], [], 1, None, 0.0, base)
    book = ForecastBook()
    for _ in range(10):
        t = trajectory(rnd, clock.now)
        w.here.append(t)
        book.add("pool", "e", t)
    with standing_from(1, clock):
        fit = book.fit(PROFILE, "pool", "e", 1, backend(None, 0.0), base, 30, 5)
        for prompt, seqs, limit in ((50, 1, 100), (120, 2, 300), (1, 1, 0), (90, 1, 250)):
            free, charge, _ = reference_decision(w, clock.now, 30, 5, prompt, seqs, limit)
            assert fit.free_blocks == free
            assert fit.charge(Shape(((prompt, 1),), seqs), limit) == charge


def test_a_standing_forecast_is_built_again_after_its_changes_and_its_span() -> None:
    clock = Clock(1000.0)
    base = KvFit(free_blocks=200, usable_blocks=400, block_size=BS, blocks=blocks16)
    book = ForecastBook()
    rnd = random.Random(1)
    for _ in range(4):
        book.add("pool", "e", trajectory(rnd, clock.now))
    b = backend(40.0, 0.0)
    with standing_from(1, clock):
        book.fit(PROFILE, "pool", "e", 1, b, base, 0, 0)
        first = book._standing["pool"][("e", 1)]
        for _ in range(rebuild_after(4)):  # newcomers counted flat
            book.add("pool", "e", trajectory(rnd, clock.now))
        book._last.clear()
        book.fit(PROFILE, "pool", "e", 1, b, base, 0, 0)
        assert book._standing["pool"][("e", 1)] is first
        assert first.flat > 0
        book.add("pool", "e", trajectory(rnd, clock.now))  # one change too many
        book._last.clear()
        book.fit(PROFILE, "pool", "e", 1, b, base, 0, 0)
        second = book._standing["pool"][("e", 1)]
        assert second is not first
        clock.now += TICK_TOKENS / 40.0 + 0.001  # past its span
        book._last.clear()
        book.fit(PROFILE, "pool", "e", 1, b, base, 0, 0)
        assert book._standing["pool"][("e", 1)] is not second


@pytest.mark.parametrize(
    ("change", "built_again"),
    [("nothing", False), ("rate", True), ("delay", True), ("lengths", True), ("recount", True)],
)
def test_a_standing_forecast_is_built_again_when_the_readings_change(
    change: str, built_again: bool
) -> None:
    clock = Clock(1000.0)
    base = KvFit(free_blocks=200, usable_blocks=400, block_size=BS, blocks=blocks16)
    book = ForecastBook()
    rnd = random.Random(2)
    for _ in range(4):
        book.add("pool", "e", trajectory(rnd, clock.now))
    b = backend(40.0, 0.0)
    with standing_from(1, clock):
        book.fit(PROFILE, "pool", "e", 1, b, base, 0, 0)
        first = book._standing["pool"][("e", 1)]
        if change == "rate":
            b = backend(30.0, 0.0)
        elif change == "delay":
            b = backend(40.0, 0.1)
        elif change == "lengths":
            more = Histogram(LENGTHS.bounds, tuple(c * 2 for c in LENGTHS.counts), 200, 0)
            b = BackendSignals(
                **{**{f: getattr(b, f) for f in b.__slots__}, "output_lengths": more}
            )
        elif change == "recount":
            book.changed()
        book._last.clear()
        book.fit(PROFILE, "pool", "e", 1, b, base, 0, 0)
        assert (book._standing["pool"][("e", 1)] is not first) == built_again


def test_an_endpoint_below_the_threshold_keeps_no_standing_forecast() -> None:
    clock = Clock(1000.0)
    base = KvFit(free_blocks=200, usable_blocks=400, block_size=BS, blocks=blocks16)
    book = ForecastBook()
    rnd = random.Random(3)
    ts = [trajectory(rnd, clock.now) for _ in range(3)]
    for t in ts:
        book.add("pool", "e", t)
    b = backend(40.0, 0.0)
    with standing_from(3, clock):
        book.fit(PROFILE, "pool", "e", 1, b, base, 0, 0)
        assert ("e", 1) in book._standing["pool"]
        book.remove("pool", "e", ts[0])  # 2 left: read at the decision's time again
        book.fit(PROFILE, "pool", "e", 1, b, base, 0, 0)
        assert ("e", 1) not in book._standing["pool"]
    # one no longer read stops keeping what is passed past its rebuild point
    with standing_from(1, clock):
        book._last.clear()
        book.fit(PROFILE, "pool", "e", 1, b, base, 0, 0)
        standing = book._standing["pool"][("e", 1)]
        for _ in range(rebuild_after(2) + 5):
            book.add("pool", "e", trajectory(rnd, clock.now))
        assert len(standing.pending) <= rebuild_after(2)
        assert not standing.fresh(standing.look, clock.now, 2)


# --- kinds' factors within a band ---------------------------------------------------------


def histogram() -> st.SearchStrategy[Histogram]:
    def build(bounds: list[int], adds: list[int]) -> Histogram:
        cum, total = [], 0
        for a in adds:
            total += a
            cum.append(float(total))
        return Histogram((*sorted(set(bounds)), INF)[: len(cum)], tuple(cum), total, 0.0)

    return st.lists(st.integers(1, 2000), min_size=1, max_size=6, unique=True).flatmap(
        lambda b: st.lists(st.integers(0, 30), min_size=len(b) + 1, max_size=len(b) + 1).map(
            lambda a: build(b, a)
        )
    )


@settings(max_examples=400, deadline=None)
@given(
    h=histogram(),
    q=st.floats(0.1, 1.0),
    caution=st.sampled_from([0.0, 0.3]),
    share=st.sampled_from([0.0, 0.2]),
    g=st.integers(0, 3000),
    limit=st.integers(1, 5000),
    floor=st.sampled_from([0, 40]),
    f=st.floats(0.125, 4.0),
    rho=st.floats(1.0 / (1.0 + FACTOR_BAND), 1.0 + FACTOR_BAND),
)
def test_the_banded_total_bounds_every_factor_within_the_band(
    h: Histogram,
    q: float,
    caution: float,
    share: float,
    g: int,
    limit: int,
    floor: int,
    f: float,
    rho: float,
) -> None:
    if f == 1.0:  # a factor of 1 is read exactly: any move builds again
        rho = 1.0
    spec = ForecastSpec(quantile=q, min_observations=1)
    look = Outlook(None, h, caution, BS, spec, 0.0, share, "p", lambda kind: f)
    exact = remaining_total(scaled(h, f * rho), q, g, limit, floor, 1, caution, share)
    assert exact <= banded_total(look, g, limit, floor, "p")


def test_a_factor_moving_within_its_band_keeps_the_standing_forecast() -> None:
    clock = Clock(1000.0)
    base = KvFit(free_blocks=200, usable_blocks=400, block_size=BS, blocks=blocks16)
    book = ForecastBook()
    profile = Profile(
        name="p",
        admission="forecast",
        forecast=ForecastSpec(quantile=QUANTILE, margin=MARGIN, min_observations=1),
    )
    rnd = random.Random(4)
    for _ in range(4):
        t = trajectory(rnd, clock.now)
        t.limit = 200  # one kind: ("p", bucket of 256)
        book.add("pool", "e", t)
    kind, other = ("p", limit_bucket(200)), ("q", 0)
    for _ in range(50):
        book.lengths.observe("pool", kind, 100)
        book.lengths.observe("pool", other, 50)
    b = backend(40.0, 0.0)
    with standing_from(1, clock):
        book.fit(profile, "pool", "e", 1, b, base, 0, 0)
        first = book._standing["pool"][("e", 1)]
        assert first.factors[kind] == pytest.approx(100 / 75)
        book.lengths.observe("pool", kind, 110)  # f moves by less than 1/32
        book._last.clear()
        book.fit(profile, "pool", "e", 1, b, base, 0, 0)
        assert book._standing["pool"][("e", 1)] is first
        for _ in range(60):  # and now by more: f = 1127 / 793 = 1.42
            book.lengths.observe("pool", kind, 2000)
        book._last.clear()
        book.fit(profile, "pool", "e", 1, b, base, 0, 0)
        assert book._standing["pool"][("e", 1)] is not first
