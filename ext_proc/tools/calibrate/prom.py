"""``--prometheus URL``: a pool's history from a Prometheus server's range queries.

Job: build the range queries (``/api/v1/query_range``) for the pool's signals with the metric
names ICE knows (``ext_proc.signals.names``), send them in chunks Prometheus accepts, and turn
the matrix answers into one ``history.Track`` per backend (the ``group_by`` label's value,
``instance`` by default) on the grid start, start + step, … ≤ end.

Queries, for field names n1|n2… (preference order; per backend the first that has data),
the pool's matchers M and the rank matchers R (``tp_rank=~"0|"`` … for each label in
``names.REPLICA_RANK_LABELS``: ranks of one replica report the same scheduler state):
    kv_cache_usage        avg by (G, __name__) ({__name__=~"n1|n2",R,M})
    num_requests_waiting  sum by (G, __name__) (…)
    preemptions           sum by (G, __name__) (…)           cumulative, increases in history
    ttft_s                sum by (G, le, __name__) ({__name__=~"n_bucket",R,M})
    PCIe (``gpu_matchers`` given)   avg by (__name__) ({__name__=~"DCGM_FI_PROF_PCIE_TX_BYTES|
                          DCGM_FI_PROF_PCIE_RX_BYTES",GM}); utilisation = max(tx, rx) / bandwidth
                          (the mean over GPUs of each direction: close to the score's
                          mean of per-GPU maxima when the GPUs are alike)
Each query covers at most ``MAX_POINTS`` steps per request (Prometheus refuses more than
11,000 points per series). Invariant: the only exception is ``InputError``.
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.request
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlencode

import numpy as np

from ext_proc.signals import names as N
from ext_proc.tools.calibrate.history import (
    Array,
    History,
    InputError,
    Track,
    build_history,
    over_target,
)

__all__ = ["MAX_POINTS", "Get", "history_from_prometheus", "matrix", "range_queries"]

MAX_POINTS = 10_000
Get = Callable[[str, float], bytes]  # (url, timeout_s) → body
_AGG = {"kv_cache_usage": "avg", "num_requests_waiting": "sum", "preemptions": "sum"}
_PCIE = ("DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_RX_BYTES")


def _selector(names: list[str], matchers: str) -> str:
    rank = ",".join(f'{label}=~"0|"' for label in sorted(N.REPLICA_RANK_LABELS))
    extra = "," + matchers if matchers else ""
    return '{__name__=~"' + "|".join(names) + '",' + rank + extra + "}"


def range_queries(kind: str, matchers: str = "", group_by: str = "instance") -> dict[str, str]:
    """Field → PromQL range query for ``kind`` ("vllm" or "sglang")."""
    if kind not in N.ENGINE_NAMES:
        raise InputError(f"unknown kind {kind!r}")
    table = N.ENGINE_NAMES[kind]
    out = {
        field: f"{agg} by ({group_by}, __name__) ({_selector(list(table[field]), matchers)})"
        for field, agg in _AGG.items()
    }
    buckets = [name + "_bucket" for name in table["ttft_s"]]
    out["ttft_s"] = f"sum by ({group_by}, le, __name__) ({_selector(buckets, matchers)})"
    return out


def pcie_query(gpu_matchers: str) -> str:
    """The PCIe query (``gpu_matchers``: the DCGM exporter's series, e.g. ``job="dcgm"``)."""
    extra = "," + gpu_matchers if gpu_matchers else ""
    return 'avg by (__name__) ({__name__=~"' + "|".join(_PCIE) + '"' + extra + "})"


def matrix(
    body: bytes | str | Mapping[str, Any],
) -> list[tuple[dict[str, str], list[tuple[float, float]]]]:
    """The series of one range-query answer: (labels with ``__name__``, [(t, value)])."""
    try:
        doc = body if isinstance(body, Mapping) else json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise InputError(f"Prometheus answer is not JSON: {e!s:.100}") from None
    if not isinstance(doc, Mapping) or doc.get("status") != "success":
        err = doc.get("error", "") if isinstance(doc, Mapping) else ""
        raise InputError(f"Prometheus query failed: {str(err)[:200]}")
    data = doc.get("data")
    if not isinstance(data, Mapping) or data.get("resultType") != "matrix":
        raise InputError("Prometheus answer is not a range (matrix) result")
    out: list[tuple[dict[str, str], list[tuple[float, float]]]] = []
    for item in data.get("result") or []:
        try:
            labels = {str(k): str(v) for k, v in item["metric"].items()}
            values = [(float(t), float(v)) for t, v in item.get("values", [])]
        except (KeyError, TypeError, ValueError, AttributeError):
            raise InputError("malformed series in a Prometheus range answer") from None
        out.append((labels, values))
    return out


def _urlopen(url: str, timeout_s: float) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        data: bytes = resp.read()
        return data


def _fetch(
    get: Get, base: str, query: str, start: float, end: float, step: float, timeout_s: float
) -> list[tuple[dict[str, str], list[tuple[float, float]]]]:
    series: dict[tuple[tuple[str, str], ...], list[tuple[float, float]]] = defaultdict(list)
    lo = start
    while lo <= end + 1e-9:
        hi = min(end, lo + step * (MAX_POINTS - 1))
        params = urlencode({"query": query, "start": repr(lo), "end": repr(hi), "step": repr(step)})
        url = f"{base.rstrip('/')}/api/v1/query_range?{params}"
        try:
            body = get(url, timeout_s)
        except (OSError, urllib.error.URLError) as e:
            raise InputError(f"Prometheus {base}: {e!s:.200}") from None
        for labels, values in matrix(body):
            series[tuple(sorted(labels.items()))] += values
        lo = hi + step
    return [(dict(k), v) for k, v in series.items()]


def _on_grid(values: list[tuple[float, float]], start: float, step: float, n: int) -> Array:
    out = np.full(n, np.nan)
    for t, v in values:
        i = round((t - start) / step)
        if 0 <= i < n and math.isfinite(v):
            out[i] = v
    return out


def _first_name(
    rows: list[tuple[dict[str, str], Array]], names: tuple[str, ...]
) -> list[tuple[dict[str, str], Array]]:
    """Keep the rows of the first preferred name that has any data."""
    for name in names:
        kept = [(lab, a) for lab, a in rows if lab.get("__name__") == name]
        if any(bool(np.any(~np.isnan(a))) for _, a in kept):
            return kept
    return []


def history_from_prometheus(
    base_url: str,
    *,
    kind: str,
    start: float,
    end: float,
    step: float,
    ttft_target_s: float,
    matchers: str = "",
    group_by: str = "instance",
    gpu_matchers: str | None = None,
    pcie_bandwidth_bytes_s: float = 32e9,
    timeout_s: float = 30.0,
    get: Get = _urlopen,
) -> History:
    """The pool's History from ``base_url`` over [start, end] every ``step`` seconds."""
    if not step > 0 or not end >= start:
        raise InputError("the range needs step > 0 and end ≥ start")
    n = math.floor((end - start) / step + 1e-9) + 1
    grid = start + step * np.arange(n, dtype=np.float64)
    table = N.ENGINE_NAMES.get(kind, {})
    queries = range_queries(kind, matchers, group_by)
    per: dict[str, dict[str, Array]] = defaultdict(dict)  # backend → field → values
    for field in _AGG:
        rows = [
            (lab, _on_grid(v, start, step, n))
            for lab, v in _fetch(get, base_url, queries[field], start, end, step, timeout_s)
        ]
        by_backend: dict[str, list[tuple[dict[str, str], Array]]] = defaultdict(list)
        for lab, a in rows:
            if lab.get(group_by):
                by_backend[lab[group_by]].append((lab, a))
        for backend, brows in by_backend.items():
            kept = _first_name(brows, table[field])
            if kept:
                per[backend][field] = kept[0][1]
    buckets: dict[str, dict[str, dict[float, Array]]] = defaultdict(lambda: defaultdict(dict))
    for lab, v in _fetch(get, base_url, queries["ttft_s"], start, end, step, timeout_s):
        key, le, name = lab.get(group_by), lab.get("le"), lab.get("__name__", "")
        if key and le is not None:
            try:
                bound = math.inf if le in ("+Inf", "Inf", "inf") else float(le)
            except ValueError:
                continue
            buckets[key][name][bound] = _on_grid(v, start, step, n)
    tracks: dict[str, Track] = {}
    for backend in sorted(set(per) | set(buckets)):
        f = per.get(backend, {})
        count, over = np.full(n, np.nan), np.full(n, np.nan)
        fams = buckets.get(backend, {})
        for name in (nm + "_bucket" for nm in table["ttft_s"]):
            fam = fams.get(name)
            if not fam or math.inf not in fam:
                continue
            bounds = sorted(fam)
            stack = np.vstack([fam[b] for b in bounds])
            for i in range(n):
                col = stack[:, i]
                if not np.any(np.isnan(col)):
                    count[i] = col[-1]
                    over[i] = over_target(bounds, list(np.maximum.accumulate(col)), ttft_target_s)
            break
        nan = np.full(n, np.nan)
        tracks[backend] = Track(
            kv=f.get("kv_cache_usage", nan),
            waiting=f.get("num_requests_waiting", nan),
            preemptions=f.get("preemptions", nan),
            ttft_count=count,
            ttft_over=over,
        )
    if not tracks:
        raise InputError(f"Prometheus {base_url}: no {kind} series for the pool in that range")
    pcie = None
    if gpu_matchers is not None:
        dirs = {
            lab.get("__name__", ""): _on_grid(v, start, step, n)
            for lab, v in _fetch(
                get, base_url, pcie_query(gpu_matchers), start, end, step, timeout_s
            )
        }
        if dirs:
            both = np.vstack(list(dirs.values()))
            peak = np.where(
                np.all(np.isnan(both), axis=0),
                np.nan,
                np.nanmax(np.nan_to_num(both, nan=-1.0), axis=0),
            )
            pcie = np.where(np.isnan(peak), np.nan, np.minimum(1.0, peak / pcie_bandwidth_bytes_s))
    return build_history(grid, tracks, pcie)
