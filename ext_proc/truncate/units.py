"""A chat request as turns: the units that truncation keeps or drops whole (pure).

A *turn* starts at a user message (for Anthropic, a user message that is not only
``tool_result`` blocks) and runs to the next one: the question, the assistant's answer and
any tool calls and results between them. Dropping whole turns keeps a conversation's
structure: user/assistant alternation survives, and a tool call travels with its result.

Units and why some must stay (``Unit.keep``):
- ``system``: OpenAI ``system``/``developer`` messages, each its own unit wherever it stands
  (Anthropic's top-level ``system`` is outside ``messages`` and never touched);
- ``current``: the last turn, which holds the latest user message (the question);
- ``recent``: the ``keep_last_turns`` turns before it;
- ``pinned``: the first ``pin_first_turns`` turns, turns holding a message whose role is in
  ``pin_roles`` or whose OpenAI ``name`` is in ``pin_names``;
- ``unknown_role``: a message whose role ICE does not know stays, in place (its meaning is
  the backend's business);
- ``None``: droppable.
Messages before the first user message (an assistant greeting, say) form a leading unit.
A tool result whose call sits in an earlier unit (a malformed but possible order) merges all
units from the call's to the result's, so the pair cannot be split; an orphaned tool result
(no call anywhere before it) stays inside its turn, never made worse than it came.

Tokens per message use the same estimator as the schema adapters (``ext_proc.schemas.estimate``):
``PER_MESSAGE_TOKENS`` + the content's text + tool-call names and arguments. The texts
embedded for a message are its text parts, tool-call names/arguments and tool-result text;
non-text parts (images, documents) are counted in ``non_text_parts`` and go with their
message.

Invariant: ``conversation_of`` never edits the body; unit indexes are ascending and cover
every message exactly once.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ext_proc.media import MediaCost
from ext_proc.schemas.base import DEFAULT_MEDIA, BadRequest, text_of_content
from ext_proc.schemas.estimate import PER_MESSAGE_TOKENS, REPLY_PRIMER_TOKENS
from ext_proc.schemas.openai import tool_call_tokens

__all__ = ["Conversation", "TurnRules", "Unit", "conversation_of", "message_text"]

_OPENAI_SYSTEM = ("system", "developer")
_OPENAI_KNOWN = ("system", "developer", "user", "assistant", "tool", "function")
_ANTHROPIC_KNOWN = ("user", "assistant")


@dataclass(frozen=True, slots=True)
class TurnRules:
    """What must stay regardless of similarity."""

    keep_last_turns: int = 2
    pin_first_turns: int = 0
    pin_roles: tuple[str, ...] = ()
    pin_names: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Unit:
    """Messages that stay or go together (``indexes`` into ``messages``, ascending)."""

    indexes: tuple[int, ...]
    tokens: int
    texts: tuple[str, ...]  # one per message, "" for a message with no text
    keep: str | None  # why it must stay (see the module docstring), None: droppable
    non_text_parts: int = 0


@dataclass(frozen=True, slots=True)
class Conversation:
    """The units of one request and what lies outside them."""

    schema: str
    query: str  # text of the latest user message ("" when it has none)
    units: tuple[Unit, ...]
    fixed_tokens: int  # reply primer and Anthropic's top-level system
    message_count: int

    @property
    def total_tokens(self) -> int:
        return self.fixed_tokens + sum(u.tokens for u in self.units)


def _content_text(content: Any) -> str:
    """The text of a content value (string or parts), parts joined by newlines."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    pieces: list[str] = []
    for part in content:
        if isinstance(part, str):
            pieces.append(part)
        elif isinstance(part, dict):
            text = part.get("text")
            if isinstance(text, str):
                pieces.append(text)
            if part.get("type") == "tool_use":
                pieces.append(_tool_text(part.get("name"), part.get("input")))
            nested = part.get("content")
            if nested is not None and nested is not content:
                pieces.append(_content_text(nested))
    return "\n".join(p for p in pieces if p)


def _tool_text(name: Any, arguments: Any) -> str:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return f"{name if isinstance(name, str) else ''}({args})"


def _non_text_parts(content: Any) -> int:
    if not isinstance(content, list):
        return 0
    return sum(
        1
        for p in content
        if isinstance(p, dict)
        and p.get("type") not in (None, "text", "tool_use", "tool_result", "input_text")
    )


def message_text(msg: dict[str, Any]) -> str:
    """The text embedded for one message: content text, then tool calls."""
    text = _content_text(msg.get("content"))
    calls = msg.get("tool_calls")
    if isinstance(calls, list):
        extra = [
            _tool_text(fn.get("name"), fn.get("arguments"))
            for c in calls
            if isinstance(c, dict) and isinstance(fn := c.get("function"), dict)
        ]
        text = "\n".join([text, *extra]) if text else "\n".join(extra)
    return text


def _message_tokens(msg: dict[str, Any], where: str, media: MediaCost) -> int:
    tokens = PER_MESSAGE_TOKENS + text_of_content(msg.get("content"), where, media)
    calls = msg.get("tool_calls")
    if isinstance(calls, list):
        tokens += tool_call_tokens(calls)  # as the OpenAI adapter counts them
    return tokens


def _call_ids(msg: dict[str, Any]) -> list[str]:
    """Tool-call ids a message opens (OpenAI ``tool_calls``, Anthropic ``tool_use``)."""
    ids: list[str] = []
    calls = msg.get("tool_calls")
    if isinstance(calls, list):
        ids.extend(c["id"] for c in calls if isinstance(c, dict) and isinstance(c.get("id"), str))
    content = msg.get("content")
    if isinstance(content, list):
        ids.extend(
            p["id"]
            for p in content
            if isinstance(p, dict) and p.get("type") == "tool_use" and isinstance(p.get("id"), str)
        )
    return ids


