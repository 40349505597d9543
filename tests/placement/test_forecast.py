"""Admission by forecast (``ext_proc.policy.output_dist``, ``ext_proc.placement.forecast``,
``ext_proc.placement.forecast_book``): output lengths from the pool's histogram given what a
request generated, the Past-Future peak of an endpoint's blocks, and the fit a request is
judged against, each against hand-computed values."""

from __future__ import annotations

import json
import math
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ext_proc.admit.pipeline import Pipeline, RequestFacts
from ext_proc.placement.forecast import Outlook, Peaks, Trajectory, peak_of
from ext_proc.placement.forecast_book import ForecastBook
from ext_proc.placement.inflight import Hold
from ext_proc.policy.errors import PolicyError
from ext_proc.policy.kvfit import KvFit, Shape
from ext_proc.policy.load import parse_policy
from ext_proc.policy.output_dist import cdf_at, remaining_total
from ext_proc.policy.settings import ForecastSpec, Profile
from ext_proc.schemas import OPENAI_CHAT
from ext_proc.signals.parse import parse_engine
from ext_proc.signals.poolbuild import backend_signals
from ext_proc.signals.scrapes import Derived, Histogram
from ext_proc.signals.snapshot import BackendSignals, PoolSnapshot
from tests.builders import LENGTHS, blocks16
from tests.builders import forecast_backend as backend

INF = math.inf


# --- output lengths -------------------------------------------------------------------------


def test_the_cdf_is_linear_inside_a_bucket() -> None:
    assert cdf_at(LENGTHS, 55) == 20 + 40 * 45 / 90  # 40
    assert cdf_at(LENGTHS, 5) == 10
    assert cdf_at(LENGTHS, 5000) == 100


def test_the_total_is_the_quantile_of_the_lengths() -> None:
    # q 0.5: target 50 in (10, 100]: 10 + 90 × 30 / 40 = 77.5 → 78
    assert remaining_total(LENGTHS, 0.5, 0, 5000) == 78
    # q 0.9: target 90 in (100, 1000]: 100 + 900 × 30 / 40 = 775
    assert remaining_total(LENGTHS, 0.9, 0, 5000) == 775


def test_the_total_rises_with_what_the_request_has_generated() -> None:
    # F(200) = 60 + 40 × 100 / 900 = 64.44; target = 64.44 + 0.9 × 35.56 = 96.44
    # → 100 + 900 × 36.44 / 40 = 920.0
    assert remaining_total(LENGTHS, 0.9, 200, 5000) == 920


def test_the_total_never_passes_the_limit_nor_falls_below_the_floor() -> None:
    assert remaining_total(LENGTHS, 0.9, 0, 300) == 300
    assert remaining_total(LENGTHS, 0.5, 0, 5000, floor=400) == 400


def test_without_enough_history_the_request_is_held_at_its_limit() -> None:
    assert remaining_total(LENGTHS, 0.9, 0, 5000, min_observations=101) == 5000
    assert remaining_total(None, 0.9, 0, 5000) == 5000


def test_past_the_history_a_request_runs_as_long_again() -> None:
    # every observation ≤ 1000: a request at 1,500 is expected to reach 3,000
    assert remaining_total(LENGTHS, 0.9, 1500, 5000) == 3000
    assert remaining_total(LENGTHS, 0.9, 1500, 2500) == 2500  # never past its limit
    # the target in the +Inf bucket: twice the largest finite bound observed (10)
    tail = Histogram(bounds=(10, INF), counts=(50, 100), count=100, sum=0)
    assert remaining_total(tail, 0.9, 0, 4096) == 20
    assert remaining_total(tail, 0.9, 30, 4096) == 60


