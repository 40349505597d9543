"""The overload benchmark's reading of ICE's own processing-time histogram (pure parts)."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from ext_proc.lab.overload import bucket_quantile, ice_body_buckets


def _page(body_times: list[float], header_times: list[float]) -> str:
    registry = CollectorRegistry()
    h = Histogram(
        "ice_processing_seconds", "t", ["phase"], buckets=(0.001, 0.01, 0.1), registry=registry
    )
    for t in body_times:
        h.labels(phase="request_body").observe(t)
    for t in header_times:
        h.labels(phase="request_headers").observe(t)
    return generate_latest(registry).decode()


def test_body_buckets_are_read_from_a_real_exposition_page() -> None:
    page = _page([0.0005, 0.005, 0.005, 0.5], header_times=[0.0001] * 7)
    # cumulative: ≤1 ms 1, ≤10 ms 3, ≤100 ms 3, +Inf 4; the header phase is not counted
    assert ice_body_buckets(page) == {0.001: 1.0, 0.01: 3.0, 0.1: 3.0, math.inf: 4.0}


@pytest.mark.parametrize(
    ("q", "bound"),
    [(0.25, 0.001), (0.5, 0.01), (0.75, 0.01), (1.0, math.inf)],
)
def test_bucket_quantile_is_the_bound_of_the_nearest_rank_bucket(q: float, bound: float) -> None:
    # 4 bodies; nearest rank ceil(q × 4): 1 → ≤1 ms, 2 and 3 → ≤10 ms, 4 → past the last bound
    cumulative = {0.001: 1.0, 0.01: 3.0, 0.1: 3.0, math.inf: 4.0}
    assert bucket_quantile(cumulative, q) == bound


def test_bucket_quantile_without_bodies_is_none() -> None:
    assert bucket_quantile({}, 0.5) is None
    assert bucket_quantile({0.001: 0.0, math.inf: 0.0}, 0.5) is None
