"""The dev backend's state: what ``/metrics`` reports, what was served, what was received.

- ``DevState``: the controller-set numbers behind the vLLM gauges (``PUT``/``GET
  /_dev/state``, see ``app.dev_state``), ``legacy`` (the pre-V1 usage name),
  ``metrics_delay_s`` and ``valve`` (vLLM 0.32's admission valve, closed: every request it
  gates is answered 503 as vLLM's API server answers it, ``answers.valve_answer``);
  ``_DEFAULTS`` is its field → default table used to type-check updates.
- ``_Backend``: all mutable server state of one app (its ``DevState``, the verbatim
  ``/metrics`` override, the last ``MAX_RECORDED`` requests, the token, finished-request and
  valve-rejection counters) and, as a collector, the vLLM-style families rendered from them.
- ``BACKEND``: the ``aiohttp`` app key every handler reads its ``_Backend`` from.

Invariants: the collector is registered on the backend's own ``CollectorRegistry`` (never the
global one), so two apps in one process never share metrics; gauges mirror ``DevState`` only;
the counters change only through ``_Backend.served`` and ``_Backend.refused`` and only grow;
``collect`` reads state and changes nothing. No I/O here.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterator
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

MAX_RECORDED = 1000
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
FINISH_REASONS = ("stop", "length", "abort")
# vLLM's admission valve (--max-num-queued-reqs, --max-num-queued-tokens): the reason label of
# vllm:admission_rejections_total, and DevState.valve's values besides "" (open)
VALVE_REASONS = ("max_num_queued_reqs", "max_num_queued_tokens")


@dataclasses.dataclass
class DevState:
    """Controller-set state behind ``/metrics`` (``PUT``/``GET /_dev/state``)."""

    kv_cache_usage_perc: float = 0.0
    num_requests_running: int = 0
    num_requests_waiting: int = 0
    num_gpu_blocks: int = 65536  # a large pool (1M tokens): small tests never fill it
    block_size: int = 16
    legacy: bool = False
    num_preemptions_total: int = 0
    metrics_delay_s: float = 0.0
    # "": open; a VALVE_REASONS value: the valve is shut for that reason (every request it
    # gates gets vLLM's 503)
    valve: str = ""


_DEFAULTS: dict[str, Any] = dataclasses.asdict(DevState())
_Metric = type[GaugeMetricFamily] | type[CounterMetricFamily]


class _Backend:
    """All mutable server state, plus the vLLM-style collector over it."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.state = DevState()
        self.raw_metrics: bytes | None = None
        self.requests: collections.deque[dict[str, Any]] = collections.deque(maxlen=MAX_RECORDED)
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.success = dict.fromkeys(FINISH_REASONS, 0)
        self.rejections = dict.fromkeys(VALVE_REASONS, 0)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def served(self, prompt: int, generated: int, reason: str) -> None:
        self.prompt_tokens += prompt
        self.generation_tokens += generated
        self.success[reason] += 1

    def refused(self, reason: str) -> None:
        """The valve answered a request 503 for ``reason`` (a ``VALVE_REASONS`` value)."""
        self.rejections[reason] += 1

    def collect(self) -> Iterator[Metric]:
        s, labels, base = self.state, ["model_name", "engine"], [self.model, "0"]
        usage = "vllm:gpu_cache_usage_perc" if s.legacy else "vllm:kv_cache_usage_perc"
        table: list[tuple[_Metric, str, float]] = [
            (GaugeMetricFamily, usage, s.kv_cache_usage_perc),
            (GaugeMetricFamily, "vllm:num_requests_running", s.num_requests_running),
            (GaugeMetricFamily, "vllm:num_requests_waiting", s.num_requests_waiting),
            (CounterMetricFamily, "vllm:num_preemptions", s.num_preemptions_total),
            (CounterMetricFamily, "vllm:prompt_tokens", self.prompt_tokens),
            (CounterMetricFamily, "vllm:generation_tokens", self.generation_tokens),
        ]
        for family, name, value in table:
            metric = family(name, f"devbackend imitation of {name}", labels=labels)
            metric.add_metric(base, value)
            yield metric
        config = ["block_size", "num_gpu_blocks", "kv_cache_size_tokens", "enable_prefix_caching"]
        info = GaugeMetricFamily("vllm:cache_config_info", "Cache config", labels=labels + config)
        tokens = s.block_size * s.num_gpu_blocks
        info.add_metric([*base, str(s.block_size), str(s.num_gpu_blocks), str(tokens), "True"], 1)
        yield info
        finished = [*labels, "finished_reason"]
        success = CounterMetricFamily("vllm:request_success", "Finished requests", labels=finished)
        for reason, count in self.success.items():
            success.add_metric([*base, reason], count)
        yield success
        # the API server's counter: model_name and reason, no engine label
        rejected = CounterMetricFamily(
            "vllm:admission_rejections",
            "Number of admission attempts rejected by a queue limit, by reason.",
            labels=["model_name", "reason"],
        )
        for reason, count in self.rejections.items():
            rejected.add_metric([self.model, reason], count)
        yield rejected


BACKEND = web.AppKey("backend", _Backend)