def test_caution_moves_the_total_towards_the_limit() -> None:
    # 775 + 0.5 × (5000 − 775) = 2887.5 → 2888
    # q' = 0.9 + 0.5 × 0.1 = 0.95: target 95 → 100 + 900 × 35/40 = 887.5 → 888
    assert remaining_total(LENGTHS, 0.9, 0, 5000, caution=0.5) == 888
    # c 1: q' 1, target 100: the top of the highest bucket observed (1000), not the limit
    assert remaining_total(LENGTHS, 0.9, 0, 5000, caution=1.0) == 1000
    # where requests run to their limits (p 0.2) the target passes N: the limit
    assert remaining_total(LENGTHS, 0.9, 0, 5000, caution=1.0, limit_share=0.2) == 5000
    # p 0.2, c 0.5: q' 0.95, target 0.95 × 125 = 118.75 > 100: the limit
    assert remaining_total(LENGTHS, 0.9, 0, 5000, caution=0.5, limit_share=0.2) == 5000
    # without a trusted history the limit either way
    assert remaining_total(None, 0.5, 0, 5000, caution=0.5) == 5000


def test_a_share_of_requests_that_ran_to_their_limit_lengthens_the_total() -> None:
    # p 0.2, q 0.5: target = 0.5 × (100 + 100 × 0.2 / 0.8) = 62.5 → 100 + 900 × 2.5/40
    # = 156.25 → 157 (78 with p = 0)
    assert remaining_total(LENGTHS, 0.5, 0, 5000, limit_share=0.2) == 157
    # p 0.5: target = 0.5 × (100 + 100) = 100 → the last observation's bucket bound, 1000
    assert remaining_total(LENGTHS, 0.5, 0, 5000, limit_share=0.5) == 1000
    # p 0.6: target = 0.5 × (100 + 150) = 125 > 100: in the mass at the limit
    assert remaining_total(LENGTHS, 0.5, 0, 5000, limit_share=0.6) == 5000
    assert remaining_total(LENGTHS, 0.5, 0, 300, limit_share=1.0) == 300
    # given g 200: F(200) = 64.44, target = 64.44 + 0.5 × (35.56 + 25) = 94.72 →
    # 100 + 900 × 34.72/40 = 881.25 → 882
    assert remaining_total(LENGTHS, 0.5, 200, 5000, limit_share=0.2) == 882
    # past the history a request that may be one of those at their limit is taken there;
    # with p = 0 it runs as long again
    assert remaining_total(LENGTHS, 0.5, 1500, 5000, limit_share=0.2) == 5000
    assert remaining_total(LENGTHS, 0.5, 1500, 5000) == 3000


def test_the_limit_share_is_length_over_the_requests_that_ended_by_themselves_or_it() -> None:
    page = (
        "# TYPE vllm:request_success_total counter\n"
        'vllm:request_success_total{finished_reason="stop",model_name="m"} 3.0\n'
        'vllm:request_success_total{finished_reason="length",model_name="m"} 1.0\n'
        'vllm:request_success_total{finished_reason="abort",model_name="m"} 5.0\n'
        'vllm:request_success_total{finished_reason="error",model_name="m"} 2.0\n'
    )
    scrape = parse_engine("vllm", "u", page, 1.0)
    assert scrape.request_success == 11.0
    assert dict(scrape.finished_by_reason) == {"stop": 3, "length": 1, "abort": 5, "error": 2}
    b = backend_signals(scrape, None)
    assert b.limit_share == 0.25  # aborted and failed requests say nothing of their length
    look = ForecastBook().outlook(Profile(name="p"), "pool", b, 16)
    assert look.limit_share == 0.25
    # an unlabelled counter (SGLang's, or an older page) gives no share
    plain = parse_engine("vllm", "u", "vllm:request_success_total 4.0\n", 1.0)
    assert backend_signals(plain, None).limit_share is None


# --- the peak -------------------------------------------------------------------------------


