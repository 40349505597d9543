"""Where two prompts of one template part ways, what kind of value differs, and a redacted
context around it.

Job: ``fingerprint`` groups prompts that come from one template (values masked); ``sites``
walks two rendered prompts of a group from the start and returns the places where they
differ, up to ``MAX_SITES``: at each first difference it takes the value holding it in both
prompts (a timestamp, an id, a number, a word, or the tools array), classifies it, and, when
the texts agree again right after the two values (``REALIGN_CHARS`` characters, or both
end), goes on past them; otherwise the prompts simply say different things there (``text``:
another history or question) and the walk stops.

Kinds: ``timestamp`` (ISO 8601 date or date-time, or a 10-digit unix time 1e9..2e9),
``id`` (uuid, 8+ hex digits with a digit, or a word mixing letters and digits joined by
``-``/``_``: ``req_8f3a2b``), ``email``, ``number`` (a digit run), ``name`` (a capitalised
word), ``word``, ``tools_order`` (the same tools in another order), ``tools_keys`` (the same
tools with keys in another order), ``tools_changed``, ``text``.

Fingerprint: sha256 (16 hex) of the first ``FINGERPRINT_CHARS`` (256) characters of the
text before the last message (a prompt of one section: its first 64 characters), after
masking timestamps, ids, emails, digit runs and capitalised words, with the tools array
sorted by its JSON: prompts that differ only in such values (or tool order) share it.

Redaction (``redact``, for the context shown around a site, never the prompt itself): at
most ``CONTEXT_CHARS`` (24) characters each side of the value, which is replaced by
``<kind>``; within them emails become ``<email>``, timestamps ``<timestamp>``, ids ``<id>``,
every digit ``0``, every letter of a word longer than ``KEEP_WORD_LETTERS`` (3) letters
after its first one ``*``, newlines ``⏎``; role markers (``<|user|>``) stay. Words of up to
3 letters stay readable ("is", "the", and also a 3-letter name next to the value).

Invariants: pure functions; ``sites`` is O(len(a) + len(b)); offsets are characters of the
rendered text (``render``).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

from ext_proc.prefix.render import Rendered

__all__ = [
    "CONTEXT_CHARS",
    "MAX_SITES",
    "Site",
    "fingerprint",
    "redact",
    "sites",
]

CONTEXT_CHARS = 24
KEEP_WORD_LETTERS = 3
MAX_SITES = 3
REALIGN_CHARS = 8
FINGERPRINT_CHARS = 256
FINGERPRINT_SHORT = 64  # a prompt without a last message: its first characters

_TS = (
    r"\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?"
    r"|\b1\d{9}(?:\.\d+)?\b"
)
_UUID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
_EMAIL = r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+"
_ID = (
    r"\b(?=[0-9a-fA-F]*\d)[0-9a-fA-F]{8,}\b"
    r"|\b(?=[\w-]*\d)(?=[\w-]*[A-Za-z])[A-Za-z0-9]+(?:[-_][A-Za-z0-9]+)+\b"
)
_VALUE = re.compile(
    rf"(?P<timestamp>{_TS})|(?P<uuid>{_UUID})|(?P<email>{_EMAIL})|(?P<id>{_ID})"
    r"|(?P<number>\d+)|(?P<word>[^\W\d_]+)"
)
_MARKER = re.compile(r"<\|\w+\|>")
_MASK = re.compile(rf"{_TS}|{_UUID}|{_EMAIL}|{_ID}|\d+|\b[A-Z][^\W\d_]+")
_REDACT = re.compile(
    rf"(?P<email>{_EMAIL})|(?P<timestamp>{_TS})|(?P<id>{_UUID}|{_ID})"
    r"|(?P<digits>\d+)|(?P<word>[^\W\d_]+)"
)


@dataclass(frozen=True, slots=True)
class Site:
    """One place where prompt ``b`` differs from prompt ``a`` before it: the value's
    ``[start, end)`` in each, its kind, and the section of ``b`` it lies in."""

    kind: str
    a_start: int
    a_end: int
    b_start: int
    b_end: int
    section: str
    section_offset: int  # characters from the section's content start in b


def _canon(tools: tuple[Any, ...] | None, *, sort_keys: bool) -> list[str]:
    return [json.dumps(t, sort_keys=sort_keys, ensure_ascii=False) for t in tools or ()]


def fingerprint(r: Rendered) -> str:
    """The template fingerprint of a rendered prompt (see the module docstring)."""
    text = r.text
    last = r.sections[-1] if len(r.sections) > 1 else None
    if last is not None and last.label.startswith("last message"):
        text = text[: last.start]
    else:
        text = text[:FINGERPRINT_SHORT]
    if r.tools is not None:
        tools = next(s for s in r.sections if s.label == "tools")
        ordered = json.dumps(sorted(_canon(r.tools, sort_keys=True)), ensure_ascii=False)
        text = text[: tools.start] + ordered + text[tools.end :]
    masked = _MASK.sub("#", text[: FINGERPRINT_CHARS * 4])[:FINGERPRINT_CHARS]
    return hashlib.sha256(masked.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def _value_at(text: str, pos: int) -> tuple[str, int, int]:
    """The value holding character ``pos`` (kind, start, end); one char of ``text``."""
    lo = max(0, pos - 64)
    for m in _VALUE.finditer(text, lo, min(len(text), pos + 64)):
        if m.start() <= pos < m.end():
            kind = m.lastgroup or "text"
            if kind == "uuid":
                kind = "id"
            elif kind == "word" and m.group()[:1].isupper():
                kind = "name"
            return kind, m.start(), m.end()
        if m.start() > pos:
            break
    return "text", pos, min(len(text), pos + 1)


def _common(a: str, i: int, b: str, j: int) -> int:
    """Length of the common prefix of ``a[i:]`` and ``b[j:]``."""
    n = min(len(a) - i, len(b) - j)
    if a[i : i + n] == b[j : j + n]:
        return n
    lo, hi = 0, n  # a[i:i+lo] == b[j:j+lo]; they differ within hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[i + lo : i + mid] == b[j + lo : j + mid]:
            lo = mid
        else:
            hi = mid
    return lo if a[i + lo] != b[j + lo] else hi


def _tools_kind(a: Rendered, b: Rendered) -> str:
    if sorted(_canon(a.tools, sort_keys=True)) == sorted(_canon(b.tools, sort_keys=True)):
        if _canon(a.tools, sort_keys=True) != _canon(b.tools, sort_keys=True):
            return "tools_order"
        return "tools_keys"
    return "tools_changed"


def sites(a: Rendered, b: Rendered, max_sites: int = MAX_SITES) -> list[Site]:
    """Where ``b`` differs from ``a`` (see the module docstring), earliest first."""
    out: list[Site] = []
    i = j = 0
    ta, tb = a.text, b.text
    while len(out) < max_sites:
        n = _common(ta, i, tb, j)
        i, j = i + n, j + n
        if i >= len(ta) or j >= len(tb):
            break
        sec_a, sec_b = a.section_at(i), b.section_at(j)
        if sec_a is not None and sec_b is not None and sec_a.label == sec_b.label == "tools":
            kind, sa, ea, sb, eb = _tools_kind(a, b), sec_a.start, sec_a.end, sec_b.start, sec_b.end
        else:
            kind, sa, ea = _value_at(ta, i)
            kind_b, sb, eb = _value_at(tb, j)
            # both values start where the texts part, or the earlier of the two starts
            back = min(i - sa, j - sb)
            sa, sb = i - back, j - back
            if kind != kind_b:
                kind = kind if kind_b == "text" else ("text" if kind == "text" else kind)
        sec = b.section_at(sb)
        realigned = ta[ea : ea + REALIGN_CHARS] == tb[eb : eb + REALIGN_CHARS] and (
            len(ta) - ea >= REALIGN_CHARS or len(ta) - ea == len(tb) - eb
        )
        if not realigned:
            kind = kind if kind.startswith("tools") else "text"
        out.append(
            Site(
                kind,
                sa,
                ea,
                sb,
                eb,
                sec.label if sec else "markers",
                sb - sec.start if sec else 0,
            )
        )
        if not realigned:
            break
        i, j = ea, eb
    return out


def redact(text: str) -> str:
    """``text`` with the redaction rules applied (see the module docstring)."""
    out: list[str] = []
    pos = 0
    for m in _MARKER.finditer(text):
        out.append(_redact_plain(text[pos : m.start()]))
        out.append(m.group())
        pos = m.end()
    out.append(_redact_plain(text[pos:]))
    return "".join(out)


def _redact_plain(text: str) -> str:
    def one(m: re.Match[str]) -> str:
        kind = m.lastgroup
        if kind in ("email", "timestamp", "id"):
            return f"<{kind}>"
        if kind == "digits":
            return "0" * len(m.group())
        word = m.group()
        if len(word) <= KEEP_WORD_LETTERS:
            return word
        return word[0] + "*" * (len(word) - 1)

    text = _REDACT.sub(one, text)
    return text.replace("\r", "").replace("\n", "⏎").replace("\t", " ")


def context(r: Rendered, start: int, end: int, kind: str) -> str:
    """The redacted context of the value at ``[start, end)`` of ``r``: at most
    ``CONTEXT_CHARS`` characters each side, the value itself shown as ``<kind>``."""
    left = redact(r.text[max(0, start - 3 * CONTEXT_CHARS) : start])[-CONTEXT_CHARS:]
    right = redact(r.text[end : end + 3 * CONTEXT_CHARS])[:CONTEXT_CHARS]
    lead = "…" if start > CONTEXT_CHARS else ""
    tail = "…" if end + CONTEXT_CHARS < len(r.text) else ""
    return f"{lead}{left}<{kind}>{right}{tail}"
