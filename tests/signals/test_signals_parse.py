"""parse.py: recorded vLLM 0.32 pages, SGLang and DCGM pages, several engines, bad pages."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from ext_proc.signals.parse import (
    _FILTERS,
    SourceParseError,
    detect_kind,
    parse_dcgm,
    parse_engine,
)
from ext_proc.signals.scrapes import EngineScrape, Histogram

DATA = Path(__file__).parents[1] / "data"
VLLM_PAGES = [
    *sorted((DATA / "vllm_cpu").glob("metrics_*.txt")),
    DATA / "vllm_v1_metrics.txt",
    # recorded pages with the valve's and sleep mode's values set (signals/make_pages.py)
    DATA / "signals" / "vllm_valve_metrics.txt",
    DATA / "signals" / "vllm_asleep_metrics.txt",
]
SGLANG = DATA / "signals" / "sglang_metrics.txt"
DCGM = DATA / "signals" / "dcgm_metrics.txt"
MIB = 1024.0 * 1024.0


def _vllm(text: str, *, reference: bool = False) -> EngineScrape:
    return parse_engine("vllm", "http://b:8000/metrics", text, 7.0, reference=reference)


def _page(name: str) -> str:
    return (DATA / "vllm_cpu" / f"metrics_{name}.txt").read_text()


# -- golden pages --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("page", "expected"),
    [
        (
            "idle",
            dict(
                kv_cache_usage=0.0,
                num_requests_running=0,
                num_requests_waiting=0,
                preemptions=0,
                prompt_tokens=0,
                request_success=0,
            ),
        ),
        (
            "loaded",
            dict(
                kv_cache_usage=0.8695652173913043,
                num_requests_running=2,
                num_requests_waiting=16,
                waiting_by_reason=(("capacity", 16), ("deferred", 0)),
                preemptions=0,
                prefix_cache_queries_tokens=4095,
                prefix_cache_hits_tokens=0,
                prompt_tokens=4095,
                generation_tokens=741,
                request_success=3,
            ),
        ),
        (
            "preempting",
            dict(
                kv_cache_usage=0.9565217391304348,
                num_requests_running=3,
                num_requests_waiting=13,
                waiting_by_reason=(("capacity", 13), ("deferred", 0)),
                preemptions=2,
                prefix_cache_queries_tokens=26578,
                prefix_cache_hits_tokens=0,
                prompt_tokens=26578,
                generation_tokens=4849,
                request_success=25,
            ),
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_recorded_vllm_032_pages(page: str, expected: dict[str, object]) -> None:
    s = _vllm(_page(page))
    assert (s.source, s.kind, s.at_s, s.models) == ("http://b:8000/metrics", "vllm", 7.0, ("tiny",))
    assert (s.num_gpu_blocks, s.block_size, s.kv_capacity_tokens) == (24, 128, 3072)
    for field, value in expected.items():
        assert getattr(s, field) == value, field
    assert s.cache_hit_rate is None


@pytest.mark.parametrize("page", ["idle", "loaded", "preempting"])
def test_recorded_032_pages_are_awake_and_their_valve_refused_nothing(page: str) -> None:
    s = _vllm(_page(page))
    assert (s.sleep_state, s.admission_rejections) == ("awake", 0)


def test_valve_page_sums_the_rejections_of_both_reasons() -> None:
    s = _vllm((DATA / "signals" / "vllm_valve_metrics.txt").read_text())
    assert s.admission_rejections == 7 + 2  # max_num_queued_reqs, max_num_queued_tokens
    assert (s.sleep_state, s.num_requests_waiting) == ("awake", 13)
    # the counter's _created series is another family: never read as the counter
    assert _vllm(_page("preempting")).admission_rejections == 0


def test_asleep_page_says_the_level() -> None:
    s = _vllm((DATA / "signals" / "vllm_asleep_metrics.txt").read_text())
    assert s.sleep_state == "weights_offloaded"  # sleep level 1
    assert s.admission_rejections == 0 and s.kv_cache_usage == 0.0


def _sleep_lines(engine: str, awake: str, offloaded: str = "0", discard: str = "0") -> str:
    lab = f'engine="{engine}",model_name="m"'
    return (
        f'vllm:engine_sleep_state{{{lab},sleep_state="awake"}} {awake}\n'
        f'vllm:engine_sleep_state{{{lab},sleep_state="weights_offloaded"}} {offloaded}\n'
        f'vllm:engine_sleep_state{{{lab},sleep_state="discard_all"}} {discard}\n'
    )


@pytest.mark.parametrize(
    ("text", "state"),
    [
        (_sleep_lines("0", "1"), "awake"),
        (_sleep_lines("0", "0", offloaded="1"), "weights_offloaded"),
        (_sleep_lines("0", "0", discard="1"), "discard_all"),
        # awake 0 without a level: sleep level 0 (scheduler paused) or the KV cache released
        (_sleep_lines("0", "0"), "paused"),
        # two data-parallel engines: the deepest state is the server's
        (_sleep_lines("0", "1") + _sleep_lines("1", "0", discard="1"), "discard_all"),
        (_sleep_lines("0", "0") + _sleep_lines("1", "0", offloaded="1"), "weights_offloaded"),
        # no awake series: the page does not say
        ('vllm:engine_sleep_state{engine="0",sleep_state="discard_all"} 0\n', None),
        ("vllm:num_requests_running 1\n", None),
        # a family declared with another type is ignored
        ("# TYPE vllm:engine_sleep_state counter\n" + _sleep_lines("0", "0"), None),
    ],
    ids=[
        "awake",
        "level-1",
        "level-2",
        "paused",
        "dp-one-asleep",
        "dp-deepest",
        "no-awake-series",
        "absent",
        "wrong-type",
    ],
)
def test_sleep_state(text: str, state: str | None) -> None:
    assert _vllm(text).sleep_state == state
    assert _vllm(text, reference=True).sleep_state == state


def test_recorded_preempting_page_histograms() -> None:
    s = _vllm(_page("preempting"))
    assert s.ttft_s is not None and s.queue_time_s is not None
    assert len(s.ttft_s.bounds) == 23 and s.ttft_s.bounds[-1] == math.inf
    assert s.ttft_s.bounds[:3] == (0.001, 0.005, 0.01)
    i = s.ttft_s.bounds.index(5.0)
    assert (s.ttft_s.counts[i - 1], s.ttft_s.counts[i]) == (10, 18)  # le=2.5, le=5.0
    assert (s.ttft_s.count, s.ttft_s.sum) == (28, 124.82297277450562)
    assert s.queue_time_s.bounds[0] == 0.3 and s.queue_time_s.counts[0] == 6
    assert (s.queue_time_s.count, s.queue_time_s.sum) == (25, 111.5390948649997)


def test_v1_page_with_help_lines() -> None:
    s = _vllm((DATA / "vllm_v1_metrics.txt").read_text())
    assert (s.kv_cache_usage, s.num_requests_running, s.num_requests_waiting) == (0.8742, 12, 3)
    assert (s.num_gpu_blocks, s.block_size, s.kv_capacity_tokens) == (1952, 16, 31232)
    assert (s.prefix_cache_queries_tokens, s.prefix_cache_hits_tokens) == (482311, 160422)
    assert s.preemptions == 41 and s.prompt_tokens is None  # the page does not say
    assert s.ttft_s == Histogram(
        bounds=(0.001, 0.1, math.inf), counts=(0, 803, 1210), count=1210, sum=151.3
    )
    assert s.queue_time_s is None


@pytest.mark.parametrize("path", [*VLLM_PAGES, SGLANG], ids=lambda p: p.name)
def test_fast_reader_equals_prometheus_client(path: Path) -> None:
    text = path.read_text()
    kind = detect_kind(text)
    fast = parse_engine(kind, "u", text, 1.0)
    assert fast == parse_engine(kind, "u", text, 1.0, reference=True)


def test_fast_reader_equals_prometheus_client_on_dcgm() -> None:
    text = DCGM.read_text()
    assert parse_dcgm("u", text, 1.0) == parse_dcgm("u", text, 1.0, reference=True)


def test_sglang_page_two_data_parallel_ranks() -> None:
    s = parse_engine("sglang", "sg", SGLANG.read_text(), 3.0)
    assert (s.kind, s.models) == ("sglang", ("Qwen/Qwen2.5-7B-Instruct",))
    assert s.kv_cache_usage == pytest.approx(0.7)  # mean of 0.6 and 0.8
    assert (s.num_requests_running, s.num_requests_waiting) == (78, 13)
    assert s.kv_capacity_tokens == 2 * 163_840 and s.num_gpu_blocks is None
    assert s.cache_hit_rate == pytest.approx(0.3)
    assert s.preemptions == 7  # num_retracted_requests_total, not the per-interval gauge
    assert (s.prompt_tokens, s.generation_tokens, s.request_success) == (1.25e6, 480_000, 2000)
    assert (s.prefix_cache_queries_tokens, s.prefix_cache_hits_tokens) == (1.25e6, 375_000)
    assert s.ttft_s is not None and s.ttft_s.count == 2000 and len(s.ttft_s.bounds) == 19
    assert s.queue_time_s is not None and s.queue_time_s.count == 200  # both ranks summed
    assert s.queue_time_s.bounds[0] == 0.0 and s.queue_time_s.counts[0] == 0


def test_dcgm_page() -> None:
    gpus = parse_dcgm("dcgm", DCGM.read_text(), 2.0)
    assert [g.gpu for g in gpus] == ["0", "1"]
    g0, g1 = gpus
    assert g0.uuid == "GPU-6f1b2c3d-0a1b-4c2d-8e3f-112233445566"
    assert (g0.host, g0.model_name) == ("gpu-node-07", "NVIDIA H100 80GB HBM3")
    assert (g0.pod, g0.namespace) == ("vllm-llama-0", "inference")
    assert (g0.fb_used_bytes, g0.fb_free_bytes) == (76325 * MIB, 4120 * MIB)
    assert g0.fb_total_bytes == (76325 + 4120 + 570) * MIB  # used + free + reserved
    assert g0.gpu_util == pytest.approx(0.93)
    assert (g0.pcie_tx_bytes_s, g0.pcie_rx_bytes_s) == (812345678, 95123456)
    assert (g1.pod, g1.namespace, g1.gpu_util) == (None, None, 0.0)
    assert (g0.source, g0.at_s) == ("dcgm", 2.0)


def test_dcgm_total_label_variants_and_mig() -> None:
    text = (
        'DCGM_FI_DEV_FB_USED{gpu="0",UUID="U0",GPU_I_ID="3",exported_pod="p",pod="exporter",'
        'exported_namespace="ns",namespace="gpu-operator"} 10\n'
        'DCGM_FI_DEV_FB_TOTAL{gpu="0",UUID="U0",GPU_I_ID="3"} 20\n'
        'DCGM_FI_DEV_FB_USED{gpu="0",UUID="U0",GPU_I_ID="5"} 1\n'
        'DCGM_FI_DEV_FB_FREE{gpu="0",UUID="U0",GPU_I_ID="5"} 2\n'
    )
    a, b = parse_dcgm("d", text, 0.0)
    assert (a.gpu, a.pod, a.namespace, a.fb_total_bytes) == ("0/3", "p", "ns", 20 * MIB)
    assert (b.gpu, b.fb_total_bytes) == ("0/5", None)  # no FB_TOTAL, no FB_RESERVED: unknown


# -- several engines / ranks ---------------------------------------------------------------


def _two_engines() -> str:
    lines = []
    for e, usage, blocks, waiting, le_1 in (("0", 0.2, 100, 1, 3), ("1", 0.6, 300, 4, 5)):
        lab = f'engine="{e}",model_name="m{e}"'
        lines += [
            f"vllm:kv_cache_usage_perc{{{lab}}} {usage}",
            f"vllm:num_requests_waiting{{{lab}}} {waiting}",
            f"vllm:num_preemptions_total{{{lab}}} {10 * int(e) + 1}",
            f'vllm:num_requests_waiting_by_reason{{{lab},reason="capacity"}} {waiting}',
            f'vllm:cache_config_info{{engine="{e}",block_size="16",num_gpu_blocks="{blocks}"}} 1',
            f'vllm:time_to_first_token_seconds_bucket{{{lab},le="1.0"}} {le_1}',
            f'vllm:time_to_first_token_seconds_bucket{{{lab},le="+Inf"}} 10',
            f"vllm:time_to_first_token_seconds_count{{{lab}}} 10",
            f"vllm:time_to_first_token_seconds_sum{{{lab}}} 7.5",
        ]
    return "\n".join(lines) + "\n"


def test_several_engines_block_weighted_usage_and_sums() -> None:
    s = _vllm(_two_engines())
    assert s.kv_cache_usage == pytest.approx((0.2 * 100 + 0.6 * 300) / 400)
    assert (s.num_requests_waiting, s.preemptions, s.num_gpu_blocks) == (5, 12, 400)
    assert (s.kv_capacity_tokens, s.models) == (400 * 16, ("m0", "m1"))
    assert s.waiting_by_reason == (("capacity", 5),)
    assert s.ttft_s == Histogram(bounds=(1.0, math.inf), counts=(8, 20), count=20, sum=15)


def test_usage_is_a_plain_mean_when_an_engine_has_no_cache_config() -> None:
    text = _two_engines().replace('num_gpu_blocks="300"', 'num_gpu_blocks="None"')
    s = _vllm(text)
    assert s.kv_cache_usage == pytest.approx(0.4)
    assert s.num_gpu_blocks == 100


def test_histograms_with_different_bounds_keep_the_shared_ones() -> None:
    text = (
        'vllm:time_to_first_token_seconds_bucket{engine="0",le="0.5"} 1\n'
        'vllm:time_to_first_token_seconds_bucket{engine="0",le="1.0"} 2\n'
        'vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf"} 3\n'
        'vllm:time_to_first_token_seconds_bucket{engine="1",le="1.0"} 4\n'
        'vllm:time_to_first_token_seconds_bucket{engine="1",le="+Inf"} 5\n'
    )
    assert _vllm(text).ttft_s == Histogram(bounds=(1.0, math.inf), counts=(6, 8), count=8, sum=0)


def test_ranks_of_one_replica_count_once() -> None:
    lines = []
    for tp in ("0", "1"):
        for dp, running in (("0", 5), ("1", 7)):
            lab = f'model_name="m",tp_rank="{tp}",dp_rank="{dp}"'
            lines += [
                f"sglang:num_running_reqs{{{lab}}} {running}",
                f"sglang:max_total_num_tokens{{{lab}}} 1000",
                f'sglang:queue_time_seconds_bucket{{{lab},le="+Inf"}} 4',
            ]
    s = parse_engine("sglang", "u", "\n".join(lines) + "\n", 0.0)
    assert (s.num_requests_running, s.kv_capacity_tokens) == (12, 2000)
    assert s.queue_time_s is not None and s.queue_time_s.count == 8


def test_legacy_names_and_v1_preference() -> None:
    legacy = (
        "vllm:gpu_cache_usage_perc 0.25\n"
        "vllm:gpu_prefix_cache_queries_total 100\nvllm:gpu_prefix_cache_hits_total 40\n"
    )
    s = _vllm(legacy)
    assert (s.kv_cache_usage, s.prefix_cache_queries_tokens, s.prefix_cache_hits_tokens) == (
        0.25,
        100,
        40,
    )
    both = legacy + "vllm:kv_cache_usage_perc 0.75\nvllm:prefix_cache_hits_total 1\n"
    s = _vllm(both)
    assert (s.kv_cache_usage, s.prefix_cache_hits_tokens) == (0.75, 1)


# -- odd but valid lines -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "field", "value"),
    [
        ('vllm:num_requests_running{engine="0"} 2 1700000000000', "num_requests_running", 2),
        ("vllm:num_requests_running 2.5e1", "num_requests_running", 25),
        ('vllm:num_requests_running{model_name="a\\"b"} 1', "models", ('a"b',)),
        ('vllm:num_requests_running{model_name="x}y",} 1', "models", ("x}y",)),
        ('vllm:num_requests_running{ model_name = "sp" } 1', "models", ("sp",)),
        ("vllm:kv_cache_usage_perc 1.7", "kv_cache_usage", 1.0),  # clamped
        ("vllm:num_requests_running\t4", "num_requests_running", 4),
    ],
    ids=["timestamp", "exponent", "escaped-quote", "brace-in-value", "spaces", "clamp", "tab"],
)
def test_valid_lines_read_alike_by_both_readers(line: str, field: str, value: object) -> None:
    text = line + "\n"
    assert getattr(_vllm(text), field) == value
    assert _vllm(text) == _vllm(text, reference=True)


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("vllm:kv_cache_usage_perc NaN\n", "kv_cache_usage"),
        ("vllm:kv_cache_usage_perc +Inf\n", "kv_cache_usage"),
        ("vllm:num_requests_waiting -Inf\n", "num_requests_waiting"),
        ("vllm:num_preemptions_total nan\n", "preemptions"),
    ],
    ids=["nan", "inf", "minus-inf", "lower-nan"],
)
def test_non_finite_samples_are_ignored(text: str, field: str) -> None:
    s = _vllm(text + "vllm:num_requests_running 3\n")
    assert getattr(s, field) is None and s.num_requests_running == 3


def test_non_finite_beside_finite_series_is_skipped() -> None:
    text = 'vllm:num_requests_waiting{engine="0"} NaN\nvllm:num_requests_waiting{engine="1"} 2\n'
    assert _vllm(text).num_requests_waiting == 2


def test_nan_in_a_bucket_drops_that_bound_or_the_histogram() -> None:
    base = (
        'vllm:time_to_first_token_seconds_bucket{le="1.0"} {a}\n'
        'vllm:time_to_first_token_seconds_bucket{le="+Inf"} {b}\n'
    )
    s = _vllm(base.replace("{a}", "NaN").replace("{b}", "4"))
    assert s.ttft_s == Histogram(bounds=(math.inf,), counts=(4,), count=4, sum=0)
    assert _vllm(base.replace("{a}", "1").replace("{b}", "NaN")).ttft_s is None


@pytest.mark.parametrize(
    ("text", "expect"),
    [
        ("# TYPE vllm:kv_cache_usage_perc counter\nvllm:kv_cache_usage_perc 0.5\n", None),
        (
            "# TYPE vllm:kv_cache_usage_perc histogram\nvllm:kv_cache_usage_perc 0.5\n"
            "# TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc 0.4\n",
            0.4,
        ),
        ("# TYPE vllm:kv_cache_usage_perc untyped\nvllm:kv_cache_usage_perc 0.5\n", 0.5),
    ],
    ids=["gauge-declared-counter", "falls-back-to-legacy", "untyped-accepted"],
)
def test_declared_type_must_match(text: str, expect: float | None) -> None:
    for reference in (False, True):
        assert _vllm(
            text + "vllm:num_requests_running 1\n", reference=reference
        ).kv_cache_usage == (expect)


def test_counter_declared_as_gauge_is_ignored() -> None:
    text = "# TYPE vllm:num_preemptions_total gauge\nvllm:num_preemptions_total 5\n"
    assert _vllm(text + "vllm:num_requests_running 1\n").preemptions is None
    ok = "# TYPE vllm:num_preemptions counter\nvllm:num_preemptions_total 5\n"
    assert _vllm(ok).preemptions == 5


def test_crlf_page_reads_the_same() -> None:
    text = _page("preempting")
    crlf = text.replace("\n", "\r\n")
    assert _vllm(crlf) == _vllm(text) == _vllm(crlf, reference=True)


def test_truncated_at_a_line_boundary_inside_a_histogram() -> None:
    text = _page("preempting")
    cut = text.index('vllm:time_to_first_token_seconds_bucket{engine="0",le="1.0"')
    s = _vllm(text[:cut])
    assert s.ttft_s is None and s.kv_cache_usage == pytest.approx(0.9565217391304348)


# -- bad pages -----------------------------------------------------------------------------

BAD_PAGES = {
    "empty": "",
    "blank": "  \n\n",
    "truncated-mid-line": _page("preempting")[:30000],
    "html": "<html><head><title>502 Bad Gateway</title></head><body>nginx</body></html>\n",
    "json": '{"detail": "Not Found"}\n',
    "binary": "\x00\x01\x02\xff\n",
    "other-exporter": "node_load1 0.5\n# TYPE go_goroutines gauge\ngo_goroutines 12\n",
    "dcgm-page": DCGM.read_text(),
    "unclosed-labels": 'vllm:kv_cache_usage_perc{engine="0" 0.5\n',
    "text-value": 'vllm:num_requests_running{engine="0"} many\n',
    "duplicate-label": 'vllm:num_requests_running{a="1",a="2"} 1\n',
    "bad-metadata": "# TYPE vllm:num_requests_running\nvllm:num_requests_running 1\n",
}


@pytest.mark.parametrize("text", BAD_PAGES.values(), ids=BAD_PAGES.keys())
@pytest.mark.parametrize("reference", [False, True], ids=["fast", "reference"])
def test_bad_pages_raise_source_parse_error(text: str, reference: bool) -> None:
    with pytest.raises(SourceParseError):
        _vllm(text, reference=reference)


@pytest.mark.parametrize("text", [_page("idle"), "<html/>\n", ""], ids=["vllm", "html", "empty"])
def test_parse_dcgm_rejects_other_pages(text: str) -> None:
    with pytest.raises(SourceParseError):
        parse_dcgm("d", text, 0.0)


def test_unknown_kind() -> None:
    with pytest.raises(SourceParseError):
        parse_engine("tgi", "u", "x 1\n", 0.0)


def _kept_lines(kind: str, text: str) -> str:
    return "".join(line + "\n" for line in _FILTERS[kind].keep.findall("\n" + text))


def _mutate(rng: random.Random, base: str) -> str:
    chars = list(base)
    for _ in range(rng.randint(1, 6)):
        i = rng.randrange(len(chars))
        op = rng.random()
        if op < 0.4:
            chars[i] = rng.choice('{}",= \n\t\\#abc0.9e+-_')
        elif op < 0.7:
            del chars[i]
        else:
            junk = ["NaN", "}", '"', "\n", "\x00", "le=", "+Inf", "1_0", "Infinity", ' # {a="1"} 2']
            chars.insert(i, rng.choice(junk))
    text = "".join(chars)
    return text[: rng.randrange(len(text))] if rng.random() < 0.2 else text


@pytest.mark.parametrize(
    ("kind", "base"),
    [
        ("vllm", _page("preempting")),
        # only the lines the pre-filter keeps, so that every mutation lands on one of them
        ("vllm", _kept_lines("vllm", _page("preempting"))),
        ("sglang", SGLANG.read_text()),
        ("dcgm", DCGM.read_text()),
    ],
    ids=["vllm-page", "vllm-kept-lines", "sglang-page", "dcgm-page"],
)
def test_mutated_pages_raise_only_source_parse_error(kind: str, base: str) -> None:
    """Random cuts, flipped characters and inserted junk: a record or SourceParseError, and
    the fast reader accepts exactly the pages prometheus_client accepts, with equal results."""
    rng = random.Random(20261129)
    accepted = 0
    for _ in range(300):
        text = _mutate(rng, base)
        results: list[object] = []
        for reference in (False, True):
            try:
                if kind == "dcgm":
                    results.append(parse_dcgm("u", text, 0.0, reference=reference))
                else:
                    results.append(parse_engine(kind, "u", text, 0.0, reference=reference))
            except SourceParseError:
                results.append(None)
        assert results[0] == results[1]
        accepted += results[0] is not None
    assert accepted > 0


# -- kind detection ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        (_page("idle"), "vllm"),
        ((DATA / "vllm_v1_metrics.txt").read_text(), "vllm"),
        (SGLANG.read_text(), "sglang"),
        (DCGM.read_text(), "dcgm"),
        ("# TYPE sglang:token_usage gauge\n", "sglang"),
    ],
    ids=["vllm-032", "vllm-v1", "sglang", "dcgm", "metadata-only"],
)
def test_detect_kind(text: str, kind: str) -> None:
    assert detect_kind(text) == kind


@pytest.mark.parametrize("text", ["", "<html/>", "node_load1 1\n"], ids=["empty", "html", "node"])
def test_detect_kind_rejects_unknown_pages(text: str) -> None:
    with pytest.raises(SourceParseError):
        detect_kind(text)