def test_the_peak_of_two_requests() -> None:
    # A: 2 blocks, 100 tokens ahead; B: 3 blocks, 10 ahead; blocks of 16.
    # Just before A ends: 2 + ceil(100/16) = 9 (B gone); just before B ends: 5 + 2 × 1 = 7
    assert peak_of([(2, 100, 1, 0), (3, 10, 1, 0)], 16) == 9


def test_the_peak_counts_the_free_slots_of_each_last_block() -> None:
    # A: a 20-token prompt, 2 blocks with 12 free slots, 100 ahead: it reaches 120 tokens,
    # ceil(120/16) = 8 blocks (not 2 + ceil(100/16) = 9); B: 48 tokens, 3 full blocks, 10
    # ahead. Just before A ends: 8; before B ends: 2 + 0 (A's 10 fit its 12 slots) + 3 + 1
    assert peak_of([(2, 100, 1, 12), (3, 10, 1, 0)], 16) == 8
    # a new 2-sequence request, 1 block each with 6 free slots, 22 ahead (between A and B):
    # A, new, B: 8 | 2 + ceil(10/16) = 1 → 3, + 2 + 2 × ceil(16/16) = 4 → 7 | 7 + 3 + 1 = ...
    peaks = Peaks([(2, 100, 1, 12), (3, 10, 1, 0)], 16)
    # at the new one (22 ahead): A 2 + ceil((22 − 12)/16) = 3, new 2 + 2 × ceil(16/16) = 4: 7
    # at B (10 ahead): A 2 + 0, new 2 + 2 × ceil(4/16) = 4, B 3 + 1 = 4: 10
    assert peaks.with_new(2, 22, 2, 6) == 10


def test_the_peak_with_a_new_request() -> None:
    peaks = Peaks([(2, 100, 1, 0), (3, 10, 1, 0)], 16)
    # C: 1 block, 50 ahead: A, C, B: 9 | 3 + 2 × 4 = 11 | 6 + 3 × 1 = 9
    assert peaks.with_new(1, 50, 1) == 11
    # a request held whole (0 ahead) adds its blocks to the last point: 6 + 2 = 8 < 9
    assert peaks.with_new(1, 0, 1) == 9
    assert Peaks([(2, 100, 1, 0)], 16, fixed=5).peak == 9 + 5


