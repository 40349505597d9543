"""Development inference backend: a fake OpenAI/Anthropic-compatible LLM server.

Used as the upstream behind a real Envoy by ICE's end-to-end tests and as the local backend
of ``make demo``. Run it with ``python -m ext_proc.devbackend --host H --port P [--model M]``;
once it accepts connections it prints exactly one line ``devbackend listening on
http://H:P`` to stdout (``--port 0`` picks a free port and prints the real one).

Invariants:

* Replies are deterministic: ``n = min(limit, 16)`` words ``"tok0 tok1 ..."``, where the limit
  is ``max_completion_tokens``/``max_tokens`` (default 16); the finish reason is "length"
  (Anthropic: "max_tokens") iff ``limit <= 16``, else "stop" ("end_turn").
* ``/metrics`` imitates vLLM and is rendered from a private ``CollectorRegistry`` (never the
  global one). Gauges only change through ``PUT /_dev/state``; the token and request-success
  counters only grow as requests are served. ``PUT /_dev/metrics`` overrides the page with a
  verbatim text until ``DELETE /_dev/metrics``.
* Every request to the three inference endpoints is recorded before any parsing, with its raw
  body bytes (``GET /_dev/requests``: a list of ``{"method", "path", "query", "headers":
  [[name, value], ...], "body_b64", "time"}``; the last 1000 are kept; ``DELETE`` clears).
* Streams send each SSE event in its own write, with ``asyncio.sleep(delay)`` between events,
  ``delay`` being request header ``x-dev-stream-delay-ms`` (default 0).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import dataclasses
import json
import signal
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, NamedTuple

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

MAX_WORDS = 16
MAX_RECORDED = 1000
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
FINISH_REASONS = ("stop", "length", "abort")


@dataclasses.dataclass
class DevState:
    """Controller-set state behind ``/metrics`` (``PUT``/``GET /_dev/state``)."""

    kv_cache_usage_perc: float = 0.0
    num_requests_running: int = 0
    num_requests_waiting: int = 0
    num_gpu_blocks: int = 65536  # a large pool (1M tokens): small tests never fill it
    block_size: int = 16
    legacy: bool = False
    num_preemptions_total: int = 0
    metrics_delay_s: float = 0.0


_DEFAULTS: dict[str, Any] = dataclasses.asdict(DevState())
_Metric = type[GaugeMetricFamily] | type[CounterMetricFamily]


class _Invalid(Exception):
    """A request the endpoint rejects with 400 in its own error format."""


class _Backend:
    """All mutable server state, plus the vLLM-style collector over it."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.state = DevState()
        self.raw_metrics: bytes | None = None
        self.requests: collections.deque[dict[str, Any]] = collections.deque(maxlen=MAX_RECORDED)
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.success = dict.fromkeys(FINISH_REASONS, 0)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def served(self, prompt: int, generated: int, reason: str) -> None:
        self.prompt_tokens += prompt
        self.generation_tokens += generated
        self.success[reason] += 1

    def collect(self) -> Iterator[Metric]:
        s, labels, base = self.state, ["model_name", "engine"], [self.model, "0"]
        usage = "vllm:gpu_cache_usage_perc" if s.legacy else "vllm:kv_cache_usage_perc"
        table: list[tuple[_Metric, str, float]] = [
            (GaugeMetricFamily, usage, s.kv_cache_usage_perc),
            (GaugeMetricFamily, "vllm:num_requests_running", s.num_requests_running),
            (GaugeMetricFamily, "vllm:num_requests_waiting", s.num_requests_waiting),
            (CounterMetricFamily, "vllm:num_preemptions", s.num_preemptions_total),
            (CounterMetricFamily, "vllm:prompt_tokens", self.prompt_tokens),
            (CounterMetricFamily, "vllm:generation_tokens", self.generation_tokens),
        ]
        for family, name, value in table:
            metric = family(name, f"devbackend imitation of {name}", labels=labels)
            metric.add_metric(base, value)
            yield metric
        config = ["block_size", "num_gpu_blocks", "kv_cache_size_tokens", "enable_prefix_caching"]
        info = GaugeMetricFamily("vllm:cache_config_info", "Cache config", labels=labels + config)
        tokens = s.block_size * s.num_gpu_blocks
        info.add_metric([*base, str(s.block_size), str(s.num_gpu_blocks), str(tokens), "True"], 1)
        yield info
        finished = [*labels, "finished_reason"]
        success = CounterMetricFamily("vllm:request_success", "Finished requests", labels=finished)
        for reason, count in self.success.items():
            success.add_metric([*base, reason], count)
        yield success


