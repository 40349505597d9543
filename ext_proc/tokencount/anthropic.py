"""Anthropic ``/v1/messages`` → OpenAI chat messages, as vLLM's Anthropic endpoint does it.

Job: ``anthropic_to_chat`` builds the chat messages vLLM builds: top-level ``system`` text
blocks joined with ``""`` into one leading system message (billing-header blocks dropped);
text blocks of a message kept as parts (so the chat shaping joins them with ``"\\n"``), a
single one as a string; ``thinking`` blocks → ``reasoning``; ``tool_use`` → ``tool_calls``;
a user's ``tool_result`` → a ``tool`` message before it; inline system messages merged into
the leading one when the template rejects a system message after the first turn
(``system_first``). ``_anthropic_tools`` turns Anthropic tools into OpenAI function tools.
The result is then shaped like any chat request (``shaping``).

Invariants: functions of their input only; the request's objects are never mutated; a
malformed message raises ``TokenCountError`` and nothing else.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ext_proc.tokencount.shaping import _BILLING_HEADER, _tool_dicts
from ext_proc.tokencount.spec import TokenCountError


def _anthropic_text(value: Any, *, inline: bool) -> str | None:
    """System text: a string, or text blocks joined with "" (billing-header blocks dropped).
    An inline system message that is a billing-header string is dropped whole; a top-level
    one is kept here and loses its first line in the chat parse, as in vLLM."""
    if isinstance(value, str):
        return None if inline and value.startswith(_BILLING_HEADER) else value
    if not isinstance(value, list):
        return None
    parts = []
    for block in value:
        if isinstance(block, dict) and block.get("type") == "text":
            text = block.get("text")
            if isinstance(text, str) and text and not text.startswith(_BILLING_HEADER):
                parts.append(text)
    return "".join(parts) if parts else None


def _anthropic_tool_result(block: dict[str, Any], out: list[dict[str, Any]]) -> None:
    content = block.get("content")
    text = ""
    images: list[dict[str, Any]] = []
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        texts = []
        for item in content:
            if not isinstance(item, dict):
                continue
            if item.get("type") == "text":
                texts.append(str(item.get("text", "")))
            elif item.get("type") == "image":
                images.append({"type": "image_url", "image_url": {"url": "<image>"}})
        text = "\n".join(texts)
    out.append({"role": "tool", "tool_call_id": block.get("tool_use_id") or "", "content": text})
    if images:
        out.append({"role": "user", "content": images})


def anthropic_to_chat(
    messages: Sequence[Any], system: Any = None, *, system_first: bool = False
) -> list[dict[str, Any]]:
    """Anthropic ``system`` + ``messages`` as the OpenAI chat messages vLLM's ``/v1/messages``
    builds from them (``system_first``: merge inline system messages into the leading one)."""
    out: list[dict[str, Any]] = []
    leading = _leading_system(messages, system, system_first=system_first)
    if leading:
        out.append({"role": "system", "content": leading})
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise TokenCountError(f"messages[{i}]: must be an object with a role")
        role = msg["role"]
        content = msg.get("content")
        if role == "system":
            text = _anthropic_text(content, inline=True)
            if text and not system_first:
                out.append({"role": "system", "content": text})
            continue
        chat: dict[str, Any] = {"role": role}
        if isinstance(content, str):
            chat["content"] = content
        elif isinstance(content, list):
            _add_blocks(chat, content, f"messages[{i}].content", out)
        if not (role == "user" and "content" not in chat):
            out.append(chat)
    return out


def _leading_system(messages: Sequence[Any], system: Any, *, system_first: bool) -> str:
    """The leading system message's text: the top-level ``system``, then (``system_first``)
    the inline system messages' text; "" when there is none."""
    system_parts = []
    leading = _anthropic_text(system, inline=False) if system else None
    if leading:
        system_parts.append(leading)
    if system_first:
        for msg in messages:
            if isinstance(msg, dict) and msg.get("role") == "system":
                text = _anthropic_text(msg.get("content"), inline=True)
                if text:
                    system_parts.append(text)
    return "".join(system_parts)


def _add_blocks(
    chat: dict[str, Any], blocks: list[Any], where: str, out: list[dict[str, Any]]
) -> None:
    """A message's content blocks into ``chat``: text and image parts, ``reasoning`` and
    ``tool_calls``; a user's tool results go to ``out`` as ``tool`` messages before it."""
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    for block in blocks:
        if not isinstance(block, dict):
            raise TokenCountError(f"{where}: blocks must be objects")
        kind = block.get("type")
        if kind == "text" and block.get("text"):
            parts.append({"type": "text", "text": block["text"]})
        elif kind == "image" and block.get("source"):
            parts.append({"type": "image_url", "image_url": {"url": "<image>"}})
        elif kind == "thinking" and block.get("thinking") is not None:
            reasoning.append(str(block["thinking"]))
        elif kind == "tool_use":
            calls.append(_tool_call(block))
        elif kind == "tool_result":
            if chat["role"] == "user":
                _anthropic_tool_result(block, out)
            else:
                result = str(block.get("content")) if block.get("content") else ""
                parts.append({"type": "text", "text": f"Tool result: {result}"})
    if reasoning:
        chat["reasoning"] = "".join(reasoning)
    if calls:
        chat["tool_calls"] = calls
    if parts:
        only_text = len(parts) == 1 and parts[0]["type"] == "text"
        chat["content"] = parts[0]["text"] if only_text else parts


def _tool_call(block: dict[str, Any]) -> dict[str, Any]:
    """A ``tool_use`` block as an OpenAI tool call."""
    arguments = json.dumps(block.get("input") or {})
    return {
        "id": block.get("id") or "call",
        "type": "function",
        "function": {"name": block.get("name") or "", "arguments": arguments},
    }


def _anthropic_tools(tools: Any) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise TokenCountError("tools: must be an array")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            raise TokenCountError(f"tools[{i}]: must be an object with a name")
        fn = {
            "name": tool["name"],
            "description": tool.get("description"),
            "parameters": tool.get("input_schema"),
            "strict": tool.get("strict"),
            "defer_loading": tool.get("defer_loading"),
        }
        out.append({"type": "function", "function": fn})
    return _tool_dicts(out)
