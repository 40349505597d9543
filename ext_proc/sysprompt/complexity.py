"""System-prompt complexity score, and lossless compaction of the JSON in system prompts.

Job: for OpenAI chat (``messages`` of role ``system`` / ``developer``, and ``tools``) and
Anthropic messages (``system``, a string or text blocks, and ``tools``), measure how much of
the prompt is system prompt and how much of that is structured data, and optionally take
the insignificant whitespace out of that structured data without changing what it means.

Score (see docs/sysprompt.md), tokens from ICE's own estimator (``ext_proc/schemas/estimate.py``, as
the adapters count them):
    system_tokens     = Σ system messages (PER_MESSAGE_TOKENS + their content's tokens)
                        + json_tokens(tools)
    structured_tokens = Σ over system texts of the tokens of their embedded JSON spans
                        (capped at the text's own tokens) + json_tokens(tools)
    system_share      = min(1, system_tokens / input_tokens)       (0 when input_tokens = 0)
    structured_share  = min(1, structured_tokens / system_tokens)  (0 when no system prompt)
    score             = system_share × (0.5 + 0.5 × structured_share)    in [0, 1]

Compaction (``compact_system_json``) edits, in the body's own bytes: the text of every
system message / system block and every tool's ``description`` (embedded JSON spans only),
and every tool's schema value (OpenAI ``function.parameters``, Anthropic ``input_schema``).
It only deletes JSON whitespace outside JSON strings (``ext_proc.sysprompt.scan``), so the
result is lossless (same values, key order, number spellings, escapes), idempotent and
deterministic; every byte outside the edited values is kept. Objects that repeat a key the
walk reads are left alone. Tokens saved are the drop in ICE's input-token estimate, which
is exactly the drop in the system texts' and tool descriptions' estimates: whitespace in a
tool schema saves bytes but no estimated tokens (ICE, and the servers' chat templates,
count a schema from its parsed value, not its spacing).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ext_proc.schemas import rawjson
from ext_proc.schemas.base import BadRequest, RequestFeatures, json_tokens, text_of_content
from ext_proc.schemas.estimate import PER_MESSAGE_TOKENS, estimate_text_tokens
from ext_proc.sysprompt.scan import (
    Members,
    array_elements,
    compact_text,
    delete_in_literal,
    embedded_json_spans,
    object_members,
    strip_json_ws,
    top_members,
)

__all__ = [
    "H_COMPACTED",
    "SYSTEM_ROLES",
    "SystemPromptScore",
    "compact_system_json",
    "maybe_compact",
    "schema_kind",
    "system_prompt_complexity",
]

H_COMPACTED = "x-ice-compacted"
SYSTEM_ROLES = frozenset(("system", "developer"))

_KINDS = {
    "openai.chat": "openai",
    "openai_chat": "openai",
    "anthropic.messages": "anthropic",
    "anthropic_messages": "anthropic",
}


def schema_kind(schema: object) -> str | None:
    """``"openai"`` or ``"anthropic"`` for a supported schema, given as an adapter, its name
    (``openai.chat``) or its policy name (``openai_chat``); None for every other schema."""
    name = schema if isinstance(schema, str) else getattr(schema, "name", None)
    return _KINDS.get(name) if isinstance(name, str) else None


@dataclass(frozen=True, slots=True)
class SystemPromptScore:
    """How much of a request is system prompt, and how structured it is (tokens, shares)."""

    input_tokens: int  # the request's input-token estimate (the denominator)
    system_tokens: int  # system messages (framing included) + tool definitions
    structured_tokens: int  # embedded JSON in system texts + tool definitions
    tool_tokens: int  # tool definitions alone
    compactable_tokens: int  # what compact_system_json would save (estimate)
    system_share: float  # 0..1
    structured_share: float  # 0..1
    score: float  # system_share × (0.5 + 0.5 × structured_share), 0..1


# --- reading the decoded body -------------------------------------------------------------


def _texts_of(content: Any) -> list[str]:
    """The plain texts of a system content: a string, or the ``text`` of its text parts."""
    if isinstance(content, str):
        return [content]
    out: list[str] = []
    if isinstance(content, list):
        for part in content:
            if isinstance(part, str):
                out.append(part)
            elif (
                isinstance(part, dict)
                and part.get("type", "text") == "text"
                and isinstance(part.get("text"), str)
            ):
                out.append(part["text"])
    return out


def _content_tokens(content: Any) -> int:
    try:
        return text_of_content(content, "system")
    except BadRequest:
        return json_tokens(content)


def _system_contents(body: dict[str, Any], kind: str) -> list[Any]:
    if kind == "anthropic":
        system = body.get("system")
        return [] if system is None else [system]
    messages = body.get("messages")
    if not isinstance(messages, list):
        return []
    return [
        m.get("content") for m in messages if isinstance(m, dict) and m.get("role") in SYSTEM_ROLES
    ]


def _tool_holders(tool: Any, kind: str) -> dict[str, Any] | None:
    """The object holding a tool's ``description`` and schema (OpenAI: ``function``)."""
    if not isinstance(tool, dict):
        return None
    holder = tool.get("function") if kind == "openai" else tool
    return holder if isinstance(holder, dict) else None


