"""Output lengths by kind of request (``ext_proc.placement.length_kinds``, ``forecast.refine``):
the limit bucket, the factor a kind's mean output over the pool's stretches the backend's
distribution by, what a finished request counts as, each against hand-computed values."""

from __future__ import annotations

import dataclasses
import math
import time

from prometheus_client import REGISTRY

from ext_proc.placement.forecast import Outlook, Trajectory
from ext_proc.placement.forecast_book import ForecastBook
from ext_proc.placement.length_kinds import ObservedLengths, limit_bucket, scaled
from ext_proc.placement.poolview import PoolViews
from ext_proc.policy.kvfit import Shape
from ext_proc.policy.load import parse_policy
from ext_proc.policy.settings import ForecastSpec, Profile
from ext_proc.signals.scrapes import Histogram
from ext_proc.signals.snapshot import PoolSnapshot
from tests.builders import FORECAST_URL as URL
from tests.builders import LENGTHS, decoding

SPEC = ForecastSpec(quantile=0.9)


def test_the_limit_bucket_is_the_first_bound_at_or_above_the_limit() -> None:
    got = [limit_bucket(n) for n in (1, 64, 65, 256, 1000, 1024, 1025, 4096, 16384, 16385)]
    assert got == [0, 0, 1, 1, 2, 2, 3, 3, 4, 5]


def observed(window: int = 1024) -> ObservedLengths:
    """20 chat requests with limit ≤ 1024 that made 40 tokens, then 20 summaries (limit
    ≤ 16384) that made 160: the pool's mean is 100."""
    seen = ObservedLengths(window)
    for _ in range(20):
        seen.observe("pool", ("chat", 2), 40)
    for _ in range(20):
        seen.observe("pool", ("summary", 4), 160)
    return seen


def test_a_kinds_factor_is_its_mean_output_over_the_pools() -> None:
    seen = observed()
    assert seen.factor("pool", ("chat", 2), 20) == 0.4  # 40 / 100
    assert seen.factor("pool", ("summary", 4), 20) == 1.6  # 160 / 100
    assert seen.kinds("pool") == {("chat", 2): 20, ("summary", 4): 20}


def test_a_kind_seen_too_few_times_or_not_at_all_keeps_the_backends_lengths() -> None:
    seen = observed()
    assert seen.factor("pool", ("chat", 2), 21) == 1.0  # 20 seen, 21 needed
    assert seen.factor("pool", ("chat", 3), 1) == 1.0  # another bucket: none seen
    assert seen.factor("other", ("chat", 2), 1) == 1.0  # another pool


def test_the_window_keeps_only_the_last_finished_requests() -> None:
    seen = observed(window=30)
    # the last 30: 10 chat (400 tokens) and 20 summaries (3,200): mean 3,600 / 30 = 120
    assert seen.kinds("pool") == {("chat", 2): 10, ("summary", 4): 20}
    assert math.isclose(seen.factor("pool", ("chat", 2), 10), 40 / 120)
    assert math.isclose(seen.factor("pool", ("summary", 4), 10), 160 / 120)


def test_a_kind_whose_streams_end_before_their_first_token_is_floored_at_an_eighth() -> None:
    seen = observed()
    for _ in range(20):
        seen.observe("pool", ("probe", 0), 0)
    # pool mean 4,000 / 60; the probes' 0 → the floor
    assert seen.factor("pool", ("probe", 0), 20) == 0.125


def test_nothing_is_kept_with_a_window_of_zero() -> None:
    seen = ObservedLengths(window=0)
    seen.observe("pool", ("chat", 2), 40)
    assert seen.kinds("pool") == {}


def test_a_refined_distribution_is_the_backends_stretched() -> None:
    half = scaled(LENGTHS, 0.5)
    assert half.bounds == (5, 50, 500, math.inf)
    assert half.counts == LENGTHS.counts
    assert scaled(LENGTHS, 1.0) is LENGTHS


def test_a_kinds_total_is_the_quantile_of_its_stretched_lengths() -> None:
    factors = {("chat", 4): 0.4, ("summary", 4): 1.6}
    look = Outlook(10.0, LENGTHS, 0.0, 16, SPEC, profile="chat", factor=factors.__getitem__)
    # chat, f 0.4: bounds 4, 40, 400; q 0.9 → target 90 in (40, 400]: 40 + 360 × 30/40 = 310
    # (unrefined: 775, tests/placement/test_forecast.py)
    assert look.total(0, 5000, 0) == 310
    # having made 200: F(200) = 60 + 40 × 160/360 = 77.78, target 77.78 + 0.9 × 22.22
    # = 97.78 → 40 + 360 × 37.78/40 = 380
    assert look.total(200, 5000, 0) == 380
    # a running summary (f 1.6: 16, 160, 1600) in the same outlook: 160 + 1440 × 30/40 = 1240
    t = Trajectory(start_s=100.0, prompt_blocks=4, seqs=1, limit=5000, kind="summary")
    assert look.state(t, 100.0) == (4, 1240, 0)


