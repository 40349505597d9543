"""Admission within a wait (``forecast.start_within_s``): a request that fits once a running
one ends is admitted, starts running at that predicted end (``Trajectory.runs_s``), and while
it waits there by plan the pressure score's queue term leaves it out
(``PoolViews.unplanned``), each against hand-computed values."""

from __future__ import annotations

import dataclasses
import time

import pytest
from prometheus_client import REGISTRY

from ext_proc.placement.forecast import Outlook, Trajectory
from ext_proc.placement.forecast_book import ForecastBook
from ext_proc.placement.poolview import PoolViews
from ext_proc.policy.kvfit import KvFit, Shape
from ext_proc.policy.settings import ForecastSpec, Level, PressureModel, Profile
from ext_proc.signals.snapshot import PoolSnapshot
from tests.builders import FORECAST_URL as URL
from tests.builders import LENGTHS, blocks16, decoding
from tests.builders import forecast_backend as backend


def waiting_profile(wait_s: float, pressure: PressureModel | None = None) -> Profile:
    spec = ForecastSpec(quantile=0.9, margin=0.1, start_within_s=wait_s)
    return Profile(
        name="p", admission="forecast", forecast=spec, pressure=pressure or PressureModel()
    )


def one_running(book: ForecastBook, pool: str = "pool", endpoint: str = "e") -> float:
    """One running request: 40 prompt blocks, limit 100 (its total: the limit binds); at
    100 tok/s it ends 1 s after its start, the time returned."""
    now = time.monotonic()
    book.add(pool, endpoint, Trajectory(now, 40, 1, 100))
    return now


BASE = KvFit(free_blocks=60, usable_blocks=100, block_size=16, blocks=blocks16)


@pytest.mark.parametrize(("wait_s", "fits"), [(0.0, False), (0.5, False), (2.0, True)])
def test_a_request_that_fits_once_a_running_one_ends_is_admitted_within_the_wait(
    wait_s: float, fits: bool
) -> None:
    book = ForecastBook()
    one_running(book)
    fit = book.fit(waiting_profile(wait_s), "pool", "e", 1, decoding(0.4), BASE, 0, 0)
    # used 40 = ICE's 40: other 0; budget floor(100 × 0.9) = 90; peak 40 + ceil(100/16)
    # = 47; free 43
    assert fit.free_blocks == 43
    # a 1000-token prompt, limit 100: 63 blocks (8 free slots in the last), 63 to start
    # (1001 tokens), more than the 60 free now: vLLM cannot start it yet. Beside the running
    # one: 40 + 7 + 63 + ceil((100 − 8)/16) = 116 > 90, charge 116 − 47 = 69 > 43. At the
    # running one's end (1 s) its start fits 60 + 40 freed, and the peak with it is 63 + 6 =
    # 69 ≤ 90: it starts within a wait of 2 s, not of 0.5 s
    charge = fit.charge(Shape.single(1000), 100)
    assert charge == (43 if fits else 69)
    assert (charge <= fit.free_blocks) is fits


def test_a_request_whose_start_fits_now_is_not_admitted_for_later() -> None:
    book = ForecastBook()
    one_running(book)
    fit = book.fit(waiting_profile(10.0), "pool", "e", 1, decoding(0.4), BASE, 0, 0)
    # a 700-token prompt, limit 100: 44 blocks to start, within the 60 free: vLLM starts it
    # at once, where the peak with it is 40 + 7 + 44 + ceil((100 − 4)/16) = 97 > 90; that
    # it would fit after the running one ends does not matter
    assert fit.charge(Shape.single(700), 100) == 97 - 47


