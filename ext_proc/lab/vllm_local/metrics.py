"""Sample values and labels from a Prometheus text page (vLLM's ``/metrics``), by sample name.

``prometheus_client``'s parser reads the page; these helpers only pick samples out of it.

Invariants: ``name`` is a *sample* name as vLLM prints it (``vllm:num_preemptions_total``,
``vllm:request_queue_time_seconds_sum`` / ``_count``, ``vllm:cache_config_info``), never a
family name, which the parser shortens (``_total``, ``_info``); the parser gives a counter
printed without ``_total`` (not vLLM's way) the ``_total`` sample name of OpenMetrics.
Samples come in page order; label values are unescaped; a page that is not Prometheus text
raises ``ValueError``. A page is parsed once for the several look-ups a poll makes of it
(a small cache keyed by the page's text).
"""

from __future__ import annotations

import functools

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

__all__ = ["metric_labels", "metric_values"]


@functools.lru_cache(maxsize=8)
def _page_samples(text: str) -> tuple[Sample, ...]:
    return tuple(s for family in text_string_to_metric_families(text) for s in family.samples)


def metric_values(text: str, name: str) -> list[float]:
    """Every sample value of ``name`` on a Prometheus text page (any labels)."""
    return [float(s.value) for s in _page_samples(text) if s.name == name]


def metric_labels(text: str, name: str) -> dict[str, str]:
    """The labels of the first sample of ``name`` that has any (e.g. ``vllm:cache_config_info``);
    ``{}`` when there is none."""
    return next((dict(s.labels) for s in _page_samples(text) if s.name == name and s.labels), {})