def test_a_finished_request_counts_what_it_generated_at_the_decode_rate() -> None:
    views = PoolViews()
    profile = Profile(name="chat", admission="forecast", forecast=SPEC)
    b = dataclasses.replace(decoding(0.4), url=URL)  # 100 tokens/s, first token at once
    snap = PoolSnapshot("pool", (b,), time.monotonic())
    endpoint = views.addresses(snap)[0]
    hold = views.hold(profile, snap, Shape.single(57), 1000, endpoint)
    assert hold is not None and hold.trajectory is not None
    assert hold.trajectory.kind == "chat"
    hold.trajectory.start_s -= 5.0  # it ran 5 s: ĝ = 100 × 5 = 500 (limit 1000: bucket 2)
    views.release(hold)
    assert views.book.lengths.kinds("pool") == {("chat", 2): 1}
    assert views.book.lengths.factor("pool", ("chat", 2), 1) == 1.0  # the pool's only kind
    p = views.book.lengths._pools["pool"]
    assert p.total == 500
    views.release(hold)  # idempotent: not counted twice
    assert views.book.lengths.kinds("pool") == {("chat", 2): 1}


def test_a_hold_taken_back_or_held_whole_is_not_an_observation() -> None:
    views = PoolViews()
    profile = Profile(name="chat", admission="forecast", forecast=SPEC)
    b = dataclasses.replace(decoding(0.4), url=URL)
    snap = PoolSnapshot("pool", (b,), time.monotonic())
    endpoint = views.addresses(snap)[0]
    hold = views.hold(profile, snap, Shape.single(57), 1000, endpoint)
    assert hold is not None
    views.unhold(hold)  # the shared ledger refused it: it never ran
    reserve = Profile(name="chat", admission="reserve")
    whole = views.hold(reserve, snap, Shape.single(57), 1000, endpoint)
    assert whole is not None and whole.trajectory is not None
    assert whole.trajectory.whole is not None
    views.release(whole)
    assert views.book.lengths.kinds("pool") == {}


def test_the_outlook_stretches_a_kind_only_under_refine() -> None:
    b = dataclasses.replace(decoding(0.4), url=URL)
    for refine, chat, summary in ((True, 310, 1240), (False, 775, 775)):
        book = ForecastBook()
        for _ in range(20):
            book.lengths.observe("pool", ("chat", 4), 40)
            book.lengths.observe("pool", ("summary", 4), 160)
        spec = dataclasses.replace(SPEC, refine=refine)
        look = book.outlook(Profile(name="chat", forecast=spec), "pool", b, 16)
        assert look.total(0, 5000, 0) == chat
        assert look.total(0, 5000, 0, "summary") == summary
    labels = {"pool": "pool", "profile": "summary", "limit": "16384"}
    assert REGISTRY.get_sample_value("ice_forecast_length_factor", labels) == 1.6


def test_the_policy_reads_refine() -> None:
    on = parse_policy("profiles: {default: {admission: forecast}}\n")
    off = parse_policy("profiles: {default: {admission: forecast, forecast: {refine: false}}}\n")
    assert on.profiles["default"].forecast.refine is True
    assert off.profiles["default"].forecast.refine is False


def test_a_histogram_scaled_keeps_the_inf_bucket() -> None:
    tail = Histogram(bounds=(10, math.inf), counts=(50, 100), count=100, sum=1000.0)
    got = scaled(tail, 2.0)
    assert got.bounds == (20, math.inf) and got.sum == 2000.0


def test_outlooks_of_the_same_readings_are_equal_and_hashable_whatever_they_memoised() -> None:
    factors = {("chat", 2): 0.5}
    a = Outlook(10.0, LENGTHS, 0.0, 16, SPEC, profile="chat", factor=factors.__getitem__)
    b = Outlook(10.0, LENGTHS, 0.0, 16, SPEC, profile="chat", factor=lambda k: 1.0)
    a.lengths_of(("chat", 2))  # memoises the stretched histogram in ``a`` only
    assert a == b and hash(a) == hash(b)
    assert a != Outlook(20.0, LENGTHS, 0.0, 16, SPEC, profile="chat")
