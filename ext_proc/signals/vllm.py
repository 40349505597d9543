"""Parse a vLLM ``/metrics`` page into ``BackendSignals`` (pure).

Metric names are data: ``SIGNAL_NAMES`` maps each ICE signal to the source names that carry
it, newest first (vLLM V1's ``vllm:kv_cache_usage_perc`` replaced the older
``vllm:gpu_cache_usage_perc``). Several engines or ``model_name`` series on one server are
combined: usage is averaged, request counts are summed, block counts are summed.

Invariant: never raises on any text; a page that says nothing usable gives a
``BackendSignals`` whose fields are all None. NaN and infinite samples are ignored.
"""

from __future__ import annotations

import math
from collections import defaultdict

from prometheus_client.parser import text_string_to_metric_families

from ext_proc.signals.snapshot import BackendSignals

__all__ = ["SIGNAL_NAMES", "MetricsParseError", "parse_vllm_metrics"]

SIGNAL_NAMES: dict[str, tuple[str, ...]] = {
    "kv_cache_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    "num_requests_running": ("vllm:num_requests_running",),
    "num_requests_waiting": ("vllm:num_requests_waiting",),
    "cache_config": ("vllm:cache_config_info",),
}
_WANTED = {name for names in SIGNAL_NAMES.values() for name in names}


class MetricsParseError(ValueError):
    """The page is not Prometheus text exposition."""


def _samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    found: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name in _WANTED and math.isfinite(s.value):
                    found[s.name].append((s.labels, s.value))
    except Exception as e:  # the parser raises ValueError, IndexError, ... on garbage
        raise MetricsParseError(f"not Prometheus text exposition: {e!s:.200}") from None
    return found


def _first(found: dict[str, list[tuple[dict[str, str], float]]], signal: str) -> list[float]:
    for name in SIGNAL_NAMES[signal]:
        if name in found:
            return [v for _, v in found[name]]
    return []


def _int_label(labels: dict[str, str], key: str) -> int | None:
    try:
        value = int(float(labels[key]))
    except (KeyError, ValueError, OverflowError):
        return None
    return value if value > 0 else None


def parse_vllm_metrics(url: str, text: str) -> BackendSignals:
    """Signals of one vLLM server from its ``/metrics`` text; raises ``MetricsParseError``."""
    found = _samples(text)
    usage = _first(found, "kv_cache_usage")
    running = _first(found, "num_requests_running")
    waiting = _first(found, "num_requests_waiting")
    blocks: int | None = None
    block_size: int | None = None
    for name in SIGNAL_NAMES["cache_config"]:
        for labels, _ in found.get(name, []):
            n = _int_label(labels, "num_gpu_blocks")
            if n is not None:
                blocks = (blocks or 0) + n
            block_size = block_size or _int_label(labels, "block_size")
    return BackendSignals(
        url=url,
        kv_cache_usage=min(1.0, max(0.0, sum(usage) / len(usage))) if usage else None,
        num_requests_running=sum(running) if running else None,
        num_requests_waiting=sum(waiting) if waiting else None,
        num_gpu_blocks=blocks,
        block_size=block_size,
    )
