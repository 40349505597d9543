"""Combine the samples of one server into normalised records: pure, no text.

Job: samples (name, labels, value) and their families' declared types → ``EngineScrape``
(``engine_from_samples``) or ``list[GpuScrape]`` (``gpus_from_samples``). The samples come
from a ``/metrics`` page (``ext_proc.signals.parse`` reads it) or from Prometheus API answers
(``ext_proc.signals.promapi``); ``names.py`` says which metric carries which field.

How: several engines / data-parallel ranks / ``model_name`` series of one server → usage
averaged (block-weighted when every engine's ``cache_config_info`` is known), counts and
counters summed, histograms summed bucket by bucket over the bounds all series share.
Series that differ only by a rank label of one replica (``tp_rank``, ...) count once.
vLLM's ``vllm:engine_sleep_state`` (one series per engine and ``sleep_state``): an engine
sleeps when its ``awake`` series is 0, at the level its ``discard_all`` (2) or
``weights_offloaded`` (1) series says, else ``paused`` (level 0, or its KV cache released);
the server's ``sleep_state`` is its deepest engine's (``model.SLEEP_STATES``), so a server
with one sleeping engine counts as asleep; engines without an ``awake`` series say nothing.
DCGM: one record per GPU (per MIG instance), ordered by GPU index.

Invariants:
- NaN and ±Inf samples are ignored. A family whose ``# TYPE`` contradicts what ICE expects is
  ignored (the next name in preference may serve). A histogram series without its ``+Inf``
  bucket makes the histogram None. ``None`` always means "the source did not say".
- The only exception is ``SourceParseError`` (an unknown engine kind); it is defined here, the
  lowest module of the two, and re-exported by ``parse``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Final

from ext_proc.signals import names as N
from ext_proc.signals.scrapes import SLEEP_STATES, EngineScrape, GpuScrape, Histogram

__all__ = [
    "Sample",
    "SourceParseError",
    "engine_from_samples",
    "gpus_from_samples",
]

Sample = tuple[str, Mapping[str, str], float]  # sample name, labels, value
_Row = tuple[Mapping[str, str], float]  # labels, value


class SourceParseError(ValueError):
    """The text is not a usable exposition page of the expected kind."""


# sample name → family, per kind (what ``parse`` keeps of a page is the same set)
_SAMPLE_NAMES: Final = {kind: N.sample_names(kind) for kind in (*N.ENGINE_KINDS, "dcgm")}
_HOW_OF: Final = {
    kind: {n: N.HOW[f] for f, names in table.items() for n in names}
    for kind, table in N.ENGINE_NAMES.items()
}


def _dedupe_ranks(
    rows: list[tuple[Mapping[str, str], float]],
) -> list[tuple[Mapping[str, str], float]]:
    """Series that differ only in a rank label of one replica count once (the first)."""
    seen: set[tuple[tuple[str, str], ...]] = set()
    out = []
    for labels, value in rows:
        key = tuple(sorted((k, v) for k, v in labels.items() if k not in N.REPLICA_RANK_LABELS))
        if key not in seen:
            seen.add(key)
            out.append((labels, value))
    return out


@lru_cache(maxsize=1024)
def _bound(le: str) -> float | None:
    """A bucket's upper bound from its ``le`` label; None when it is not a number."""
    try:
        bound = float(le)
    except ValueError:
        return None
    return None if math.isnan(bound) else bound


def _positive_int(labels: Mapping[str, str], key: str) -> int | None:
    try:
        value = int(float(labels[key]))
    except (KeyError, ValueError, OverflowError):
        return None
    return value if value > 0 else None


