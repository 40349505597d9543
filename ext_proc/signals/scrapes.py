"""Normalised signals: what one scrape of one source says, in ICE's names and units.

Every source (vLLM, SGLang, DCGM exporter, NVML, a Prometheus server) is turned into these
frozen records by a pure parser; the collector keeps a short history of them per backend and
derives rates and quantiles over a sliding window (``Derived``).

Units are in the names: ``_s`` seconds, ``_bytes`` bytes, ``_tokens`` tokens; fractions are
0-1. ``None`` always means "the source did not say", never zero. Counters are cumulative
since the source started (a decrease is a reset). ``at_s`` is ``time.monotonic()`` of the
scrape.

``sleep_state`` (vLLM's ``vllm:engine_sleep_state``, one of ``SLEEP_STATES``): ``awake``
when every engine says ``awake`` = 1; otherwise the deepest state of an engine whose
``awake`` = 0: ``paused`` (its scheduler is paused: sleep level 0, or the KV cache released),
``weights_offloaded`` (level 1), ``discard_all`` (level 2). Any state but ``awake`` means
the server does not serve now.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

__all__ = ["SLEEP_STATES", "Derived", "EngineScrape", "GpuScrape", "Histogram", "Speed"]

# vLLM's engine sleep states, shallowest first (``EngineScrape.sleep_state``)
SLEEP_STATES: Final = ("awake", "paused", "weights_offloaded", "discard_all")


@dataclass(frozen=True, slots=True)
class Histogram:
    """A cumulative Prometheus histogram: ``counts[i]`` observations ≤ ``bounds[i]``."""

    bounds: tuple[float, ...]  # ascending upper bounds; the last is +inf
    counts: tuple[float, ...]  # cumulative, same length as bounds
    count: float
    sum: float


@dataclass(frozen=True, slots=True)
class EngineScrape:
    """One scrape of one inference server (all its engines and models combined)."""

    source: str
    kind: str  # "vllm" | "sglang"
    at_s: float
    models: tuple[str, ...] = ()
    # gauges
    kv_cache_usage: float | None = None  # used fraction of the KV cache
    num_requests_running: float | None = None
    num_requests_waiting: float | None = None
    waiting_by_reason: tuple[tuple[str, float], ...] = ()
    sleep_state: str | None = None  # vllm:engine_sleep_state, see the module docstring
    # capacity (vllm:cache_config_info, sglang:max_total_num_tokens)
    num_gpu_blocks: int | None = None
    block_size: int | None = None
    kv_capacity_tokens: int | None = None
    # vllm:cache_config_info enable_prefix_caching: True/False when every engine says
    prefix_caching: bool | None = None
    # counters, cumulative
    preemptions: float | None = None
    prefix_cache_queries_tokens: float | None = None
    prefix_cache_hits_tokens: float | None = None
    prompt_tokens: float | None = None
    generation_tokens: float | None = None
    request_success: float | None = None
    # finished requests by vllm:request_success_total's finished_reason (stop, length, abort,
    # …), when the page splits the counter by it
    finished_by_reason: tuple[tuple[str, float], ...] = ()
    # requests the API server's own valve answered 503 (vLLM --max-num-queued-reqs /
    # --max-num-queued-tokens: vllm:admission_rejections_total, every reason summed)
    admission_rejections: float | None = None
    # histograms, cumulative
    ttft_s: Histogram | None = None
    queue_time_s: Histogram | None = None
    output_lengths: Histogram | None = None  # output tokens of each finished request
    itl_s: Histogram | None = None  # seconds between two output tokens of a request
    # each finished request's prefill: its seconds in the prefill phase, and the prompt
    # tokens it computed (cached ones excluded): vLLM's prefill speed (ext_proc.signals.slo)
    prefill_time_s: Histogram | None = None
    prefill_computed_tokens: Histogram | None = None
    # tokens of each engine step, prefill chunks and decodes (vllm:iteration_tokens_total)
    iteration_tokens: Histogram | None = None
    # ratios some engines publish directly (SGLang's cache_hit_rate)
    cache_hit_rate: float | None = None


@dataclass(frozen=True, slots=True)
class GpuScrape:
    """One GPU as the DCGM exporter or NVML reports it."""

    source: str
    at_s: float
    gpu: str  # index as a string
    uuid: str | None = None
    host: str | None = None
    pod: str | None = None
    namespace: str | None = None
    model_name: str | None = None
    fb_used_bytes: float | None = None
    fb_free_bytes: float | None = None
    fb_total_bytes: float | None = None
    gpu_util: float | None = None  # fraction 0-1
    pcie_tx_bytes_s: float | None = None
    pcie_rx_bytes_s: float | None = None


@dataclass(frozen=True, slots=True)
class Speed:
    """How fast one backend prefills and decodes, over the window (``ext_proc.signals.slo``;
    docs/slo.md). None: the window cannot say."""

    # prompt tokens computed (cache hits excluded) per second a request spends in prefill
    prefill_tokens_per_s: float | None = None
    # mean prompt tokens a request computed in its prefill (cache hits excluded)
    computed_prompt_tokens: float | None = None
    # the decode step as it grows with the running sequences: step_s = base + per_running × n
    step_base_s: float | None = None
    step_per_running_s: float | None = None
    step_points: int = 0  # scrape intervals the line was fitted on
    # the rest of a first token's time: mean TTFT − mean queue time − mean prefill time (s)
    ttft_overhead_s: float | None = None
    # the TTFT prediction's own error over the window: mean |predicted − observed| ÷ observed
    # of each interval's prediction (made from the intervals before it) against the mean TTFT
    # the backend reported over it; and how many intervals it averages
    ttft_error_ratio: float | None = None
    ttft_error_points: int = 0
    # the engine step as it grows with the tokens it schedules (prefill chunks and decodes):
    # step_s = fixed + per_token × tokens, from vllm:iteration_tokens_total against the
    # inter-token latency (docs/slo.md, "The engine's step line")
    token_step_fixed_s: float | None = None
    token_step_per_token_s: float | None = None
    token_step_points: int = 0


@dataclass(frozen=True, slots=True)
class Derived:
    """Rates and quantiles of one backend over a sliding window (from two or more scrapes)."""

    window_s: float
    prefix_cache_hit_ratio: float | None = None  # Δhits / Δqueries (tokens)
    preemptions_per_s: float | None = None
    prompt_tokens_per_s: float | None = None
    generation_tokens_per_s: float | None = None
    completions_per_s: float | None = None
    ttft_p50_s: float | None = None
    ttft_p95_s: float | None = None
    queue_time_p95_s: float | None = None
    ttft_delta: Histogram | None = None  # the window's own TTFT observations
    # the backend's own admission valve (vllm:admission_rejections_total): requests it
    # answered 503 per second over the window, and whether it answered any between the
    # newest two scrapes that carry the counter (None: fewer than two)
    admission_rejections_per_s: float | None = None
    admission_rejected_recently: bool | None = None
    speed: Speed | None = None  # prefill and decode speeds (ext_proc.signals.slo)
