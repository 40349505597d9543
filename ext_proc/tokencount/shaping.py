"""Conversation shaping: OpenAI chat messages as vLLM hands them to the chat template.

Job: vLLM's ``parse_chat_messages`` for text content. String content stays as is; content
parts are joined with ``"\\n"`` (empty texts dropped) for "string"-format templates, or kept
as ``{"type": "text", "text": ...}`` dicts (with their unknown fields) for "openai"-format
ones; ``None`` content is ``""``; Claude Code's billing-header line is dropped from system
text; assistant tool-call arguments are parsed into objects; ``developer`` becomes
``system`` (merged into one leading message) for templates that never name it; ``tools``
become vLLM's pydantic dump. Also transformers' ``continue_final_message``: tag the final
message's text, render, cut the text at the tag. And the request fields that change the prompt
(``_flag``, ``_template_kwargs``: what vLLM adds from ``reasoning_effort`` and ``documents``).

Invariants: functions of their input only; the request's own objects are never mutated
(messages, parts and tool calls are rebuilt; only the conversation built here is changed in
place). Non-text content (images, audio, video) and malformed messages raise
``TokenCountError`` and nothing else.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

from ext_proc.tokencount.spec import TokenCountError

# Content-part types vLLM reads as text, and the key holding the text.
_TEXT_PARTS = {
    "text": "text",
    "input_text": "text",
    "output_text": "text",
    "refusal": "refusal",
    "thinking": "thinking",
}
# Part fields vLLM knows; others ride along on text parts of "openai"-format templates.
_KNOWN_PART_FIELDS = frozenset(
    {
        "audio_embeds",
        "audio_url",
        "closed",
        "data",
        "file",
        "image_embeds",
        "image_pil",
        "image_url",
        "input_audio",
        "name",
        "prompt_cache_breakpoint",
        "refusal",
        "text",
        "thinking",
        "type",
        "uuid",
        "video_embeds",
        "video_url",
    }
)
# Claude Code's per-request attribution line, dropped from system text by vLLM.
_BILLING_HEADER = "x-anthropic-billing-header"
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


# --- conversation shaping (vLLM's parse_chat_messages, text only) ---------------------------


def _strip_billing(text: str) -> str | None:
    if not text.startswith(_BILLING_HEADER):
        return text
    rest = text.partition("\n")[2]
    return rest or None


def _part_text(part: Any, where: str) -> tuple[str, dict[str, Any]] | None:
    """The text of one content part and its extra fields, or None for a part vLLM skips."""
    if isinstance(part, str):
        return part, {}
    if not isinstance(part, dict):
        raise TokenCountError(f"{where}: a content part must be a string or an object")
    kind = part.get("type")
    key = _TEXT_PARTS.get(kind) if isinstance(kind, str) else None
    if key is None:
        raise TokenCountError(f"{where}: content part of type {kind!r} is not text")
    text = part.get(key)
    if text is None:
        return None
    if not isinstance(text, str):
        raise TokenCountError(f"{where}.{key}: must be a string")
    return text, {k: v for k, v in part.items() if k not in _KNOWN_PART_FIELDS}


def _conversation_message(
    msg: Any, where: str, content_format: Literal["string", "openai"]
) -> dict[str, Any]:
    if not isinstance(msg, dict):
        raise TokenCountError(f"{where}: a message must be an object")
    role = msg.get("role")
    if not isinstance(role, str):
        raise TokenCountError(f"{where}.role: must be a string")
    content = msg.get("content")
    common = content_format == "string" and role in ("user", "assistant") and len(msg) == 2
    if common and type(content) is str:
        return {"role": role, "content": content}  # the common turn: what the rest would build
    parts: list[Any]
    if content is None:
        parts = []
    elif isinstance(content, str):
        parts = [content]
    elif isinstance(content, list):
        parts = content
    else:
        raise TokenCountError(f"{where}.content: must be a string, an array or null")
    texts: list[tuple[str, dict[str, Any]]] = []
    for i, part in enumerate(parts):
        got = _part_text(part, f"{where}.content[{i}]")
        if got is None:
            continue
        text, extra = got
        if role == "system":
            stripped = _strip_billing(text)
            if stripped is None:
                continue
            text = stripped
        texts.append((text, extra))
    out: dict[str, Any] = {"role": role}
    if content_format == "openai":
        out["content"] = [{"type": "text", "text": t, **extra} for t, extra in texts]
    else:
        out["content"] = "\n".join(t for t, _ in texts if t)
    if role == "assistant":
        calls = msg.get("tool_calls")
        if calls is not None:
            out["tool_calls"] = list(calls) if isinstance(calls, list) else calls
        reasoning = msg.get("reasoning")
        if reasoning is not None:
            out["reasoning"] = reasoning
            out["reasoning_content"] = reasoning
    elif role == "tool":
        if "tool_call_id" in msg:
            out["tool_call_id"] = msg["tool_call_id"]
        if content_format == "openai" and isinstance(out["content"], list):
            out["content"] = "\n".join(p["text"] for p in out["content"])
    for key in ("name", "task"):
        if isinstance(msg.get(key), str):
            out[key] = msg[key]
    if role == "developer":
        out["tools"] = msg.get("tools")
    return out


def _parse_arguments(fn: dict[str, Any]) -> None:
    raw = fn.get("arguments")
    if not raw:
        fn["arguments"] = {}
        return
    if isinstance(raw, dict):
        return
    parsed: Any = raw
    if isinstance(raw, str):
        try:
            parsed = json.loads(raw)
        except ValueError:  # vLLM coerces malformed arguments to {}
            parsed = None
    fn["arguments"] = parsed if isinstance(parsed, dict) else {}


def _postprocess(conversation: list[dict[str, Any]]) -> None:
    """Assistant tool calls as templates expect them: arguments parsed into objects."""
    for i, msg in enumerate(conversation):
        if msg["role"] != "assistant" or "tool_calls" not in msg:
            continue
        calls = msg["tool_calls"]
        if not isinstance(calls, list):
            continue
        if not calls:
            del msg["tool_calls"]
            continue
        copied = []
        for call in calls:
            fn = call.get("function") if isinstance(call, dict) else None
            if not isinstance(fn, dict) or call.get("type", "function") != "function":
                raise TokenCountError(f"messages[{i}].tool_calls: only function calls are counted")
            fn = dict(fn)
            _parse_arguments(fn)
            copied.append({**call, "function": fn})
        msg["tool_calls"] = copied


def _developer_to_system(conversation: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """vLLM's fallback for templates that never mention ``developer``: developer → system,
    and all system messages merged into one leading message when they are not already one."""
    converted = []
    for msg in conversation:
        if msg["role"] == "developer":
            converted.append({**{k: v for k, v in msg.items() if k != "tools"}, "role": "system"})
        else:
            converted.append(msg)
    system_texts: list[str] = []
    rest: list[dict[str, Any]] = []
    merge = False
    for i, msg in enumerate(converted):
        if msg["role"] != "system":
            rest.append(msg)
            continue
        if i > 0 or system_texts:
            merge = True
        content = msg.get("content", "")
        if isinstance(content, list):
            content = "\n".join(
                p["text"] if isinstance(p, dict) else str(p)
                for p in content
                if isinstance(p, str) or (isinstance(p, dict) and "text" in p)
            )
        if content:
            system_texts.append(content)
    if not merge:
        return converted
    return [{"role": "system", "content": "\n\n".join(system_texts)}, *rest]


def _tool_dicts(tools: Any) -> list[dict[str, Any]] | None:
    """OpenAI ``tools`` as vLLM hands them to the template (its pydantic dump)."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise TokenCountError("tools: must be an array")
    out = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise TokenCountError(f"tools[{i}]: must be a function tool with a name")
        dumped: dict[str, Any] = {
            "name": fn["name"],
            "description": fn.get("description"),
            "parameters": fn.get("parameters"),
        }
        for key in ("strict", "defer_loading"):
            if fn.get(key) is not None:
                dumped[key] = fn[key]
        if tool.get("defer_loading") is not None and "defer_loading" not in dumped:
            dumped["defer_loading"] = tool["defer_loading"]
        entry: dict[str, Any] = {"type": "function", "function": dumped}
        if tool.get("defer_loading") is not None:
            entry["defer_loading"] = tool["defer_loading"]
        out.append(entry)
    return out


