"""The dev backend's answers: request parsing and the OpenAI/Anthropic replies and SSE events.

- ``_parse_chat`` / ``_parse_completion`` / ``_parse_message`` / ``_parse_response`` /
  ``_parse_token_generate`` / ``_parse_sglang``: a body → ``(prompt_tokens, limit)``; prompt
  tokens are whitespace-separated words (+4 per chat message or Responses input item; one per
  token id), the limit is the endpoint's own field (``max_completion_tokens``/``max_tokens``,
  Responses ``max_output_tokens``, ``sampling_params.max_tokens`` / ``.max_new_tokens``;
  default ``MAX_WORDS``; required for messages).
- ``_chat`` / ``_completion`` / ``_message`` / ``_response`` / ``_token_generate`` /
  ``_sglang``: a ``_Gen`` → ``Rendered``, the non-streamed reply and the SSE events of the
  streamed one (``_sse``), each in the endpoint's own format; ``stream_options.include_usage``
  adds OpenAI's final usage chunk. A Responses reply is always ``"status": "completed"`` and
  its stream ends with ``response.completed``.
- ``_conversations`` / ``_chat_batch``: vLLM's ``/v1/chat/completions/batch`` (``messages`` a
  list of conversations → one ``chat.completion`` with a choice per conversation).
- ``_embedding_inputs`` / ``_embeddings``: ``/v1/embeddings``, one embedding per input (a
  fixed 8-dimensional vector whose first value is the input's token count; base64 float32
  when ``encoding_format`` is ``"base64"``).
- ``_openai_error`` / ``_anthropic_error``: a 400 in each API's error format; ``_Invalid`` is
  what parsing raises to ask for one.
- ``valve_answer``: vLLM 0.32's admission valve refusing a request, byte for byte as its API
  server sends it (``vllm/exceptions.py`` QueueOverflowError / MaxQueuedTokensError, a
  GracefulHTTPError rendered by ``create_error_response``: type = the status's phrase,
  ``code`` the status as a number; Starlette's compact JSON, ``server: uvicorn``, no
  Retry-After); on ``/v1/messages`` translated as vLLM's Anthropic router does
  (``{"type": "error", "error": {"type", "message"}}``).

Invariants: deterministic apart from ids and ``created`` (``uuid4``, the clock): ``n`` words
``"tok0 tok1 ..."`` give the same text, usage and finish reason every time, and the streamed
events concatenate to the non-streamed reply; Anthropic's stop reason is "max_tokens" iff
OpenAI's would be "length". No I/O and no server state here.
"""

from __future__ import annotations

import base64
import json
import struct
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


_TEXT_PARTS = ("text", "input_text", "output_text")


def _words(content: Any) -> int:
    """Whitespace-separated words in a string or a list of ``{type: text, text}`` parts
    (Responses' ``input_text`` / ``output_text`` parts count too)."""
    if isinstance(content, str):
        return len(content.split())
    if not isinstance(content, list):
        return 0
    texts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") in _TEXT_PARTS]
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


# vLLM 0.32's valve messages (vllm/exceptions.py), by vllm:admission_rejections_total reason.
VALVE_MESSAGES = {
    "max_num_queued_reqs": "The engine is currently busy and cannot accept new requests. "
    "Please try again later or on a different instance.",
    "max_num_queued_tokens": "The engine has reached its prefill token backlog limit. "
    "Please try again later or on a different instance.",
}


def valve_answer(reason: str, anthropic: bool) -> web.Response:
    """vLLM's 503 for a request its admission valve refuses for ``reason``."""
    message = VALVE_MESSAGES[reason]
    if anthropic:
        doc: dict[str, Any] = {
            "type": "error",
            "error": {"type": "Service Unavailable", "message": message},
        }
    else:
        error = {"message": message, "type": "Service Unavailable", "param": None, "code": 503}
        doc = {"error": error}
    body = json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode()
    return web.Response(
        status=503, body=body, content_type="application/json", headers={"server": "uvicorn"}
    )


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