def _histogram(
    family: str, by_name: Mapping[str, list[tuple[Mapping[str, str], float]]]
) -> Histogram | None:
    """Bucket-wise sum over every series, on the bounds all series share (cumulative counts
    stay exact there); None without samples or when a series lacks its +Inf bucket."""
    totals: dict[float, float] = {}
    seen: dict[float, int] = {}
    isfinite, bound_of = math.isfinite, _bound
    for labels, value in by_name.get(family + "_bucket", ()):
        bound = bound_of(labels.get("le", ""))
        if bound is None or not isfinite(value):
            continue
        totals[bound] = totals.get(bound, 0.0) + value
        seen[bound] = seen.get(bound, 0) + 1
    sums = by_name.get(family + "_sum", [])
    counts = by_name.get(family + "_count", [])
    n_series = max(len(sums), len(counts), seen.get(math.inf, 0))
    if n_series == 0 or seen.get(math.inf, 0) != n_series:
        return None
    bounds = sorted(b for b, n in seen.items() if n == n_series)
    cumulative: list[float] = []
    running = 0.0
    for b in bounds:  # enforce monotonic counts, as Prometheus's histogram_quantile does
        running = max(running, totals[b])
        cumulative.append(running)
    return Histogram(
        bounds=tuple(bounds),
        counts=tuple(cumulative),
        count=cumulative[-1],
        sum=math.fsum(v for _, v in sums if math.isfinite(v)),
    )


def _group(
    samples: Iterable[Sample], family_of: Mapping[str, str], declared: Mapping[str, str], kind: str
) -> tuple[dict[str, list[tuple[Mapping[str, str], float]]], bool]:
    """Samples by name, dropping families whose declared type contradicts names.py and
    non-finite values (histogram buckets are checked in ``_histogram``); and whether any
    series carries a replica rank label."""
    how_of = _HOW_OF.get(kind, {})
    by_name: dict[str, list[tuple[Mapping[str, str], float]]] = defaultdict(list)
    bad: set[str] = set()
    for family, typ in declared.items():
        expected = N.EXPECTED_TYPE[how_of[family]] if family in how_of else "gauge"
        if typ not in (expected, "untyped", "unknown"):
            bad.add(family)
    ranked = False
    ranks = N.REPLICA_RANK_LABELS
    isfinite = math.isfinite
    for name, labels, value in samples:
        fam = family_of.get(name)
        if fam is None or fam in bad:
            continue
        if isfinite(value) or name.endswith("_bucket"):
            by_name[name].append((labels, value))
            if not ranked and not ranks.isdisjoint(labels):
                ranked = True
    return by_name, ranked


def engine_from_samples(
    kind: str,
    source: str,
    at_s: float,
    samples: Iterable[Sample],
    declared: Mapping[str, str] | None = None,
) -> EngineScrape:
    """Combine the samples of one server (see the module docstring) into an EngineScrape."""
    if kind not in N.ENGINE_NAMES:
        raise SourceParseError(f"unknown engine kind {kind!r}")
    by_name, ranked = _group(samples, _SAMPLE_NAMES[kind], declared or {}, kind)
    series = _Series(N.ENGINE_NAMES[kind], by_name, _dedupe_ranks if ranked else _same)
    cap = _capacity(series)
    reasons: dict[str, float] = defaultdict(float)
    for labels, value in series.rows("waiting_by_reason"):
        reasons[labels.get("reason", "")] += value
    finished: dict[str, float] = defaultdict(float)
    for labels, value in series.rows("request_success"):
        if "finished_reason" in labels:
            finished[labels["finished_reason"]] += value
    total = series.total
    return EngineScrape(
        source=source,
        kind=kind,
        at_s=at_s,
        models=_models(by_name),
        kv_cache_usage=series.mean("kv_cache_usage", cap.engine_blocks),
        num_requests_running=total("num_requests_running"),
        num_requests_waiting=total("num_requests_waiting"),
        waiting_by_reason=tuple(sorted(reasons.items())),
        sleep_state=_sleep_state(series.rows("sleep_state")),
        num_gpu_blocks=cap.blocks,
        block_size=cap.block_size,
        kv_capacity_tokens=cap.tokens,
        prefix_caching=cap.prefix_caching,
        preemptions=total("preemptions"),
        prefix_cache_queries_tokens=total("prefix_cache_queries_tokens"),
        prefix_cache_hits_tokens=total("prefix_cache_hits_tokens"),
        prompt_tokens=total("prompt_tokens"),
        generation_tokens=total("generation_tokens"),
        request_success=total("request_success"),
        finished_by_reason=tuple(sorted(finished.items())),
        admission_rejections=total("admission_rejections"),
        ttft_s=series.histogram("ttft_s"),
        queue_time_s=series.histogram("queue_time_s"),
        output_lengths=series.histogram("output_lengths"),
        itl_s=series.histogram("itl_s"),
        prefill_time_s=series.histogram("prefill_time_s"),
        prefill_computed_tokens=series.histogram("prefill_computed_tokens"),
        iteration_tokens=series.histogram("iteration_tokens"),
        cache_hit_rate=series.mean("cache_hit_rate", None),
    )


