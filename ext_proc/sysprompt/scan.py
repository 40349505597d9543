"""Lossless building blocks of ``ext_proc.sysprompt`` (the score and the compaction):
embedded-JSON scan, whitespace stripping, raw-string editing and a nested span walker.

Job: find JSON embedded in a text, take out its insignificant whitespace without touching
any other character, and apply that edit to the *raw* JSON string literal of the body so
that every escape sequence the client wrote (``\\u00e9``, ``\\/``) survives byte for byte.

Invariants:
- Nothing is re-serialised: compaction only deletes JSON whitespace (space, tab, LF, CR)
  that lies outside JSON strings, so key order, repeated keys, number spellings (``1.0``,
  ``1e5``) and string escapes are kept exactly. The value a span parses to is unchanged.
- The embedded scan (``embedded_json_spans``) is deterministic: left to right, at each ``{``
  or ``[`` the standard library's decoder (strict JSON: no ``NaN``/``Infinity``) tries to
  read one value; a value that parses is a span and the scan resumes after it (outermost
  spans only, never overlapping); one that does not moves the scan one character on. Work
  is bounded: texts over ``SCAN_MAX_CHARS`` are not scanned, and the scan stops once failed
  attempts have read ``SCAN_WORK_FACTOR × len(text) + 4096`` characters (spans found until
  then stand).
- ``embedded_json_spans`` and ``compact_text`` are cached (``SCAN_CACHE_TEXTS`` texts):
  the score and the compaction of one request scan a system text once. Their results are
  tuples, and the embedded values are shared: never changed by a caller.
- Every function is pure and raises only ``ValueError`` / ``RecursionError`` (walker) on
  malformed input; the callers turn those into "leave the body alone".
"""

from __future__ import annotations

import bisect
import functools
import json
import re
from collections.abc import Sequence
from json.decoder import scanstring  # type: ignore[attr-defined]
from typing import Any

__all__ = [
    "SCAN_MAX_CHARS",
    "SCAN_WORK_FACTOR",
    "Members",
    "array_elements",
    "compact_text",
    "delete_in_literal",
    "embedded_json_spans",
    "object_members",
    "strip_json_ws",
    "top_members",
]

SCAN_MAX_CHARS = 1 << 20
SCAN_WORK_FACTOR = 4
# system texts whose scan is kept: the score and the compaction of one request share it
SCAN_CACHE_TEXTS = 16

_WS = " \t\n\r"
_OPENERS = re.compile(r"[{\[]")
# a JSON string (kept) or a run of JSON whitespace (dropped); only used on valid JSON text
_STRING_OR_WS = re.compile(r'"(?:[^"\\]|\\.)*"|[ \t\n\r]+', re.DOTALL)
# pieces of a raw string literal's inside: plain runs, surrogate-pair escapes, escapes
_PIECE = re.compile(
    r'[^"\\]+'
    r"|\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}"
    r"|\\u[0-9a-fA-F]{4}"
    r"|\\.",
    re.DOTALL,
)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_STRICT = json.JSONDecoder(parse_constant=_no_constant)  # embedded JSON: standard only
_BODY = json.JSONDecoder()  # the body itself: what rawjson / json.loads accept


@functools.lru_cache(maxsize=SCAN_CACHE_TEXTS)
def embedded_json_spans(text: str) -> tuple[tuple[int, int, Any], ...]:
    """``(start, end, value)`` of each outermost JSON object or array embedded in ``text``
    (cached: a request's system texts are scanned once for its score and its compaction;
    the values are shared, never to be changed)."""
    spans: list[tuple[int, int, Any]] = []
    if len(text) > SCAN_MAX_CHARS:
        return ()
    budget = SCAN_WORK_FACTOR * len(text) + 4096
    i = 0
    while (m := _OPENERS.search(text, i)) is not None:
        start = m.start()
        try:
            value, end = _STRICT.raw_decode(text, start)
        except json.JSONDecodeError as e:
            budget -= max(1, e.pos - start)
        except (ValueError, RecursionError):
            budget -= len(text) - start  # unknown reach: charge the rest of the text
        else:
            spans.append((start, end, value))
            i = end
            continue
        if budget <= 0:
            break
        i = start + 1
    return tuple(spans)


def _ws_runs(json_text: str, offset: int) -> list[tuple[int, int]]:
    return [
        (offset + m.start(), offset + m.end())
        for m in _STRING_OR_WS.finditer(json_text)
        if m.group()[0] != '"'
    ]


def strip_json_ws(json_text: str) -> str:
    """``json_text`` (valid JSON) without its insignificant whitespace, tokens untouched."""
    return _STRING_OR_WS.sub(lambda m: m.group() if m.group()[0] == '"' else "", json_text)