def _response(g: _Gen) -> Rendered:
    _, model, prompt, words, _reason = g
    n, text = len(words), "".join(words)
    usage = {"input_tokens": prompt, "output_tokens": n, "total_tokens": prompt + n}
    head: dict[str, Any] = {"id": f"resp_{uuid.uuid4().hex}", "object": "response"}
    head |= {"created_at": int(time.time()), "model": model, "error": None}
    head |= {"incomplete_details": None, "max_output_tokens": g.body.get("max_output_tokens")}
    head |= {"tools": [], "metadata": {}}
    item_id = f"msg_{uuid.uuid4().hex}"
    part = {"type": "output_text", "text": text, "annotations": []}
    item = {"type": "message", "id": item_id, "status": "completed", "role": "assistant"}
    output = {**item, "content": [part]}
    reply = {**head, "status": "completed", "output": [output], "usage": usage}
    at = {"item_id": item_id, "output_index": 0, "content_index": 0}
    events: list[tuple[str, dict[str, Any]]] = [
        ("response.created", {"response": {**head, "status": "in_progress", "output": []}}),
        (
            "response.output_item.added",
            {"output_index": 0, "item": {**item, "status": "in_progress", "content": []}},
        ),
        ("response.content_part.added", {**at, "part": {**part, "text": ""}}),
        *(("response.output_text.delta", {**at, "delta": w, "logprobs": []}) for w in words),
        ("response.output_text.done", {**at, "text": text, "logprobs": []}),
        ("response.content_part.done", {**at, "part": part}),
        ("response.output_item.done", {"output_index": 0, "item": output}),
        ("response.completed", {"response": reply}),
    ]
    return reply, [
        _sse({"type": name, "sequence_number": i, **data}, name)
        for i, (name, data) in enumerate(events)
    ]


def _token_generate(g: _Gen) -> Rendered:
    """vLLM's ``/inference/v1/generate``: token ids out (``0, 1, ...``)."""
    _, model, prompt, words, reason = g
    head = {"request_id": f"gen-{uuid.uuid4().hex}", "model": model}
    ids = list(range(len(words)))
    usage = {"prompt_tokens": prompt, "completion_tokens": len(ids)}
    usage["total_tokens"] = prompt + len(ids)
    choice = {"index": 0, "token_ids": ids, "finish_reason": reason}
    reply = {**head, "choices": [choice], "usage": usage}
    chunks = [
        {**head, "choices": [{"index": 0, "token_ids": [i], "finish_reason": None}]} for i in ids
    ]
    chunks.append({**head, "choices": [{"index": 0, "token_ids": [], "finish_reason": reason}]})
    return reply, [*map(_sse, chunks), _sse("[DONE]")]


def _sglang(g: _Gen) -> Rendered:
    """SGLang's native ``/generate``: ``text`` and ``meta_info``; a stream repeats the text
    so far in each event."""
    _, _, prompt, words, reason = g
    rid, n = uuid.uuid4().hex, len(words)
    finish = {"type": "length", "length": n} if reason == "length" else {"type": "stop"}

    def event(k: int, done: bool) -> dict[str, Any]:
        meta = {"id": rid, "prompt_tokens": prompt, "completion_tokens": k}
        return {
            "text": "".join(words[:k]),
            "meta_info": {**meta, "finish_reason": finish if done else None},
        }

    reply = event(n, True)
    return reply, [*(_sse(event(k, k == n)) for k in range(1, n + 1)), _sse("[DONE]")]


def _conversations(body: dict[str, Any]) -> tuple[list[int], int]:
    """vLLM's batch chat: each conversation's prompt tokens, and the shared limit."""
    convs = body.get("messages")
    if not isinstance(convs, list) or not convs or not all(isinstance(c, list) for c in convs):
        raise _Invalid("messages: must be a non-empty list of conversations")
    if body.get("n", 1) != 1:
        raise _Invalid("n: must be 1 for batch chat")
    if body.get("stream") is True:
        raise _Invalid("stream: not supported for batch chat")
    return [_messages_tokens(c) for c in convs], _limit(body, "max_completion_tokens", "max_tokens")


