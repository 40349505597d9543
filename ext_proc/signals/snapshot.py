"""Immutable views of backends and pools, as the evaluator sees them.

Invariant: a ``PoolSnapshot`` is never mutated; the store swaps whole snapshots by
reference, so a reader always sees one consistent scrape.

A backend is ``asleep`` when its engine sleeps (vLLM sleep mode: ``sleep_state`` other than
``awake``): it serves nothing now, so the evaluator gives it no room, and a pool whose every
backend is asleep is not ready (``PoolSnapshot.asleep``). ``admission_rejected``: the
backend's own valve answered a request 503 between its two newest scrapes (its queue is at
its cap).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ext_proc.signals.scrapes import Derived, GpuScrape, Histogram, Speed
from ext_proc.signals.slo import predicted_tpot_s, predicted_ttft_step_s

__all__ = ["BackendSignals", "PoolSnapshot"]


@dataclass(frozen=True, slots=True)
class BackendSignals:
    """What one backend's ``/metrics`` said. ``None`` means the page did not say."""

    url: str
    kv_cache_usage: float | None = None  # used fraction, 0-1
    num_requests_running: float | None = None
    num_requests_waiting: float | None = None
    num_gpu_blocks: int | None = None
    block_size: int | None = None
    derived: Derived | None = None  # rates and quantiles over the pool's window
    cache_hit_rate: float | None = None  # an engine's own prefix-cache hit gauge (SGLang)
    # vllm:cache_config_info enable_prefix_caching (None: the page does not say)
    prefix_caching: bool | None = None
    # vllm:engine_sleep_state: awake, paused, weights_offloaded, discard_all (None: not said)
    sleep_state: str | None = None
    # cumulative since the server started: output tokens of each finished request, and
    # preemptions (the forecast: ext_proc.placement.forecast)
    output_lengths: Histogram | None = None
    preemptions: float | None = None
    # of the requests that finished on their own or at their limit (vllm:request_success_total
    # by finished_reason: length ÷ (length + stop + repetition)), the share that ran to their
    # output limit; None when the page does not split finished requests by reason
    limit_share: float | None = None
    # mean seconds between two output tokens of a running request, since the server started
    # (vllm:inter_token_latency_seconds' sum ÷ count): the forecast's decode rate is 1 / it
    itl_mean_s: float | None = None
    age_s: float = 0.0  # age of the scrape these values come from, when the view was built
    stale: bool = False  # the values are older than the pool's stale_after_s

    @property
    def asleep(self) -> bool:
        """The backend's engine sleeps (any state but ``awake``; unknown counts as awake)."""
        return self.sleep_state is not None and self.sleep_state != "awake"

    @property
    def admission_rejected(self) -> bool:
        """Its valve (vLLM ``--max-num-queued-reqs`` / ``--max-num-queued-tokens``) refused
        a request between its two newest scrapes (unknown counts as no)."""
        return self.derived is not None and self.derived.admission_rejected_recently is True

    @property
    def decode_rate(self) -> float | None:
        """Tokens a second one running sequence generates, as the forecast reads it
        (``docs/forecast.md``): 1 ÷ ``itl_mean_s``, or, when lower, the window's
        ``generation_tokens_per_s`` ÷ max(1, ``num_requests_running``). None without the
        latency histogram (no window rate alone: it swings with the running gauge)."""
        if not self.itl_mean_s:
            return None
        rate = 1.0 / self.itl_mean_s
        d = self.derived
        if d is not None and d.generation_tokens_per_s is not None:
            # under load a sequence decodes slower than the mean since start (mostly light
            # load) says
            running = max(1.0, self.num_requests_running or 0.0)
            rate = min(rate, d.generation_tokens_per_s / running)
        return rate

    @property
    def first_token_delay_s(self) -> float:
        """d: seconds from a request's start to its first token, the window's TTFT p50
        (0 when the window has none)."""
        d = self.derived
        return d.ttft_p50_s if d is not None and d.ttft_p50_s is not None else 0.0

    @property
    def speed(self) -> Speed | None:
        """Prefill speed and decode step line over the window (docs/slo.md)."""
        return self.derived.speed if self.derived is not None else None

    @property
    def hit_ratio(self) -> float | None:
        """The expected prefix-cache hit of a prompt here: the window's hit ratio, else the
        engine's own gauge (SGLang), else None (no hit expected)."""
        d = self.derived
        if d is not None and d.prefix_cache_hit_ratio is not None:
            return d.prefix_cache_hit_ratio
        return self.cache_hit_rate

    def predicted_ttft_s(self, prompt_tokens: float, ahead_tokens: float = 0.0) -> float | None:
        """Seconds to the first token of a request of ``prompt_tokens`` sent here now
        (``ext_proc.signals.slo.predicted_ttft_step_s``; O(1)). None: no prefill speed known."""
        sp = self.speed
        if sp is None:
            return None
        return predicted_ttft_step_s(
            sp,
            self.num_requests_waiting,
            self.num_requests_running,
            prompt_tokens,
            self.hit_ratio,
            ahead_tokens,
            completions_per_s=self.derived.completions_per_s if self.derived else None,
        )

    @property
    def predicted_tpot_s(self) -> float | None:
        """Seconds per output token here with one more sequence running than now."""
        sp = self.speed
        if sp is None:
            return None
        return predicted_tpot_s(sp, (self.num_requests_running or 0.0) + 1.0)

    @property
    def kv_capacity_tokens(self) -> int | None:
        if self.num_gpu_blocks is None or self.block_size is None:
            return None
        return self.num_gpu_blocks * self.block_size

    @property
    def usable_blocks(self) -> int | None:
        """Blocks a request can get on an idle server: vLLM keeps one null block aside, and
        its ``kv_cache_usage_perc`` is used / (num_gpu_blocks − 1)."""
        return self.num_gpu_blocks - 1 if self.num_gpu_blocks else None

    @property
    def free_blocks(self) -> int | None:
        """floor((num_gpu_blocks − 1) × (1 − kv_cache_usage)): blocks free right now."""
        usable = self.usable_blocks
        if usable is None or self.kv_cache_usage is None:
            return None
        return int(usable * (1.0 - min(1.0, max(0.0, self.kv_cache_usage))) + 1e-9)


