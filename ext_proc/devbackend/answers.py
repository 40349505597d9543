"""The dev backend's answers: request parsing and the OpenAI/Anthropic replies and SSE events.

- ``_parse_chat`` / ``_parse_completion`` / ``_parse_message``: a body → ``(prompt_tokens,
  limit)``; prompt tokens are whitespace-separated words (+4 per chat message), the limit is
  ``max_completion_tokens``/``max_tokens`` (default ``MAX_WORDS``; required for messages).
- ``_chat`` / ``_completion`` / ``_message``: a ``_Gen`` → ``Rendered``, the non-streamed reply
  and the SSE events of the streamed one (``_sse``), each in the endpoint's own format;
  ``stream_options.include_usage`` adds OpenAI's final usage chunk.
- ``_openai_error`` / ``_anthropic_error``: a 400 in each API's error format; ``_Invalid`` is
  what parsing raises to ask for one.

Invariants: deterministic apart from ids and ``created`` (``uuid4``, the clock): ``n`` words
``"tok0 tok1 ..."`` give the same text, usage and finish reason every time, and the streamed
events concatenate to the non-streamed reply; Anthropic's stop reason is "max_tokens" iff
OpenAI's would be "length". No I/O and no server state here.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, NamedTuple

from aiohttp import web

MAX_WORDS = 16


class _Invalid(Exception):
    """A request the endpoint rejects with 400 in its own error format."""


def _limit(body: dict[str, Any], *keys: str, required: bool = False) -> int:
    for key in keys:
        value = body.get(key)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise _Invalid(f"{key}: must be a non-negative integer")
        return value
    if required:
        raise _Invalid(f"{keys[0]}: Field required")
    return MAX_WORDS


def _words(content: Any) -> int:
    """Whitespace-separated words in a string or a list of ``{type: text, text}`` parts."""
    if isinstance(content, str):
        return len(content.split())
    if not isinstance(content, list):
        return 0
    texts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
    return sum(len(t.split()) for t in texts if isinstance(t, str))


def _messages_tokens(messages: Any) -> int:
    if not isinstance(messages, list):
        raise _Invalid("messages: must be a list")
    return sum(_words(m.get("content") if isinstance(m, dict) else None) + 4 for m in messages)


def _prompt_tokens(prompt: Any) -> int:
    if isinstance(prompt, str):
        return len(prompt.split())
    if isinstance(prompt, list):
        return sum(1 if isinstance(p, int) else _prompt_tokens(p) for p in prompt)
    raise _Invalid("prompt: must be a string or a list")


def _sse(data: Any, event: str | None = None) -> str:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {data if isinstance(data, str) else json.dumps(data)}\n\n"


def _openai_error(message: str) -> web.Response:
    error = {"message": message, "type": "invalid_request_error", "param": None, "code": None}
    return web.json_response({"error": error}, status=400)


def _anthropic_error(message: str) -> web.Response:
    error = {"type": "invalid_request_error", "message": message}
    return web.json_response({"type": "error", "error": error}, status=400)


# Each renderer returns (the non-streamed reply, the SSE events of the streamed one).
Rendered = tuple[dict[str, Any], list[str]]


class _Gen(NamedTuple):
    """What to reply: the request body, model, prompt token count, words and finish reason."""

    body: dict[str, Any]
    model: str
    prompt: int
    words: list[str]
    reason: str


def _openai_stream(body: dict[str, Any], chunks: list[dict[str, Any]], usage: Any) -> list[str]:
    options = body.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage") is True:
        last = {**chunks[-1], "choices": [], "usage": usage}
        chunks = [*({**c, "usage": None} for c in chunks), last]
    return [*map(_sse, chunks), _sse("[DONE]")]


def _chat(g: _Gen) -> Rendered:
    body, model, prompt, words, reason = g
    n = len(words)
    usage = {"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n}
    head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": model}
    message = {"role": "assistant", "content": "".join(words)}
    choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": reason}
    reply = {**head, "object": "chat.completion", "usage": usage}
    reply["choices"] = [{**choice, "message": message}]
    head |= {"object": "chat.completion.chunk"}
    deltas = [{"role": "assistant", "content": ""}, *({"content": w} for w in words), {}]
    finishes = [None if d else reason for d in deltas]
    chunks = [
        {**head, "choices": [{**choice, "delta": d, "finish_reason": f}]}
        for d, f in zip(deltas, finishes, strict=True)
    ]
    return reply, _openai_stream(body, chunks, usage)


def _completion(g: _Gen) -> Rendered:
    body, model, prompt, words, reason = g
    n = len(words)
    usage = {"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n}
    head = {"id": f"cmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": model}
    head |= {"object": "text_completion"}

    def choices(text: str, finish: str | None) -> list[dict[str, Any]]:
        return [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]

    reply = {**head, "choices": choices("".join(words), reason), "usage": usage}
    chunks = [{**head, "choices": choices(w, None)} for w in words]
    chunks.append({**head, "choices": choices("", reason)})
    return reply, _openai_stream(body, chunks, usage)


def _message(g: _Gen) -> Rendered:
    _, model, prompt, words, reason = g
    stop, n = "max_tokens" if reason == "length" else "end_turn", len(words)
    msg = {"id": f"msg_{uuid.uuid4().hex}", "type": "message", "role": "assistant", "model": model}
    content = [{"type": "text", "text": "".join(words)}]
    usage = {"input_tokens": prompt, "output_tokens": n}
    reply = {**msg, "content": content, "stop_reason": stop, "stop_sequence": None, "usage": usage}
    start = {**reply, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 0}}
    events: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"message": start}),
        ("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
        *(
            ("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": w}})
            for w in words
        ),
        ("content_block_stop", {"index": 0}),
        (
            "message_delta",
            {"delta": {"stop_reason": stop, "stop_sequence": None}, "usage": {"output_tokens": n}},
        ),
        ("message_stop", {}),
    ]
    return reply, [_sse({"type": name, **data}, name) for name, data in events]


def _parse_chat(body: dict[str, Any]) -> tuple[int, int]:
    limit = _limit(body, "max_completion_tokens", "max_tokens")
    return _messages_tokens(body.get("messages")), limit


def _parse_completion(body: dict[str, Any]) -> tuple[int, int]:
    return _prompt_tokens(body.get("prompt", "")), _limit(body, "max_tokens")


def _parse_message(body: dict[str, Any]) -> tuple[int, int]:
    limit = _limit(body, "max_tokens", required=True)
    return _messages_tokens(body.get("messages")) + _words(body.get("system")), limit
