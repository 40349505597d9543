"""``--pages DIR``: a pool's history from a folder of recorded ``/metrics`` pages.

Job: find the pages, give each its time and backend, parse it with ICE's own page parser
(``ext_proc.signals.parse``: the same names and combination as a live scrape), and put the
backends on one time grid (``history.Track``). DCGM exporter pages (recognised by their
content) give the PCIe term.

Layout (docs/calibrate.md):
    DIR/<backend>/<stamp>.txt     one subfolder per backend (the folder's name is its name)
    DIR/<stamp>.txt               or flat: one backend, named "pages"
    DIR/timestamps.json           optional sidecar: {"<path relative to DIR>": unix_s, ...};
                                  a listed page takes this time, others the one in the name
Pages end in ``.txt``, ``.prom`` or ``.metrics``; ``<stamp>`` is the first number in the file
name, Unix seconds (``1718000000.txt``, ``metrics-1718000030.5.prom``).

Grid: from the first page's time to the last, every ``step_s`` (default: the median gap
between successive pages of the first backend). At grid time g a backend's values are those
of its latest page at or before g, when that page is less than 1.5 × step_s old (else
missing). Invariant: the only exception is ``InputError``.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path

import numpy as np

from ext_proc.signals.combine import SourceParseError
from ext_proc.signals.parse import detect_kind, parse_dcgm, parse_engine
from ext_proc.signals.scrapes import EngineScrape
from ext_proc.tools.calibrate.history import (
    Array,
    History,
    InputError,
    Track,
    build_history,
    over_target,
)

__all__ = ["SIDECAR", "history_from_pages", "page_times"]

SIDECAR = "timestamps.json"
_SUFFIXES = (".txt", ".prom", ".metrics")
_STAMP = re.compile(r"\d+(?:\.\d+)?")


def page_times(root: Path) -> list[tuple[str, float, Path]]:
    """(backend, unix_s, path) of every page under ``root``, by time."""
    if not root.is_dir():
        raise InputError(f"--pages {root}: not a folder")
    sidecar: dict[str, float] = {}
    side = root / SIDECAR
    if side.is_file():
        try:
            raw = json.loads(side.read_text(encoding="utf-8"))
            sidecar = {str(k): float(v) for k, v in raw.items()}
        except (ValueError, TypeError, AttributeError) as e:
            raise InputError(f"{side}: not a map of page → unix seconds ({e!s:.100})") from None
    out: list[tuple[str, float, Path]] = []
    for path in sorted(root.rglob("*")):
        if not path.is_file() or path.suffix not in _SUFFIXES:
            continue
        rel = path.relative_to(root)
        if len(rel.parts) > 2:
            continue
        backend = rel.parts[0] if len(rel.parts) == 2 else "pages"
        if rel.as_posix() in sidecar:
            at = sidecar[rel.as_posix()]
        else:
            m = _STAMP.search(path.stem if path.suffix else path.name)
            if m is None:
                raise InputError(f"{path}: no time in its name and none in {SIDECAR}")
            at = float(m.group(0))
        out.append((backend, at, path))
    if not out:
        raise InputError(f"--pages {root}: no pages (*.txt, *.prom, *.metrics)")
    return sorted(out, key=lambda r: (r[1], r[0]))


def _grid(times: dict[str, list[float]], step_s: float | None) -> tuple[Array, float]:
    first = sorted(times)[0]
    if step_s is None:
        own = np.diff(np.array(sorted(times[first])))
        own = own[own > 0]
        if own.shape[0] == 0:
            raise InputError("one page per backend: give --step")
        step_s = float(np.median(own))
    if not step_s > 0:
        raise InputError("--step must be > 0")
    lo = min(min(v) for v in times.values())
    hi = max(max(v) for v in times.values())
    n = int(np.floor((hi - lo) / step_s + 1e-9)) + 1
    return lo + step_s * np.arange(n, dtype=np.float64), step_s


def _at(grid: Array, times: list[float], step_s: float) -> list[int | None]:
    """For each grid time, the index of the latest page at or before it (≤ 1.5 steps old)."""
    arr = np.array(times)
    k = np.searchsorted(arr, grid + 1e-9, side="right") - 1
    return [
        int(i) if i >= 0 and g - arr[i] < 1.5 * step_s else None
        for i, g in zip(k, grid, strict=True)
    ]


def history_from_pages(
    root: Path,
    *,
    kind: str | None,
    ttft_target_s: float,
    step_s: float | None = None,
    pcie_bandwidth_bytes_s: float = 32e9,
) -> History:
    """The pool's History from the pages under ``root`` (``kind`` None: from the pages)."""
    engines: dict[str, list[EngineScrape]] = defaultdict(list)
    gpus: list[tuple[float, float]] = []  # (time, PCIe utilisation)
    for backend, at, path in page_times(root):
        try:
            text = path.read_text(encoding="utf-8")
            page_kind = detect_kind(text)
            if page_kind == "dcgm":
                cards = parse_dcgm(backend, text, at)
                util = [
                    max(g.pcie_tx_bytes_s or 0.0, g.pcie_rx_bytes_s or 0.0)
                    for g in cards
                    if g.pcie_tx_bytes_s is not None or g.pcie_rx_bytes_s is not None
                ]
                if util:
                    gpus.append((at, min(1.0, float(np.mean(util)) / pcie_bandwidth_bytes_s)))
                continue
            if kind is not None and page_kind != kind:
                continue
            kind = page_kind
            engines[backend].append(parse_engine(page_kind, backend, text, at))
        except (OSError, UnicodeDecodeError, SourceParseError) as e:
            raise InputError(f"{path}: {e!s:.200}") from None
    if not engines:
        raise InputError(f"--pages {root}: no {kind or 'vLLM/SGLang'} pages")
    times = {b: [s.at_s for s in v] for b, v in engines.items()}
    grid, step = _grid(times, step_s)
    n = int(grid.shape[0])
    tracks: dict[str, Track] = {}
    for backend, scrapes in engines.items():
        cols = np.full((5, n), np.nan)
        for g, i in enumerate(_at(grid, times[backend], step)):
            if i is None:
                continue
            s = scrapes[i]
            cols[0, g] = np.nan if s.kv_cache_usage is None else s.kv_cache_usage
            cols[1, g] = np.nan if s.num_requests_waiting is None else s.num_requests_waiting
            cols[2, g] = np.nan if s.preemptions is None else s.preemptions
            if s.ttft_s is not None:
                cols[3, g] = s.ttft_s.count
                cols[4, g] = over_target(s.ttft_s.bounds, s.ttft_s.counts, ttft_target_s)
        tracks[backend] = Track(*(cols[j] for j in range(5)))
    pcie = None
    if gpus:
        pcie = np.full(n, np.nan)
        gt = [t for t, _ in gpus]
        for g, i in enumerate(_at(grid, gt, step)):
            if i is not None:
                pcie[g] = gpus[i][1]
    return build_history(grid, tracks, pcie)
