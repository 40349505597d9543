"""cache_efficiency_ratio, tokenize_latency_risk and Retry-After against hand-computed cases."""

from __future__ import annotations

import math

import pytest

from ext_proc.policy.scores import (
    DrainInputs,
    cache_efficiency_ratio,
    drain_inputs,
    retry_after_s,
    tokenize_latency_risk,
)
from ext_proc.signals.scrapes import Derived, Histogram
from ext_proc.signals.snapshot import BackendSignals, PoolSnapshot
from ext_proc.signals.window import exceedance

INF = math.inf
# 100 observations: 10 ≤ 0.1 s, 60 ≤ 0.5 s, 90 ≤ 1 s, 100 ≤ +Inf
H = Histogram(bounds=(0.1, 0.5, 1.0, INF), counts=(10, 60, 90, 100), count=100, sum=50.0)


@pytest.mark.parametrize(
    ("threshold", "expected"),
    [
        (0.1, 0.90),  # exactly a bound: 90 above
        (0.3, 0.65),  # halfway through (0.1, 0.5]: 10 + 50 × 0.5 = 35 below
        (0.75, 0.25),  # halfway through (0.5, 1]: 60 + 30 × 0.5 = 75 below
        (1.0, 0.10),  # only the +Inf bucket above
        (5.0, 0.10),  # inside the +Inf bucket: all of it counts above
        (0.05, 0.95),  # inside the first bucket (0, 0.1]: 10 × 0.5 = 5 below
    ],
)
def test_exceedance_interpolates_like_histogram_quantile(threshold: float, expected: float) -> None:
    assert exceedance(H, threshold) == pytest.approx(expected)


def test_exceedance_without_observations_is_none() -> None:
    assert exceedance(Histogram((1.0, INF), (0, 0), 0, 0.0), 0.5) is None


def test_tokenize_latency_risk_pools_backends_by_observation_count() -> None:
    small = Histogram(bounds=(1.0, INF), counts=(0, 10), count=10, sum=30.0)  # all above 1 s
    # (100 × 0.10 + 10 × 1.0) / 110 = 20 / 110
    assert tokenize_latency_risk([H, small, None], 1.0) == pytest.approx(20 / 110)
    assert tokenize_latency_risk([None], 1.0) is None


def d(ratio: float | None) -> Derived:
    return Derived(window_s=10.0, prefix_cache_hit_ratio=ratio)


def test_cache_efficiency_ratio_weights_by_queries_and_falls_back_to_gauges() -> None:
    # (0.2 × 1000 + 0.8 × 3000) / 4000 = 0.65
    assert cache_efficiency_ratio([(d(0.2), 1000, None), (d(0.8), 3000, None)]) == pytest.approx(
        0.65
    )
    # SGLang: no window ratio, the engine's gauge
    assert cache_efficiency_ratio([(None, None, 0.4)]) == pytest.approx(0.4)
    assert cache_efficiency_ratio([(d(None), None, None)]) is None


@pytest.mark.parametrize(
    ("drain", "need", "expected"),
    [
        # rate 100 + 400 = 500 tok/s; 2 completions/s → 250 tok/request;
        # backlog = 4 × 250 + 1000 − 500 = 1500 → ceil(1500 / 500) = 3 s
        (DrainInputs(100, 400, 2, 4, 500), 1000, 3),
        # plenty free: backlog ≤ 0 → the minimum
        (DrainInputs(100, 400, 2, 0, 5000), 1000, 1),
        # a huge backlog is capped
        (DrainInputs(10, 0, 0.01, 100, 0), 1000, 30),
        # no completions observed: the constant fallback
        (DrainInputs(100, 400, 0, 4, 500), 1000, 2),
        (None, 1000, 2),
    ],
    ids=["worked", "free", "capped", "no-completions", "unknown"],
)
def test_retry_after_from_drain_rate(drain: DrainInputs | None, need: int, expected: int) -> None:
    assert retry_after_s(drain, need, min_s=1, max_s=30, fallback_s=2) == expected


def test_drain_leaves_out_sleeping_backends_unless_all_sleep() -> None:
    rates = Derived(
        window_s=10.0, prompt_tokens_per_s=300.0, generation_tokens_per_s=100.0,
        completions_per_s=2.0,
    )  # fmt: skip
    # 11 blocks of 16 tokens: 10 usable; usage 0.5 → 5 free = 80 tokens; asleep: 10 free
    awake = BackendSignals(
        url="a", kv_cache_usage=0.5, num_requests_waiting=3, num_gpu_blocks=11, block_size=16,
        derived=rates,
    )  # fmt: skip
    asleep = BackendSignals(
        url="b", kv_cache_usage=0.0, num_requests_waiting=0, num_gpu_blocks=11, block_size=16,
        derived=Derived(window_s=10.0, completions_per_s=0.0), sleep_state="discard_all",
    )  # fmt: skip
    both = PoolSnapshot(pool="p", backends=(awake, asleep), taken_at_s=0.0)
    assert drain_inputs(both) == DrainInputs(300.0, 100.0, 2.0, 3.0, 80.0)  # not 80 + 160
    only_asleep = PoolSnapshot(pool="p", backends=(asleep,), taken_at_s=0.0)
    assert drain_inputs(only_asleep) == DrainInputs(0.0, 0.0, 0.0, 0.0, 160.0)