def brute_peak(states: list[tuple[int, int, int, int]], bs: int) -> int:
    """Step the decode: at t, the requests with left ≥ t still hold b + seqs × ceil((t −
    room)/bs), their last block's free slots filled first."""
    horizon = max((s[1] for s in states), default=0)
    best = 0
    for t in range(horizon + 1):
        held = sum(b + s * -(-max(0, t - r) // bs) for b, left, s, r in states if left >= t)
        best = max(best, held)
    return best


def state(bs: int) -> st.SearchStrategy[tuple[int, int, int, int]]:
    return st.tuples(
        st.integers(0, 40), st.integers(0, 300), st.integers(1, 4), st.integers(0, bs - 1)
    )


STATES = st.lists(state(16), max_size=12)


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from([1, 16, 128]).flatmap(
        lambda bs: st.tuples(st.lists(state(bs), max_size=12), st.just(bs))
    )
)
def test_the_peak_is_the_highest_point_of_the_stepped_decode(
    case: tuple[list[tuple[int, int, int, int]], int],
) -> None:
    states, bs = case
    assert peak_of(states, bs) == brute_peak(states, bs)


@settings(max_examples=200, deadline=None)
@given(STATES, state(16))
def test_the_peak_with_a_new_request_is_the_peak_of_all(
    states: list[tuple[int, int, int, int]], new: tuple[int, int, int, int]
) -> None:
    assert Peaks(states, 16).with_new(*new) == peak_of([*states, new], 16)


# --- a trajectory -----------------------------------------------------------------------------


def test_a_trajectory_grows_at_the_decode_rate() -> None:
    spec = ForecastSpec(quantile=0.9)
    look = Outlook(rate=10.0, lengths=LENGTHS, caution=0.0, block_size=16, spec=spec)
    t = Trajectory(start_s=100.0, prompt_blocks=4, seqs=2, limit=5000)
    # 25 s at 10 tok/s: g = 250; b = 4 + 2 × ceil(250/16) = 36;
    # total: F(250) = 60 + 40 × 150/900 = 66.67, target 96.67 → 100 + 900 × 36.67/40 = 925
    assert look.state(t, 125.0) == (36, 925 - 250, 0)
    whole = Trajectory(start_s=100.0, prompt_blocks=4, seqs=2, limit=5000, whole=30)
    assert look.state(whole, 125.0) == (30, 0, 0)
    # its prompt known (50 tokens, 4 blocks): 300 tokens a sequence = ceil(300/16) = 19
    # blocks, 4 + 2 × (19 − 4) = 34, and 19 × 16 − 300 = 4 free slots in each last block
    known = Trajectory(start_s=100.0, prompt_blocks=4, seqs=2, limit=5000, tokens=50)
    assert look.state(known, 125.0) == (34, 925 - 250, 4)


# --- the fit --------------------------------------------------------------------------------


def test_the_fit_is_the_budget_less_the_forecast_peak() -> None:
    profile = Profile(
        name="p", admission="forecast", forecast=ForecastSpec(quantile=0.9, margin=0.1)
    )
    book = ForecastBook()
    now = time.monotonic()
    # two running requests of this worker: 3 blocks of prompt, limit 5000 (total 775)
    for _ in range(2):
        book.add("pool", "e", Trajectory(now, 3, 1, 5000))
    base = KvFit(free_blocks=80, usable_blocks=100, block_size=16, blocks=blocks16)
    fit = book.fit(profile, "pool", "e", 1, backend(0.2), base, unseen=0, others=0)
    # used 20, ICE's now 6: other = 14; budget = floor(100 × 0.9) − 14 = 76;
    # peak = 6 + 2 × ceil(775/16) = 6 + 98 = 104 → free = max(0, 76 − 104) = 0
    assert fit.free_blocks == 0
    # one request: peak 3 + 49 = 52, other = 17, budget 73, free 21
    book2 = ForecastBook()
    book2.add("pool", "e", Trajectory(now, 3, 1, 5000))
    fit2 = book2.fit(profile, "pool", "e", 1, backend(0.2), base, unseen=0, others=0)
    assert fit2.free_blocks == 21
    # a new 57-token prompt with limit 100 (total 100: the limit binds): 4 blocks now,
    # 100 ahead: sorted old (775), new (100): 52 | 3 + 4 + 2 × 7 = 21 → peak stays 52, +0;
    # but it takes ceil(58/16) = 4 blocks the moment it starts: charge = max(0, 4 + 0)
    assert fit2.charge(Shape.single(57), 100) == 4
    # with only 2 blocks free now (F − A = 80 − 78), the start does not fit now:
    # charge = 4 + (21 − 2) = 23 > 21
    tight = book2.fit(profile, "pool", "e", 1, backend(0.2), base, unseen=78, others=0)
    assert tight.charge(Shape.single(57), 100) == 23
    # limit 5000 (total 775): the new one's 57 tokens leave 7 free slots in its 4th block:
    # 3 + 49 + 4 + ceil((775 − 7)/16) = 48 → 104, charge 104 − 52 = 52 > 21 free
    assert fit2.charge(Shape.single(57), 5000) == 52
    assert fit2.output_fit(Shape.single(57), 5000) < 5000


def test_a_preemption_raises_caution_that_halves_every_recovery() -> None:
    book = ForecastBook()
    b = backend(0.2, preemptions=3)
    assert book.caution("pool", b, 20.0, 100.0) == 0.0  # first read: a baseline
    assert book.caution("pool", backend(0.2, preemptions=5), 20.0, 110.0) == 1.0
    assert book.caution("pool", backend(0.2, preemptions=5), 20.0, 130.0) == 0.5
    assert book.caution("pool", backend(0.2, preemptions=5), 20.0, 150.0) == 0.25


def test_preemptions_while_none_of_ices_requests_run_are_not_its_cue() -> None:
    book = ForecastBook()
    assert book.caution("pool", backend(0.2, preemptions=3), 20.0, 100.0) == 0.0
    # other traffic preempted while this worker had nothing there: a new baseline
    assert book.caution("pool", backend(0.2, preemptions=9), 20.0, 110.0, busy=False) == 0.0
    assert book.caution("pool", backend(0.2, preemptions=9), 20.0, 111.0) == 0.0
    assert book.caution("pool", backend(0.2, preemptions=10), 20.0, 112.0) == 1.0


# --- through the pipeline: forecast admits what reserve cannot --------------------------------

BODY = json.dumps({"messages": [{"role": "user", "content": "x" * 200}], "max_tokens": 1000})


def judge(pipeline: Pipeline) -> tuple[str, Hold | None]:
    route = pipeline.router.resolve([])
    facts = RequestFacts(adapter=OPENAI_CHAT, priority="standard")
    verdict = pipeline.on_body(route, facts, BODY.encode())
    assert verdict is not None and verdict.decision is not None
    return f"{verdict.decision.decision}:{verdict.decision.reason}", pipeline.recorder.record(
        route, verdict
    )


def admitted(admission: str, lengths: Histogram | None) -> int:
    policy = parse_policy(
        f"profiles: {{default: {{on_kv_shortfall: shed, admission: {admission}, "
        "forecast: {margin: 0.0, quantile: 0.9}}}\n"
    )
    b = BackendSignals(
        url="u",
        kv_cache_usage=0.0,
        num_requests_waiting=0,
        num_gpu_blocks=401,
        block_size=16,
        output_lengths=lengths,
    )
    snap = PoolSnapshot("default", (b,), time.monotonic() - 1.0)
    pipeline = Pipeline(policy, lambda _: snap)
    passed = 0
    for _ in range(40):
        got, _hold = judge(pipeline)
        if got != "pass:ok":
            assert got == "reject:kv_exhausted", got
            break
        passed += 1
    return passed


SHORT = Histogram(bounds=(10, 100, 1000, INF), counts=(50, 100, 100, 100), count=100, sum=0)


def test_forecast_admits_what_reserve_holds_back_when_outputs_are_short() -> None:
    # 400 usable blocks; each request: 57 prompt tokens + 1000 limit = 67 blocks held whole:
    # reserve admits floor(400 / 67) = 5. Outputs: q 0.9 of SHORT = 10 + 90 × 40/50 = 82:
    # forecast holds 57 + 82 = 139 tokens = 9 blocks each: 400 / 9 → 44 ≥ 40 asked
    assert admitted("reserve", SHORT) == 5
    assert admitted("forecast", SHORT) == 40


def test_forecast_without_a_history_admits_as_reserve() -> None:
    assert admitted("forecast", None) == admitted("reserve", None) == 5


# --- the policy -----------------------------------------------------------------------------


def test_the_policy_reads_admission_and_forecast_settings() -> None:
    policy = parse_policy(
        "profiles: {default: {admission: forecast, default_output_tokens: 512, "
        "forecast: {quantile: 0.8, margin: 0.1, recovery_s: 5, min_observations: 3, "
        "read_floors: false, start_within_s: 1.5}}}\n"
    )
    p = policy.profiles["default"]
    assert p.admission == "forecast" and p.default_output_tokens == 512
    assert p.forecast == ForecastSpec(0.8, 0.1, 5.0, 3, read_floors=False, start_within_s=1.5)
    assert parse_policy("profiles: {default: {}}\n").profiles["default"].admission == "reserve"


def test_bad_admission_settings_are_refused_by_name() -> None:
    for text, name in (
        ("admission: guess", "admission"),
        ("forecast: {quantile: 0.05}", "forecast.quantile"),
        ("forecast: {margin: 0.9}", "forecast.margin"),
        ("forecast: {start_within_s: 61}", "forecast.start_within_s"),
        ("default_output_tokens: 0", "default_output_tokens"),
    ):
        with pytest.raises(PolicyError, match=name):
            parse_policy(f"profiles: {{default: {{{text}}}}}\n")


# --- the forecast's inputs from a vLLM page ---------------------------------------------------

PAGE = """\
# HELP vllm:request_generation_tokens Number of generation tokens processed.
# TYPE vllm:request_generation_tokens histogram
vllm:request_generation_tokens_bucket{le="10.0",model_name="m"} 20.0
vllm:request_generation_tokens_bucket{le="100.0",model_name="m"} 60.0
vllm:request_generation_tokens_bucket{le="1000.0",model_name="m"} 100.0
vllm:request_generation_tokens_bucket{le="+Inf",model_name="m"} 100.0
vllm:request_generation_tokens_count{model_name="m"} 100.0
vllm:request_generation_tokens_sum{model_name="m"} 9000.0
# HELP vllm:inter_token_latency_seconds Histogram of inter-token latency in seconds.
# TYPE vllm:inter_token_latency_seconds histogram
vllm:inter_token_latency_seconds_bucket{le="0.01",model_name="m"} 300.0
vllm:inter_token_latency_seconds_bucket{le="+Inf",model_name="m"} 400.0
vllm:inter_token_latency_seconds_count{model_name="m"} 400.0
vllm:inter_token_latency_seconds_sum{model_name="m"} 8.0
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{model_name="m"} 3.0
"""


@pytest.mark.parametrize("reference", [False, True])
def test_the_forecast_reads_lengths_decode_rate_and_preemptions_from_vllms_page(
    reference: bool,
) -> None:
    scrape = parse_engine("vllm", "u", PAGE, 1.0, reference=reference)
    b = backend_signals(scrape, None)
    assert b.output_lengths is not None and b.output_lengths.counts == (20, 60, 100, 100)
    assert b.itl_mean_s == 8.0 / 400  # 20 ms: 50 tokens/s per sequence
    assert b.preemptions == 3.0
    look = ForecastBook().outlook(Profile(name="p"), "pool", b, 16)
    assert look.rate == pytest.approx(50.0)


@pytest.mark.parametrize(
    ("window_rate", "running", "rate"),
    [
        (None, 4.0, 50.0),  # no window: 1 / 20 ms
        (120.0, 4.0, 30.0),  # 120 tok/s over 4 running sequences is slower than 50
        (120.0, 1.0, 50.0),  # 120 over 1 is faster: the mean since start bounds it
        (120.0, 0.0, 50.0),  # the running gauge counts at least 1
    ],
)
def test_the_decode_rate_is_the_slower_of_the_mean_latency_and_the_window_rate_per_sequence(
    window_rate: float | None, running: float, rate: float
) -> None:
    derived = Derived(window_s=10.0, generation_tokens_per_s=window_rate, ttft_p50_s=0.25)
    b = BackendSignals(url="u", itl_mean_s=0.02, num_requests_running=running, derived=derived)
    assert b.decode_rate == pytest.approx(rate)
    assert b.first_token_delay_s == 0.25
    look = ForecastBook().outlook(Profile(name="p"), "pool", b, 16)
    assert (look.rate, look.delay_s) == (pytest.approx(rate), 0.25)


def test_without_the_latency_histogram_there_is_no_decode_rate_and_no_delay_without_a_window() -> (
    None
):
    assert (
        BackendSignals(url="u", derived=Derived(10.0, generation_tokens_per_s=99.0)).decode_rate
        is None
    )
    assert BackendSignals(url="u", itl_mean_s=0.02).first_token_delay_s == 0.0
