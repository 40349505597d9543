"""Parse one ``/metrics`` page of vLLM, SGLang or the DCGM exporter into normalised records.

Job: text → ``EngineScrape`` (``parse_engine``) or ``list[GpuScrape]`` (``parse_dcgm``), pure.
``names.py`` says which metric carries which field; this module only reads and combines.

How, and why so (a collector parses 64 pages of ~50 KB every 200 ms; a vLLM page is mostly
histogram buckets ICE never reads):
1. Pre-filter and read. One regex pass over the page (its literal prefix, e.g. "\nvllm:",
   lets the regex engine skip the rest) picks the sample lines of the wanted families and
   splits each into name, label text and value; label texts are memoised (a backend's label
   sets are the same every scrape). A second pass picks their ``# TYPE`` lines.
2. Only when a kept line is not of the plain form ``name{k="v",...} value [timestamp]``
   (escapes aside), or a ``# TYPE`` line is odd, or ``reference=True``: the kept lines, with
   their ``# HELP``/``# TYPE`` lines, go to ``prometheus_client.parser.
   text_string_to_metric_families``, which is the judge of what is valid. Both ways give the
   same records (tests compare them on every golden page and on thousands of mutated ones).
3. Combine the samples (``engine_from_samples``, also used for Prometheus API answers):
   several engines / data-parallel ranks / ``model_name`` series of one server → usage
   averaged (block-weighted when every engine's ``cache_config_info`` is known), counts and
   counters summed, histograms summed bucket by bucket over the bounds all series share.
   Series that differ only by a rank label of one replica (``tp_rank``, ...) count once.

Invariants:
- The only exception is ``SourceParseError``: empty page, a page not ending in a newline
  (the exposition format ends every line with one; a cut page does not), a kept line that
  prometheus_client rejects, or a page with no line of the kind's metrics at all (HTML, JSON,
  another kind). Lines of other families are not looked at, so not validated.
- NaN and ±Inf samples are ignored. A family whose ``# TYPE`` contradicts what ICE expects is
  ignored (the next name in preference may serve). A histogram series without its ``+Inf``
  bucket makes the histogram None. ``None`` always means "the page did not say".
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import lru_cache
from typing import Any, Final

from prometheus_client.parser import text_string_to_metric_families

from ext_proc.signals import names as N
from ext_proc.signals.model import EngineScrape, GpuScrape, Histogram

__all__ = [
    "Sample",
    "SourceParseError",
    "detect_kind",
    "engine_from_samples",
    "gpus_from_samples",
    "parse_dcgm",
    "parse_engine",
    "read_samples",
]

Sample = tuple[str, Mapping[str, str], float]  # sample name, labels, value


class SourceParseError(ValueError):
    """The text is not a usable exposition page of the expected kind."""


# -- step 1: the pre-filter ----------------------------------------------------------------


def _alternation(names: Iterable[str], prefix: str) -> str:
    """A regex matching exactly the names (less their common prefix), as a trie: the regex
    engine tries alternatives one by one, and a trie makes each line fail after a character
    or two instead of after trying every name."""
    trie: dict[str, Any] = {}
    for name in names:
        node = trie
        for ch in name[len(prefix) :]:
            node = node.setdefault(ch, {})
        node[""] = {}
    return _trie_regex(trie)


def _trie_regex(node: dict[str, Any]) -> str:
    branches = [re.escape(ch) + _trie_regex(child) for ch, child in sorted(node.items()) if ch]
    optional = "" in node
    if not branches:
        return ""
    body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
    if optional:  # a name ends here, a longer one goes on
        return f"(?:{body})?"
    return body


def _type_names(kind: str) -> dict[str, str]:
    """``# TYPE`` name → source name in names.py (a counter may be declared with or without
    ``_total``)."""
    out: dict[str, str] = {}
    if kind == "dcgm":
        return {n: n for names in N.GPU_NAMES.values() for n in names}
    for names in N.ENGINE_NAMES[kind].values():
        for name in names:
            out[name] = name
            if name.endswith("_total"):
                out[name[: -len("_total")]] = name
    return out


_VALUE = r"[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?|[-+]?(?:Inf|inf|NaN|nan)"
# label text up to the first "}": a "}" inside a label value sends the page to prometheus_client
_LABELS = r"[^}\n]*"


class _Filter:
    """Compiled regexes of one kind. Every pattern starts with a literal ("\\n" + prefix),
    which lets the regex engine skip through the page at memchr speed."""

    def __init__(self, kind: str) -> None:
        prefix = N.KIND_PREFIX[kind]
        self.family_of = N.sample_names(kind)
        self.type_names = _type_names(kind)
        samples = _alternation(self.family_of, prefix)
        types = _alternation(self.type_names, prefix)
        p = re.escape(prefix)
        # a wanted sample line: (name, labels, value, "") when it has the plain form
        # ``name{k="v",...} value [timestamp]``, else (name, "", "", rest of the line)
        self.sample = re.compile(
            rf"\n({p}(?:{samples}))(?:(?:\{{({_LABELS})\}})?[ \t]+({_VALUE})"
            rf"(?:[ \t]+-?[0-9]+)?[ \t]*\r?(?=\n)|(?=[{{ \t\n])([^\n]*))"
        )
        self.type = re.compile(rf"\n# TYPE ({p}(?:{types}))(?=[ \t\n])([^\n]*)")
        self.keep = re.compile(
            rf"\n((?:# (?:HELP|TYPE) {p}(?:{types})|{p}(?:{samples}))(?=[ \t{{\n])[^\n]*)"
        )


_FILTERS: Final = {kind: _Filter(kind) for kind in (*N.ENGINE_KINDS, "dcgm")}
_SAMPLE_NAMES: Final = {kind: f.family_of for kind, f in _FILTERS.items()}
_HOW_OF: Final = {
    kind: {n: N.HOW[f] for f, names in table.items() for n in names}
    for kind, table in N.ENGINE_NAMES.items()
}


def _check_page(text: str) -> None:
    if not text.strip():
        raise SourceParseError("empty page")
    if not text.endswith("\n"):
        raise SourceParseError("page does not end with a newline (truncated?)")


# -- step 2: reading kept lines ------------------------------------------------------------

_TYPE_REST: Final = re.compile(r"[ \t]+([a-z]+)[ \t]*\r?")
_METRIC_TYPES: Final = frozenset(
    {"counter", "gauge", "summary", "histogram", "gaugehistogram", "untyped", "unknown"}
    | {"info", "stateset"}
)
_PAIR = r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\\n]|\\.)*)"[ \t]*'
_PAIR_RE: Final = re.compile(_PAIR)
_PAIRS_FULL: Final = re.compile(rf"(?:{_PAIR},)*(?:{_PAIR},?)?[ \t]*")
_ESCAPE: Final = re.compile(r'\\[\\n"]')
_UNESCAPE: Final = {"\\\\": "\\", "\\n": "\n", '\\"': '"'}
_NO_LABELS: Final[Mapping[str, str]] = {}


@lru_cache(maxsize=8192)
def _labels(text: str) -> Mapping[str, str] | None:
    """A label set from its text, or None if it is not of the plain form. Shared result:
    never mutated."""
    if not text:
        return _NO_LABELS
    if _PAIRS_FULL.fullmatch(text) is None:
        return None
    out: dict[str, str] = {}
    for key, value in _PAIR_RE.findall(text):
        if key in out:
            return None
        out[key] = _ESCAPE.sub(lambda m: _UNESCAPE[m.group(0)], value) if "\\" in value else value
    return out


def _fast_samples(matches: Sequence[tuple[str, str, str, str]]) -> list[Sample] | None:
    """Samples from the sample regex's matches; None as soon as one line is not plain."""
    out: list[Sample] = []
    for name, label_text, value, _ in matches:
        labels = _labels(label_text) if value else None
        if labels is None:
            return None
        out.append((name, labels, float(value)))
    return out


