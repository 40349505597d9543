"""System-prompt complexity score: how much of a prompt is system prompt, and how much of
that is structured data.

Job: for OpenAI chat (``messages`` of role ``system`` / ``developer``, and ``tools``) and
Anthropic messages (``system``, a string or text blocks, and ``tools``), score a decoded
body. Taking the insignificant whitespace out of that structured data is
``ext_proc.sysprompt.compact``'s job.

Score (see docs/sysprompt.md), tokens from ICE's own estimator (``ext_proc/schemas/estimate.py``, as
the adapters count them):
    system_tokens     = Σ system messages (PER_MESSAGE_TOKENS + their content's tokens)
                        + json_tokens(tools)
    structured_tokens = Σ over system texts of the tokens of their embedded JSON spans
                        (capped at the text's own tokens) + json_tokens(tools)
    system_share      = min(1, system_tokens / input_tokens)       (0 when input_tokens = 0)
    structured_share  = min(1, structured_tokens / system_tokens)  (0 when no system prompt)
    score             = system_share × (0.5 + 0.5 × structured_share)    in [0, 1]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ext_proc.schemas.base import BadRequest, RequestFeatures, json_tokens, text_of_content
from ext_proc.schemas.estimate import PER_MESSAGE_TOKENS, estimate_text_tokens
from ext_proc.sysprompt.scan import compact_text, embedded_json_spans

__all__ = [
    "SYSTEM_ROLES",
    "SystemPromptScore",
    "schema_kind",
    "system_prompt_complexity",
    "system_tokens",
]

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


def system_tokens(body: dict[str, Any], kind: str) -> int:
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
    system = system_tokens(body_values, kind)
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