@dataclass(frozen=True, slots=True)
class _Series:
    """One server's samples by name, read a field at a time: the first of the field's names
    (names.py's order of preference) that has samples, its rank copies counted once."""

    table: Mapping[str, tuple[str, ...]]  # field → its sample names, by preference
    by_name: Mapping[str, list[_Row]]
    dedupe: Callable[[list[_Row]], list[_Row]]

    def first(self, field: str) -> str | None:
        by_name = self.by_name
        for name in self.table.get(field, ()):
            if N.HOW[field] == "histogram":
                if name + "_bucket" in by_name:
                    return name
            elif name in by_name:
                return name
        return None

    def rows(self, field: str) -> list[_Row]:
        name = self.first(field)
        return self.dedupe(self.by_name[name]) if name else []

    def total(self, field: str) -> float | None:
        r = self.rows(field)
        return math.fsum(v for _, v in r) if r else None

    def mean(self, field: str, engine_blocks: Mapping[str, int] | None) -> float | None:
        """The mean in [0, 1], weighted by ``engine_blocks`` when it covers every engine."""
        r = self.rows(field)
        if not r:
            return None
        if len(r) == 1:
            value = r[0][1]
        elif engine_blocks and all(lb.get("engine") in engine_blocks for lb, _ in r):
            w = [engine_blocks[lb["engine"]] for lb, _ in r]
            value = math.fsum(v * wi for (_, v), wi in zip(r, w, strict=True)) / sum(w)
        else:
            value = math.fsum(v for _, v in r) / len(r)
        return min(1.0, max(0.0, value))

    def histogram(self, field: str) -> Histogram | None:
        family = self.first(field)
        if not family:
            return None
        return _histogram(family, _histogram_rows(self.by_name, family, self.dedupe))


@dataclass(frozen=True, slots=True)
class _Capacity:
    """The KV cache's size, from vLLM's ``cache_config_info`` labels (one series per engine)
    or a capacity series."""

    engine_blocks: dict[str, int]  # engine → its KV blocks
    blocks: int | None
    block_size: int | None
    tokens: int | None
    prefix_caching: bool | None  # None: not said, False: the engines disagree


def _capacity(series: _Series) -> _Capacity:
    engine_blocks: dict[str, int] = {}
    blocks: int | None = None
    block_size: int | None = None
    capacity: int | None = None
    anonymous = 0
    size_tokens = 0
    caching: set[bool] = set()
    for labels, _ in series.rows("cache_config"):
        flag = labels.get("enable_prefix_caching")
        if flag is not None:
            caching.add(flag.strip().lower() == "true")
        n = _positive_int(labels, "num_gpu_blocks")
        block_size = block_size or _positive_int(labels, "block_size")
        size_tokens += _positive_int(labels, "kv_cache_size_tokens") or 0
        if n is None:
            continue
        if "engine" in labels:
            engine_blocks.setdefault(labels["engine"], n)
        else:
            anonymous += n
    if engine_blocks or anonymous:
        blocks = sum(engine_blocks.values()) + anonymous
    if blocks is not None and block_size is not None:
        capacity = blocks * block_size
    elif size_tokens:
        capacity = size_tokens
    cap_rows = series.rows("kv_capacity_tokens")
    if cap_rows:
        capacity = int(math.fsum(v for _, v in cap_rows))
    prefix_caching = caching.pop() if len(caching) == 1 else (False if caching else None)
    return _Capacity(engine_blocks, blocks, block_size, capacity, prefix_caching)


def _models(by_name: Mapping[str, list[_Row]]) -> tuple[str, ...]:
    """The ``model_name`` labels of every series but histogram buckets, sorted."""
    return tuple(
        sorted(
            {
                labels["model_name"]
                for name, rs in by_name.items()
                if not name.endswith("_bucket")
                for labels, _ in rs
                if "model_name" in labels
            }
        )
    )