def _compacted_tools(tools: Any, kind: str) -> Any:
    """``tools`` with each description's embedded JSON compacted (decoded values)."""
    if not isinstance(tools, list):
        return tools
    out: list[Any] = []
    for tool in tools:
        holder = _tool_holders(tool, kind)
        desc = holder.get("description") if holder is not None else None
        if holder is None or not isinstance(desc, str):
            out.append(tool)
            continue
        new_holder = {**holder, "description": compact_text(desc)[0]}
        out.append({**tool, "function": new_holder} if kind == "openai" else new_holder)
    return out


def _system_tokens(body: dict[str, Any], kind: str) -> int:
    contents = _system_contents(body, kind)
    tokens = sum(PER_MESSAGE_TOKENS + _content_tokens(c) for c in contents)
    tools = body.get("tools")
    return tokens + (json_tokens(tools) if tools is not None else 0)


def system_prompt_complexity(
    body_values: dict[str, Any], adapter_schema: object, estimate: int | RequestFeatures
) -> SystemPromptScore:
    """Score a decoded request body (see the module docstring for the formulas).

    ``adapter_schema``: the adapter, its name or its policy name (other schemas score 0);
    ``estimate``: the request's input tokens (``RequestFeatures`` or the number), which
    should come from the same estimator for the shares to mean what they say."""
    input_tokens = estimate.input_tokens if isinstance(estimate, RequestFeatures) else estimate
    kind = schema_kind(adapter_schema)
    if kind is None:
        return SystemPromptScore(max(0, input_tokens), 0, 0, 0, 0, 0.0, 0.0, 0.0)
    structured = compactable = 0
    for content in _system_contents(body_values, kind):
        for text in _texts_of(content):
            own = estimate_text_tokens(text)
            spans = sum(estimate_text_tokens(text[a:b]) for a, b, _ in embedded_json_spans(text))
            structured += min(own, spans)
            compactable += own - estimate_text_tokens(compact_text(text)[0])
    tools = body_values.get("tools")
    tool_tokens = json_tokens(tools) if tools is not None else 0
    if tools is not None:
        compactable += tool_tokens - json_tokens(_compacted_tools(tools, kind))
    structured += tool_tokens
    system = _system_tokens(body_values, kind)
    system_share = min(1.0, system / input_tokens) if input_tokens > 0 else 0.0
    structured_share = min(1.0, structured / system) if system > 0 else 0.0
    return SystemPromptScore(
        input_tokens=max(0, input_tokens),
        system_tokens=system,
        structured_tokens=min(structured, system),
        tool_tokens=tool_tokens,
        compactable_tokens=compactable,
        system_share=system_share,
        structured_share=structured_share,
        score=system_share * (0.5 + 0.5 * structured_share),
    )


# --- editing the raw body -----------------------------------------------------------------

Edit = tuple[int, int, str]  # (start, end, replacement) in the body's text


def _get(obj: tuple[Members, frozenset[str]], key: str) -> tuple[int, int, Any] | None:
    """A member's span, or None when absent or repeated (a repeated key is left alone)."""
    members, repeated = obj
    return None if key in repeated else members.get(key)


