"""Which source metric carries which ICE signal: the mapping table, as data.

Job: for each source kind (``vllm``, ``sglang``, ``dcgm``) name, per ICE field of
``EngineScrape`` / ``GpuScrape``, the source metric names that carry it, in preference order
(vLLM V1 names first, then the legacy ones). The parser takes, per field, the first name that
has samples on the page and never mixes two names for one field.

Invariant: names only. How a field is combined across engines (``HOW``), the units
(``GPU_SCALE``) and the label names (``GPU_LABELS``) live here too, but no parsing does.

Name forms: gauges and info metrics by their sample name; counters by their sample name with
``_total`` (as vLLM, SGLang and prometheus_client write them); histograms by their family name
(samples ``_bucket``, ``_count``, ``_sum``).
"""

from __future__ import annotations

from typing import Final, Literal

__all__ = [
    "ENGINE_KINDS",
    "ENGINE_NAMES",
    "EXPECTED_TYPE",
    "GPU_INSTANCE_LABEL",
    "GPU_LABELS",
    "GPU_NAMES",
    "GPU_SCALE",
    "HOW",
    "KIND_PREFIX",
    "REPLICA_RANK_LABELS",
    "How",
    "sample_names",
]

How = Literal[
    "mean", "sum", "counter", "histogram", "by_reason", "cache_config", "info_sum", "sleep_state"
]

ENGINE_KINDS: Final = ("vllm", "sglang")
KIND_PREFIX: Final[dict[str, str]] = {"vllm": "vllm:", "sglang": "sglang:", "dcgm": "DCGM_FI_"}

# How each EngineScrape field is combined over the series of one server (several engines,
# data-parallel ranks or model_name labels):
#   mean: averaged (kv_cache_usage: block-weighted when every engine's cache_config is known)
#   sum: gauges summed; counter: counters summed; histogram: summed bucket by bucket
#   by_reason: summed per ``reason`` label; cache_config: vLLM's info labels (blocks summed
#   over engines, block size of the first); info_sum: a capacity gauge summed over replicas;
#   sleep_state: vLLM's per-engine ``sleep_state`` label set (awake / weights_offloaded /
#   discard_all), the deepest engine's state (model.SLEEP_STATES).
HOW: Final[dict[str, How]] = {
    "kv_cache_usage": "mean",
    "num_requests_running": "sum",
    "num_requests_waiting": "sum",
    "waiting_by_reason": "by_reason",
    "cache_config": "cache_config",
    "kv_capacity_tokens": "info_sum",
    "preemptions": "counter",
    "prefix_cache_queries_tokens": "counter",
    "prefix_cache_hits_tokens": "counter",
    "prompt_tokens": "counter",
    "generation_tokens": "counter",
    "request_success": "counter",
    "admission_rejections": "counter",
    "sleep_state": "sleep_state",
    "ttft_s": "histogram",
    "queue_time_s": "histogram",
    "output_lengths": "histogram",
    "itl_s": "histogram",
    "prefill_time_s": "histogram",
    "prefill_computed_tokens": "histogram",
    "iteration_tokens": "histogram",
    "cache_hit_rate": "mean",
}

ENGINE_NAMES: Final[dict[str, dict[str, tuple[str, ...]]]] = {
    "vllm": {
        "kv_cache_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        "num_requests_running": ("vllm:num_requests_running",),
        "num_requests_waiting": ("vllm:num_requests_waiting",),
        "waiting_by_reason": ("vllm:num_requests_waiting_by_reason",),
        "cache_config": ("vllm:cache_config_info",),
        "preemptions": ("vllm:num_preemptions_total",),
        "prefix_cache_queries_tokens": (
            "vllm:prefix_cache_queries_total",
            "vllm:gpu_prefix_cache_queries_total",
        ),
        "prefix_cache_hits_tokens": (
            "vllm:prefix_cache_hits_total",
            "vllm:gpu_prefix_cache_hits_total",
        ),
        "prompt_tokens": ("vllm:prompt_tokens_total",),
        "generation_tokens": ("vllm:generation_tokens_total",),
        # every finished_reason (stop, length, abort, error, ...) summed
        "request_success": ("vllm:request_success_total",),
        # the API server's valve (--max-num-queued-reqs / --max-num-queued-tokens, vLLM
        # 0.32+): requests it answered 503, labels model_name and reason, summed
        "admission_rejections": ("vllm:admission_rejections_total",),
        # one gauge per engine and sleep_state (awake, weights_offloaded, discard_all)
        "sleep_state": ("vllm:engine_sleep_state",),
        "ttft_s": ("vllm:time_to_first_token_seconds",),
        "queue_time_s": ("vllm:request_queue_time_seconds",),
        # output tokens of each finished request (the forecast's length distribution)
        "output_lengths": ("vllm:request_generation_tokens",),
        # seconds between two output tokens of a running request (the forecast's decode rate)
        "itl_s": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
        # each finished request's prefill phase: seconds, and prompt tokens it computed (the
        # prefill speed of docs/slo.md)
        "prefill_time_s": ("vllm:request_prefill_time_seconds",),
        "prefill_computed_tokens": ("vllm:request_prefill_kv_computed_tokens",),
        # tokens each engine step scheduled (prefill chunks and decodes): the step line of
        # docs/slo.md's engine prefill rate
        "iteration_tokens": ("vllm:iteration_tokens_total",),
    },
    # SGLang (python/sglang/srt/metrics/collector.py). Its token counters are counted when a
    # request finishes, not when its prefill runs: prefix-cache "queries" are all prompt
    # tokens of finished requests and "hits" their cached tokens.
    "sglang": {
        "kv_cache_usage": ("sglang:token_usage",),
        "num_requests_running": ("sglang:num_running_reqs",),
        "num_requests_waiting": ("sglang:num_queue_reqs",),
        "kv_capacity_tokens": ("sglang:max_total_num_tokens",),
        "preemptions": ("sglang:num_retracted_requests_total",),
        "prefix_cache_queries_tokens": ("sglang:prompt_tokens_total",),
        "prefix_cache_hits_tokens": ("sglang:cached_tokens_total",),
        "prompt_tokens": ("sglang:prompt_tokens_total",),
        "generation_tokens": ("sglang:generation_tokens_total",),
        "request_success": ("sglang:num_requests_total",),
        "ttft_s": ("sglang:time_to_first_token_seconds",),
        "queue_time_s": ("sglang:queue_time_seconds",),
        "cache_hit_rate": ("sglang:cache_hit_rate",),
    },
}

