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
3. Combine the samples: ``ext_proc.signals.combine`` (also used for Prometheus API answers).

Invariants:
- The only exception is ``SourceParseError``: empty page, a page not ending in a newline
  (the exposition format ends every line with one; a cut page does not), a kept line that
  prometheus_client rejects, or a page with no line of the kind's metrics at all (HTML, JSON,
  another kind). Lines of other families are not looked at, so not validated.
- What the records say of NaN, ±Inf, contradicting ``# TYPE`` lines and histograms without
  their ``+Inf`` bucket: see ``combine``. ``None`` always means "the page did not say".
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from typing import Any, Final

from prometheus_client.parser import text_string_to_metric_families

from ext_proc.signals import names as N
from ext_proc.signals.combine import (
    Sample,
    SourceParseError,
    engine_from_samples,
    gpus_from_samples,
)
from ext_proc.signals.scrapes import EngineScrape, GpuScrape

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