def test_a_request_is_judged_where_the_backend_would_start_it_not_where_it_fits_best() -> None:
    book = ForecastBook()
    now = time.monotonic()
    book.add("pool", "e", Trajectory(now, 20, 1, 100))  # A: ends at 1 s
    book.add("pool", "e", Trajectory(now, 20, 1, 300))  # B: ends at 3 s
    base = KvFit(free_blocks=55, usable_blocks=100, block_size=16, blocks=blocks16)
    fit = book.fit(waiting_profile(4.0), "pool", "e", 1, decoding(0.45), base, 0, 0)
    # used 45, ICE's 40: other 5, budget 90 − 5 = 85; peak: B 20 + 19 = 39, A 40 + 2 × 7 =
    # 54; free 31. A 1000-token prompt, limit 200 (63 blocks, 8 free slots): not now (63 >
    # 55 free). At 1 s A has ended: B holds 20 + ceil(100/16) = 27, 13 freed, and 63 ≤ 55 +
    # 13: vLLM starts it there, beside B (200 left each): 27 + 13 + 63 + ceil(192/16) = 115
    # > 85. At 3 s (B ended) it would fit (63 + 12 = 75), but vLLM does not wait till then
    assert fit.free_blocks == 31
    assert fit.charge(Shape.single(1000), 200) > fit.free_blocks
    assert book.planned_start("pool", Shape.single(1000), 200, time.monotonic()) is None


def test_without_a_decode_rate_nothing_is_admitted_for_later() -> None:
    book = ForecastBook()
    one_running(book)
    slow = book.fit(waiting_profile(10.0), "pool", "e", 1, backend(0.4), BASE, 0, 0)
    assert slow.charge(Shape.single(700), 100) > slow.free_blocks  # r = 0: no end is known


def test_a_request_admitted_for_later_runs_from_the_end_that_frees_its_room() -> None:
    book = ForecastBook()
    started = one_running(book)
    fit = book.fit(waiting_profile(2.0), "pool", "e", 1, decoding(0.4), BASE, 0, 0)
    shape = Shape.single(1000)
    assert fit.charge(shape, 100) == 43  # fits at the running one's end (above)
    now = time.monotonic()
    runs = book.planned_start("pool", shape, 100, now)
    # the running one ends at its start + 100 tokens / 100 tok/s, rounded up to 10 ms
    assert runs is not None
    assert started + 1.0 <= runs <= started + 1.0 + 0.011
    assert book.planned_start("pool", shape, 100, now) is None  # a hold takes it once
    # from then on it generates: g = r × (t − s − d), nothing while it waits
    t = Trajectory(now, 63, 1, 100, tokens=1000, runs_s=runs)
    look = Outlook(100.0, LENGTHS, 0.0, 16, waiting_profile(2.0).forecast)
    assert look.generated(t, runs - 0.1) == 0
    assert look.generated(t, runs + 0.25) == 25
    # it ends at s + T / r = runs + 100 / 100 (the limit binds: q 0.9 of LENGTHS is 775)
    assert look.end_s(t, now) == pytest.approx(runs + 1.0)
    # and it counts as waiting by plan from its admission until it runs
    assert t.waiting_at(now) and t.waiting_at(runs - 0.001)
    assert not t.waiting_at(runs) and not t.waiting_at(now - 0.001)


def test_the_hold_of_a_request_admitted_for_later_carries_its_start() -> None:
    views = PoolViews()
    profile = waiting_profile(2.0)
    b = dataclasses.replace(decoding(0.4), url=URL)  # 100 usable, 60 free (as BASE)
    snap = PoolSnapshot("pool", (b,), time.monotonic())
    endpoint = views.addresses(snap)[0]
    started = one_running(views.book, endpoint=endpoint)
    fit = views.room(profile, snap, endpoint)
    assert fit is not None
    late, now = Shape.single(1000), Shape.single(100)
    assert fit.charge(late, 100) == fit.free_blocks == 43  # as above: starts at the end
    assert fit.charge(now, 100) < fit.free_blocks
    waits = REGISTRY.get_sample_value("ice_forecast_waits_total", {"pool": "pool"}) or 0.0
    held = [views.hold(profile, snap, shape, 100, endpoint) for shape in (late, now)]
    assert REGISTRY.get_sample_value("ice_forecast_waits_total", {"pool": "pool"}) == waits + 1
    assert held[0] is not None and held[0].trajectory is not None
    runs = held[0].trajectory.runs_s
    assert runs is not None and started + 1.0 <= runs <= started + 1.011
    assert held[1] is not None and held[1].trajectory is not None
    assert held[1].trajectory.runs_s is None


