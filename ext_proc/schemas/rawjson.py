"""Top-level JSON objects with the byte spans of their members, and minimal edits of them.

Job: parse a request body once, keeping where each top-level member's value lies in the
original text, so that ICE can change one value (or add one member) and leave every other
byte as the client sent it: field order, spacing, unknown fields and number spellings survive.

``parse_object`` is the one decode of a request body on ICE's way (it can also walk named
top-level arrays element by element, for their element spans); ``splice`` applies text
edits to a decoded body and moves every span with them, so an edited body (compacted,
truncated, its limit lowered) is known without a second parse. ``decode_object`` is the
span-less decode the tools and tests use.

Invariants:
- Values are decoded by the standard library's JSON decoder (C scanner); this module only
  walks the top-level object and records spans, it never re-serialises the body.
- ``replace_value``, ``replace_values`` and ``add_member`` return new bytes, and
  ``remove_member`` a new decode; the input is never modified.
- A body with an integer of more digits than the interpreter converts
  (``sys.get_int_max_str_digits()``, 4,300 by default) is ``InvalidJSON``
  (``too_long_integer``), never the decoder's bare ``ValueError``.
- Duplicate keys: the last occurrence wins, as with ``json.loads`` (and Python backends);
  ``parse_object`` and ``decode_object`` also remember, per object, which keys were repeated
  (``duplicate_keys``), so that a schema adapter can refuse a repeated key it reads. Objects
  without repeats are plain dicts.
"""

from __future__ import annotations

import bisect
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from json.decoder import scanstring  # type: ignore[attr-defined]
from typing import Any

__all__ = [
    "DROPPED",
    "InvalidJSON",
    "TopLevel",
    "add_member",
    "array_items",
    "decode_object",
    "duplicate_keys",
    "edit_member",
    "parse_object",
    "remove_member",
    "replace_array",
    "replace_value",
    "replace_values",
    "splice",
    "too_long_integer",
]

_DECODER = json.JSONDecoder()
_WS = " \t\n\r"


class InvalidJSON(ValueError):
    """The body is not a UTF-8 JSON object; ``args[0]`` says where and why."""


@dataclass(frozen=True, slots=True)
class TopLevel:
    """A decoded top-level object plus the character spans of each member's value."""

    text: str
    values: dict[str, Any]
    spans: dict[str, tuple[int, int]]
    close_index: int  # index of the closing ``}``
    # the element spans of the top-level arrays ``parse_object`` was asked to walk
    items: dict[str, tuple[tuple[int, int], ...]] = field(default_factory=dict)

    def slim(self) -> TopLevel:
        """This document without its array values (their keys map to ``DROPPED``): what an
        edit of its output limit needs, cheap to send to another process."""
        values = {k: DROPPED if isinstance(v, list) else v for k, v in self.values.items()}
        return TopLevel(self.text, values, self.spans, self.close_index, self.items)