def _reference_samples(kept: Sequence[str]) -> list[Sample]:
    text = "\n".join(kept) + "\n"
    try:
        return [
            (s.name, s.labels, float(s.value))
            for family in text_string_to_metric_families(text)
            for s in family.samples
        ]
    except Exception as e:  # the parser raises ValueError, IndexError, ... on garbage
        raise SourceParseError(f"not Prometheus text exposition: {e!s:.200}") from None


def _findall(pattern: re.Pattern[str], text: str) -> list[Any]:
    """``pattern.findall("\\n" + text)`` without copying the page (the patterns start with
    "\\n" and stop before the next one): the first line is matched on its own. ``text`` ends
    with a newline."""
    first_end = text.find("\n") + 1
    found: list[Any] = pattern.findall("\n" + text[:first_end])
    found += pattern.findall(text, first_end - 1)
    return found


def read_samples(
    kind: str, text: str, *, reference: bool = False
) -> tuple[list[Sample], dict[str, str]]:
    """The wanted samples of a page and the declared types of their families (source name
    → type). Raises ``SourceParseError`` for an empty, cut or malformed page, or one without
    any line of ``kind``'s metrics."""
    _check_page(text)
    f = _FILTERS[kind]
    declared: dict[str, str] = {}
    samples: list[Sample] | None = None
    for name, rest in _findall(f.type, text):
        m = _TYPE_REST.fullmatch(rest)
        if m is None or m.group(1) not in _METRIC_TYPES:  # let prometheus_client judge
            reference = True
        else:
            declared[f.type_names[name]] = m.group(1)
    if not reference:
        matches = _findall(f.sample, text)
        if not matches:
            raise SourceParseError(f"no {kind} metrics on the page")
        samples = _fast_samples(matches)
    if samples is None:
        kept = _findall(f.keep, text)
        samples = _reference_samples(kept)
        if not any(not line.startswith("#") for line in kept):
            raise SourceParseError(f"no {kind} metrics on the page")
    return samples, declared


