"""promapi.py: Prometheus /api/v1/query answers → per-backend records, same as a scrape."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from ext_proc.signals.parse import SourceParseError, parse_dcgm, parse_engine
from ext_proc.signals.promapi import (
    build_queries,
    engine_backends,
    engine_scrapes,
    gpu_scrapes,
    vector_samples,
)
from tests.builders import as_prometheus as _as_prometheus
from tests.builders import promapi_answer as _answer

DATA = Path(__file__).parents[1] / "data"


def test_build_queries_vllm() -> None:
    q = build_queries("vllm")
    assert q["kv_cache_usage"] == '{__name__=~"vllm:kv_cache_usage_perc|vllm:gpu_cache_usage_perc"}'
    assert q["ttft_s"] == (
        '{__name__=~"vllm:time_to_first_token_seconds_bucket|'
        'vllm:time_to_first_token_seconds_count|vllm:time_to_first_token_seconds_sum"}'
    )
    assert q["request_success"] == '{__name__=~"vllm:request_success_total"}'
    assert set(q) >= {"num_requests_waiting", "cache_config", "prefix_cache_hits_tokens"}


def test_build_queries_other_kinds() -> None:
    assert build_queries("sglang")["kv_cache_usage"] == '{__name__=~"sglang:token_usage"}'
    assert build_queries("dcgm")["fb_used_bytes"] == '{__name__=~"DCGM_FI_DEV_FB_USED"}'
    with pytest.raises(ValueError):
        build_queries("tgi")


def test_two_backends_match_their_direct_scrapes() -> None:
    a = DATA / "vllm_cpu" / "metrics_preempting.txt"
    b = DATA / "vllm_cpu" / "metrics_loaded.txt"
    samples = _as_prometheus("vllm", a, "10.0.0.1:8000") + _as_prometheus(
        "vllm", b, "10.0.0.2:8000"
    )
    # split into several answers, as one query per field would
    bodies = [json.dumps(_answer(samples[i::3])) for i in range(3)]
    got = engine_scrapes("vllm", bodies, 5.0)
    assert list(got) == ["10.0.0.1:8000", "10.0.0.2:8000"]
    assert got["10.0.0.1:8000"] == parse_engine("vllm", "10.0.0.1:8000", a.read_text(), 5.0)
    assert got["10.0.0.2:8000"] == parse_engine("vllm", "10.0.0.2:8000", b.read_text(), 5.0)


def test_group_by_pod_and_series_without_the_label_are_skipped() -> None:
    body = _answer(
        [
            ("sglang:token_usage", {"pod": "sg-0", "dp_rank": "0"}, 0.5),
            ("sglang:token_usage", {"pod": "sg-0", "dp_rank": "1"}, 0.7),
            ("sglang:token_usage", {"pod": "sg-1"}, 0.1),
            ("sglang:token_usage", {"instance": "x"}, 0.9),
            ("sglang:num_queue_reqs", {"pod": "sg-1"}, math.nan),
        ]
    )
    got = engine_scrapes("sglang", [body], 1.0, group_by="pod")
    assert set(got) == {"sg-0", "sg-1"}
    assert got["sg-0"].kv_cache_usage == pytest.approx(0.6)
    assert (got["sg-1"].kv_cache_usage, got["sg-1"].num_requests_waiting) == (0.1, None)


@pytest.mark.parametrize(
    ("labels", "pod"),
    [
        ({"instance": "a", "pod": "vllm-0", "namespace": "llm"}, ("llm", "vllm-0")),
        ({"instance": "a", "pod": "vllm-0"}, ("", "vllm-0")),
        (
            {"instance": "a", "kubernetes_pod_name": "vllm-0", "kubernetes_namespace": "llm"},
            ("llm", "vllm-0"),
        ),
        ({"instance": "a"}, None),
    ],
    ids=["pod-and-namespace", "pod-only", "older-relabelling", "no-pod-label"],
)
def test_engine_backends_name_each_backends_pod(
    labels: dict[str, str], pod: tuple[str, str] | None
) -> None:
    body = _answer([("vllm:num_requests_running", labels, 2.0)])
    ((key, (scrape, got)),) = engine_backends("vllm", [body], 0.0).items()
    assert (key, scrape.num_requests_running, got) == ("a", 2.0, pod)


def test_dcgm_through_prometheus() -> None:
    path = DATA / "signals" / "dcgm_metrics.txt"
    samples = _as_prometheus("dcgm", path, "node-7:9400")
    got = gpu_scrapes([_answer(samples)], 2.0)
    assert got == {"node-7:9400": parse_dcgm("node-7:9400", path.read_text(), 2.0)}


def test_native_histogram_samples_are_skipped() -> None:
    body = _answer([("vllm:num_requests_running", {"instance": "a"}, 2.0)])
    body["data"]["result"].append(
        {"metric": {"__name__": "vllm:x", "instance": "a"}, "histogram": [1, {"count": "1"}]}
    )
    assert engine_scrapes("vllm", [body], 0.0)["a"].num_requests_running == 2


BAD = {
    "not-json": "<html>502</html>",
    "json-list": "[1, 2]",
    "error": {"status": "error", "errorType": "bad_data", "error": "parse error"},
    "matrix": {"status": "success", "data": {"resultType": "matrix", "result": []}},
    "scalar": {"status": "success", "data": {"resultType": "scalar", "result": [1, "2"]}},
    "result-not-list": {"status": "success", "data": {"resultType": "vector", "result": {}}},
    "no-name": {
        "status": "success",
        "data": {"resultType": "vector", "result": [{"metric": {}, "value": [1, "2"]}]},
    },
    "bad-value": {
        "status": "success",
        "data": {
            "resultType": "vector",
            "result": [{"metric": {"__name__": "vllm:num_requests_running"}, "value": [1, "x"]}],
        },
    },
    "value-shape": {
        "status": "success",
        "data": {
            "resultType": "vector",
            "result": [{"metric": {"__name__": "vllm:num_requests_running"}, "value": "2"}],
        },
    },
    "item-not-object": {"status": "success", "data": {"resultType": "vector", "result": [3]}},
}


@pytest.mark.parametrize("body", BAD.values(), ids=BAD.keys())
def test_bad_answers_raise_source_parse_error(body: Any) -> None:
    with pytest.raises(SourceParseError):
        engine_scrapes("vllm", [body if isinstance(body, str) else json.dumps(body)], 0.0)


def test_vector_samples_accepts_bytes_and_decoded() -> None:
    body = _answer([("vllm:num_requests_running", {"instance": "a"}, 2.0)])
    expected = [("vllm:num_requests_running", {"instance": "a"}, 2.0)]
    assert vector_samples(json.dumps(body).encode()) == expected
    assert vector_samples(body) == expected