# The declared ``# TYPE`` each kind of field must have; a family declared otherwise is
# ignored (its field stays None). ``untyped``/``unknown`` are accepted everywhere.
EXPECTED_TYPE: Final[dict[How, str]] = {
    "mean": "gauge",
    "sum": "gauge",
    "by_reason": "gauge",
    "cache_config": "gauge",
    "info_sum": "gauge",
    "sleep_state": "gauge",
    "counter": "counter",
    "histogram": "histogram",
}

# Labels that tell apart ranks of one model replica (tensor/pipeline/expert parallel): every
# rank of a replica reports the same scheduler state, so such series count once.
REPLICA_RANK_LABELS: Final = frozenset({"tp_rank", "pp_rank", "moe_ep_rank", "attn_tp_rank"})

# DCGM exporter (etc/default-counters.csv, dcp-metrics-included.csv). GpuScrape field →
# names; GPU_SCALE turns the source unit into ICE's (MiB → bytes, % → fraction).
GPU_NAMES: Final[dict[str, tuple[str, ...]]] = {
    "fb_used_bytes": ("DCGM_FI_DEV_FB_USED",),
    "fb_free_bytes": ("DCGM_FI_DEV_FB_FREE",),
    "fb_total_bytes": ("DCGM_FI_DEV_FB_TOTAL",),
    # only used to derive the total (used + free + reserved) when FB_TOTAL is absent
    "fb_reserved_bytes": ("DCGM_FI_DEV_FB_RESERVED",),
    "gpu_util": ("DCGM_FI_DEV_GPU_UTIL",),
    "pcie_tx_bytes_s": ("DCGM_FI_PROF_PCIE_TX_BYTES",),
    "pcie_rx_bytes_s": ("DCGM_FI_PROF_PCIE_RX_BYTES",),
}
_MIB: Final = 1024.0 * 1024.0
GPU_SCALE: Final[dict[str, float]] = {
    "fb_used_bytes": _MIB,
    "fb_free_bytes": _MIB,
    "fb_total_bytes": _MIB,
    "fb_reserved_bytes": _MIB,
    "gpu_util": 0.01,
    "pcie_tx_bytes_s": 1.0,
    "pcie_rx_bytes_s": 1.0,
}
# GpuScrape attribute → label names, first present wins. Behind a Prometheus server the
# exporter's own pod/namespace target labels push the workload's to exported_*.
GPU_LABELS: Final[dict[str, tuple[str, ...]]] = {
    "gpu": ("gpu",),
    "uuid": ("UUID", "uuid"),
    "host": ("Hostname", "hostname"),
    "pod": ("exported_pod", "pod"),
    "namespace": ("exported_namespace", "namespace"),
    "model_name": ("modelName",),
}
# A MIG instance is its own GPU: gpu becomes "<gpu>/<GPU_I_ID>".
GPU_INSTANCE_LABEL: Final = "GPU_I_ID"

_HIST_SUFFIXES: Final = ("_bucket", "_count", "_sum")


def sample_names(kind: str) -> dict[str, str]:
    """Every sample name the parser keeps for ``kind`` → the family (metric) name it belongs
    to: histogram samples map to their family, the rest to themselves."""
    out: dict[str, str] = {}
    if kind == "dcgm":
        for names in GPU_NAMES.values():
            for name in names:
                out[name] = name
        return out
    for field, names in ENGINE_NAMES[kind].items():
        for name in names:
            if HOW[field] == "histogram":
                for suffix in _HIST_SUFFIXES:
                    out[name + suffix] = name
            else:
                out[name] = name
    return out