class _Dropped:
    """The value of an array ``TopLevel.slim`` left out."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "DROPPED"

    def __reduce__(self) -> str:
        return "DROPPED"  # unpickled as this module's one instance


DROPPED: Any = _Dropped()


class _Repeated(dict[str, Any]):
    """A decoded object that gave some keys more than once (their last values kept)."""

    __slots__ = ("repeated",)
    repeated: frozenset[str]


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) == len(pairs):
        return obj
    seen: set[str] = set()
    repeated: set[str] = set()
    for key, _ in pairs:
        (repeated if key in seen else seen).add(key)
    marked = _Repeated(obj)
    marked.repeated = frozenset(repeated)
    return marked


# parse_object's decoder: nested objects remember their repeated keys, as decode_object's do
_MARKING = json.JSONDecoder(object_pairs_hook=_object)


def duplicate_keys(obj: object) -> frozenset[str]:
    """The keys a decoded object gave more than once (empty for most objects)."""
    return obj.repeated if type(obj) is _Repeated else frozenset()


def too_long_integer() -> str:
    """Why a body with an integer of more digits than ``sys.get_int_max_str_digits()`` is
    refused: converting one costs time quadratic in its digits (the interpreter's guard), no
    field a server reads can hold one, and a Python server's JSON decoder refuses it too."""
    limit = sys.get_int_max_str_digits()
    return f"a number has more than {limit} digits, the most an integer may have"


def _skip_ws(text: str, i: int) -> int:
    n = len(text)
    while i < n and text[i] in _WS:
        i += 1
    return i


def decode_object(body: bytes) -> dict[str, Any]:
    """Decode ``body`` as a JSON object without spans (the fast path: one C-level parse).

    Accepts exactly what ``parse_object`` accepts; raises ``InvalidJSON`` likewise.
    """
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidJSON(f"body is not valid UTF-8 (byte {e.start})") from None
    try:
        value = json.loads(text, object_pairs_hook=_object)
    except RecursionError:
        raise InvalidJSON("the JSON is nested too deeply") from None
    except json.JSONDecodeError as e:
        if e.msg == "Extra data":
            raise InvalidJSON(f"unexpected data after the object at char {e.pos}") from None
        raise InvalidJSON(f"{e.msg} at char {e.pos}") from None
    except ValueError:  # an integer of too many digits (too_long_integer)
        raise InvalidJSON(too_long_integer()) from None
    if not isinstance(value, dict):
        raise InvalidJSON("body must be a JSON object")
    return value


def parse_object(body: bytes, arrays: frozenset[str] = frozenset()) -> TopLevel:
    """Decode ``body`` as a JSON object, recording each top-level value's span: the one
    decode of a request body on ICE's way (its values are ``decode_object``'s, repeated keys
    marked alike). The top-level arrays named in ``arrays`` are walked element by element,
    so that their element spans are known too (``TopLevel.items``: history truncation).

    Raises ``InvalidJSON`` with a precise message for non-UTF-8 bytes, syntax errors,
    non-object documents and trailing data.
    """
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidJSON(f"body is not valid UTF-8 (byte {e.start})") from None
    try:
        return _parse_text(text, arrays)
    except InvalidJSON:
        raise
    except json.JSONDecodeError as e:
        raise InvalidJSON(f"{e.msg} at char {e.pos}") from None
    except RecursionError:
        raise InvalidJSON("the JSON is nested too deeply") from None
    except ValueError:  # an integer of too many digits (too_long_integer)
        raise InvalidJSON(too_long_integer()) from None


def _parse_text(text: str, arrays: frozenset[str]) -> TopLevel:
    i = _skip_ws(text, 0)
    if i >= len(text) or text[i] != "{":
        raise InvalidJSON("body must be a JSON object")
    pairs: list[tuple[str, Any]] = []
    spans: dict[str, tuple[int, int]] = {}
    items: dict[str, tuple[tuple[int, int], ...]] = {}
    i = _skip_ws(text, i + 1)
    close = i
    more = False  # after a comma: a member must follow
    while more or i >= len(text) or text[i] != "}":
        if i >= len(text) or text[i] != '"':
            raise InvalidJSON(f"expected a member name at char {i}")
        key, i = scanstring(text, i + 1, True)
        i = _skip_ws(text, i)
        if i >= len(text) or text[i] != ":":
            raise InvalidJSON(f"expected ':' at char {i}")
        i = _skip_ws(text, i + 1)
        if key in arrays and i < len(text) and text[i] == "[":
            value, end, items[key] = _walk_array(text, i)
        else:
            value, end = _MARKING.raw_decode(text, i)
        pairs.append((key, value))
        spans[key] = (i, end)
        i = _skip_ws(text, end)
        more = i < len(text) and text[i] == ","
        if more:
            i = _skip_ws(text, i + 1)
        elif i >= len(text) or text[i] != "}":
            raise InvalidJSON(f"expected ',' or '}}' at char {i}")
        close = i
    end = _skip_ws(text, close + 1)
    if end != len(text):
        raise InvalidJSON(f"unexpected data after the object at char {end}")
    return TopLevel(text=text, values=_object(pairs), spans=spans, close_index=close, items=items)


def _walk_array(text: str, i: int) -> tuple[list[Any], int, tuple[tuple[int, int], ...]]:
    """The array at ``text[i]``: its values, the index after it, each element's span."""
    values: list[Any] = []
    spans: list[tuple[int, int]] = []
    i = _skip_ws(text, i + 1)
    if i < len(text) and text[i] == "]":
        return values, i + 1, ()
    while True:
        value, end = _MARKING.raw_decode(text, i)
        values.append(value)
        spans.append((i, end))
        i = _skip_ws(text, end)
        if i < len(text) and text[i] == ",":
            i = _skip_ws(text, i + 1)
        elif i < len(text) and text[i] == "]":
            return values, i + 1, tuple(spans)
        else:
            raise json.JSONDecodeError("Expecting ',' delimiter", text, i)


def splice(doc: TopLevel, edits: list[tuple[int, int, str]], values: dict[str, Any]) -> TopLevel:
    """``doc`` with the text edits ``(start, end, replacement)`` applied (in character
    offsets; they do not overlap, and each lies inside one member's value or the object's
    closing space) and ``values`` as the new values: every offset moves by the edits that
    start before it, so the result is what ``parse_object`` would give for the new text,
    with no parse."""
    ordered = sorted(edits)
    parts: list[str] = []
    pos = 0
    for start, end, replacement in ordered:
        parts.append(doc.text[pos:start])
        parts.append(replacement)
        pos = end
    parts.append(doc.text[pos:])
    starts = [s for s, _, _ in ordered]
    shifts = [0]
    for start, end, replacement in ordered:
        shifts.append(shifts[-1] + len(replacement) - (end - start))

    def moved(offset: int) -> int:  # by the edits that start before it
        return offset + shifts[bisect.bisect_left(starts, offset)]

    spans = {k: (moved(s), moved(e)) for k, (s, e) in doc.spans.items()}
    items = {k: tuple((moved(s), moved(e)) for s, e in v) for k, v in doc.items.items()}
    close = moved(doc.close_index)
    return TopLevel("".join(parts), values, spans, close, items)


def replace_value(doc: TopLevel, key: str, value: Any) -> bytes:
    """Return the body with the value of top-level ``key`` replaced by ``value``."""
    start, end = doc.spans[key]
    encoded = json.dumps(value, ensure_ascii=False)
    return (doc.text[:start] + encoded + doc.text[end:]).encode("utf-8")


def replace_values(doc: TopLevel, changes: dict[str, Any]) -> bytes:
    """Return the body with each top-level ``key`` of ``changes`` given its new value, in one
    pass (the text unchanged when ``changes`` is empty)."""
    edits = [(*doc.spans[k], json.dumps(v, ensure_ascii=False)) for k, v in changes.items()]
    values = {**doc.values, **changes}
    return splice(doc, edits, values).text.encode("utf-8")


def add_member(doc: TopLevel, key: str, value: Any) -> bytes:
    """Return the body with ``"key": value`` appended as the last top-level member."""
    member = json.dumps(key, ensure_ascii=False) + ": " + json.dumps(value, ensure_ascii=False)
    close = doc.close_index
    head = doc.text[:close].rstrip(_WS)
    sep = "" if not doc.spans else ", "
    return (head + sep + member + doc.text[len(head) :]).encode("utf-8")


def array_items(doc: TopLevel, key: str) -> list[str]:
    """The original text of each element of the top-level array ``key``, in order.

    Raises ``InvalidJSON`` when the member is not an array.
    """
    start, end = doc.spans[key]
    text = doc.text
    if text[start] != "[":
        raise InvalidJSON(f"'{key}' is not an array")
    items: list[str] = []
    i = _skip_ws(text, start + 1)
    if text[i] == "]":
        return items
    while i < end:
        _, stop = _DECODER.raw_decode(text, i)
        items.append(text[i:stop])
        i = _skip_ws(text, stop)
        if text[i] == ",":
            i = _skip_ws(text, i + 1)
        elif text[i] == "]":
            break
    return items


def replace_array(doc: TopLevel, key: str, items: list[str]) -> bytes:
    """Return the body with the top-level array ``key`` made of ``items`` (element texts,
    e.g. from ``array_items``, kept byte for byte) joined by ``", "``."""
    start, end = doc.spans[key]
    return (doc.text[:start] + "[" + ", ".join(items) + "]" + doc.text[end:]).encode("utf-8")


def _member(text: str) -> TopLevel:
    """One member's object, parsed for its spans (a part of a decoded body, not the body)."""
    try:
        return _parse_text(text, frozenset())
    except InvalidJSON:
        raise
    except json.JSONDecodeError as e:
        raise InvalidJSON(f"{e.msg} at char {e.pos}") from None
    except ValueError:
        raise InvalidJSON(too_long_integer()) from None


def edit_member(doc: TopLevel, key: str, edit: Callable[[TopLevel], bytes]) -> bytes:
    """Return the body with the value of top-level ``key`` (an object, or an array of
    objects) replaced by ``edit`` of each object (parsed with ``parse_object``): everything
    outside the edited objects stays byte for byte (array elements are rejoined by ``", "``).

    Raises ``InvalidJSON`` when the member is neither."""
    start, end = doc.spans[key]
    value = doc.values[key]
    if isinstance(value, dict):
        inner = _member(doc.text[start:end])
        return (doc.text[:start] + edit(inner).decode("utf-8") + doc.text[end:]).encode("utf-8")
    if isinstance(value, list) and all(isinstance(v, dict) for v in value):
        items = [edit(_member(t)).decode("utf-8") for t in array_items(doc, key)]
        return replace_array(doc, key, items)
    raise InvalidJSON(f"'{key}' is not an object or an array of objects")


def _member_start(doc: TopLevel, key: str) -> int:
    """Where the member whose value ``doc.spans[key]`` holds begins (its name's quote): the
    members before it are walked from the nearest known value's end, so a repeated key's
    earlier copy (whose span ``spans`` does not keep) is stepped over, not swallowed."""
    start = doc.spans[key][0]
    before = [e for s, e in doc.spans.values() if e <= start]
    i = max(before) if before else doc.text.index("{") + 1
    text = doc.text
    while True:
        i = _skip_ws(text, i)
        if text[i] == ",":
            i = _skip_ws(text, i + 1)
        name_at = i
        _, i = scanstring(text, i + 1, True)
        i = _skip_ws(text, _skip_ws(text, i) + 1)  # past the ':'
        if i == start:
            return name_at
        _, i = _MARKING.raw_decode(text, i)  # an unkept copy of a repeated key


def remove_member(doc: TopLevel, key: str) -> TopLevel:
    """``doc`` without its top-level member ``key`` (the last copy, the one ``values``
    holds; the caller refuses a repeated one): the member and one comma beside it go, every
    other byte stays, and the other keys' repeat marks are kept."""
    text = doc.text
    name_at, end = _member_start(doc, key), doc.spans[key][1]
    after = _skip_ws(text, end)
    if text[after] == ",":  # not the last member: up to the next member's name
        cut = (name_at, _skip_ws(text, after + 1))
    else:  # the last: from the comma before it (none: the only member)
        head = text[:name_at].rstrip(_WS)
        cut = (len(head) - 1, end) if head.endswith(",") else (name_at, end)
    values = _object([(k, v) for k, v in doc.values.items() if k != key])
    repeated = duplicate_keys(doc.values) - {key}
    if repeated:
        marked = _Repeated(values)
        marked.repeated = repeated
        values = marked
    spans = {k: v for k, v in doc.spans.items() if k != key}
    items = {k: v for k, v in doc.items.items() if k != key}
    return splice(replace(doc, spans=spans, items=items), [(cut[0], cut[1], "")], values)