def _result_ids(msg: dict[str, Any]) -> list[str]:
    """Tool-call ids a message answers (OpenAI ``tool`` role, Anthropic ``tool_result``)."""
    ids: list[str] = []
    if isinstance(msg.get("tool_call_id"), str):
        ids.append(msg["tool_call_id"])
    content = msg.get("content")
    if isinstance(content, list):
        ids.extend(
            p["tool_use_id"]
            for p in content
            if isinstance(p, dict)
            and p.get("type") == "tool_result"
            and isinstance(p.get("tool_use_id"), str)
        )
    return ids


def _only_tool_results(content: Any) -> bool:
    return (
        isinstance(content, list)
        and bool(content)
        and all(isinstance(p, dict) and p.get("type") == "tool_result" for p in content)
    )


@dataclass(slots=True)
class _Draft:
    indexes: list[int]
    turn: bool  # a user turn (or the leading unit) rather than a standalone message
    keep: str | None = None


def conversation_of(
    schema: str, body: dict[str, Any], rules: TurnRules, media: MediaCost = DEFAULT_MEDIA
) -> Conversation:
    """Split a chat body (``openai.chat`` or ``anthropic.messages``) into units.

    Raises ``BadRequest`` when ``messages`` is not an array of objects (the adapters have
    already refused such bodies; this guard keeps the function total).
    """
    messages = body.get("messages")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise BadRequest("'messages' must be an array of objects", param="messages")
    anthropic = schema == "anthropic.messages"
    known = _ANTHROPIC_KNOWN if anthropic else _OPENAI_KNOWN
    fixed = REPLY_PRIMER_TOKENS
    if anthropic and body.get("system") is not None:
        fixed += PER_MESSAGE_TOKENS + text_of_content(body.get("system"), "system", media)

    drafts: list[_Draft] = []
    current: _Draft | None = None
    unit_of_call: dict[str, int] = {}
    last_user = -1
    for i, msg in enumerate(messages):
        role = msg.get("role")
        if not isinstance(role, str) or role not in known:
            drafts.append(_Draft([i], turn=False, keep="unknown_role"))
            continue
        if not anthropic and role in _OPENAI_SYSTEM:
            drafts.append(_Draft([i], turn=False, keep="system"))
            continue
        starts_turn = role == "user" and not (anthropic and _only_tool_results(msg.get("content")))
        if starts_turn:
            last_user = i
            current = _Draft([i], turn=True)
            drafts.append(current)
        elif current is None:
            current = _Draft([i], turn=True)  # the leading unit
            drafts.append(current)
        else:
            current.indexes.append(i)
        here = len(drafts) - 1 if drafts[-1] is current else drafts.index(current)
        for rid in _result_ids(msg):
            opened = unit_of_call.get(rid)
            if opened is not None and opened < here:
                _merge(drafts, opened, here, unit_of_call)
                current = drafts[opened]
                here = opened
        for cid in _call_ids(msg):
            unit_of_call[cid] = here

    _mark_keeps(drafts, messages, rules, last_user)
    units = tuple(_unit(d, messages, media) for d in drafts)
    query = message_text(messages[last_user]) if last_user >= 0 else ""
    return Conversation(schema, query, units, fixed, len(messages))


def _merge(drafts: list[_Draft], lo: int, hi: int, unit_of_call: dict[str, int]) -> None:
    """Merge drafts lo..hi into drafts[lo] (keeps of standalone messages survive as keeps)."""
    merged = drafts[lo]
    keep = merged.keep
    for d in drafts[lo + 1 : hi + 1]:
        merged.indexes.extend(d.indexes)
        keep = keep or d.keep
    merged.indexes.sort()
    merged.keep = keep
    merged.turn = True
    del drafts[lo + 1 : hi + 1]
    for cid, u in list(unit_of_call.items()):
        if u > hi:
            unit_of_call[cid] = u - (hi - lo)
        elif u >= lo:
            unit_of_call[cid] = lo


def _mark_keeps(
    drafts: list[_Draft], messages: list[Any], rules: TurnRules, last_user: int
) -> None:
    turns = [d for d in drafts if d.turn]
    if turns:  # no user message at all: the last unit stands for the current turn
        cur = next((k for k, d in enumerate(turns) if last_user in d.indexes), len(turns) - 1)
        for k, d in enumerate(turns):
            if k >= cur:
                d.keep = d.keep or "current"
            elif k >= cur - rules.keep_last_turns:
                d.keep = d.keep or "recent"
    user_turns = [d for d in turns if messages[d.indexes[0]].get("role") == "user"]
    for d in user_turns[: rules.pin_first_turns]:
        d.keep = d.keep or "pinned"
    if rules.pin_roles or rules.pin_names:
        for d in drafts:
            if d.keep is None and any(
                messages[i].get("role") in rules.pin_roles
                or messages[i].get("name") in rules.pin_names
                for i in d.indexes
            ):
                d.keep = "pinned"


def _unit(draft: _Draft, messages: list[Any], media: MediaCost) -> Unit:
    tokens = 0
    texts: list[str] = []
    non_text = 0
    for i in draft.indexes:
        msg = messages[i]
        tokens += _message_tokens(msg, f"messages[{i}].content", media)
        texts.append(message_text(msg))
        non_text += _non_text_parts(msg.get("content"))
    return Unit(tuple(draft.indexes), tokens, tuple(texts), draft.keep, non_text)


def droppable(units: Iterable[Unit]) -> list[int]:
    """Positions of the units that may be dropped."""
    return [k for k, u in enumerate(units) if u.keep is None]
