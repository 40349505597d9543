"""Rates and quantiles of one backend over a sliding window of its scrapes (pure).

Job: ``derive(history, window_s)`` looks at the scrapes whose ``at_s`` lies within
``window_s`` of the newest (``history`` oldest first) and turns their cumulative counters and
histograms into a ``Derived``. Every figure is None when the window cannot say: fewer than two
scrapes carrying the field, no time between them, or no observations.

``Window`` gives the same figures for the collector at a cost that does not grow with the
window: see its docstring (but for ``Derived.speed``, ``ext_proc.signals.slo``, which walks
the window's scrapes once per new scrape).

Formulas (the ones Prometheus uses, so ICE and a dashboard agree):
- Counter increase over the window, walking consecutive scrapes a → b: ``b − a`` when
  ``b ≥ a``, else ``b`` (the counter was reset — the server restarted — and everything it
  counted since then is new). ``rate = increase / (t_newest − t_oldest)`` over the scrapes
  that carry the counter.
- ``prefix_cache_hit_ratio = increase(hits) / increase(queries)`` (tokens), None when no
  token was queried in the window; clamped to [0, 1].
- ``admission_rejections_per_s``: the rate of vLLM's ``vllm:admission_rejections_total``
  (requests its own valve answered 503) as above; ``admission_rejected_recently``:
  ``increase`` of that counter between the newest two scrapes of the window that carry it
  is > 0 (a reset whose new value is > 0 counts, by the rule above); None with fewer than
  two such scrapes.
- Histogram delta: the newest minus the oldest, bucket by bucket, with the same reset rule on
  the observation count (a scrape whose count fell, or whose bucket bounds changed, starts a
  new segment that counts from zero). Bounds that changed inside the window: only the
  segments with the newest bounds count.
- ``histogram_quantile(q, h)``, Prometheus's linear interpolation: ``N`` = count of the +Inf
  bucket, ``rank = q·N``; ``b`` = the first bucket whose cumulative count ``c_b ≥ rank``.
  If ``b`` is the +Inf bucket the answer is the highest finite bound; else, with
  ``lower = upper_{b−1}`` (0 for the first bucket) and ``c_below = c_{b−1}`` (0 for the
  first), ``q̂ = lower + (upper_b − lower)·(rank − c_below)/(c_b − c_below)``. A first
  bucket whose bound is ≤ 0 answers its bound.
- ``exceedance(h, t)``: the fraction of the window's observations above ``t``, with the
  count at or below ``t`` interpolated linearly inside the bucket holding ``t`` (same lower
  bound rule); every observation in the +Inf bucket counts as above a ``t`` past the highest
  finite bound.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from ext_proc.signals.scrapes import Derived, EngineScrape, Histogram
from ext_proc.signals.slo import speed

__all__ = [
    "Window",
    "derive",
    "exceedance",
    "histogram_delta",
    "histogram_quantile",
    "increase",
]


def increase(values: Sequence[float]) -> float:
    """Increase of a cumulative counter over consecutive readings, resets counted (see the
    module docstring)."""
    total = 0.0
    for a, b in itertools.pairwise(values):
        total += b - a if b >= a else b
    return total


def _counter(
    window: Sequence[EngineScrape], get: Callable[[EngineScrape], float | None]
) -> tuple[float, float] | None:
    """(increase, seconds) of one counter over the window, or None."""
    points = [(s.at_s, v) for s in window if (v := get(s)) is not None]
    if len(points) < 2:
        return None
    span = points[-1][0] - points[0][0]
    if span <= 0:
        return None
    return increase([v for _, v in points]), span


def _rate(
    window: Sequence[EngineScrape], get: Callable[[EngineScrape], float | None]
) -> float | None:
    found = _counter(window, get)
    return found[0] / found[1] if found else None


def _add(acc: list[float], h: Histogram, sign: float) -> None:
    for i, c in enumerate(h.counts):
        acc[i] += sign * c


def histogram_delta(hs: Sequence[Histogram]) -> Histogram | None:
    """The observations between the first and the last of ``hs`` (oldest first), resets and
    bound changes handled; None for fewer than two histograms."""
    if len(hs) < 2:
        return None
    bounds = hs[-1].bounds
    start = len(hs) - 1
    while start > 0 and hs[start - 1].bounds == bounds:
        start -= 1
    run = hs[start:]
    counts = [0.0] * len(bounds)
    total_sum = 0.0
    seg_first = run[0]
    if start > 0:  # the bounds changed just before the run: it counts from zero
        _add(counts, seg_first, 1.0)
        total_sum += seg_first.sum
    for a, b in itertools.pairwise(run):
        if b.count < a.count:  # reset: close the segment, the new one counts from zero
            _add(counts, a, 1.0)
            _add(counts, seg_first, -1.0)
            _add(counts, b, 1.0)
            total_sum += a.sum - seg_first.sum + b.sum
            seg_first = b
    last = run[-1]
    _add(counts, last, 1.0)
    _add(counts, seg_first, -1.0)
    total_sum += last.sum - seg_first.sum
    cumulative: list[float] = []
    running = 0.0
    for c in counts:  # keep cumulative counts non-negative and non-decreasing
        running = max(running, c)
        cumulative.append(running)
    return Histogram(
        bounds=bounds,
        counts=tuple(cumulative),
        count=cumulative[-1] if cumulative else 0.0,
        sum=total_sum,
    )


def _usable(h: Histogram) -> bool:
    return len(h.bounds) >= 2 and len(h.counts) == len(h.bounds) and h.bounds[-1] == math.inf


def histogram_quantile(q: float, h: Histogram) -> float | None:
    """Prometheus's ``histogram_quantile`` (see the module docstring); None without
    observations or with fewer than two buckets."""
    if not _usable(h) or not 0.0 <= q <= 1.0:
        return None
    n = h.counts[-1]
    if n <= 0:
        return None
    rank = q * n
    b = next((i for i, c in enumerate(h.counts[:-1]) if c >= rank), len(h.counts) - 1)
    if b == len(h.counts) - 1:
        return h.bounds[-2]
    if b == 0 and h.bounds[0] <= 0:
        return h.bounds[0]
    lower = h.bounds[b - 1] if b > 0 else 0.0
    below = h.counts[b - 1] if b > 0 else 0.0
    width = h.counts[b] - below
    if width <= 0:
        return lower
    return lower + (h.bounds[b] - lower) * (rank - below) / width


def exceedance(delta: Histogram, threshold_s: float) -> float | None:
    """Fraction of the histogram's observations above ``threshold_s`` (see the module
    docstring); None without observations."""
    if not _usable(delta):
        return None
    n = delta.counts[-1]
    if n <= 0:
        return None
    finite = len(delta.bounds) - 1
    if threshold_s >= delta.bounds[finite - 1]:
        at_or_below = delta.counts[finite - 1]
    else:
        i = next(i for i in range(finite) if delta.bounds[i] >= threshold_s)
        lower = delta.bounds[i - 1] if i > 0 else min(0.0, delta.bounds[0])
        below = delta.counts[i - 1] if i > 0 else 0.0
        upper = delta.bounds[i]
        if upper <= lower:
            at_or_below = delta.counts[i]
        else:
            frac = (max(threshold_s, lower) - lower) / (upper - lower)
            at_or_below = below + (delta.counts[i] - below) * frac
    return min(1.0, max(0.0, (n - at_or_below) / n))


def derive(history: Sequence[EngineScrape], window_s: float) -> Derived:
    """Rates and quantiles over the scrapes within ``window_s`` of the newest one (history
    oldest first). ``Derived.window_s`` is the span those scrapes actually cover."""
    if not history:
        return Derived(window_s=0.0)
    newest = history[-1].at_s
    window = [s for s in history if newest - window_s <= s.at_s <= newest]
    if len(window) < 2:
        return Derived(window_s=0.0)
    hits = _counter(window, lambda s: s.prefix_cache_hits_tokens)
    queries = _counter(window, lambda s: s.prefix_cache_queries_tokens)
    ratio: float | None = None
    if hits is not None and queries is not None and queries[0] > 0:
        ratio = min(1.0, max(0.0, hits[0] / queries[0]))
    ttft = histogram_delta([s.ttft_s for s in window if s.ttft_s is not None])
    queue = histogram_delta([s.queue_time_s for s in window if s.queue_time_s is not None])
    rejections = [v for s in window if (v := s.admission_rejections) is not None]
    return Derived(
        window_s=window[-1].at_s - window[0].at_s,
        prefix_cache_hit_ratio=ratio,
        preemptions_per_s=_rate(window, lambda s: s.preemptions),
        prompt_tokens_per_s=_rate(window, lambda s: s.prompt_tokens),
        generation_tokens_per_s=_rate(window, lambda s: s.generation_tokens),
        completions_per_s=_rate(window, lambda s: s.request_success),
        ttft_p50_s=histogram_quantile(0.5, ttft) if ttft else None,
        ttft_p95_s=histogram_quantile(0.95, ttft) if ttft else None,
        queue_time_p95_s=histogram_quantile(0.95, queue) if queue else None,
        ttft_delta=ttft,
        admission_rejections_per_s=_rate(window, lambda s: s.admission_rejections),
        admission_rejected_recently=(
            increase(rejections[-2:]) > 0 if len(rejections) >= 2 else None
        ),
        speed=speed(window, ratio),
    )


# -- incremental: what the collector keeps per backend -------------------------------------

_COUNTERS: Final = (
    "prefix_cache_hits_tokens",
    "prefix_cache_queries_tokens",
    "preemptions",
    "prompt_tokens",
    "generation_tokens",
    "request_success",
    "admission_rejections",
)
_HITS, _QUERIES, _PREEMPTIONS, _PROMPT, _GENERATION, _SUCCESS, _REJECTIONS = range(len(_COUNTERS))


@dataclass(frozen=True, slots=True)
class _Hist:
    """One scrape's histogram and the running totals of its bounds epoch."""

    raw: Histogram
    epoch: int  # changes whenever the bounds differ from the previous histogram's
    counts: tuple[float, ...]  # reset-adjusted running total per bucket, within the epoch
    sum: float


