"""ICE's own sends since the scrape and its running requests' TPOT targets
(ext_proc.placement.slo_book; docs/slo.md), against values computed by hand."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ext_proc.placement.endpoints import Candidate
from ext_proc.placement.inflight import Hold
from ext_proc.placement.slo_book import KEEP_S, SloBook, by_headroom, slo_case, ttfts
from ext_proc.policy.settings import SloTarget
from ext_proc.signals.poolbuild import backend_signals
from ext_proc.signals.snapshot import PoolSnapshot
from ext_proc.signals.window import derive
from tests.signals.test_slo_predict import HISTORY

# The backend of tests/signals/test_slo_predict.py: r = 1500 tok/s, c̄ = 500, h = 0.25,
# α = β = 0.005 s, waiting 3, running 8.
B = backend_signals(HISTORY[-1], derive(HISTORY, 10.0))
TAKEN = 100.0
SNAP = PoolSnapshot("p", (B,), TAKEN)
TARGET = SloTarget(ttft_ms=2000, tpot_ms=50)


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def hold(endpoint: str = "a:1") -> Hold:
    return Hold("p", endpoint, 10)


def test_a_request_alone_is_predicted_from_the_scrape() -> None:
    c = slo_case(SloBook(), SNAP, ["a:1"], "a:1", TARGET, 0.25, 800)
    # (3 × 500 + 800 × 0.75) / 1500 = 1.4 s; TPOT 0.005 + 0.005 × (8 + 1) = 0.05; u₁ = 0.01
    assert (c.ttft_target_s, c.tpot_target_s, c.waited_s) == (2.0, 0.05, 0.25)
    assert c.ttft_s == pytest.approx(1.4)
    assert c.tpot_s == pytest.approx(0.05)
    assert c.alone_tpot_s == pytest.approx(0.01)
    assert c.tightest_tpot_s is None


def test_what_ice_sent_since_the_scrape_is_work_ahead_and_running() -> None:
    clock = Clock(TAKEN - 1.0)
    book = SloBook(clock)
    book.admitted(hold(), SloTarget(), 999)  # before the scrape: the scrape shows it
    clock.now = TAKEN + 0.2
    book.admitted(hold(), SloTarget(tpot_ms=40), 400)
    book.admitted(hold(), SloTarget(tpot_ms=60), 400)
    c = slo_case(book, SNAP, ["a:1"], "a:1", TARGET, 0.0, 800)
    # ahead = 800 × 0.75 = 600: (1500 + 600 + 600) / 1500 = 1.8 s
    assert c.ttft_s == pytest.approx(1.8)
    # running 8 + 2 sent + 1: 0.005 + 0.005 × 11 = 0.06
    assert c.tpot_s == pytest.approx(0.06)
    # V: the tighter of the running 40 and 60 ms
    assert c.tightest_tpot_s == pytest.approx(0.04)


def test_envoy_placed_sends_are_shared_out_and_their_targets_bind_every_endpoint() -> None:
    clock = Clock(TAKEN + 0.5)
    book = SloBook(clock)
    book.admitted(hold(""), SloTarget(tpot_ms=30), 1000)  # placed by Envoy: ÷ 2 endpoints
    snap = PoolSnapshot("p", (B, replace(B, url="http://b:2/metrics")), TAKEN)
    c = slo_case(book, snap, ["a:1", "b:2"], "a:1", TARGET, 0.0, 800)
    # ahead = 1000 / 2 × 0.75 = 375: (1500 + 375 + 600) / 1500 = 1.65 s
    assert c.ttft_s == pytest.approx(1.65)
    # running 8 + 0.5 + 1: 0.005 + 0.005 × 9.5 = 0.0525
    assert c.tpot_s == pytest.approx(0.0525)
    assert c.tightest_tpot_s == pytest.approx(0.03)


def test_a_released_request_no_longer_binds_and_release_is_idempotent() -> None:
    book = SloBook(Clock(TAKEN + 1))
    h1, h2 = hold(), hold()
    book.admitted(h1, SloTarget(tpot_ms=40), 10)
    book.admitted(h2, SloTarget(tpot_ms=40), 10)
    book.admitted(h1, SloTarget(tpot_ms=40), 10)  # once per hold
    book.released(h1)
    book.released(h1)
    assert book.tightest_s("p", "a:1") == pytest.approx(0.04)
    book.released(h2)
    assert book.tightest_s("p", "a:1") is None
    book.admitted(None, SloTarget(tpot_ms=10), 10)  # nothing to remember it by
    assert book.tightest_s("p", "a:1") is None


def test_old_sends_are_forgotten() -> None:
    clock = Clock(0.0)
    book = SloBook(clock)
    book.admitted(hold(), SloTarget(), 100)
    clock.now = KEEP_S + 1
    book.admitted(hold(), SloTarget(), 200)
    assert book.since("p", "a:1", -1.0, 1) == (200, 1)


def test_envoy_placement_takes_the_pools_least_and_no_view_predicts_nothing() -> None:
    slow = replace(B, url="http://b:2/metrics", num_requests_waiting=9.0)
    snap = PoolSnapshot("p", (slow, B), TAKEN)
    c = slo_case(SloBook(), snap, ["b:2", "a:1"], None, TARGET, 0.0, 800)
    assert c.ttft_s == pytest.approx(1.4)  # a:1's; b:2's is (4500 + 600) / 1500 = 3.4
    assert slo_case(SloBook(), None, [], None, TARGET, 0.0, 800).ttft_s is None


def test_placement_by_predicted_headroom() -> None:
    slow = replace(B, url="http://b:2/metrics", num_requests_waiting=9.0)
    snap = PoolSnapshot("p", (slow, B), TAKEN)
    got = ttfts(SloBook(), snap, ["b:2", "a:1"], 800)
    assert got == pytest.approx({"b:2": 3.4, "a:1": 1.4})
    # b:2 has more free blocks, a:1 more headroom (2.0 − 1.4 = 0.6 s against −1.4 s)
    scored = [Candidate("b:2", 900, 10), Candidate("a:1", 100, 10)]
    assert by_headroom(scored, got, 2.0, None) == scored[1]
    # the prefix's endpoint within budget wins over more headroom
    both = {"b:2": 1.9, "a:1": 1.4}
    assert by_headroom(scored, both, 2.0, "b:2") == scored[0]
    assert by_headroom(scored, both, 2.0, None) == scored[1]
    # within budget nowhere, or not fitting: the usual pick decides (None)
    assert by_headroom(scored, got, 1.0, None) is None
    assert by_headroom([Candidate("a:1", 5, 10)], got, 2.0, None) is None
