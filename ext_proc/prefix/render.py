"""A request body as prompt text with named sections, for prefix analysis without a template.

Job: turn one recorded request body (OpenAI chat, Anthropic messages, or a completions
``prompt`` string) into one text in the order chat templates put things, marking where each
part starts and ends, so a divergence can be named ("system prompt, character 412").

Rendering (each part is a marker line, then its content, then ``"\\n"``)::

    <|system|>\\n{system text}\\n          OpenAI system/developer messages at the start;
                                          Anthropic's top-level ``system`` (blocks joined "")
    <|tools|>\\n{json.dumps(tools)}\\n     the request's ``tools`` array as given (order and
                                          keys kept, ``ensure_ascii=False``)
    <|{role}|>\\n{content}\\n              every other message in order
    <|assistant|>\\n                       the generation prompt

Content: a string as is; a list of parts joins text parts (``text``) with ``"\\n"``, other
parts become ``<|{type}|>`` (images, audio...); assistant ``tool_calls`` / Anthropic
``tool_use`` blocks and ``tool_result`` blocks are their JSON. A ``prompt`` string (a
completions body) is the text itself, one section ``prompt``. This is the order most chat
templates (Llama 3, Qwen 2.5, Hermes) use: system, then tools, then the turns; templates
that place tools elsewhere move the tools' offsets, not which value changes.

Invariants: pure; never raises on a decoded JSON object (unknown shapes are rendered as
JSON); section spans cover the content only (markers excluded) and do not overlap.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

__all__ = ["Rendered", "Section", "render_body"]


@dataclass(frozen=True, slots=True)
class Section:
    """One part of the prompt: ``label`` (``system prompt``, ``tools``, ``message 2
    (user)``, ``last message (user)``, ``prompt``) and its content's ``[start, end)``."""

    label: str
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class Rendered:
    """The prompt text, its sections and the request's ``tools`` array (or None)."""

    text: str
    sections: tuple[Section, ...]
    tools: tuple[Any, ...] | None = None

    def section_at(self, offset: int) -> Section | None:
        """The section holding character ``offset``, or None (a marker)."""
        for s in self.sections:
            if s.start <= offset < s.end or (s.start == s.end == offset):
                return s
        return None


def _dumps(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(value)


def _content(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict):
                kind = part.get("type")
                if kind == "text" and isinstance(part.get("text"), str):
                    parts.append(part["text"])
                elif kind in ("tool_use", "tool_result"):
                    parts.append(_dumps(part))
                else:
                    parts.append(f"<|{kind if isinstance(kind, str) else 'part'}|>")
            else:
                parts.append(_dumps(part))
        return "\n".join(parts)
    return _dumps(content)


class _Builder:
    def __init__(self) -> None:
        self.chunks: list[str] = []
        self.length = 0
        self.sections: list[Section] = []

    def add(self, marker: str, label: str, content: str) -> None:
        head = f"<|{marker}|>\n"
        self.chunks.append(head)
        self.length += len(head)
        self.sections.append(Section(label, self.length, self.length + len(content)))
        self.chunks.append(content + "\n")
        self.length += len(content) + 1


def render_body(body: Any) -> Rendered:
    """Render a decoded request body (see the module docstring)."""
    if not isinstance(body, dict):
        text = _dumps(body)
        return Rendered(text, (Section("prompt", 0, len(text)),))
    if isinstance(body.get("prompt"), str) and "messages" not in body:
        text = body["prompt"]
        return Rendered(text, (Section("prompt", 0, len(text)),))
    b = _Builder()
    messages = body.get("messages")
    messages = list(messages) if isinstance(messages, list) else []
    system = body.get("system")
    if system is not None:
        if isinstance(system, list):
            text = "".join(s.get("text", "") if isinstance(s, dict) else str(s) for s in system)
        else:
            text = system if isinstance(system, str) else _dumps(system)
        b.add("system", "system prompt", text)
    else:
        lead: list[str] = []
        while (
            messages
            and isinstance(messages[0], dict)
            and messages[0].get("role")
            in (
                "system",
                "developer",
            )
        ):
            lead.append(_content(messages.pop(0).get("content")))
        if lead:
            b.add("system", "system prompt", "\n".join(lead))
    tools = body.get("tools")
    if isinstance(tools, list) and tools:
        b.add("tools", "tools", _dumps(tools))
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            b.add("message", f"message {i + 1}", _dumps(message))
            continue
        role = message.get("role")
        role = role if isinstance(role, str) else "message"
        text = _content(message.get("content"))
        if message.get("tool_calls") is not None:
            text = (text + "\n" if text else "") + _dumps(message["tool_calls"])
        last = i == len(messages) - 1
        b.add(role, f"last message ({role})" if last else f"message {i + 1} ({role})", text)
    b.chunks.append("<|assistant|>\n")
    kept = tuple(tools) if isinstance(tools, list) and tools else None
    return Rendered("".join(b.chunks), tuple(b.sections), kept)
