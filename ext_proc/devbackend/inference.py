"""The dev backend's inference endpoints: record, parse, then reply or stream.

- ``_read_json``: record the request (method, path, query, raw headers, raw body in base64,
  time) in the backend, then parse the body as a JSON object.
- ``_inference``: one handler from a parser, a renderer and an error format (``answers``):
  ``n = min(limit, MAX_WORDS)`` words, finish reason "length" iff ``limit <= MAX_WORDS``;
  a JSON reply, or ``_stream`` when ``"stream": true``.
- ``chat_completions`` / ``completions`` / ``messages``: the three handlers ``app`` routes.

Invariants: every request is recorded before any parsing, so a rejected body is recorded
too; a served request counts once in the backend's counters (``_Backend.served``); a stream
sends each SSE event in its own write with ``asyncio.sleep(delay)`` between events (``delay``:
header ``x-dev-stream-delay-ms``, default 0) and counts as "abort" with no generated tokens
when the client goes away or the handler is cancelled before the end.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from ext_proc.devbackend.answers import (
    MAX_WORDS,
    Rendered,
    _anthropic_error,
    _chat,
    _completion,
    _Gen,
    _Invalid,
    _message,
    _openai_error,
    _parse_chat,
    _parse_completion,
    _parse_message,
)
from ext_proc.devbackend.state import BACKEND

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def _read_json(request: web.Request) -> dict[str, Any]:
    """Record the request (raw body first), then parse its body as a JSON object."""
    received = time.time()
    raw = await request.read()
    headers = [
        [k.decode(errors="replace"), v.decode(errors="replace")] for k, v in request.raw_headers
    ]
    request.app[BACKEND].requests.append(
        {
            "method": request.method,
            "path": request.path,
            "query": request.query_string,
            "headers": headers,
            "body_b64": base64.b64encode(raw).decode(),
            "time": received,
        }
    )
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise _Invalid(f"invalid JSON body: {exc}") from exc
    if not isinstance(body, dict):
        raise _Invalid("request body must be a JSON object")
    return body


def _inference(
    parse: Callable[[dict[str, Any]], tuple[int, int]],
    render: Callable[[_Gen], Rendered],
    error: Callable[[str], web.Response],
) -> Handler:
    """An inference handler: record, parse ``(prompt_tokens, limit)``, reply or stream."""

    async def handler(request: web.Request) -> web.StreamResponse:
        backend = request.app[BACKEND]
        try:
            body = await _read_json(request)
            prompt, limit = parse(body)
        except _Invalid as exc:
            return error(str(exc))
        model = body.get("model")
        model = model if isinstance(model, str) and model else backend.model
        words = [f"tok{i}" if i == 0 else f" tok{i}" for i in range(min(limit, MAX_WORDS))]
        reason = "length" if limit <= MAX_WORDS else "stop"
        reply, events = render(_Gen(body, model, prompt, words, reason))
        if body.get("stream") is not True:
            backend.served(prompt, len(words), reason)
            return web.json_response(reply)
        return await _stream(request, events, prompt, len(words), reason)

    return handler


async def _stream(
    request: web.Request, events: list[str], prompt: int, n: int, reason: str
) -> web.StreamResponse:
    try:
        delay = max(0.0, float(request.headers.get("x-dev-stream-delay-ms", "0")) / 1000)
    except ValueError:
        delay = 0.0
    headers = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    resp = web.StreamResponse(headers=headers)
    finished = False
    try:
        await resp.prepare(request)
        for i, event in enumerate(events):
            if i:
                await asyncio.sleep(delay)
            await resp.write(event.encode())
        await resp.write_eof()
        finished = True
    except ConnectionResetError:  # client gone; a cancelled handler also counts as an abort
        pass
    finally:
        request.app[BACKEND].served(prompt, n if finished else 0, reason if finished else "abort")
    return resp


chat_completions = _inference(_parse_chat, _chat, _openai_error)
completions = _inference(_parse_completion, _completion, _openai_error)
messages = _inference(_parse_message, _message, _anthropic_error)
