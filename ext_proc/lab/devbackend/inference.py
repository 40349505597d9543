"""The dev backend's inference endpoints: record, parse, then reply or stream.

- ``record``: record the request (method, path, query, raw headers, raw body in base64,
  time) in the backend and return its raw body; ``_read_json`` records, then parses the body
  as a JSON object.
- ``_inference``: one handler from a parser, a renderer and an error format (``answers``),
  through ``_generate``: ``n = min(limit, MAX_WORDS)`` words, finish reason "length" iff
  ``limit <= MAX_WORDS``; a JSON reply, or ``_stream`` when ``"stream": true``.
- ``chat_completions`` / ``completions`` / ``messages`` / ``responses`` /
  ``generate_tokens`` (vLLM ``/inference/v1/generate``) / ``sglang_generate`` (SGLang
  ``/generate``): handlers made by ``_inference``; ``invocations`` (SageMaker) answers as
  chat when the body has ``messages``, else as completions; ``chat_batch`` and
  ``embeddings`` reply in JSON only.

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

from ext_proc.lab.devbackend.answers import (
    MAX_WORDS,
    Rendered,
    _anthropic_error,
    _chat,
    _chat_batch,
    _completion,
    _conversations,
    _embedding_inputs,
    _embeddings,
    _Gen,
    _Invalid,
    _message,
    _openai_error,
    _parse_chat,
    _parse_completion,
    _parse_message,
    _parse_response,
    _parse_sglang,
    _parse_token_generate,
    _response,
    _sglang,
    _token_generate,
)
from ext_proc.lab.devbackend.state import BACKEND

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def record(request: web.Request) -> bytes:
    """Record the request in the backend (``GET /_dev/requests``); its raw body."""
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
    return raw


async def _read_json(request: web.Request) -> dict[str, Any]:
    """Record the request (raw body first), then parse its body as a JSON object."""
    raw = await record(request)
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
        try:
            body = await _read_json(request)
        except _Invalid as exc:
            return error(str(exc))
        return await _generate(request, body, parse, render, error)

    return handler


def _model(request: web.Request, body: dict[str, Any]) -> str:
    """The body's ``model``, else the one the backend serves."""
    model = body.get("model")
    return model if isinstance(model, str) and model else request.app[BACKEND].model


def _gen(request: web.Request, body: dict[str, Any], prompt: int, limit: int) -> _Gen:
    model = _model(request, body)
    words = [f"tok{i}" if i == 0 else f" tok{i}" for i in range(min(limit, MAX_WORDS))]
    return _Gen(body, model, prompt, words, "length" if limit <= MAX_WORDS else "stop")


async def _generate(
    request: web.Request,
    body: dict[str, Any],
    parse: Callable[[dict[str, Any]], tuple[int, int]],
    render: Callable[[_Gen], Rendered],
    error: Callable[[str], web.Response],
) -> web.StreamResponse:
    """Parse a recorded body, then reply or stream."""
    try:
        prompt, limit = parse(body)
    except _Invalid as exc:
        return error(str(exc))
    g = _gen(request, body, prompt, limit)
    reply, events = render(g)
    if body.get("stream") is not True:
        request.app[BACKEND].served(prompt, len(g.words), g.reason)
        return web.json_response(reply)
    return await _stream(request, events, prompt, len(g.words), g.reason)


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
responses = _inference(_parse_response, _response, _openai_error)
generate_tokens = _inference(_parse_token_generate, _token_generate, _openai_error)
sglang_generate = _inference(_parse_sglang, _sglang, _openai_error)


async def invocations(request: web.Request) -> web.StreamResponse:
    """SageMaker's one endpoint: chat when the body has ``messages``, else completions."""
    try:
        body = await _read_json(request)
    except _Invalid as exc:
        return _openai_error(str(exc))
    if "messages" in body:
        return await _generate(request, body, _parse_chat, _chat, _openai_error)
    return await _generate(request, body, _parse_completion, _completion, _openai_error)


async def chat_batch(request: web.Request) -> web.StreamResponse:
    """vLLM's batch chat: one ``chat.completion``, a choice per conversation."""
    try:
        body = await _read_json(request)
        prompts, limit = _conversations(body)
    except _Invalid as exc:
        return _openai_error(str(exc))
    g = _gen(request, body, sum(prompts), limit)
    request.app[BACKEND].served(sum(prompts), len(g.words) * len(prompts), g.reason)
    return web.json_response(_chat_batch(g, prompts))


async def embeddings(request: web.Request) -> web.StreamResponse:
    """One embedding per input; nothing generated."""
    try:
        body = await _read_json(request)
        counts = _embedding_inputs(body)
    except _Invalid as exc:
        return _openai_error(str(exc))
    request.app[BACKEND].served(sum(counts), 0, "stop")
    return web.json_response(_embeddings(body, _model(request, body), counts))