def _sleep_state(rows: Iterable[tuple[Mapping[str, str], float]]) -> str | None:
    """The server's sleep state from vLLM's per-engine series (see the module docstring);
    None when no engine has an ``awake`` series."""
    engines: dict[tuple[tuple[str, str], ...], dict[str, float]] = defaultdict(dict)
    for labels, value in rows:
        state = labels.get("sleep_state")
        if state is not None:
            engine = tuple(sorted((k, v) for k, v in labels.items() if k != "sleep_state"))
            engines[engine].setdefault(state, value)
    deepest: str | None = None
    for states in engines.values():
        awake = states.get("awake")
        if awake is None:
            continue
        if awake > 0:
            state = "awake"
        elif states.get("discard_all", 0.0) > 0:
            state = "discard_all"
        elif states.get("weights_offloaded", 0.0) > 0:
            state = "weights_offloaded"
        else:
            state = "paused"
        if deepest is None or SLEEP_STATES.index(state) > SLEEP_STATES.index(deepest):
            deepest = state
    return deepest


def _same(
    rows: list[tuple[Mapping[str, str], float]],
) -> list[tuple[Mapping[str, str], float]]:
    return rows


def _histogram_rows(
    by_name: Mapping[str, list[tuple[Mapping[str, str], float]]],
    family: str,
    dedupe: Callable[
        [list[tuple[Mapping[str, str], float]]], list[tuple[Mapping[str, str], float]]
    ],
) -> dict[str, list[tuple[Mapping[str, str], float]]]:
    return {family + s: dedupe(by_name.get(family + s, [])) for s in ("_bucket", "_count", "_sum")}


# -- DCGM ----------------------------------------------------------------------------------


def _label(labels: Mapping[str, str], attr: str) -> str | None:
    for key in N.GPU_LABELS[attr]:
        value = labels.get(key)
        if value:
            return value
    return None


def gpus_from_samples(
    source: str, at_s: float, samples: Iterable[Sample], declared: Mapping[str, str] | None = None
) -> list[GpuScrape]:
    """One GpuScrape per GPU (per MIG instance), ordered by GPU index."""
    by_name, _ = _group(samples, _SAMPLE_NAMES["dcgm"], declared or {}, "dcgm")
    field_of = {n: f for f, names in N.GPU_NAMES.items() for n in names}
    values: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)
    ident: dict[tuple[str, str], Mapping[str, str]] = {}
    for field, names in N.GPU_NAMES.items():
        name = next((n for n in names if n in by_name), None)
        if name is None:
            continue
        for labels, value in by_name[name]:
            gpu = _label(labels, "gpu") or _label(labels, "uuid") or ""
            instance = labels.get(N.GPU_INSTANCE_LABEL)
            key = (f"{gpu}/{instance}" if instance else gpu, _label(labels, "uuid") or "")
            ident.setdefault(key, labels)
            values[key].setdefault(field_of[name], value * N.GPU_SCALE[field])
    out = []
    for key, v in values.items():
        labels = ident[key]
        total = v.get("fb_total_bytes")
        parts = [v.get(k) for k in ("fb_used_bytes", "fb_free_bytes", "fb_reserved_bytes")]
        if total is None and all(p is not None for p in parts):
            total = math.fsum(p for p in parts if p is not None)
        out.append(
            GpuScrape(
                source=source,
                at_s=at_s,
                gpu=key[0],
                uuid=key[1] or None,
                host=_label(labels, "host"),
                pod=_label(labels, "pod"),
                namespace=_label(labels, "namespace"),
                model_name=_label(labels, "model_name"),
                fb_used_bytes=v.get("fb_used_bytes"),
                fb_free_bytes=v.get("fb_free_bytes"),
                fb_total_bytes=total,
                gpu_util=v.get("gpu_util"),
                pcie_tx_bytes_s=v.get("pcie_tx_bytes_s"),
                pcie_rx_bytes_s=v.get("pcie_rx_bytes_s"),
            )
        )
    return sorted(out, key=lambda g: _gpu_order(g.gpu))


def _gpu_order(gpu: str) -> tuple[int, str]:
    head = gpu.split("/", 1)[0]
    return (int(head), gpu) if head.isdigit() else (1 << 30, gpu)
