"""Lossless compaction of the JSON in system prompts and tools, on the body's one decode.

Compaction (``compact_doc``; ``compact_system_json`` for raw bytes) edits, in the body's own
bytes: the text of every system message / system block and every tool's ``description``
(embedded JSON spans only), and every tool's schema value (OpenAI ``function.parameters``,
Anthropic ``input_schema``). It only deletes JSON whitespace outside JSON strings
(``ext_proc.sysprompt.scan``), so the result is lossless (same values, key order, number
spellings, escapes), idempotent and deterministic; every byte outside the edited values is
kept. Objects that repeat a key the walk reads are left alone.

Tokens saved are the drop in ICE's input-token estimate
(``complexity.system_tokens(before) − system_tokens(after)``), which is exactly the drop in
the system texts' and tool descriptions' estimates: whitespace in a tool schema saves bytes
but no estimated tokens (ICE, and the servers' chat templates, count a schema from its
parsed value, not its spacing).

Invariant: the body is not decoded again. The walk takes the top-level members' spans and
values from the decode (``rawjson.TopLevel``); only the members it may edit (the system
messages, up to the last one, and ``tools``) are scanned for their inner spans; the
compacted body's values are the decode's with each edited string replaced
(``rawjson.splice``), so ``after`` needs no parse either.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any

from ext_proc.schemas import rawjson
from ext_proc.sysprompt.complexity import SYSTEM_ROLES, schema_kind, system_tokens
from ext_proc.sysprompt.scan import (
    Members,
    array_elements,
    compact_text,
    delete_in_literal,
    object_members,
    strip_json_ws,
)

__all__ = ["H_COMPACTED", "compact_doc", "compact_system_json", "maybe_compact"]

H_COMPACTED = "x-ice-compacted"

Path = tuple[str | int, ...]
Span = tuple[int, int, Any]  # (start, end, value) in the body's text


@dataclass(frozen=True, slots=True)
class _Edit:
    start: int
    end: int
    replacement: str
    path: Path  # where the value lies in the decoded body
    value: Any  # its new value (a schema keeps its value: only spacing goes)
    changes_value: bool


def _get(obj: tuple[Members, frozenset[str]], key: str) -> Span | None:
    """A member's span, or None when absent or repeated (a repeated key is left alone)."""
    members, repeated = obj
    return None if key in repeated else members.get(key)


def _members_at(text: str, start: int) -> tuple[Members, frozenset[str]]:
    members, repeated, _ = object_members(text, start)
    return members, repeated


def _text_edit(text: str, span: Span | None, path: Path) -> _Edit | None:
    """The edit compacting the embedded JSON of one string value of the body."""
    if span is None or not isinstance(span[2], str):
        return None
    start, end, value = span
    new_value, removed = compact_text(value)
    if not removed:
        return None
    literal = delete_in_literal(text[start:end], removed)
    if literal is None or json.loads(literal) != new_value:
        return None
    return _Edit(start, end, literal, path, new_value, True)


def _content_edits(text: str, span: Span | None, path: Path) -> list[_Edit | None]:
    if span is None:
        return []
    if isinstance(span[2], str):
        return [_text_edit(text, span, path)]
    if not isinstance(span[2], list):
        return []
    edits: list[_Edit | None] = []
    for i, part in enumerate(array_elements(text, span[0])):
        if isinstance(part[2], str):
            edits.append(_text_edit(text, part, (*path, i)))
        elif isinstance(part[2], dict) and part[2].get("type", "text") == "text":
            obj = _members_at(text, part[0])
            if _get(obj, "type") is None and "type" in part[2]:
                continue  # a repeated "type"
            edits.append(_text_edit(text, _get(obj, "text"), (*path, i, "text")))
    return edits


def _schema_edit(text: str, span: Span | None, path: Path) -> _Edit | None:
    if span is None:
        return None
    start, end, value = span
    raw = text[start:end]
    compact = strip_json_ws(raw)
    if compact == raw or json.loads(compact) != value:
        return None
    return _Edit(start, end, compact, path, value, False)


def _top(doc: rawjson.TopLevel) -> tuple[Members, frozenset[str]]:
    """The top-level members as the scan's spans, from the decode."""
    members = {k: (s, e, doc.values[k]) for k, (s, e) in doc.spans.items()}
    return members, rawjson.duplicate_keys(doc.values)


