"""Signals from a Prometheus server's HTTP API instead of each backend's page (pure).

Job: ``build_queries(kind)`` gives the instant queries ICE sends to ``/api/v1/query``;
``engine_scrapes`` / ``gpu_scrapes`` turn the JSON answers into the same records a direct
scrape gives, one ``EngineScrape`` per backend, grouped by a target label (``instance`` by
default, or ``pod``); ``engine_backends`` adds each backend's pod (its series' ``pod`` and
``namespace`` target labels), which ``gpu_join: pod`` needs. No HTTP client here: the caller
fetches and hands the bodies in.

The queries are raw selectors, one per ICE field, e.g. for ``kv_cache_usage`` of vLLM::

    {__name__=~"vllm:kv_cache_usage_perc|vllm:gpu_cache_usage_perc"}

so Prometheus returns the series as the backends exposed them (plus its target labels), and
the combination over engines, ranks and ``model_name`` series is ``combine.engine_from_samples``,
the one a direct scrape uses — ICE sees the same numbers either way. Histograms come as their
``_bucket``/``_count``/``_sum`` series; counters stay cumulative (``window.derive`` makes the
rates from successive answers). The queries may be sent one by one or joined with ``or``.

Invariant: the only exception is ``SourceParseError`` (bad JSON, ``status`` not
``success``, a result that is not an instant vector, a malformed sample). Series without the
grouping label are skipped; native-histogram samples are skipped; NaN values are ignored.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from ext_proc.signals import names as N
from ext_proc.signals.combine import (
    Sample,
    SourceParseError,
    engine_from_samples,
    gpus_from_samples,
)
from ext_proc.signals.scrapes import EngineScrape, GpuScrape

__all__ = [
    "Body",
    "build_queries",
    "engine_backends",
    "engine_scrapes",
    "gpu_scrapes",
    "vector_samples",
]

Body = str | bytes | Mapping[str, Any]  # one /api/v1/query answer: raw JSON or decoded


def build_queries(kind: str) -> dict[str, str]:
    """ICE field → PromQL instant query (a raw ``__name__`` selector) for ``kind``
    ("vllm", "sglang" or "dcgm")."""
    if kind == "dcgm":
        table = N.GPU_NAMES
        how: Mapping[str, N.How] = {}
    elif kind in N.ENGINE_NAMES:
        table = N.ENGINE_NAMES[kind]
        how = N.HOW
    else:
        raise ValueError(f"unknown kind {kind!r}")
    out: dict[str, str] = {}
    for field, names in table.items():
        series: list[str] = []
        for name in names:
            if how.get(field) == "histogram":
                series += [name + "_bucket", name + "_count", name + "_sum"]
            else:
                series.append(name)
        out[field] = '{__name__=~"' + "|".join(series) + '"}'
    return out


def _decode(body: Body) -> Mapping[str, Any]:
    if isinstance(body, Mapping):
        return body
    try:
        decoded = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise SourceParseError(f"not JSON: {e!s:.200}") from None
    if not isinstance(decoded, dict):
        raise SourceParseError("not a Prometheus API answer")
    return decoded


def vector_samples(body: Body) -> list[Sample]:
    """The samples of one instant-vector answer; each sample's labels keep the target labels
    and lose ``__name__`` (the name is the sample's name)."""
    doc = _decode(body)
    if doc.get("status") != "success":
        raise SourceParseError(
            f"query failed: {doc.get('errorType', '?')}: {str(doc.get('error', ''))[:200]}"
        )
    data = doc.get("data")
    if not isinstance(data, Mapping) or data.get("resultType") != "vector":
        kind = data.get("resultType") if isinstance(data, Mapping) else None
        raise SourceParseError(f"not an instant vector (resultType {kind!r})")
    result = data.get("result")
    if not isinstance(result, list):
        raise SourceParseError("vector result is not a list")
    out: list[Sample] = []
    for item in result:
        if not isinstance(item, Mapping):
            raise SourceParseError("malformed vector sample")
        metric = item.get("metric")
        value = item.get("value")
        if value is None and "histogram" in item:
            continue  # a native histogram: ICE reads classic buckets only
        if not isinstance(metric, Mapping) or not isinstance(value, list) or len(value) != 2:
            raise SourceParseError("malformed vector sample")
        name = metric.get("__name__")
        if not isinstance(name, str):
            raise SourceParseError("vector sample without __name__ (use a raw selector)")
        try:
            number = float(value[1])
        except (TypeError, ValueError):
            raise SourceParseError(f"malformed sample value {value[1]!r:.50}") from None
        labels = {str(k): str(v) for k, v in metric.items() if k != "__name__"}
        out.append((name, labels, number))
    return out


def _grouped(bodies: Iterable[Body], group_by: str) -> dict[str, list[Sample]]:
    groups: dict[str, list[Sample]] = defaultdict(list)
    for body in bodies:
        for name, labels, value in vector_samples(body):
            key = labels.get(group_by)
            if key:
                groups[key].append((name, labels, value))
    return groups


def engine_scrapes(
    kind: str, bodies: Iterable[Body], at_s: float, *, group_by: str = "instance"
) -> dict[str, EngineScrape]:
    """One EngineScrape per value of the ``group_by`` label (its ``source``), from the
    answers to ``build_queries(kind)``. ``at_s`` is when the answers arrived."""
    return {
        key: scrape
        for key, (scrape, _) in engine_backends(kind, bodies, at_s, group_by=group_by).items()
    }


def engine_backends(
    kind: str, bodies: Iterable[Body], at_s: float, *, group_by: str = "instance"
) -> dict[str, tuple[EngineScrape, tuple[str, str] | None]]:
    """``engine_scrapes`` and each backend's pod, ``(namespace or "", pod)``, from its series'
    target labels (``pod``/``namespace``, or the older ``kubernetes_pod_name``/
    ``kubernetes_namespace``); None when they carry no pod label."""
    if kind not in N.ENGINE_NAMES:
        raise SourceParseError(f"unknown engine kind {kind!r}")
    return {
        key: (engine_from_samples(kind, key, at_s, samples), _pod(samples))
        for key, samples in sorted(_grouped(bodies, group_by).items())
    }


def _pod(samples: Iterable[Sample]) -> tuple[str, str] | None:
    for _, labels, _ in samples:
        pod = labels.get("pod") or labels.get("kubernetes_pod_name")
        if pod:
            return labels.get("namespace") or labels.get("kubernetes_namespace") or "", pod
    return None


def gpu_scrapes(
    bodies: Iterable[Body], at_s: float, *, group_by: str = "instance"
) -> dict[str, list[GpuScrape]]:
    """The GPUs behind each value of ``group_by`` (a DCGM exporter's target), from the
    answers to ``build_queries("dcgm")``."""
    return {
        key: gpus_from_samples(key, at_s, samples)
        for key, samples in sorted(_grouped(bodies, group_by).items())
    }