def _chat_batch(g: _Gen, prompts: list[int]) -> dict[str, Any]:
    _, model, _, words, reason = g
    n, k = len(words), len(prompts)
    usage = {"prompt_tokens": sum(prompts), "completion_tokens": n * k}
    usage["total_tokens"] = usage["prompt_tokens"] + n * k
    message = {"role": "assistant", "content": "".join(words)}
    choices = [
        {"index": i, "message": message, "logprobs": None, "finish_reason": reason}
        for i in range(k)
    ]
    head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": model}
    return {**head, "object": "chat.completion", "choices": choices, "usage": usage}


EMBEDDING_DIM = 8


def _embedding_inputs(body: dict[str, Any]) -> list[int]:
    """The token count of each input: a string, a list of strings, a token list, or a list
    of token lists."""
    value = body.get("input")
    if isinstance(value, str):
        return [len(value.split())]
    if not isinstance(value, list) or not value:
        raise _Invalid("input: must be a string or a non-empty list")
    if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return [len(value)]
    counts = []
    for v in value:
        if isinstance(v, str):
            counts.append(len(v.split()))
        elif isinstance(v, list) and all(isinstance(i, int) for i in v):
            counts.append(len(v))
        else:
            raise _Invalid("input: items must be strings or token lists")
    return counts


def _embeddings(body: dict[str, Any], model: str, counts: list[int]) -> dict[str, Any]:
    as_base64 = body.get("encoding_format") == "base64"

    def vector(tokens: int) -> Any:
        values = [float(tokens), *(k / EMBEDDING_DIM for k in range(1, EMBEDDING_DIM))]
        if as_base64:
            return base64.b64encode(struct.pack(f"<{EMBEDDING_DIM}f", *values)).decode()
        return values

    data = [
        {"object": "embedding", "index": i, "embedding": vector(c)} for i, c in enumerate(counts)
    ]
    usage = {"prompt_tokens": sum(counts), "total_tokens": sum(counts)}
    return {"object": "list", "data": data, "model": model, "usage": usage}


def _parse_chat(body: dict[str, Any]) -> tuple[int, int]:
    limit = _limit(body, "max_completion_tokens", "max_tokens")
    return _messages_tokens(body.get("messages")), limit


def _parse_completion(body: dict[str, Any]) -> tuple[int, int]:
    return _prompt_tokens(body.get("prompt", "")), _limit(body, "max_tokens")


def _parse_message(body: dict[str, Any]) -> tuple[int, int]:
    limit = _limit(body, "max_tokens", required=True)
    return _messages_tokens(body.get("messages")) + _words(body.get("system")), limit


def _input_tokens(value: Any) -> int:
    """Responses ``input``: a string, or a list of items (messages count +4 each)."""
    if isinstance(value, str):
        return len(value.split())
    if not isinstance(value, list):
        raise _Invalid("input: must be a string or a list")
    tokens = 0
    for item in value:
        if isinstance(item, dict) and "content" in item:
            tokens += _words(item["content"]) + 4
        elif isinstance(item, dict):
            tokens += _words(item.get("output"))
    return tokens


def _parse_response(body: dict[str, Any]) -> tuple[int, int]:
    if "input" not in body:
        raise _Invalid("input: Field required")
    prompt = _input_tokens(body["input"]) + _words(body.get("instructions"))
    return prompt, _limit(body, "max_output_tokens")


def _sampling(body: dict[str, Any], key: str) -> int:
    params = body.get("sampling_params", {})
    if not isinstance(params, dict):
        raise _Invalid("sampling_params: must be an object")
    return _limit(params, key)


def _token_ids(value: Any, field: str) -> int:
    if not isinstance(value, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in value
    ):
        raise _Invalid(f"{field}: must be a list of token ids")
    return len(value)


def _parse_token_generate(body: dict[str, Any]) -> tuple[int, int]:
    return _token_ids(body.get("token_ids"), "token_ids"), _sampling(body, "max_tokens")


def _parse_sglang(body: dict[str, Any]) -> tuple[int, int]:
    if "input_ids" in body:
        prompt = _token_ids(body["input_ids"], "input_ids")
    elif isinstance(body.get("text"), str):
        prompt = len(body["text"].split())
    else:
        raise _Invalid("text: must be a string (or give input_ids)")
    return prompt, _sampling(body, "max_new_tokens")