def _message_edits(doc: rawjson.TopLevel, span: Span) -> list[_Edit | None]:
    """The system messages' edits; the array is scanned up to its last system message."""
    messages: list[Any] = span[2]
    system = [isinstance(m, dict) and m.get("role") in SYSTEM_ROLES for m in messages]
    last = max((i for i, s in enumerate(system) if s), default=-1)
    if last < 0:
        return []
    text = doc.text
    known = doc.items.get("messages")
    if known:
        starts = [s for s, _ in known]
    else:
        starts = [e[0] for e in array_elements(text, span[0], last + 1)]
    found: list[_Edit | None] = []
    for k in range(last + 1):
        if not system[k]:
            continue
        obj = _members_at(text, starts[k])
        if _get(obj, "role") is not None:
            found += _content_edits(text, _get(obj, "content"), ("messages", k, "content"))
    return found


def _tool_edits(text: str, span: Span, kind: str) -> list[_Edit | None]:
    found: list[_Edit | None] = []
    for j, tool in enumerate(array_elements(text, span[0])):
        if not isinstance(tool[2], dict):
            continue
        holder: tuple[Members, frozenset[str]] | None = _members_at(text, tool[0])
        path: Path = ("tools", j)
        if kind == "openai" and holder is not None:
            fn = _get(holder, "function")
            holder = _members_at(text, fn[0]) if fn and isinstance(fn[2], dict) else None
            path = ("tools", j, "function")
        if holder is None:
            continue
        found.append(_text_edit(text, _get(holder, "description"), (*path, "description")))
        key = "parameters" if kind == "openai" else "input_schema"
        found.append(_schema_edit(text, _get(holder, key), (*path, key)))
    return found


def _edits(doc: rawjson.TopLevel, kind: str) -> list[_Edit]:
    top = _top(doc)
    found: list[_Edit | None] = []
    if kind == "anthropic":
        found += _content_edits(doc.text, _get(top, "system"), ("system",))
    else:
        messages = _get(top, "messages")
        if messages is not None and isinstance(messages[2], list):
            found += _message_edits(doc, messages)
    tools = _get(top, "tools")
    if tools is not None and isinstance(tools[2], list):
        found += _tool_edits(doc.text, tools, kind)
    return sorted((e for e in found if e is not None), key=lambda e: e.start)


def _replaced(values: Any, path: Path, value: Any) -> Any:
    """``values`` with the value at ``path`` replaced: copies along the path only (repeated
    keys' marks kept)."""
    if not path:
        return value
    head, rest = path[0], path[1:]
    out = copy.copy(values)
    out[head] = _replaced(values[head], rest, value)
    return out


def compact_doc(doc: rawjson.TopLevel, schema: object) -> tuple[rawjson.TopLevel, int] | None:
    """The decoded body with its system prompt's and tools' JSON compacted, and the input
    tokens that saves (ICE's estimate); None when nothing changed (unsupported schema, or
    nothing to compact). See the module docstring."""
    kind = schema_kind(schema)
    if kind is None:
        return None
    try:
        edits = _edits(doc, kind)
    except (ValueError, RecursionError):
        return None
    if not edits:
        return None
    after = doc.values
    for e in edits:
        if e.changes_value:
            after = _replaced(after, e.path, e.value)
    compacted = rawjson.splice(doc, [(e.start, e.end, e.replacement) for e in edits], after)
    saved = system_tokens(doc.values, kind) - system_tokens(after, kind)
    return compacted, max(0, saved)


def compact_system_json(body: bytes, schema: object) -> tuple[bytes, int] | None:
    """``compact_doc`` on raw bytes (the CLI and tests): the new bytes and the tokens saved;
    None also for a body that is not a JSON object."""
    try:
        doc = rawjson.parse_object(body)
    except rawjson.InvalidJSON:
        return None
    got = compact_doc(doc, schema)
    return None if got is None else (got[0].text.encode("utf-8"), got[1])


def maybe_compact(
    doc: rawjson.TopLevel, schema: str, *, enabled: bool
) -> tuple[rawjson.TopLevel, tuple[tuple[str, str], ...]] | None:
    """The profile's ``compact_system_json``: the compacted body and the headers to add
    (``x-ice-compacted: tokens=<n>``), or None when the flag is off or nothing changed."""
    if not enabled:
        return None
    result = compact_doc(doc, schema)
    if result is None:
        return None
    compacted, saved = result
    return compacted, ((H_COMPACTED, f"tokens={saved}"),)