@functools.lru_cache(maxsize=SCAN_CACHE_TEXTS)
def compact_text(text: str) -> tuple[str, tuple[tuple[int, int], ...]]:
    """``text`` with the embedded JSON's whitespace removed, and the removed ranges (sorted,
    disjoint, indices into ``text``). A span whose compact form would not parse to the same
    value (never expected) is left alone. Cached, as ``embedded_json_spans``."""
    removed: list[tuple[int, int]] = []
    for start, end, value in embedded_json_spans(text):
        runs = _ws_runs(text[start:end], start)
        if not runs:
            continue
        compact = strip_json_ws(text[start:end])
        try:
            again, stop = _STRICT.raw_decode(compact)
        except (ValueError, RecursionError):
            continue
        if stop != len(compact) or again != value:
            continue
        removed.extend(runs)
    if not removed:
        return text, ()
    parts: list[str] = []
    pos = 0
    for a, b in removed:
        parts.append(text[pos:a])
        pos = b
    parts.append(text[pos:])
    return "".join(parts), tuple(removed)


def delete_in_literal(literal: str, removed: Sequence[tuple[int, int]]) -> str | None:
    """The raw JSON string ``literal`` (quotes included) with the *decoded* characters in
    ``removed`` taken out: plain characters lose their one character, escapes
    (``\\n``, ``\\u0020``) their whole sequence; every other byte is kept. None when the
    literal's pieces do not add up to its decoded length (not expected)."""
    inner = literal[1:-1]
    dec_starts: list[int] = []
    raw_starts: list[int] = []
    raw_ends: list[int] = []
    runs: list[bool] = []
    d = 0
    for m in _PIECE.finditer(inner):
        tok = m.group()
        dec_starts.append(d)
        raw_starts.append(m.start())
        raw_ends.append(m.end())
        plain = tok[0] != "\\"
        runs.append(plain)
        d += len(tok) if plain else 1
    cut: list[tuple[int, int]] = []
    for a, b in removed:
        for k in range(a, b):
            idx = bisect.bisect_right(dec_starts, k) - 1
            if idx < 0 or k >= d:
                return None
            if runs[idx]:
                r = raw_starts[idx] + (k - dec_starts[idx])
                cut.append((r, r + 1))
            else:
                cut.append((raw_starts[idx], raw_ends[idx]))
    out: list[str] = []
    pos = 0
    for a, b in cut:
        out.append(inner[pos:a])
        pos = b
    out.append(inner[pos:])
    return '"' + "".join(out) + '"'


# --- a span walker over the body's text ---------------------------------------------------

Members = dict[str, tuple[int, int, Any]]  # key -> (value start, value end, decoded value)


def _skip(text: str, i: int) -> int:
    n = len(text)
    while i < n and text[i] in _WS:
        i += 1
    return i


def _at(text: str, i: int) -> str:
    return text[i] if i < len(text) else ""


def object_members(text: str, i: int) -> tuple[Members, frozenset[str], int]:
    """The members of the object at ``text[i]``: their spans and values, the keys given
    more than once (their last copy is in the members, as ``json.loads`` keeps), and the
    index after the closing brace. Raises ``ValueError`` when it is not an object."""
    if _at(text, i) != "{":
        raise ValueError(f"expected an object at char {i}")
    members: Members = {}
    repeated: set[str] = set()
    i = _skip(text, i + 1)
    if _at(text, i) == "}":
        return members, frozenset(), i + 1
    while True:
        if _at(text, i) != '"':
            raise ValueError(f"expected a member name at char {i}")
        key, i = scanstring(text, i + 1, True)
        i = _skip(text, i)
        if _at(text, i) != ":":
            raise ValueError(f"expected ':' at char {i}")
        i = _skip(text, i + 1)
        value, end = _BODY.raw_decode(text, i)
        if key in members:
            repeated.add(key)
        members[key] = (i, end, value)
        i = _skip(text, end)
        if _at(text, i) == ",":
            i = _skip(text, i + 1)
            continue
        if _at(text, i) == "}":
            return members, frozenset(repeated), i + 1
        raise ValueError(f"expected ',' or '}}' at char {i}")


def array_elements(text: str, i: int, limit: int | None = None) -> list[tuple[int, int, Any]]:
    """``(start, end, value)`` of each element of the array at ``text[i]`` (its first
    ``limit`` elements: the rest is not read)."""
    if _at(text, i) != "[":
        raise ValueError(f"expected an array at char {i}")
    items: list[tuple[int, int, Any]] = []
    i = _skip(text, i + 1)
    if _at(text, i) == "]":
        return items
    while limit is None or len(items) < limit:
        value, end = _BODY.raw_decode(text, i)
        items.append((i, end, value))
        i = _skip(text, end)
        if _at(text, i) == ",":
            i = _skip(text, i + 1)
            continue
        if _at(text, i) == "]":
            return items
        raise ValueError(f"expected ',' or ']' at char {i}")
    return items


def top_members(text: str) -> tuple[Members, frozenset[str]]:
    """The top-level object's members; ``ValueError`` unless ``text`` is one JSON object."""
    members, repeated, end = object_members(text, _skip(text, 0))
    if _skip(text, end) != len(text):
        raise ValueError(f"unexpected data after the object at char {end}")
    return members, repeated