BACKEND = web.AppKey("backend", _Backend)
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


def _parse_chat(body: dict[str, Any]) -> tuple[int, int]:
    limit = _limit(body, "max_completion_tokens", "max_tokens")
    return _messages_tokens(body.get("messages")), limit


def _parse_completion(body: dict[str, Any]) -> tuple[int, int]:
    return _prompt_tokens(body.get("prompt", "")), _limit(body, "max_tokens")


def _parse_message(body: dict[str, Any]) -> tuple[int, int]:
    limit = _limit(body, "max_tokens", required=True)
    return _messages_tokens(body.get("messages")) + _words(body.get("system")), limit


chat_completions = _inference(_parse_chat, _chat, _openai_error)
completions = _inference(_parse_completion, _completion, _openai_error)
messages = _inference(_parse_message, _message, _anthropic_error)


async def health(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def models(request: web.Request) -> web.Response:
    model = {"id": request.app[BACKEND].model, "object": "model", "created": 0}
    return web.json_response({"object": "list", "data": [{**model, "owned_by": "ice-dev"}]})


async def metrics(request: web.Request) -> web.Response:
    backend = request.app[BACKEND]
    if backend.state.metrics_delay_s > 0:
        await asyncio.sleep(backend.state.metrics_delay_s)
    page = backend.raw_metrics
    if page is None:
        page = generate_latest(backend.registry)
    return web.Response(body=page, headers={"Content-Type": METRICS_CONTENT_TYPE})


def _fits(key: str, value: Any) -> bool:
    """Whether ``value`` may be stored in state field ``key`` (bools are not numbers here)."""
    kind = type(_DEFAULTS[key]) if key in _DEFAULTS else None
    wanted = (int, float) if kind is float else kind
    return (
        wanted is not None and isinstance(value, wanted) and (kind is bool) == (type(value) is bool)
    )


async def dev_state(request: web.Request) -> web.Response:
    backend = request.app[BACKEND]
    if request.method == "PUT":
        try:
            update = json.loads(await request.read())
        except ValueError as exc:
            return web.json_response({"error": f"invalid JSON body: {exc}"}, status=400)
        if not isinstance(update, dict) or not all(_fits(k, v) for k, v in update.items()):
            return web.json_response({"error": f"invalid state update: {update!r}"}, status=400)
        update = {k: float(v) if type(_DEFAULTS[k]) is float else v for k, v in update.items()}
        backend.state = dataclasses.replace(backend.state, **update)
    return web.json_response(dataclasses.asdict(backend.state))


async def dev_metrics(request: web.Request) -> web.Response:
    request.app[BACKEND].raw_metrics = await request.read() if request.method == "PUT" else None
    return web.Response()


async def dev_requests(request: web.Request) -> web.Response:
    recorded = request.app[BACKEND].requests
    if request.method == "DELETE":
        recorded.clear()
    return web.json_response(list(recorded))


def build_app(model: str) -> web.Application:
    """The devbackend application serving ``model``, with fresh state and metrics."""
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[BACKEND] = _Backend(model)
    for method, path, handler in [
        ("POST", "/v1/chat/completions", chat_completions),
        ("POST", "/v1/completions", completions),
        ("POST", "/v1/messages", messages),
        ("GET", "/health", health),
        ("GET", "/v1/models", models),
        ("GET", "/metrics", metrics),
        *(("GET", "/_dev/state", dev_state), ("PUT", "/_dev/state", dev_state)),
        *(("PUT", "/_dev/metrics", dev_metrics), ("DELETE", "/_dev/metrics", dev_metrics)),
        *(("GET", "/_dev/requests", dev_requests), ("DELETE", "/_dev/requests", dev_requests)),
    ]:
        app.router.add_route(method, path, handler)
    return app


async def _serve(host: str, port: int, model: str) -> None:
    runner = web.AppRunner(build_app(model), access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
        bound = runner.addresses[0][1]
        shown = f"[{host}]" if ":" in host else host
        print(f"devbackend listening on http://{shown}:{bound}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--model", default="dev-model")
    args = parser.parse_args(argv)
    asyncio.run(_serve(args.host, args.port, args.model))


if __name__ == "__main__":
    main()