@dataclass(frozen=True, slots=True)
class PoolSnapshot:
    """The backends of one pool at one scrape. ``taken_at_s`` is ``time.monotonic()``."""

    pool: str
    backends: tuple[BackendSignals, ...]
    taken_at_s: float
    stale: bool = False  # some source is stale (kept as last known or saturated, or left out)
    gpus: tuple[GpuScrape, ...] = ()  # the pool's GPUs (DCGM), when configured
    pcie_bandwidth_bytes_s: float = 32e9

    @property
    def asleep(self) -> bool:
        """Every backend of the pool sleeps: nothing can serve a request now."""
        return bool(self.backends) and all(b.asleep for b in self.backends)

    @property
    def serving(self) -> PoolSnapshot:
        """This view less its sleeping backends (itself when none sleeps, or all do)."""
        awake = tuple(b for b in self.backends if not b.asleep)
        if not awake or len(awake) == len(self.backends):
            return self
        return replace(self, backends=awake)

    @property
    def pcie_utilization(self) -> float | None:
        """Mean over the pool's GPUs of max(tx, rx) / pcie_bandwidth_bytes_s, clamped to 0-1."""
        values = [
            max(g.pcie_tx_bytes_s or 0.0, g.pcie_rx_bytes_s or 0.0) / self.pcie_bandwidth_bytes_s
            for g in self.gpus
            if g.pcie_tx_bytes_s is not None or g.pcie_rx_bytes_s is not None
        ]
        if not values:
            return None
        return min(1.0, max(0.0, sum(values) / len(values)))

    @property
    def gpu_memory_used_fraction(self) -> float | None:
        """Mean framebuffer used fraction (used / (used + free), or used / total)."""
        values: list[float] = []
        for g in self.gpus:
            total = g.fb_total_bytes or (
                (g.fb_used_bytes or 0.0) + (g.fb_free_bytes or 0.0) if g.fb_free_bytes else None
            )
            if g.fb_used_bytes is not None and total:
                values.append(min(1.0, g.fb_used_bytes / total))
        return sum(values) / len(values) if values else None

    @property
    def kv_cache_usage(self) -> float | None:
        """Pool usage: block-weighted when every backend reports its blocks, else the mean."""
        reports = [b for b in self.backends if b.kv_cache_usage is not None]
        if not reports:
            return None
        if all(b.num_gpu_blocks for b in reports):
            total = sum(b.num_gpu_blocks or 0 for b in reports)
            used = sum((b.kv_cache_usage or 0.0) * (b.num_gpu_blocks or 0) for b in reports)
            return used / total
        return sum(b.kv_cache_usage or 0.0 for b in reports) / len(reports)

    @property
    def block_size(self) -> int | None:
        """The pool's KV block size (its backends serve one model with one block size)."""
        for b in self.backends:
            if b.block_size:
                return b.block_size
        return None

    @property
    def prefix_caching(self) -> bool:
        """Whether every backend says it caches prefixes (vLLM's ``enable_prefix_caching``):
        then the ``n`` samples of one prompt share its full blocks. Unknown counts as no."""
        return bool(self.backends) and all(b.prefix_caching is True for b in self.backends)

    @property
    def max_free_blocks(self) -> int | None:
        """Free blocks of the backend with the most: the best a new request can find."""
        values = [f for f in (b.free_blocks for b in self.backends) if f is not None]
        return max(values) if values else None
