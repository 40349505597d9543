"""A vLLM ``/metrics`` page whose scrapes show a prefill speed, for the dev backend's verbatim
page (``PUT /_dev/metrics``): the e2e test and the bench of ``admission: slo``
(tests/e2e/test_slo_admission.py, bench/slo_refusal.py).

``speed_page(step, waiting)``: vLLM's page after ``step`` requests each prefilled 50 computed
tokens in 0.5 s, so that two scrapes of pages ``1`` then ``2`` give ICE (docs/slo.md)
``r = 50 ÷ 0.5 = 100`` tokens a second and ``c̄ = 50`` tokens; ``waiting`` requests queued
(each 0.5 s of prefill ahead of a new one), one running, the KV cache empty.
"""

from __future__ import annotations

__all__ = ["speed_page"]


def speed_page(step: int, waiting: int, model: str = "dev-model", tokens: float = 50.0) -> bytes:
    """The page (module docstring); ``tokens``: computed tokens per prefill of 0.5 s (the
    default 50: r = 100 tokens a second)."""
    labels = f'engine="0",model_name="{model}"'
    lines = [
        "# TYPE vllm:kv_cache_usage_perc gauge",
        f"vllm:kv_cache_usage_perc{{{labels}}} 0.0",
        "# TYPE vllm:num_requests_running gauge",
        f"vllm:num_requests_running{{{labels}}} 1",
        "# TYPE vllm:num_requests_waiting gauge",
        f"vllm:num_requests_waiting{{{labels}}} {waiting}",
        "# TYPE vllm:cache_config_info gauge",
        f'vllm:cache_config_info{{{labels},block_size="16",num_gpu_blocks="65536",'
        'enable_prefix_caching="True"} 1.0',
    ]
    for name, total in (
        ("vllm:request_prefill_time_seconds", 0.5 * step),
        ("vllm:request_prefill_kv_computed_tokens", tokens * step),
    ):
        lines += [
            f"# TYPE {name} histogram",
            f'{name}_bucket{{{labels},le="+Inf"}} {step}',
            f"{name}_sum{{{labels}}} {total}",
            f"{name}_count{{{labels}}} {step}",
        ]
    return ("\n".join(lines) + "\n").encode()
