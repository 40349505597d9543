"""Predicted TTFT and TPOT per backend (ext_proc.signals.slo; docs/slo.md), against values
computed by hand. Nothing here changes a verdict: the figures are shown and measured."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from ext_proc.serve.collecting import observe_slo
from ext_proc.signals.parse import parse_engine
from ext_proc.signals.poolbuild import backend_signals
from ext_proc.signals.scrapes import EngineScrape, Histogram, Speed
from ext_proc.signals.slo import predicted_tpot_s, predicted_ttft_s, speed
from ext_proc.signals.window import Window, derive

DATA = Path(__file__).resolve().parents[1] / "data"
INF = float("inf")


def _h(total: float, count: float) -> Histogram:
    return Histogram(bounds=(INF,), counts=(count,), count=count, sum=total)


def _vllm(
    at_s: float,
    prefill: tuple[float, float, float],  # (seconds sum, computed tokens sum, requests)
    ttft: tuple[float, float],
    itl: tuple[float, float],
    running: float,
    waiting: float,
    hits: tuple[float, float],  # (queries, hits) in tokens
) -> EngineScrape:
    return EngineScrape(
        source="b",
        kind="vllm",
        at_s=at_s,
        num_requests_running=running,
        num_requests_waiting=waiting,
        prefill_time_s=_h(prefill[0], prefill[2]),
        prefill_computed_tokens=_h(prefill[1], prefill[2]),
        ttft_s=_h(*ttft),
        itl_s=_h(*itl),
        prefix_cache_queries_tokens=hits[0],
        prefix_cache_hits_tokens=hits[1],
    )


# Four scrapes a second apart. By hand (docs/slo.md):
#   prefill per interval: 1000 tokens in 0.5 s, 1000 in 0.5 s, 1000 in 1.0 s (2 requests each)
#     r = 3000 / 2.0 = 1500 tok/s; c̄ = 3000 / 6 = 500 tokens
#   mean TTFT per interval: 0.6/2 = 0.3, 1.0/2 = 0.5, 1.4/2 = 0.7 s
#   the prediction at a, from the intervals before it: interval 0 has none; interval 1:
#     r = 2000, c̄ = 500, waiting 1: (1 + 1)·500/2000 = 0.5 vs 0.5 → 0; interval 2: r = 2000,
#     waiting 2: 3·500/2000 = 0.75 vs 0.7 → 0.05/0.7; error = (0 + 0.0714…)/2
#   decode points (x = mean running, y = Δitl_sum/Δitl_count): (3, 0.02), (5, 0.03), (7, 0.04)
#     β = 0.005 s per running sequence, α = 0.03 − 0.005·5 = 0.005 s
#   hit ratio = 1000/4000 = 0.25
HISTORY = [
    _vllm(0.0, (0.0, 0.0, 0), (0.0, 0), (0.0, 0), 2, 0, (0, 0)),
    _vllm(1.0, (0.5, 1000.0, 2), (0.6, 2), (0.2, 10), 4, 1, (1000, 250)),
    _vllm(2.0, (1.0, 2000.0, 4), (1.6, 4), (0.5, 20), 6, 2, (2000, 500)),
    _vllm(3.0, (2.0, 3000.0, 6), (3.0, 6), (0.9, 30), 8, 3, (4000, 1000)),
]


def test_speed_of_a_vllm_window_by_hand() -> None:
    sp = speed(HISTORY, 0.25)
    assert sp.prefill_tokens_per_s == pytest.approx(1500.0)
    assert sp.computed_prompt_tokens == pytest.approx(500.0)
    assert sp.step_base_s == pytest.approx(0.005)
    assert sp.step_per_running_s == pytest.approx(0.005)
    assert sp.step_points == 3
    assert sp.ttft_error_ratio == pytest.approx((0.0 + 0.05 / 0.7) / 2)
    assert sp.ttft_error_points == 2


def test_the_backend_predicts_ttft_and_tpot_in_o1_by_hand() -> None:
    b = backend_signals(HISTORY[-1], derive(HISTORY, 10.0))
    assert b.hit_ratio == pytest.approx(0.25)
    # (waiting 3 × 500 + 800 × (1 − 0.25)) / 1500 = (1500 + 600) / 1500
    assert b.predicted_ttft_s(800) == pytest.approx(1.4)
    # plus 300 tokens ICE sent there that have not started
    assert b.predicted_ttft_s(800, ahead_tokens=300) == pytest.approx(1.6)
    # running 8 + 1: 0.005 + 0.005 × 9
    assert b.predicted_tpot_s == pytest.approx(0.05)


def test_the_windows_incremental_speed_equals_derives() -> None:
    w = Window(10.0)
    for s in HISTORY:
        w.append(s)
    got = w.derived()
    assert got is not None and got.speed == derive(HISTORY, 10.0).speed


def test_without_prefill_histograms_ttft_less_queue_time_is_the_prefill() -> None:
    # SGLang, older vLLM: per interval 1000 prompt tokens × (1 − 0.2) = 800 computed, in
    # Δttft_sum − Δqueue_sum = 1.0 − 0.5 s, over 2 requests → r = 1600 tok/s, c̄ = 400
    window = [
        EngineScrape(
            source="s",
            kind="sglang",
            at_s=float(i),
            prompt_tokens=1000.0 * i,
            ttft_s=_h(1.0 * i, 2 * i),
            queue_time_s=_h(0.5 * i, 2 * i),
        )
        for i in range(3)
    ]
    sp = speed(window, 0.2)
    assert sp.prefill_tokens_per_s == pytest.approx(1600.0)
    assert sp.computed_prompt_tokens == pytest.approx(400.0)
    assert sp.step_base_s is None and sp.step_points == 0


def test_a_restart_interval_says_nothing() -> None:
    restarted = _vllm(4.0, (0.1, 50.0, 1), (0.1, 1), (0.0, 0), 1, 0, (0, 0))
    sp = speed([*HISTORY, restarted], 0.25)
    assert sp.prefill_tokens_per_s == pytest.approx(1500.0)  # the fall counts nothing
    assert sp.step_points == 3


@pytest.mark.parametrize(
    ("scrapes", "alpha", "beta"),
    [
        # (running, itl sum s, itl count) per scrape; a point per interval:
        # (mean running, Δsum/Δcount)
        ([(4, 0.0, 0), (4, 0.2, 10)], 0.02, 0.0),  # one point (4, 0.02): flat
        ([(4, 0.0, 0), (4, 0.2, 10), (4, 0.6, 20)], 0.03, 0.0),  # equal x: the mean
        ([(2, 0.0, 0), (2, 0.5, 10), (6, 0.8, 20)], 0.04, 0.0),  # (2, .05), (4, .03): falls
    ],
    ids=["one-point", "equal-x", "negative-slope"],
)
def test_the_step_line_is_flat_when_it_cannot_rise(
    scrapes: list[tuple[float, float, float]], alpha: float, beta: float
) -> None:
    window = [
        _vllm(float(i), (0, 0, 0), (0, 0), (itl_s, n), running, 0, (0, 0))
        for i, (running, itl_s, n) in enumerate(scrapes)
    ]
    sp = speed(window, None)
    assert sp.step_base_s == pytest.approx(alpha)
    assert sp.step_per_running_s == pytest.approx(beta)


def test_the_predictions_by_hand_and_their_edges() -> None:
    sp = Speed(prefill_tokens_per_s=2000.0, computed_prompt_tokens=400.0)
    # (5 × 400 + 1000 × (1 − 0.5)) / 2000
    assert predicted_ttft_s(sp, 5, 1000, 0.5) == pytest.approx(1.25)
    assert predicted_ttft_s(sp, None, 1000, None) == pytest.approx(0.5)  # unknowns: 0
    assert predicted_ttft_s(Speed(), 5, 1000, 0.5) is None  # no speed: no prediction
    line = Speed(step_base_s=-0.01, step_per_running_s=0.02)
    assert predicted_tpot_s(line, 0) == 0.0  # never below zero
    assert predicted_tpot_s(line, 3) == pytest.approx(0.05)
    assert predicted_tpot_s(Speed(), 3) is None


def test_a_recorded_vllm_page_gives_the_prefill_histograms() -> None:
    text = (DATA / "vllm_cpu" / "metrics_loaded.txt").read_text()
    s = parse_engine("vllm", "u", text, 0.0)
    assert s.prefill_time_s is not None and s.prefill_time_s.count == 3
    assert s.prefill_time_s.sum == pytest.approx(0.3068623720000687)
    assert s.prefill_computed_tokens is not None and s.prefill_computed_tokens.count == 3


def test_the_collector_exports_the_predictions() -> None:
    b = backend_signals(HISTORY[-1], derive(HISTORY, 10.0))
    observe_slo("slo-test", b)
    labels = {"pool": "slo-test", "backend": "b"}
    # a mean request: prompt c̄/(1 − h) = 666.7, its own 500 computed: (1500 + 500)/1500
    got = REGISTRY.get_sample_value("ice_slo_predicted_ttft_seconds", labels)
    assert got == pytest.approx(2000 / 1500)
    assert REGISTRY.get_sample_value("ice_slo_predicted_tpot_seconds", labels) == pytest.approx(
        0.05
    )
    err = REGISTRY.get_sample_value("ice_slo_ttft_prediction_error_ratio", labels)
    assert err == pytest.approx((0.05 / 0.7) / 2)


def test_the_rest_of_a_first_tokens_time_is_added_by_hand() -> None:
    # vLLM with its queue histogram: per interval 2 requests, 1000 computed tokens in 0.5 s
    # of prefill, 1.6 s of TTFT and 0.4 s queued:
    #   o = 3.2/4 − 0.8/4 − 1.0/4 = 0.8 − 0.2 − 0.25 = 0.35 s (the API server, the step)
    #   r = 2000 tok/s, c̄ = 500; 1 waiting, no hit: (500 + 800)/2000 + 0.35 = 1.0 s
    #   the error: at scrape 1, from interval 0 only (o = 0.35 too): (1 + 1)·500/2000 + 0.35
    #   = 0.85 against 1.6/2 = 0.8 → 0.05/0.8 = 0.0625
    window = [
        EngineScrape(
            source="b",
            kind="vllm",
            at_s=float(i),
            num_requests_running=2,
            num_requests_waiting=1,
            prefill_time_s=_h(0.5 * i, 2 * i),
            prefill_computed_tokens=_h(1000.0 * i, 2 * i),
            ttft_s=_h(1.6 * i, 2 * i),
            queue_time_s=_h(0.4 * i, 2 * i),
        )
        for i in range(3)
    ]
    sp = speed(window, None)
    assert sp.ttft_overhead_s == pytest.approx(0.35)
    assert predicted_ttft_s(sp, 1, 800, None) == pytest.approx(1.0)
    assert sp.ttft_error_ratio == pytest.approx(0.0625)
    assert sp.ttft_error_points == 1
    # a window without vLLM's queue histogram says nothing of it (o unknown: 0)
    bare = [replace(s, queue_time_s=None) for s in window]
    assert speed(bare, None).ttft_overhead_s is None
    assert predicted_ttft_s(speed(bare, None), 1, 800, None) == pytest.approx(0.65)
    # a mean below 0 (the three histograms count different requests) is 0
    fast = [replace(s, ttft_s=_h(0.1 * i, 2 * i)) for i, s in enumerate(window)]
    assert speed(fast, None).ttft_overhead_s == 0.0
