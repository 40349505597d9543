"""The engine's step line and the TTFT predicted from it (ext_proc.signals.slo; docs/slo.md,
"The engine's step line"), against values computed by hand."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from ext_proc.placement.slo_book import SloBook, slo_case
from ext_proc.policy.settings import SloTarget
from ext_proc.signals.parse import parse_engine
from ext_proc.signals.poolbuild import backend_signals
from ext_proc.signals.scrapes import EngineScrape, Histogram, Speed
from ext_proc.signals.slo import predicted_ttft_s, predicted_ttft_step_s, speed
from ext_proc.signals.snapshot import PoolSnapshot
from ext_proc.signals.window import derive

DATA = Path(__file__).resolve().parents[1] / "data"
INF = float("inf")


def _h(total: float, count: float) -> Histogram:
    return Histogram(bounds=(INF,), counts=(count,), count=count, sum=total)


def _scrape(
    at_s: float, i: int, tokens: float, itl_s: float, ttft: tuple[float, float] = (0.0, 0)
) -> EngineScrape:
    """The i-th of four scrapes: cumulative engine steps (10 an interval) and their tokens,
    inter-token latencies (10 an interval) and per-request prefill (2 requests of 500
    computed tokens an interval, 0.5 s of prefill each)."""
    return EngineScrape(
        source="b",
        kind="vllm",
        at_s=at_s,
        num_requests_running=10,
        num_requests_waiting=2,
        iteration_tokens=_h(tokens, 10 * i),
        itl_s=_h(itl_s, 10 * i),
        prefill_time_s=_h(1.0 * i, 2 * i),
        prefill_computed_tokens=_h(1000.0 * i, 2 * i),
        ttft_s=_h(*ttft),
    )


# Intervals (x = Δtokens ÷ Δsteps, y = Δitl_sum ÷ Δitl_count):
#   1: 200 tokens in 10 steps → x = 20,  0.1 s over 10 → y = 0.01
#   2: 1200 tokens            → x = 120, 0.2 s        → y = 0.02
#   3: 2200 tokens            → x = 220, 0.3 s        → y = 0.03
# b = Σ(x − x̄)(y − ȳ) ÷ Σ(x − x̄)² = (100·0.01 + 100·0.01) ÷ (100² + 100²) = 0.0001 s a token
# a = ȳ − b x̄ = 0.02 − 0.0001 × 120 = 0.008 s
HISTORY = [
    _scrape(0.0, 0, 0.0, 0.0),
    _scrape(1.0, 1, 200.0, 0.1),
    _scrape(2.0, 2, 1400.0, 0.3),
    _scrape(3.0, 3, 3600.0, 0.6),
]


def test_its_own_error_is_measured_by_the_step_line_by_hand() -> None:
    """ICE's own error (ttft_error_ratio) predicts by the line of the intervals before each
    one: at scrape 1 the line has one point (b = 0: the per-request speed), at scrape 2
    two points (b = 0.0001, a = 0.008)."""
    # mean TTFTs: interval 2 (1.5 s over 2), interval 3 (0.15 s over 2)
    ttfts = [(0.0, 0), (0.2, 2), (3.2, 4), (3.5, 6)]
    history = [replace(s, ttft_s=_h(*t)) for s, t in zip(HISTORY, ttfts, strict=True)]
    sp = speed(history, None)
    # at 1: r = 1000, c̄ = 500 from interval 1: (2 + 1) × 500 ÷ 1000 = 1.5 s vs 1.5: error 0
    # at 2: W = (2 + 1) × 500 = 1500, d = 10: 0.0045 + 0.008 + 0.0001 × 1510 = 0.1635 s
    #       vs 0.15: error 0.0135 ÷ 0.15 = 0.09
    assert sp.ttft_error_points == 2
    assert sp.ttft_error_ratio == pytest.approx((0.0 + 0.09) / 2)


def test_the_step_line_of_a_window_by_hand() -> None:
    sp = speed(HISTORY, None)
    assert sp.token_step_fixed_s == pytest.approx(0.008)
    assert sp.token_step_per_token_s == pytest.approx(0.0001)
    assert sp.token_step_points == 3
    # the per-request speed is still there: 3000 tokens in 3.0 s of prefill
    assert sp.prefill_tokens_per_s == pytest.approx(1000.0)
    assert sp.computed_prompt_tokens == pytest.approx(500.0)


LINE = Speed(
    prefill_tokens_per_s=1000.0,
    computed_prompt_tokens=500.0,
    token_step_fixed_s=0.008,
    token_step_per_token_s=0.0001,
)


def test_the_ttft_by_the_step_line_by_hand() -> None:
    # W = 2 × 500 + 300 + 800 × 0.75 = 1900 tokens, d = 10, one step of 8192:
    # (0.008 + 0.0001 × 10) ÷ 2 + 0.008 + 0.0001 × (1900 + 10) = 0.0045 + 0.008 + 0.191
    assert predicted_ttft_step_s(LINE, 2, 10, 800, 0.25, 300) == pytest.approx(0.2035)
    # steps of 1000 tokens: k = ceil(1900 ÷ 990) = 2: 0.0045 + 0.016 + 0.0001 × 1920
    got = predicted_ttft_step_s(LINE, 2, 10, 800, 0.25, 300, max_batched_tokens=1000)
    assert got == pytest.approx(0.2125)


def test_waiting_requests_wait_for_room_by_hand() -> None:
    # 2 waiting (vLLM had no room for them) + 1 sent since the scrape, 4 completions a
    # second: q = (2 + 1 + 1) ÷ 4 = 1.0 s on top of the steps' 0.2035 s
    got = predicted_ttft_step_s(
        LINE, 2, 10, 800, 0.25, 300, ahead_requests=1, completions_per_s=4.0
    )
    assert got == pytest.approx(1.2035)
    # nothing waiting: the requests sent since are prefilled in the steps, no wait for room
    # (W = 300 + 600 = 900: 0.0045 + 0.008 + 0.0001 × 910)
    got = predicted_ttft_step_s(
        LINE, 0, 10, 800, 0.25, 300, ahead_requests=1, completions_per_s=4.0
    )
    assert got == pytest.approx(0.1035)
    # no completions in the window: λ unknown, no term (fail-open)
    assert predicted_ttft_step_s(LINE, 2, 10, 800, 0.25, 300, ahead_requests=1) == (
        pytest.approx(0.2035)
    )


def test_with_o_and_without_a_line() -> None:
    sp = Speed(
        prefill_tokens_per_s=1000.0,
        computed_prompt_tokens=500.0,
        token_step_fixed_s=0.008,
        token_step_per_token_s=0.0001,
        ttft_overhead_s=0.05,
    )
    assert predicted_ttft_step_s(sp, 2, 10, 800, 0.25, 300) == pytest.approx(0.2535)
    # no line (or a flat one): the speed per request, (1000 + 300 + 600) ÷ 1000 + 0.05
    flat = Speed(prefill_tokens_per_s=1000.0, computed_prompt_tokens=500.0, ttft_overhead_s=0.05)
    assert predicted_ttft_step_s(flat, 2, 10, 800, 0.25, 300) == pytest.approx(1.95)
    assert predicted_ttft_step_s(flat, 2, 10, 800, 0.25, 300) == predicted_ttft_s(
        flat, 2, 800, 0.25, 300
    )
    assert predicted_ttft_step_s(Speed(), 2, 10, 800, 0.25) is None


def test_the_book_predicts_by_the_step_line() -> None:
    """admission: slo reads the step line: the same 1900 tokens ahead, through slo_case."""
    b = backend_signals(HISTORY[-1], derive(HISTORY, 10.0))
    snap = PoolSnapshot(pool="p", taken_at_s=0.0, backends=(b,))
    case = slo_case(SloBook(clock=lambda: 1.0), snap, ["e"], "e", SloTarget(2000, None), 0, 1100)
    # W = 2 × 500 + 1100 = 2100 (no hit), d = 10: 0.0045 + 0.008 + 0.0001 × 2110 = 0.2235
    assert case.ttft_s == pytest.approx(0.2235)


def test_a_recorded_vllm_page_gives_the_step_tokens() -> None:
    text = (DATA / "vllm_cpu" / "metrics_loaded.txt").read_text()
    s = parse_engine("vllm", "u", text, 0.0)
    assert s.iteration_tokens is not None
    assert (s.iteration_tokens.count, s.iteration_tokens.sum) == (379.0, 4836.0)