# -- step 3: combining samples -------------------------------------------------------------


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
    table = N.ENGINE_NAMES[kind]
    by_name, ranked = _group(samples, _SAMPLE_NAMES[kind], declared or {}, kind)
    dedupe = _dedupe_ranks if ranked else _same

    def first(field: str) -> str | None:
        for name in table.get(field, ()):
            if N.HOW[field] == "histogram":
                if name + "_bucket" in by_name:
                    return name
            elif name in by_name:
                return name
        return None

    def rows(field: str) -> list[tuple[Mapping[str, str], float]]:
        name = first(field)
        return dedupe(by_name[name]) if name else []

    def total(field: str) -> float | None:
        r = rows(field)
        return math.fsum(v for _, v in r) if r else None

    # capacity: vLLM's cache_config_info labels, one per engine
    engine_blocks: dict[str, int] = {}
    blocks: int | None = None
    block_size: int | None = None
    capacity: int | None = None
    anonymous = 0
    size_tokens = 0
    for labels, _ in rows("cache_config"):
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
    cap_rows = rows("kv_capacity_tokens")
    if cap_rows:
        capacity = int(math.fsum(v for _, v in cap_rows))

    def mean(field: str, weighted: bool) -> float | None:
        r = rows(field)
        if not r:
            return None
        if len(r) == 1:
            value = r[0][1]
        elif weighted and engine_blocks and all(lb.get("engine") in engine_blocks for lb, _ in r):
            w = [engine_blocks[lb["engine"]] for lb, _ in r]
            value = math.fsum(v * wi for (_, v), wi in zip(r, w, strict=True)) / sum(w)
        else:
            value = math.fsum(v for _, v in r) / len(r)
        return min(1.0, max(0.0, value))

    reasons: dict[str, float] = defaultdict(float)
    for labels, value in rows("waiting_by_reason"):
        reasons[labels.get("reason", "")] += value

    models = sorted(
        {
            labels["model_name"]
            for name, rs in by_name.items()
            if not name.endswith("_bucket")
            for labels, _ in rs
            if "model_name" in labels
        }
    )
    ttft = first("ttft_s")
    queue = first("queue_time_s")
    return EngineScrape(
        source=source,
        kind=kind,
        at_s=at_s,
        models=tuple(models),
        kv_cache_usage=mean("kv_cache_usage", weighted=True),
        num_requests_running=total("num_requests_running"),
        num_requests_waiting=total("num_requests_waiting"),
        waiting_by_reason=tuple(sorted(reasons.items())),
        num_gpu_blocks=blocks,
        block_size=block_size,
        kv_capacity_tokens=capacity,
        preemptions=total("preemptions"),
        prefix_cache_queries_tokens=total("prefix_cache_queries_tokens"),
        prefix_cache_hits_tokens=total("prefix_cache_hits_tokens"),
        prompt_tokens=total("prompt_tokens"),
        generation_tokens=total("generation_tokens"),
        request_success=total("request_success"),
        ttft_s=_histogram(ttft, _histogram_rows(by_name, ttft, dedupe)) if ttft else None,
        queue_time_s=_histogram(queue, _histogram_rows(by_name, queue, dedupe)) if queue else None,
        cache_hit_rate=mean("cache_hit_rate", weighted=False),
    )


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


def parse_engine(
    kind: str, source: str, text: str, at_s: float, *, reference: bool = False
) -> EngineScrape:
    """One inference server's page → EngineScrape. ``kind``: "vllm" or "sglang".
    ``reference=True`` reads the kept lines with prometheus_client only (slower, same result).
    Raises ``SourceParseError`` only."""
    if kind not in N.ENGINE_NAMES:
        raise SourceParseError(f"unknown engine kind {kind!r}")
    samples, declared = read_samples(kind, text, reference=reference)
    return engine_from_samples(kind, source, at_s, samples, declared)


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


def parse_dcgm(source: str, text: str, at_s: float, *, reference: bool = False) -> list[GpuScrape]:
    """A DCGM exporter page → one GpuScrape per GPU. Raises ``SourceParseError`` only."""
    samples, declared = read_samples("dcgm", text, reference=reference)
    return gpus_from_samples(source, at_s, samples, declared)


# -- kind detection ------------------------------------------------------------------------

_KIND_LINE: Final = re.compile(r"\n(?:# (?:HELP|TYPE) )?(vllm:|sglang:|DCGM_FI_)")
_KIND_OF: Final = {"vllm:": "vllm", "sglang:": "sglang", "DCGM_FI_": "dcgm"}


def detect_kind(text: str) -> str:
    """ "vllm", "sglang" or "dcgm": the kind with the most lines on the page (ties: that
    order). Raises ``SourceParseError`` when none of them is there."""
    found = Counter(_KIND_LINE.findall("\n" + text))
    if not found:
        raise SourceParseError("no vLLM, SGLang or DCGM metrics on the page")
    order = list(_KIND_OF)
    best = max(found, key=lambda p: (found[p], -order.index(p)))
    return _KIND_OF[best]