@dataclass(frozen=True, slots=True)
class _Entry:
    scrape: EngineScrape
    counters: tuple[float | None, ...]  # reset-adjusted running totals; None: not reported
    ttft: _Hist | None
    queue: _Hist | None


class _HistTotals:
    """Running totals of one histogram field across appends (kept when entries leave)."""

    __slots__ = ("counts", "epoch", "last", "sum")

    def __init__(self) -> None:
        self.last: Histogram | None = None
        self.epoch = 0
        self.counts: list[float] = []
        self.sum = 0.0

    def add(self, h: Histogram) -> _Hist:
        last = self.last
        if last is None or last.bounds != h.bounds:  # a new epoch counts from zero
            self.epoch += 1
            self.counts = list(h.counts)
            self.sum = h.sum
        elif h.count < last.count:  # reset: the new segment counts from zero
            self.counts = [a + c for a, c in zip(self.counts, h.counts, strict=False)]
            self.sum += h.sum
        else:
            self.counts = [
                a + c - p for a, c, p in zip(self.counts, h.counts, last.counts, strict=False)
            ]
            self.sum += h.sum - last.sum
        self.last = h
        return _Hist(h, self.epoch, tuple(self.counts), self.sum)


class Window:
    """A backend's scrapes of the last ``window_s`` seconds and their ``Derived``, kept
    incrementally: ``derived()`` equals ``derive(scrapes, window_s)`` (to float rounding of
    non-integer sums) at a cost independent of how many scrapes the window holds.

    How: ``append`` stores with each scrape the running, reset-adjusted total of every counter
    since the source was first seen (``total += b − a``, or ``+= b`` after a reset), so the
    increase over the window is the newest total minus the oldest — the same sum ``increase``
    walks. Histograms likewise, bucket by bucket, within an epoch of equal bounds (a bounds
    change starts a new epoch from zero; only the newest epoch's observations count, as in
    ``histogram_delta``). Scrapes must be appended in ``at_s`` order."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._entries: deque[_Entry] = deque()
        self._last_values: list[float | None] = [None] * len(_COUNTERS)
        self._totals = [0.0] * len(_COUNTERS)
        self._ttft = _HistTotals()
        self._queue = _HistTotals()
        self._derived: Derived | None = None
        self._fresh = False  # _derived is up to date

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def newest(self) -> EngineScrape | None:
        return self._entries[-1].scrape if self._entries else None

    @property
    def scrapes(self) -> list[EngineScrape]:
        """The scrapes within ``window_s`` of the newest, oldest first."""
        return [e.scrape for e in self._entries]

    def append(self, scrape: EngineScrape) -> None:
        """Add the newest scrape; scrapes older than ``window_s`` before it leave."""
        counters: list[float | None] = []
        for i, name in enumerate(_COUNTERS):
            value: float | None = getattr(scrape, name)
            last = self._last_values[i]
            if value is None:
                counters.append(None)
                continue
            if last is not None:
                self._totals[i] += value - last if value >= last else value
            self._last_values[i] = value
            counters.append(self._totals[i])
        ttft = self._ttft.add(scrape.ttft_s) if scrape.ttft_s is not None else None
        queue = self._queue.add(scrape.queue_time_s) if scrape.queue_time_s is not None else None
        entries = self._entries
        entries.append(_Entry(scrape, tuple(counters), ttft, queue))
        oldest_kept = scrape.at_s - self.window_s  # derive's rule, to the last float bit
        while entries[0].scrape.at_s < oldest_kept:
            entries.popleft()
        self._fresh = False

    def derived(self) -> Derived | None:
        """``derive(self.scrapes, window_s)``; None with fewer than two scrapes."""
        if self._fresh:
            return self._derived
        entries = self._entries
        result: Derived | None = None
        if len(entries) >= 2:
            hits = self._counter(_HITS)
            queries = self._counter(_QUERIES)
            ratio: float | None = None
            if hits is not None and queries is not None and queries[0] > 0:
                ratio = min(1.0, max(0.0, hits[0] / queries[0]))
            ttft = self._histogram("ttft")
            queue = self._histogram("queue")
            result = Derived(
                window_s=entries[-1].scrape.at_s - entries[0].scrape.at_s,
                prefix_cache_hit_ratio=ratio,
                preemptions_per_s=self._rate(_PREEMPTIONS),
                prompt_tokens_per_s=self._rate(_PROMPT),
                generation_tokens_per_s=self._rate(_GENERATION),
                completions_per_s=self._rate(_SUCCESS),
                ttft_p50_s=histogram_quantile(0.5, ttft) if ttft else None,
                ttft_p95_s=histogram_quantile(0.95, ttft) if ttft else None,
                queue_time_p95_s=histogram_quantile(0.95, queue) if queue else None,
                ttft_delta=ttft,
                admission_rejections_per_s=self._rate(_REJECTIONS),
                admission_rejected_recently=self._rose_last(_REJECTIONS),
                # O(scrapes in the window), once per scrape: docs/slo.md
                speed=speed(self.scrapes, ratio),
            )
        self._derived, self._fresh = result, True
        return result

    def _counter(self, i: int) -> tuple[float, float] | None:
        """(increase, seconds) of counter ``i`` over the window, or None (see ``_counter``)."""
        entries = self._entries
        first: _Entry | None = entries[0]
        last: _Entry | None = entries[-1]
        if first is not None and first.counters[i] is None:  # rare: scan for carriers
            first = next((e for e in entries if e.counters[i] is not None), None)
        if last is not None and last.counters[i] is None:
            last = next((e for e in reversed(entries) if e.counters[i] is not None), None)
        if first is None or last is None or first is last:
            return None
        span = last.scrape.at_s - first.scrape.at_s
        if span <= 0:
            return None
        return (last.counters[i] or 0.0) - (first.counters[i] or 0.0), span

    def _rate(self, i: int) -> float | None:
        found = self._counter(i)
        return found[0] / found[1] if found else None

    def _rose_last(self, i: int) -> bool | None:
        """Whether counter ``i`` rose between the newest two scrapes that carry it (None:
        fewer than two): their running totals differ by exactly ``increase`` of the two."""
        if self._last_values[i] is None:  # never reported: no scan
            return None
        newer: float | None = None
        for entry in reversed(self._entries):
            total = entry.counters[i]
            if total is None:
                continue
            if newer is not None:
                return newer > total
            newer = total
        return None

    def _histogram(self, field: str) -> Histogram | None:
        """``histogram_delta`` of the window's histograms of one field (``ttft``/``queue``)."""
        entries = self._entries
        first: _Hist | None = getattr(entries[0], field)
        last: _Hist | None = getattr(entries[-1], field)
        if first is None:  # rare: scan for carriers
            first = next((h for e in entries if (h := getattr(e, field)) is not None), None)
        if last is None:
            last = next(
                (h for e in reversed(entries) if (h := getattr(e, field)) is not None), None
            )
        if first is None or last is None or first is last:
            return None  # fewer than two histograms
        if first.epoch == last.epoch:  # epochs are contiguous: one run of equal bounds
            counts = [a - b for a, b in zip(last.counts, first.counts, strict=False)]
            total_sum = last.sum - first.sum
        else:  # the bounds changed inside the window: the newest epoch counts from zero
            counts, total_sum = list(last.counts), last.sum
        # keep cumulative counts non-negative and non-decreasing
        cumulative = list(itertools.accumulate(counts, max, initial=0.0))[1:]
        return Histogram(
            bounds=last.raw.bounds,
            counts=tuple(cumulative),
            count=cumulative[-1] if cumulative else 0.0,
            sum=total_sum,
        )
