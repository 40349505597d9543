"""Parsing vLLM /metrics pages into BackendSignals (pure, with prometheus_client's parser)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ext_proc.signals.vllm import MetricsParseError, parse_vllm_metrics

DATA = Path(__file__).parent / "data"


def test_v1_page() -> None:
    s = parse_vllm_metrics("u", (DATA / "vllm_v1_metrics.txt").read_text())
    assert (s.kv_cache_usage, s.num_requests_running, s.num_requests_waiting) == (0.8742, 12, 3)
    assert (s.num_gpu_blocks, s.block_size, s.kv_capacity_tokens) == (1952, 16, 31232)


def test_legacy_gauge_name() -> None:
    s = parse_vllm_metrics("u", 'vllm:gpu_cache_usage_perc{model_name="m"} 0.5\n')
    assert s.kv_cache_usage == 0.5


def test_v1_name_wins_over_legacy_when_both_present() -> None:
    text = "vllm:gpu_cache_usage_perc 0.1\nvllm:kv_cache_usage_perc 0.7\n"
    assert parse_vllm_metrics("u", text).kv_cache_usage == 0.7


def test_several_engines_average_usage_and_sum_counts() -> None:
    text = "\n".join(
        [
            'vllm:kv_cache_usage_perc{engine="0"} 0.2',
            'vllm:kv_cache_usage_perc{engine="1"} 0.6',
            'vllm:num_requests_waiting{engine="0"} 1',
            'vllm:num_requests_waiting{engine="1"} 4',
            'vllm:cache_config_info{engine="0",block_size="16",num_gpu_blocks="100"} 1',
            'vllm:cache_config_info{engine="1",block_size="16",num_gpu_blocks="300"} 1',
            "",
        ]
    )
    s = parse_vllm_metrics("u", text)
    assert s.kv_cache_usage == pytest.approx(0.4)
    assert (s.num_requests_waiting, s.num_gpu_blocks) == (5, 400)


@pytest.mark.parametrize(
    "text",
    [
        "vllm:kv_cache_usage_perc NaN\n",
        "vllm:kv_cache_usage_perc +Inf\n",
        "",
        "# only a comment\n",
        "other_metric 1\n",
    ],
    ids=["nan", "inf", "empty", "comment", "unrelated"],
)
def test_pages_without_usable_signals_give_none(text: str) -> None:
    s = parse_vllm_metrics("u", text)
    assert (s.kv_cache_usage, s.num_requests_running, s.num_gpu_blocks) == (None, None, None)


def test_usage_is_clamped_to_unit_interval() -> None:
    assert parse_vllm_metrics("u", "vllm:kv_cache_usage_perc 1.7\n").kv_cache_usage == 1.0


@pytest.mark.parametrize(
    "text",
    [
        "<html><body>502 Bad Gateway</body></html>",
        'vllm:kv_cache_usage_perc{engine="0" 0.5\n',
        "vllm:kv_cache_usage_perc zero\n",
    ],
    ids=["html", "truncated-labels", "bad-value"],
)
def test_garbage_raises_a_parse_error(text: str) -> None:
    with pytest.raises(MetricsParseError):
        parse_vllm_metrics("u", text)


def test_bad_cache_config_labels_are_ignored() -> None:
    s = parse_vllm_metrics("u", 'vllm:cache_config_info{num_gpu_blocks="None",block_size="x"} 1\n')
    assert (s.num_gpu_blocks, s.block_size) == (None, None)