def _members_at(text: str, start: int) -> tuple[Members, frozenset[str]]:
    members, repeated, _ = object_members(text, start)
    return members, repeated


def _text_edit(text: str, span: tuple[int, int, Any] | None) -> Edit | None:
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
    return start, end, literal


def _content_edits(text: str, span: tuple[int, int, Any] | None) -> list[Edit | None]:
    if span is None:
        return []
    if isinstance(span[2], str):
        return [_text_edit(text, span)]
    if not isinstance(span[2], list):
        return []
    edits: list[Edit | None] = []
    for part in array_elements(text, span[0]):
        if isinstance(part[2], str):
            edits.append(_text_edit(text, part))
        elif isinstance(part[2], dict) and part[2].get("type", "text") == "text":
            obj = _members_at(text, part[0])
            kind = _get(obj, "type")
            if kind is None and "type" in part[2]:
                continue  # a repeated "type"
            edits.append(_text_edit(text, _get(obj, "text")))
    return edits


def _schema_edit(text: str, span: tuple[int, int, Any] | None) -> Edit | None:
    if span is None:
        return None
    start, end, value = span
    raw = text[start:end]
    compact = strip_json_ws(raw)
    if compact == raw or json.loads(compact) != value:
        return None
    return start, end, compact


def _edits(text: str, kind: str) -> list[Edit]:
    top = top_members(text)
    found: list[Edit | None] = []
    if kind == "anthropic":
        found += _content_edits(text, _get(top, "system"))
    else:
        messages = _get(top, "messages")
        if messages is not None and isinstance(messages[2], list):
            for msg in array_elements(text, messages[0]):
                if not isinstance(msg[2], dict) or msg[2].get("role") not in SYSTEM_ROLES:
                    continue
                obj = _members_at(text, msg[0])
                if _get(obj, "role") is not None:
                    found += _content_edits(text, _get(obj, "content"))
    tools = _get(top, "tools")
    if tools is not None and isinstance(tools[2], list):
        for tool in array_elements(text, tools[0]):
            if not isinstance(tool[2], dict):
                continue
            holder: tuple[Members, frozenset[str]] | None = _members_at(text, tool[0])
            if kind == "openai" and holder is not None:
                fn = _get(holder, "function")
                holder = _members_at(text, fn[0]) if fn and isinstance(fn[2], dict) else None
            if holder is None:
                continue
            found.append(_text_edit(text, _get(holder, "description")))
            key = "parameters" if kind == "openai" else "input_schema"
            found.append(_schema_edit(text, _get(holder, key)))
    return sorted(e for e in found if e is not None)


def compact_system_json(body: bytes, schema: object) -> tuple[bytes, int] | None:
    """The body with its system prompt's and tools' JSON compacted, and the input tokens
    that saves (ICE's estimate); None when nothing changed (unsupported schema, a body that
    is not a JSON object, or nothing to compact). See the module docstring."""
    kind = schema_kind(schema)
    if kind is None:
        return None
    try:
        text = body.decode("utf-8")
        edits = _edits(text, kind)
    except (ValueError, RecursionError):
        return None
    if not edits:
        return None
    parts: list[str] = []
    pos = 0
    for start, end, replacement in edits:
        parts.append(text[pos:start])
        parts.append(replacement)
        pos = end
    parts.append(text[pos:])
    new_body = "".join(parts).encode("utf-8")
    try:
        before = rawjson.decode_object(body)
        after = rawjson.decode_object(new_body)
    except rawjson.InvalidJSON:  # not expected: the edits keep the document valid
        return None
    saved = _system_tokens(before, kind) - _system_tokens(after, kind)
    return new_body, max(0, saved)


def maybe_compact(
    profile_flag: bool, body: bytes, schema: str
) -> tuple[bytes, list[tuple[str, str]]] | None:
    """The profile's ``compact_system_json``: the compacted body and the headers to add
    (``x-ice-compacted: tokens=<n>``), or None when the flag is off or nothing changed."""
    if not profile_flag:
        return None
    result = compact_system_json(body, schema)
    if result is None:
        return None
    new_body, saved = result
    return new_body, [(H_COMPACTED, f"tokens={saved}")]