def test_a_request_that_fits_now_runs_at_once() -> None:
    book = ForecastBook()
    one_running(book)
    fit = book.fit(waiting_profile(2.0), "pool", "e", 1, decoding(0.4), BASE, 0, 0)
    # 100 tokens + 100 output: 13 blocks beside the running one, within the 43 free
    shape = Shape.single(100)
    assert fit.charge(shape, 100) <= fit.free_blocks
    assert book.planned_start("pool", shape, 100, time.monotonic()) is None


# --- the pressure score ---------------------------------------------------------------------

TINY = PressureModel(
    weight_kv_cache=0.2,
    weight_queue=0.8,
    queue_saturation_requests=2,
    medium_at=20,
    high_at=35,
    critical_at=70,
)


def waiting_view(waiting: float, at: float) -> PoolSnapshot:
    b = dataclasses.replace(decoding(0.5), url=URL, num_requests_waiting=waiting)
    return PoolSnapshot("pool", (b,), at)


@pytest.mark.parametrize(
    ("wait_s", "score", "level"), [(1.0, 50.0, Level.HIGH), (0.0, 90.0, Level.CRITICAL)]
)
def test_the_queue_term_leaves_out_the_requests_admitted_to_wait(
    wait_s: float, score: float, level: Level
) -> None:
    views = PoolViews()
    now = time.monotonic()
    endpoint = views.addresses(waiting_view(0, now))[0]
    # one request admitted 0.2 s ago to run in 0.5 s (waiting by plan when the view is
    # taken), one admitted 0.3 s ago that runs at once, one planned to have run 0.1 s ago
    # (overdue: if it still waits, that is queue the plan did not expect)
    views.book.add("pool", endpoint, Trajectory(now - 0.2, 7, 1, 200, runs_s=now + 0.5))
    views.book.add("pool", endpoint, Trajectory(now - 0.3, 7, 1, 200))
    views.book.add("pool", endpoint, Trajectory(now - 0.6, 7, 1, 200, runs_s=now - 0.1))
    # 2 waiting: with the wait, q = 2 − 1 = 1: 100 × (0.2 × 0.5 + 0.8 × min(1, 1/2)) = 50
    # (high); without it (admission by plan never happens) q = 2: 100 × (0.1 + 0.8) = 90
    got = views.pressure(waiting_profile(wait_s, TINY), waiting_view(2, now))
    assert got is not None
    assert (got.score, got.level) == (score, level)


def test_requests_placed_by_envoy_count_a_share_at_each_endpoint() -> None:
    views = PoolViews()
    now = time.monotonic()
    b = dataclasses.replace(decoding(0.5), num_requests_waiting=1.0)
    snap = PoolSnapshot("pool", (b, dataclasses.replace(b, url=URL)), now)
    for _ in range(2):  # two waiting by plan, placed anywhere: 1/2 each at each endpoint
        views.book.add("pool", "", Trajectory(now - 0.1, 7, 1, 200, runs_s=now + 1.0))
    # q = max(0, 1 − 2/2) = 0 at both: 100 × (0.2 × 0.5) / 1.0 = 10 (low)
    got = views.pressure(waiting_profile(1.0, TINY), snap)
    assert got is not None and got.score == 10.0
    # more planned than waiting never goes below 0; the view itself is untouched
    assert views.unplanned(snap).backends[0].num_requests_waiting == 0.0
    assert snap.backends[0].num_requests_waiting == 1.0
