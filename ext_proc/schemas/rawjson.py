"""Top-level JSON objects with the byte spans of their members, and minimal edits of them.

Job: parse a request body once, keeping where each top-level member's value lies in the
original text, so that ICE can change one value (or add one member) and leave every other
byte as the client sent it: field order, spacing, unknown fields and number spellings survive.

Invariants:
- Values are decoded by the standard library's JSON decoder (C scanner); this module only
  walks the top-level object and records spans, it never re-serialises the body.
- ``replace_value`` and ``add_member`` return new bytes; the input is never modified.
- Duplicate keys: the last occurrence wins, as with ``json.loads`` (and Python backends);
  ``decode_object`` also remembers, per object, which keys were repeated
  (``duplicate_keys``), so that a schema adapter can refuse a repeated key it reads. Objects
  without repeats are plain dicts.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from json.decoder import scanstring  # type: ignore[attr-defined]
from typing import Any

__all__ = [
    "InvalidJSON",
    "TopLevel",
    "add_member",
    "array_items",
    "decode_object",
    "duplicate_keys",
    "edit_member",
    "parse_object",
    "replace_array",
    "replace_value",
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


def duplicate_keys(obj: object) -> frozenset[str]:
    """The keys a decoded object gave more than once (empty for most objects)."""
    return obj.repeated if type(obj) is _Repeated else frozenset()


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
    if not isinstance(value, dict):
        raise InvalidJSON("body must be a JSON object")
    return value


def parse_object(body: bytes) -> TopLevel:
    """Decode ``body`` as a JSON object, recording each top-level value's span.

    Raises ``InvalidJSON`` with a precise message for non-UTF-8 bytes, syntax errors,
    non-object documents and trailing data.
    """
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidJSON(f"body is not valid UTF-8 (byte {e.start})") from None
    i = _skip_ws(text, 0)
    if i >= len(text) or text[i] != "{":
        raise InvalidJSON("body must be a JSON object")
    values: dict[str, Any] = {}
    spans: dict[str, tuple[int, int]] = {}
    i = _skip_ws(text, i + 1)
    try:
        if i < len(text) and text[i] == "}":
            close = i
        else:
            while True:
                if i >= len(text) or text[i] != '"':
                    raise InvalidJSON(f"expected a member name at char {i}")
                key, i = scanstring(text, i + 1, True)
                i = _skip_ws(text, i)
                if i >= len(text) or text[i] != ":":
                    raise InvalidJSON(f"expected ':' at char {i}")
                i = _skip_ws(text, i + 1)
                value, end = _DECODER.raw_decode(text, i)
                values[key] = value
                spans[key] = (i, end)
                i = _skip_ws(text, end)
                if i < len(text) and text[i] == ",":
                    i = _skip_ws(text, i + 1)
                    continue
                if i < len(text) and text[i] == "}":
                    close = i
                    break
                raise InvalidJSON(f"expected ',' or '}}' at char {i}")
    except json.JSONDecodeError as e:
        raise InvalidJSON(f"{e.msg} at char {e.pos}") from None
    except RecursionError:
        raise InvalidJSON("the JSON is nested too deeply") from None
    end = _skip_ws(text, close + 1)
    if end != len(text):
        raise InvalidJSON(f"unexpected data after the object at char {end}")
    return TopLevel(text=text, values=values, spans=spans, close_index=close)


def replace_value(doc: TopLevel, key: str, value: Any) -> bytes:
    """Return the body with the value of top-level ``key`` replaced by ``value``."""
    start, end = doc.spans[key]
    encoded = json.dumps(value, ensure_ascii=False)
    return (doc.text[:start] + encoded + doc.text[end:]).encode("utf-8")


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


def edit_member(doc: TopLevel, key: str, edit: Callable[[TopLevel], bytes]) -> bytes:
    """Return the body with the value of top-level ``key`` (an object, or an array of
    objects) replaced by ``edit`` of each object (parsed with ``parse_object``): everything
    outside the edited objects stays byte for byte (array elements are rejoined by ``", "``).

    Raises ``InvalidJSON`` when the member is neither."""
    start, end = doc.spans[key]
    value = doc.values[key]
    if isinstance(value, dict):
        inner = parse_object(doc.text[start:end].encode("utf-8"))
        return (doc.text[:start] + edit(inner).decode("utf-8") + doc.text[end:]).encode("utf-8")
    if isinstance(value, list) and all(isinstance(v, dict) for v in value):
        items = [
            edit(parse_object(t.encode("utf-8"))).decode("utf-8") for t in array_items(doc, key)
        ]
        return replace_array(doc, key, items)
    raise InvalidJSON(f"'{key}' is not an object or an array of objects")
