"""The overload benchmark's pure parts: its reading of ICE's processing-time histogram and of
vLLM's admission-rejection counter, and the per-run summary (429s by reason, 503s by valve,
queued, drain, goodput, tenants, size classes), spreads and tables."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from ext_proc.lab.overload import (
    ROWS,
    RunResult,
    Shot,
    admission_rejections,
    bucket_quantile,
    by_reason,
    by_status,
    by_valve,
    drain_s,
    goodput,
    ice_body_buckets,
    kind_breakdown,
    kind_table,
    one_line,
    plan_burst,
    plan_mixed,
    report,
    spread,
    spreads,
    table,
    tenant_breakdown,
    tenant_table,
    totals,
)
from ext_proc.lab.overload.metrics import rejection_delta
from ext_proc.lab.overload.results import _cell


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


# --- per-run summary, goodput, spread and tenants, on synthetic shots (no vLLM) ---------------


def _shot(
    index: int,
    status: int,
    latency: float,
    *,
    ttft: float | None = None,
    tokens: int = 0,
    reason: str | None = None,
    tenant: str | None = None,
    queued: float | None = None,
    start: float | None = None,
    error: str | None = None,
) -> Shot:
    return Shot(
        index=index,
        priority="standard",
        at_s=index * 0.25,
        status=status,
        latency_s=latency,
        ttft_s=ttft,
        completion_tokens=tokens,
        reason=reason,
        tenant=tenant,
        queued_ms=queued,
        start_s=start,
        error=error,
    )


def _run(
    mode: str, round_no: int, shots: list[Shot], *, preemptions: int = 0, variant: str = ""
) -> RunResult:
    return RunResult(
        mode=mode,
        round=round_no,
        wall_s=1.0,
        preemptions=preemptions,
        queue_time_mean_s=None,
        vllm_requests=0,
        waiting_max=0,
        running_max=0,
        kv_usage_max=0.0,
        ext_proc={},
        shots=shots,
        variant=variant,
    )


# Starts 0.25 s apart (index × 0.25); end = start + latency.
SHOTS = [
    _shot(0, 200, 3.0, ttft=0.5, tokens=100, tenant="heavy"),  # ends 3.0; TTFT within SLO
    _shot(1, 200, 4.0, ttft=2.5, tokens=100, tenant="heavy", queued=1200),  # 4.25; TTFT late
    _shot(2, 429, 0.1, ttft=0.1, reason="kv_exhausted", tenant="light"),  # 0.6
    _shot(3, 429, 5.0, ttft=5.0, reason="queue_timeout", tenant="heavy"),  # 5.75: the last end
    _shot(4, 503, 0.2, error="upstream", tenant="light"),  # 1.2
    # started 50 ms late; TTFT exactly at the SLO counts
    _shot(5, 200, 2.0, ttft=2.0, tokens=50, tenant="light", queued=300, start=1.3),  # 3.3
    _shot(6, 0, 0.01, error="ClientConnectorError: refused", tenant="heavy"),  # 1.51
    _shot(7, 200, 1.0, ttft=0.2, tokens=0, error="stream cut", tenant="heavy"),  # 2.75, not ok
]


def test_drain_time_is_from_t0_to_the_end_of_the_last_request() -> None:
    assert drain_s(SHOTS) == pytest.approx(5.75)
    assert SHOTS[5].end_s == pytest.approx(3.3)  # the real start, not the planned 1.25
    assert drain_s([]) == 0.0


def test_goodput_counts_the_tokens_of_ok_requests_whose_ttft_met_the_slo() -> None:
    # 2.0 s: shots 0 (100) and 5 (50, TTFT = SLO); shot 1 is late, shot 7 failed mid-stream
    assert goodput(SHOTS, 2.0) == pytest.approx(150 / 5.75)
    assert goodput(SHOTS, 3.0) == pytest.approx(250 / 5.75)
    assert goodput(SHOTS, 0.4) == 0.0
    assert goodput(SHOTS, 2.0, drain=10.0) == pytest.approx(15.0)
    assert goodput([], 2.0) == 0.0


def test_429s_by_reason_and_other_answers_by_status() -> None:
    assert by_reason(SHOTS) == {"kv_exhausted": 1, "queue_timeout": 1}
    more = [*SHOTS, _shot(8, 429, 0.1, reason="queue_full"), _shot(9, 429, 0.1, reason=None)]
    more.append(_shot(10, 429, 0.1, reason="queue_full"))
    # most first, then by name; a 429 without x-ice-reason counts as "-"
    assert list(by_reason(more).items()) == [
        ("queue_full", 2),
        ("-", 1),
        ("kv_exhausted", 1),
        ("queue_timeout", 1),
    ]
    # 0: no answer at all; a 200 whose stream failed is not ok and counts under 200; a 503
    # is a refusal (vLLM's valve, or here one whose body names no valve: "-"), not "other"
    assert by_status(SHOTS) == {"0": 1, "200": 1}
    assert by_valve(SHOTS) == {"-": 1}


def test_summary_of_a_run_against_hand_computed_values() -> None:
    s = _run("queue", 1, SHOTS).summary()
    expected: dict[str, Any] = {
        "label": "queue",
        "requests": 8,
        "ok": 3,
        "shed_429": 2,
        "shed_by_reason": {"kv_exhausted": 1, "queue_timeout": 1},
        "refused_503": 1,
        "refused_503_by_valve": {"-": 1},
        "valve_rejections": {},
        "other": 2,
        "other_by_status": {"0": 1, "200": 1},
        "queued": 2,
        "queued_ms_p50": 300.0,  # nearest rank ceil(0.5 × 2) = 1st of [300, 1200]
        "queued_ms_p95": 1200.0,
        "queued_ms_max": 1200.0,
        "output_tokens": 250,
        "drain_s": 5.75,
        "output_tok_per_s": 43.5,  # 250 / 5.75 = 43.48
        "ttft_slo_s": 2.0,
        "slo_met": 2,
        "goodput_tok_per_s": 26.1,  # 150 / 5.75 = 26.09
        "wait_p50_s": 2.0,  # TTFT of the ok ones: [0.5, 2.0, 2.5]
        "wait_p95_s": 2.5,
        "ok_p50_s": 3.0,  # end to end of the ok ones: [2.0, 3.0, 4.0]
        "ok_p95_s": 4.0,
        "ok_max_s": 4.0,
    }
    assert {k: s[k] for k in expected} == expected
    slower = RunResult(**{**_run("queue", 1, SHOTS).__dict__, "ttft_slo_s": 3.0}).summary()
    assert (slower["slo_met"], slower["goodput_tok_per_s"]) == (3, 43.5)


def test_tenant_breakdown_against_hand_computed_values() -> None:
    assert tenant_breakdown(SHOTS) == {
        # shots 0, 1, 3, 6, 7: ok 0 and 1; one 429; shot 1 queued 1200 ms; TTFT [0.5, 2.5]
        "heavy": {
            "requests": 5,
            "ok": 2,
            "shed_429": 1,
            "queued": 1,
            "queued_ms_p95": 1200.0,
            "ttft_p95_s": 2.5,
        },
        # shots 2, 4, 5
        "light": {
            "requests": 3,
            "ok": 1,
            "shed_429": 1,
            "queued": 1,
            "queued_ms_p95": 300.0,
            "ttft_p95_s": 2.0,
        },
    }
    assert tenant_breakdown([_shot(0, 200, 1.0, ttft=0.1)]) == {}
    run = _run("ice", 1, SHOTS)
    assert run.summary()["tenants"] == tenant_breakdown(SHOTS, run.ttft_slo_s)


def test_a_tenants_goodput_is_its_slo_tokens_over_its_own_drain() -> None:
    got = tenant_breakdown(SHOTS, 2.0)
    # heavy: shot 0's 100 tokens (shot 1's TTFT is late) over its last end, shot 3's 5.75 s
    assert got["heavy"]["goodput_tok_per_s"] == round(100 / 5.75, 2) == 17.39
    # light: shot 5's 50 tokens (TTFT = SLO) over its last end, 3.3 s
    assert got["light"]["goodput_tok_per_s"] == round(50 / 3.3, 2) == 15.15


@pytest.mark.parametrize(
    ("values", "text"),
    [
        ([3.0, 1.0, 2.0], "2 [1–3]"),
        ([1.0, 2.0, 3.0, 10.0], "2.5 [1–10]"),  # even count: the mean of the middle two
        ([1.5, 1.5, 1.5], "1.5"),
        ([0.1234, 0.2], "0.162 [0.123–0.2]"),
        ([None, 2.0, 4.0], "3 [2–4] (n=2)"),
        ([7.0], "7"),
        ([], "-"),
        ([None, None], "-"),
    ],
)
def test_spread_is_median_and_range(values: list[float | None], text: str) -> None:
    assert spread(values) == text


def _row(markdown: str, first: str) -> dict[str, str]:
    """The cells of the row whose first cell is ``first``, by column heading."""
    lines = [line for line in markdown.splitlines() if line.startswith("|")]
    heads = [c.strip() for c in lines[0].strip("|").split("|")]
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[0] == first:
            return dict(zip(heads, cells, strict=True))
    raise AssertionError(f"no row {first!r} in\n{markdown}")


def _ok(i: int, latency: float, ttft: float, tokens: int = 10) -> Shot:
    return _shot(i, 200, latency, ttft=ttft, tokens=tokens)


def test_totals_is_one_row_per_mode_with_the_spread_over_rounds() -> None:
    kv, qt = "kv_exhausted", "queue_timeout"
    results = [
        # given out of order: rows still come direct, ice, queue, then the control
        _run("queue", 1, [_ok(0, 1.0, 0.5), _shot(1, 429, 0.1, reason=qt)], preemptions=0),
        _run("ice", 1, [_ok(0, 1.0, 0.5), _shot(1, 429, 0.1, reason=kv)], preemptions=1),
        _run("ice", 2, [_ok(0, 2.0, 0.5), _ok(1, 1.0, 0.25)], preemptions=3),
        _run("ice", 3, [_ok(0, 3.0, 0.5), _shot(1, 429, 0.1, reason=kv)], preemptions=2),
        _run("direct", 1, [_ok(0, 4.0, 3.0), _ok(1, 4.0, 3.0)], preemptions=5),
        _run("queue", 1, [_ok(0, 1.0, 0.5)], variant="light alone"),
    ]
    text = totals(results)
    lines = [line for line in text.splitlines() if line.startswith("| ")]
    assert [line.split("|")[1].strip() for line in lines[1:]] == [
        "direct",
        "ice",
        "queue",
        "queue light alone",
    ]
    ice = _row(text, "ice")
    assert ice["runs"] == "3"
    assert ice["200"] == "1 [1–2]"
    assert ice["preemptions"] == "2 [1–3]"
    assert ice["429 kv_exhausted"] == "1 [0–1]"  # round 2 had none: 0
    assert ice["429 queue_timeout"] == "0"  # a reason of another mode's runs only
    assert ice["e2e max s"] == "2 [1–3]"
    assert ice["queued ms p95"] == "-"  # nothing queued
    # goodput: tokens within 2 s / drain: round 1 10 / 1.0 s (the 429 ends at 0.35 s),
    # round 2 20 / 2.0 s, round 3 10 / 3.0 s = 3.3
    assert ice["goodput tok/s"] == "10 [3.3–10]"
    assert _row(text, "direct")["goodput tok/s"] == "0"  # TTFT 3 s > SLO 2 s
    assert "TTFT ≤ 2 s" in text.splitlines()[-1]


def test_tenant_table_spreads_each_tenant_of_each_mode() -> None:
    def burst(heavy_ttft: float, queued: float) -> list[Shot]:
        return [
            _shot(0, 200, 2.0, ttft=heavy_ttft, tokens=5, tenant="heavy", queued=queued),
            _shot(1, 429, 0.1, reason="queue_full", tenant="heavy"),
            _shot(2, 200, 1.0, ttft=0.5, tokens=5, tenant="light"),
        ]

    results = [_run("queue", r, burst(t, q)) for r, (t, q) in enumerate([(1, 100), (3, 500)], 1)]
    text = tenant_table(results)
    heads = [c.strip() for c in text.splitlines()[0].strip("|").split("|")]
    rows = [
        dict(zip(heads, (c.strip() for c in line.strip("|").split("|")), strict=True))
        for line in text.splitlines()[2:]
    ]
    assert [(r["mode"], r["tenant"]) for r in rows] == [("queue", "heavy"), ("queue", "light")]
    assert rows[0]["429"] == "1"
    assert rows[0]["queued ms p95"] == "300 [100–500]"
    assert rows[0]["TTFT p95 s"] == "2 [1–3]"
    assert rows[1]["queued ms p95"] == "-"
    assert tenant_table([_run("ice", 1, [_ok(0, 1.0, 0.5)])]) == ""


def test_spreads_and_report_carry_everything_per_run_as_json() -> None:
    results = [
        _run("ice", 1, SHOTS),
        _run("ice", 2, SHOTS[:3]),
    ]
    data = spreads(results)
    assert data["ice"]["runs"] == 2
    assert data["ice"]["ok"] == {"median": 2.5, "min": 2.0, "max": 3.0, "n": 2}
    assert data["ice"]["shed_by_reason.queue_timeout"] == {
        "median": 0.5,
        "min": 0.0,
        "max": 1.0,
        "n": 2,
    }
    burst = plan_burst(8, 10, 10, 250, "standard=1", "heavy=3,light=1")
    full = json.loads(json.dumps(report(results, burst, {"ttft_slo_s": 2.0})))
    assert full["burst"]["tenants"] == {"heavy": 6, "light": 2}
    assert full["burst"]["ttft_slo_s"] == 2.0
    assert full["runs"][0]["summary"]["tenants"]["light"]["ok"] == 1
    assert full["runs"][0]["shots"][1]["queued_ms"] == 1200
    assert full["spread"]["ice"]["ok"]["max"] == 3.0


def test_table_and_one_line_show_the_new_numbers() -> None:
    results = [_run("queue", 1, SHOTS), _run("direct", 1, SHOTS[:1])]
    text = table(results)
    assert [c.strip() for c in text.splitlines()[0].split("|")[2:4]] == ["r1 direct", "r1 queue"]
    reasons = next(line for line in text.splitlines() if line.startswith("| 429 by reason"))
    assert reasons.split("|")[3].strip() == "kv_e:1 queu:1"
    line = one_line(results[0])
    assert "2 × 429 (kv_exhausted:1 queue_timeout:1)" in line
    assert "2 queued (p95 1200 ms)" in line
    assert "goodput 26.1 tok/s (TTFT ≤ 2.0 s)" in line


def test_a_dict_cell_cuts_keys_only_as_far_as_they_stay_apart() -> None:
    assert _cell({"critical": 0, "standard": 3}) == "crit:0 stan:3"
    assert _cell({"queue_timeout": 1, "queue_full": 2}) == "queue_t:1 queue_f:2"
    assert _cell({}) == "-"


# --- vLLM's admission valve: 503s, the rejection counter, the arms' tables ------------------

DATA = Path(__file__).resolve().parents[1] / "data"
REQS_503 = (
    '{"error":{"message":"The engine is currently busy and cannot accept new requests. '
    'Please try again later or on a different instance.","type":"Service Unavailable",'
    '"param":null,"code":503}}'
)
TOKENS_503 = (
    '{"error":{"message":"The engine has reached its prefill token backlog limit. Please '
    'try again later or on a different instance.","type":"Service Unavailable","code":503}}'
)


def test_admission_rejections_are_read_by_reason_from_recorded_vllm_pages() -> None:
    # vLLM 0.32's page as recorded (no valve: both reasons at 0), and the same page after a
    # valve refused 7 requests and 2 prompts; the _created gauges beside them do not count
    loaded = (DATA / "vllm_cpu" / "metrics_loaded.txt").read_text()
    assert admission_rejections(loaded) == {
        "max_num_queued_reqs": 0.0,
        "max_num_queued_tokens": 0.0,
    }
    sample = 'vllm:admission_rejections_total{model_name="tiny",reason="max_num_queued_%s"}'
    valve = loaded.replace(f"{sample % 'reqs'} 0.0", f"{sample % 'reqs'} 7.0").replace(
        f"{sample % 'tokens'} 0.0", f"{sample % 'tokens'} 2.0"
    )
    assert admission_rejections(valve) == {"max_num_queued_reqs": 7.0, "max_num_queued_tokens": 2.0}
    # a vLLM without the counter (an older page) gives {}
    assert admission_rejections((DATA / "vllm_v1_metrics.txt").read_text()) == {}


def test_the_rejection_delta_is_after_less_before() -> None:
    before = {"max_num_queued_reqs": 7.0, "max_num_queued_tokens": 2.0}
    after = {"max_num_queued_reqs": 12.0, "max_num_queued_tokens": 2.0, "new_reason": 1.0}
    assert rejection_delta(before, after) == {
        "max_num_queued_reqs": 5,
        "max_num_queued_tokens": 0,
        "new_reason": 1,
    }
    assert rejection_delta({}, {}) == {}


# A run against a vLLM with a valve: 2 ok, three valve 503s (two reqs, one tokens), one 503
# that names no valve (Envoy without an upstream), one ICE 429.
VALVE_SHOTS = [
    _shot(0, 200, 2.0, ttft=0.5, tokens=100),
    _shot(1, 200, 3.0, ttft=2.5, tokens=100),
    _shot(2, 503, 0.02, ttft=0.02, error=REQS_503),
    _shot(3, 503, 0.02, ttft=0.02, error=REQS_503),
    _shot(4, 503, 0.03, ttft=0.03, error=TOKENS_503),
    _shot(5, 503, 0.5, error="upstream connect error or disconnect/reset before headers"),
    _shot(6, 429, 0.05, ttft=0.05, reason="kv_exhausted"),
]


def _valve_run(
    mode: str,
    round_no: int,
    shots: list[Shot],
    valve: str,
    rejections: dict[str, int],
    *,
    preemptions: int = 0,
) -> RunResult:
    run = _run(mode, round_no, shots, preemptions=preemptions)
    run.valve = valve
    run.admission_rejections = rejections
    return run


def test_503s_are_refusals_counted_by_valve_beside_vllms_counter() -> None:
    counter = {"max_num_queued_reqs": 2, "max_num_queued_tokens": 1}
    s = _valve_run("direct", 1, VALVE_SHOTS, "reqs=2", counter).summary()
    assert s["label"] == s["arm"] == "valve:reqs=2"
    assert (s["mode"], s["valve"]) == ("direct", "reqs=2")
    assert s["ok"] == 2 and s["shed_429"] == 1
    assert s["refused_503"] == 4
    assert s["refused_503_by_valve"] == {"reqs": 2, "-": 1, "tokens": 1}
    assert s["valve_rejections"] == {"reqs": 2, "tokens": 1}
    # a 503 is not "other"; nothing else went wrong
    assert (s["other"], s["other_by_status"]) == (0, {})
    assert by_valve(VALVE_SHOTS) == {"reqs": 2, "-": 1, "tokens": 1}
    # a valve arm shows its counter even when it never fired; an arm without a valve only
    # what happened
    quiet = {"max_num_queued_reqs": 0, "max_num_queued_tokens": 0}
    assert _valve_run("ice", 1, [], "tokens=512", quiet).summary()["valve_rejections"] == {
        "reqs": 0,
        "tokens": 0,
    }
    assert _valve_run("ice", 1, [], "", quiet).summary()["valve_rejections"] == {}
    line = one_line(_valve_run("direct", 1, VALVE_SHOTS, "reqs=2", counter))
    assert "1 × 429 (kv_exhausted:1), 4 × 503 (reqs:2 -:1 tokens:1)" in line


def _heads(markdown: str) -> list[str]:
    return [c.strip() for c in markdown.splitlines()[0].strip("|").split("|")]


# The per-arm table's columns for runs without a valve, as before valves existed.
PLAIN_HEADS = [
    "mode",
    "runs",
    "requests",
    "200",
    "429",
    "429 kv_exhausted",
    "queued",
    "queued ms p95",
    "queued ms max",
    "preemptions",
    "TTFT p50 s",
    "TTFT p95 s",
    "e2e p50 s",
    "e2e p95 s",
    "e2e max s",
    "drain s",
    "tok/s",
    "goodput tok/s",
    "fail-open",
]


def test_the_arms_table_adds_the_valve_columns_only_when_a_run_has_them() -> None:
    kv = "kv_exhausted"
    plain = [
        _run("direct", 1, [_ok(0, 4.0, 3.0)], preemptions=5),
        _run("ice", 1, [_ok(0, 1.0, 0.5), _shot(1, 429, 0.1, reason=kv)], preemptions=1),
    ]
    text = totals(plain)
    assert _heads(text) == PLAIN_HEADS
    assert "valve Δ" not in text
    quiet = {"max_num_queued_reqs": 0, "max_num_queued_tokens": 0}

    def reqs2(round_no: int, refused: int) -> RunResult:
        shots = [_ok(0, 1.0, 0.5)] + [
            _shot(i, 503, 0.02, ttft=0.02, error=REQS_503) for i in range(1, refused + 1)
        ]
        counter = {**quiet, "max_num_queued_reqs": refused}
        return _valve_run("direct", round_no, shots, "reqs=2", counter)

    results = [
        *plain,
        reqs2(1, 3),
        reqs2(2, 1),
        _valve_run("ice", 1, [_ok(0, 1.0, 0.5)], "reqs=2", quiet),
        _valve_run("direct", 1, [_ok(0, 2.0, 0.5)], "tokens=1024", quiet, preemptions=4),
        _valve_run("direct", 1, [_ok(0, 2.0, 0.5)], "reqs=16", quiet),
    ]
    text = totals(results)
    heads = _heads(text)
    assert heads[:6] == ["mode", "runs", "requests", "200", "429", "429 kv_exhausted"]
    assert heads[6:10] == ["503", "503 reqs", "valve Δ reqs", "valve Δ tokens"]
    lines = [line for line in text.splitlines() if line.startswith("| ")]
    # no valve first, then by valve (reqs by limit, then tokens), the modes as in MODES
    assert [line.split("|")[1].strip() for line in lines[1:]] == [
        "direct",
        "ice",
        "valve:reqs=2",
        "ice+valve:reqs=2",
        "valve:reqs=16",
        "valve:tokens=1024",
    ]
    valve = _row(text, "valve:reqs=2")
    assert (valve["runs"], valve["503"], valve["503 reqs"]) == ("2", "2 [1–3]", "2 [1–3]")
    assert (valve["valve Δ reqs"], valve["valve Δ tokens"]) == ("2 [1–3]", "0")
    assert _row(text, "direct")["503"] == "0"
    assert _row(text, "direct")["valve Δ reqs"] == "0"  # no counter delta: counts 0
    assert _row(text, "valve:tokens=1024")["preemptions"] == "4"
    assert "valve Δ <valve>: vllm:admission_rejections_total" in text.splitlines()[-1]


def test_the_per_run_table_shows_the_valve_rows_only_when_a_run_has_them() -> None:
    plain = [_run("direct", 1, SHOTS[:2]), _run("ice", 1, SHOTS[:2])]
    labels = [line.split("|")[1].strip() for line in table(plain).splitlines()[2:]]
    assert labels == [label for key, label in ROWS if not key.startswith(("refused", "valve"))]
    counter = {"max_num_queued_reqs": 2, "max_num_queued_tokens": 1}
    text = table([*plain, _valve_run("direct", 1, VALVE_SHOTS, "reqs=2", counter)])
    assert [c.strip() for c in text.splitlines()[0].split("|")[2:5]] == [
        "r1 direct",
        "r1 ice",
        "r1 valve:reqs=2",
    ]
    refused = _row(text, "503 refused")
    assert (refused["r1 direct"], refused["r1 valve:reqs=2"]) == ("0", "4")
    assert _row(text, "503 by valve (body)")["r1 valve:reqs=2"] == "reqs:2 -:1 toke:1"
    assert _row(text, "vLLM admission rejections (delta)")["r1 valve:reqs=2"] == "reqs:2 toke:1"
    assert _row(text, "vLLM admission rejections (delta)")["r1 direct"] == "-"


def _kind_shot(i: int, kind: str, status: int, ttft: float, latency: float, tokens: int) -> Shot:
    shot = _shot(i, status, latency, ttft=ttft, tokens=tokens)
    shot.kind = kind
    return shot


def test_the_mixed_workload_is_broken_down_by_size_class() -> None:
    def run(round_no: int, short_ttft: float) -> RunResult:
        return _run(
            "ice",
            round_no,
            [
                _kind_shot(0, "short", 200, short_ttft, 1.0, 30),
                _kind_shot(1, "long", 200, 2.5, 5.75, 300),  # ends 6.0: the drain
                _kind_shot(2, "short", 429, 0.1, 0.1, 0),
                _kind_shot(3, "long", 503, 0.02, 0.02, 0),
            ],
        )

    s = run(1, 0.5).summary()
    assert s["kinds"] == {
        "short": {
            "requests": 2,
            "ok": 1,
            "shed_429": 1,
            "refused_503": 0,
            "ttft_p50_s": 0.5,
            "ttft_p95_s": 0.5,
            "e2e_p95_s": 1.0,
            "goodput_tok_per_s": 5.0,  # 30 tokens within the SLO / the run's 6.0 s drain
        },
        "long": {
            "requests": 2,
            "ok": 1,
            "shed_429": 0,
            "refused_503": 1,
            "ttft_p50_s": 2.5,
            "ttft_p95_s": 2.5,
            "e2e_p95_s": 5.75,
            "goodput_tok_per_s": 0.0,  # its first token came after the 2 s SLO
        },
    }
    assert s["goodput_tok_per_s"] == 5.0  # the classes add up to the run's goodput
    assert kind_breakdown(SHOTS, 2.0) == {}  # the burst has no classes
    text = kind_table([run(1, 0.5), run(2, 1.5)])
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()[2:]]
    assert _heads(text)[:3] == ["mode", "class", "runs"]
    assert [r[:3] for r in rows] == [["ice", "short", "2"], ["ice", "long", "2"]]
    assert rows[0][_heads(text).index("TTFT p50 s")] == "1 [0.5–1.5]"
    assert rows[1][_heads(text).index("503")] == "1"
    assert kind_table([_run("ice", 1, SHOTS)]) == ""


def test_the_report_keeps_the_plan_and_its_sizes() -> None:
    plan = plan_mixed(10, 0, "standard=1", seed=2)
    full = json.loads(json.dumps(report([_run("ice", 1, SHOTS)], plan, {"workload": "mixed"})))
    assert full["burst"]["workload"] == "mixed"
    assert [p["kind"] for p in full["burst"]["plan"]] == [p.kind for p in plan]
    assert full["burst"]["sizes"]["long"]["requests"] == 3
    assert "refused_503_by_valve.-" in full["spread"]["ice"]


def test_a_503_that_ice_answered_for_the_backend_counts_under_ices_reason() -> None:
    # an ICE that answers a backend's overload 503 itself: its own body, x-ice-reason
    ice_503 = _shot(0, 503, 0.05, reason="backend_overloaded", error='{"error":{"code":"x"}}')
    envoy_503 = _shot(1, 503, 0.5, error="no healthy upstream")
    valve_503 = _shot(2, 503, 0.02, reason="backend_overloaded", error=REQS_503)
    assert by_valve([ice_503, envoy_503, valve_503]) == {"-": 1, "backend_overloaded": 1, "reqs": 1}