# --- continue_final_message, as transformers does it ----------------------------------------------


def _tag_final_message(conversation: list[dict[str, Any]]) -> str:
    """Mark the final message's text for ``continue_final_message`` (as transformers does)."""
    if not conversation:
        raise TokenCountError("continue_final_message: there is no final message")
    last = conversation[-1]
    content = last.get("content")
    if isinstance(content, list):
        for part in reversed(content):
            if isinstance(part, dict) and "text" in part:
                final = str(part["text"])
                part["text"] = final + _CONTINUE_TAG
                return final
        raise TokenCountError("continue_final_message: the final message has no text")
    if not isinstance(content, str):
        raise TokenCountError("continue_final_message: the final message has no content")
    last["content"] = content + _CONTINUE_TAG
    return content


def _cut_at_tag(text: str, final: str) -> str:
    tag = _CONTINUE_TAG.strip()
    if final.strip() not in text or tag not in text:
        raise TokenCountError("continue_final_message: the template dropped the final message")
    at = text.rindex(tag)
    if text[at : at + len(_CONTINUE_TAG)] == _CONTINUE_TAG:
        return text[:at]
    return text[:at].rstrip()


# --- request fields that change the prompt


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _flag(body: Mapping[str, Any], key: str, default: bool) -> bool:
    value = body.get(key)
    return value if isinstance(value, bool) else default


def _template_kwargs(body: Mapping[str, Any], effort: Any) -> dict[str, Any]:
    """``chat_template_kwargs`` with what vLLM adds from the request (unset when None)."""
    given = body.get("chat_template_kwargs")
    kwargs: dict[str, Any] = dict(given) if isinstance(given, dict) else {}
    if effort is not None and effort != "auto":
        kwargs.setdefault("enable_thinking", effort != "none")
        kwargs["reasoning_effort"] = effort
    documents = body.get("documents")
    if documents is not None:
        kwargs["documents"] = documents
    return kwargs
