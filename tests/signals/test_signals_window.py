"""window.py against hand-computed values: increases with resets, histogram deltas,
Prometheus's histogram_quantile, exceedance, and derive over a scrape history."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from ext_proc.signals.scrapes import Derived, EngineScrape, Histogram
from ext_proc.signals.window import (
    Window,
    derive,
    exceedance,
    histogram_delta,
    histogram_quantile,
    increase,
)

INF = math.inf
# 10 observations: 2 ≤ 0.1 s, 4 in (0.1, 0.5], 3 in (0.5, 1], 1 above 1 s
H = Histogram(bounds=(0.1, 0.5, 1.0, INF), counts=(2, 6, 9, 10), count=10, sum=5.0)
EMPTY = Histogram(bounds=(0.1, 0.5, 1.0, INF), counts=(0, 0, 0, 0), count=0, sum=0.0)


def _h(counts: tuple[float, ...], total_sum: float = 0.0) -> Histogram:
    return Histogram(bounds=(0.1, 0.5, 1.0, INF), counts=counts, count=counts[-1], sum=total_sum)


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([1, 2, 3], 2),
        ([5], 0),
        ([], 0),
        ([0, 0, 0], 0),
        ([5, 2, 4], 4),  # reset: 2 counted since the restart, then +2
        ([3, 1, 0, 2], 3),  # reset to 1 (+1), reset to 0 (+0), then +2
        ([100, 100, 7], 7),
    ],
    ids=["steady", "one", "none", "flat", "reset", "two-resets", "reset-at-end"],
)
def test_increase(values: list[float], expected: float) -> None:
    assert increase(values) == expected


@pytest.mark.parametrize(
    ("q", "expected"),
    [
        (0.5, 0.4),  # rank 5 in (0.1, 0.5]: 0.1 + 0.4·(5−2)/(6−2)
        (0.1, 0.05),  # rank 1 in the first bucket, lower bound 0: 0.1·1/2
        (0.2, 0.1),  # rank 2 = c_0: the first bucket's bound
        (0.9, 1.0),  # rank 9 = c_2: 0.5 + 0.5·3/3
        (0.95, 1.0),  # rank 9.5 only in +Inf: the highest finite bound
        (0.75, 0.5 + 0.5 * 1.5 / 3),
    ],
)
def test_histogram_quantile(q: float, expected: float) -> None:
    assert histogram_quantile(q, H) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("h", "q", "expected"),
    [
        (EMPTY, 0.5, None),
        (Histogram(bounds=(INF,), counts=(5,), count=5, sum=1), 0.5, None),
        (Histogram(bounds=(1.0, 2.0), counts=(1, 2), count=2, sum=1), 0.5, None),  # no +Inf
        (H, 1.5, None),
        (Histogram(bounds=(0.0, 1.0, INF), counts=(5, 8, 10), count=10, sum=3), 0.3, 0.0),
        (Histogram(bounds=(0.0, 1.0, INF), counts=(5, 8, 10), count=10, sum=3), 0.65, 0.5),
    ],
    ids=["no-observations", "one-bucket", "no-inf", "q-out-of-range", "zero-bound", "after-zero"],
)
def test_histogram_quantile_edges(h: Histogram, q: float, expected: float | None) -> None:
    got = histogram_quantile(q, h)
    assert got == (pytest.approx(expected) if expected is not None else None)


@pytest.mark.parametrize(
    ("threshold", "expected"),
    [
        (0.5, 0.4),  # 6 at or below 0.5
        (0.3, 0.6),  # 2 + 4·(0.3−0.1)/(0.5−0.1) = 4 at or below
        (1.0, 0.1),
        (2.0, 0.1),  # past the highest finite bound: the +Inf bucket's 1
        (0.05, 0.9),  # 0 + 2·0.05/0.1 = 1 at or below
        (0.0, 1.0),
        (-1.0, 1.0),
    ],
)
def test_exceedance(threshold: float, expected: float) -> None:
    assert exceedance(H, threshold) == pytest.approx(expected)


def test_exceedance_without_observations() -> None:
    assert exceedance(EMPTY, 0.5) is None


def test_histogram_delta_plain() -> None:
    d = histogram_delta([_h((1, 2, 3, 4), 1.0), _h((1, 3, 5, 6), 2.0), _h((2, 5, 8, 10), 4.0)])
    assert d == _h((1, 3, 5, 6), 3.0)


def test_histogram_delta_with_reset() -> None:
    # 6 new observations before the restart (4 → 10), then 5 counted from zero (0 → 3 → 5)
    before, peak = _h((1, 2, 3, 4), 1.0), _h((2, 5, 8, 10), 5.0)
    after1, after2 = _h((1, 1, 2, 3), 0.5), _h((1, 2, 4, 5), 1.5)
    d = histogram_delta([before, peak, after1, after2])
    assert d == _h((1 + 1, 3 + 2, 5 + 4, 6 + 5), 4.0 + 1.5)


def test_histogram_delta_when_bounds_change() -> None:
    old = Histogram(bounds=(1.0, INF), counts=(5, 9), count=9, sum=3)
    new1 = _h((0, 1, 1, 2), 0.25)
    new2 = _h((1, 2, 3, 4), 1.0)
    assert histogram_delta([old, new1, new2]) == _h((1, 2, 3, 4), 1.0)
    assert histogram_delta([new1]) is None


def _scrape(at_s: float, **fields: Any) -> EngineScrape:
    return EngineScrape(source="b", kind="vllm", at_s=at_s, **fields)


HISTORY = [
    _scrape(
        0.0, preemptions=10.0, prompt_tokens=1000.0, generation_tokens=50.0,
        request_success=4.0, prefix_cache_queries_tokens=1000.0, prefix_cache_hits_tokens=100.0,
        ttft_s=_h((1, 2, 3, 4)), queue_time_s=_h((4, 4, 4, 4)),
    ),
    _scrape(
        1.0, preemptions=12.0, prompt_tokens=1600.0, generation_tokens=250.0,
        request_success=6.0, prefix_cache_queries_tokens=1600.0, prefix_cache_hits_tokens=400.0,
        ttft_s=_h((1, 3, 5, 6)), queue_time_s=_h((5, 6, 6, 6)),
    ),
    _scrape(
        2.0, preemptions=3.0, prompt_tokens=2000.0, generation_tokens=450.0,
        request_success=10.0, prefix_cache_queries_tokens=2000.0, prefix_cache_hits_tokens=500.0,
        ttft_s=_h((2, 5, 8, 10)), queue_time_s=_h((8, 9, 9, 14)),
    ),
]  # fmt: skip


def test_derive_over_the_whole_history() -> None:
    d = derive(HISTORY, 10.0)
    assert d.window_s == 2.0
    assert d.preemptions_per_s == pytest.approx((2 + 3) / 2)  # reset between 1 s and 2 s
    assert d.prompt_tokens_per_s == pytest.approx(500.0)
    assert d.generation_tokens_per_s == pytest.approx(200.0)
    assert d.completions_per_s == pytest.approx(3.0)
    assert d.prefix_cache_hit_ratio == pytest.approx(400 / 1000)
    assert d.ttft_delta == _h((1, 3, 5, 6))
    # ttft delta (1, 3, 5, 6): p50 rank 3 → bucket (0.1, 0.5]: 0.1 + 0.4·(3−1)/(3−1) = 0.5
    assert d.ttft_p50_s == pytest.approx(0.5)
    # p95 rank 5.7 → only +Inf holds it: 1.0
    assert d.ttft_p95_s == pytest.approx(1.0)
    # queue delta (4, 5, 5, 10): p95 rank 9.5 → +Inf → 1.0
    assert d.queue_time_p95_s == pytest.approx(1.0)


def test_derive_uses_only_the_window() -> None:
    d = derive(HISTORY, 1.0)  # the scrapes at 1 s and 2 s
    assert d.window_s == 1.0
    assert d.prompt_tokens_per_s == pytest.approx(400.0)
    assert d.preemptions_per_s == pytest.approx(3.0)  # reset: the 3 since the restart
    assert d.prefix_cache_hit_ratio == pytest.approx(100 / 400)
    assert d.ttft_delta == _h((1, 2, 3, 4))


@pytest.mark.parametrize(
    "history",
    [[], HISTORY[:1], [HISTORY[0], _scrape(0.0, preemptions=11.0)]],
    ids=["empty", "one", "no-time"],
)
def test_derive_says_nothing_without_two_scrapes_apart(history: list[EngineScrape]) -> None:
    d = derive(history, 10.0)
    assert (d.preemptions_per_s, d.ttft_p50_s, d.ttft_delta, d.prefix_cache_hit_ratio) == (
        None, None, None, None,
    )  # fmt: skip


def test_derive_fields_the_source_does_not_say_stay_none() -> None:
    d = derive([_scrape(0.0, prompt_tokens=1.0), _scrape(2.0, prompt_tokens=5.0)], 10.0)
    assert d.prompt_tokens_per_s == pytest.approx(2.0)
    assert (d.preemptions_per_s, d.prefix_cache_hit_ratio, d.ttft_p95_s) == (None, None, None)


def test_hit_ratio_none_without_queries_and_quantiles_none_without_observations() -> None:
    a = _scrape(0.0, prefix_cache_queries_tokens=5.0, prefix_cache_hits_tokens=1.0, ttft_s=H)
    b = _scrape(1.0, prefix_cache_queries_tokens=5.0, prefix_cache_hits_tokens=1.0, ttft_s=H)
    d = derive([a, b], 5.0)
    assert d.prefix_cache_hit_ratio is None
    assert d.ttft_delta is not None and d.ttft_delta.count == 0
    assert (d.ttft_p50_s, d.ttft_p95_s) == (None, None)


def test_counter_missing_in_some_scrapes_uses_those_that_have_it() -> None:
    hist = [
        _scrape(0.0, preemptions=1.0),
        _scrape(1.0),
        _scrape(4.0, preemptions=9.0),
    ]
    assert derive(hist, 10.0).preemptions_per_s == pytest.approx(2.0)


# -- vLLM's admission valve: the rejection rate and the "recent" flag ----------------------

_R = "admission_rejections"


@pytest.mark.parametrize(
    ("values", "rate", "recent"),
    [
        # at 0, 1, 2, 3 s: +4 in 3 s; the newest two (4 → 4) are equal
        ([0.0, 1.0, 4.0, 4.0], 4 / 3, False),
        # the newest step rose: 2 → 7
        ([0.0, 0.0, 2.0, 7.0], 7 / 3, True),
        # a restart between the newest two: 9 → 3 counts the 3 since (reset rule)
        ([5.0, 9.0, 9.0, 3.0], (4 + 3) / 3, True),
        # a restart to 0: nothing new
        ([5.0, 6.0, 6.0, 0.0], 1 / 3, False),
        # the newest scrape does not carry it: the newest two that do (1 s, 2 s: 1 → 3)
        ([0.0, 1.0, 3.0, None], 3 / 2, True),
        # only one scrape carries it
        ([None, None, 2.0, None], None, None),
    ],
    ids=["flat-last", "rising", "reset", "reset-to-zero", "last-missing", "one-carrier"],
)
def test_admission_rejections_rate_and_recent_flag(
    values: list[float | None], rate: float | None, recent: bool | None
) -> None:
    history = [
        _scrape(float(t), **({_R: v} if v is not None else {})) for t, v in enumerate(values)
    ]
    for d in (derive(history, 10.0), _window_of(history, 10.0).derived()):
        assert d is not None
        if rate is None:
            assert d.admission_rejections_per_s is None
        else:
            assert d.admission_rejections_per_s == pytest.approx(rate)
        assert d.admission_rejected_recently is recent


def test_recent_flag_looks_only_inside_the_window() -> None:
    # 0 s: 0, 5 s: 3, 6 s: 3; a 2 s window holds 5 s and 6 s only → +0: not recent
    history = [_scrape(0.0, **{_R: 0.0}), _scrape(5.0, **{_R: 3.0}), _scrape(6.0, **{_R: 3.0})]
    for d in (derive(history, 2.0), _window_of(history, 2.0).derived()):
        assert d is not None
        assert (d.admission_rejections_per_s, d.admission_rejected_recently) == (0.0, False)


# -- Window: the collector's incremental derive ---------------------------------------------


_DERIVED_FIELDS = (
    "window_s",
    "prefix_cache_hit_ratio",
    "preemptions_per_s",
    "prompt_tokens_per_s",
    "generation_tokens_per_s",
    "completions_per_s",
    "ttft_p50_s",
    "ttft_p95_s",
    "queue_time_p95_s",
    "admission_rejections_per_s",
)


def _close(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


def _same_derived(a: Derived | None, b: Derived | None) -> bool:
    """Equal to float rounding (running totals round differently from window sums)."""
    if a is None or b is None:
        return a is b
    if not all(_close(getattr(a, f), getattr(b, f)) for f in _DERIVED_FIELDS):
        return False
    if a.admission_rejected_recently is not b.admission_rejected_recently:
        return False
    ha, hb = a.ttft_delta, b.ttft_delta
    if ha is None or hb is None:
        return ha is hb
    return (
        ha.bounds == hb.bounds
        and len(ha.counts) == len(hb.counts)
        and all(_close(x, y) for x, y in zip(ha.counts, hb.counts, strict=True))
        and _close(ha.count, hb.count)
        and _close(ha.sum, hb.sum)
    )


def _window_of(history: list[EngineScrape], window_s: float) -> Window:
    w = Window(window_s)
    for s in history:
        w.append(s)
    return w


def test_window_gives_the_hand_computed_derive() -> None:
    d = _window_of(HISTORY, 1.0).derived()
    assert d is not None and d.window_s == 1.0
    assert d.prompt_tokens_per_s == pytest.approx(400.0)
    assert d.preemptions_per_s == pytest.approx(3.0)  # reset: the 3 since the restart
    assert d.ttft_delta == _h((1, 2, 3, 4))


def test_window_drops_scrapes_older_than_its_span_and_needs_two() -> None:
    w = _window_of(HISTORY[:1], 10.0)
    assert w.derived() is None
    w = _window_of(HISTORY, 1.0)
    assert [s.at_s for s in w.scrapes] == [1.0, 2.0]


def _random_histogram(rng: random.Random, bounds: tuple[float, ...], total: float) -> Histogram:
    counts: list[float] = []
    running = 0.0
    for _ in bounds:
        running += rng.choice([0, 0, 1, 3])
        counts.append(running)
    counts[-1] = max(counts[-1], total)
    return Histogram(bounds=bounds, counts=tuple(counts), count=counts[-1], sum=counts[-1] * 0.3)


def _random_history(rng: random.Random) -> list[EngineScrape]:
    """Counters that grow, reset or go missing; histograms that grow, reset or change bounds."""
    bounds_a: tuple[float, ...] = (0.1, 0.5, 1.0, INF)
    bounds_b: tuple[float, ...] = (0.2, 1.0, INF)
    t = 0.0
    values = dict.fromkeys(
        (
            "prefix_cache_hits_tokens",
            "prefix_cache_queries_tokens",
            "preemptions",
            "prompt_tokens",
            "generation_tokens",
            "request_success",
            "admission_rejections",
        ),
        0.0,
    )
    bounds, ttft_total, queue_total = bounds_a, 0.0, 0.0
    out = []
    for _ in range(rng.randint(1, 40)):
        t += rng.choice([0.0, 0.1, 0.2, 0.2, 0.5, 3.0])
        fields: dict[str, Any] = {}
        for name in values:
            roll = rng.random()
            if roll < 0.05:
                values[name] = float(rng.randint(0, 3))  # a restart
            elif roll < 0.9:
                values[name] += rng.randint(0, 50)
            if roll < 0.95:  # else the scrape does not carry it
                fields[name] = values[name]
        roll = rng.random()
        if roll < 0.05:
            bounds = bounds_b if bounds is bounds_a else bounds_a
            ttft_total = 0.0
        elif roll < 0.1:
            ttft_total = 0.0  # reset
        ttft_total += rng.randint(0, 5)
        queue_total = 0.0 if rng.random() < 0.05 else queue_total + rng.randint(0, 5)
        if rng.random() < 0.9:
            fields["ttft_s"] = _random_histogram(rng, bounds, ttft_total)
        if rng.random() < 0.9:
            fields["queue_time_s"] = _random_histogram(rng, bounds_a, queue_total)
        out.append(_scrape(t, **fields))
    return out


@pytest.mark.parametrize("seed", range(40))
def test_window_equals_derive_on_random_histories(seed: int) -> None:
    """After every append, Window.derived() is derive() over the same scrapes."""
    rng = random.Random(seed)
    history = _random_history(rng)
    window_s = rng.choice([0.5, 1.0, 2.0, 10.0])
    w = Window(window_s)
    for i, scrape in enumerate(history):
        w.append(scrape)
        kept = [s for s in history[: i + 1] if scrape.at_s - window_s <= s.at_s]
        assert w.scrapes == kept
        expected = derive(kept, window_s) if len(kept) >= 2 else None
        assert _same_derived(w.derived(), expected), (seed, i)
