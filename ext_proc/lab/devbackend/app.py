"""Development inference backend: a fake OpenAI/Anthropic-compatible LLM server.

This module: the ``aiohttp`` application, its control endpoints and the entry point.

- ``build_app``: a fresh ``_Backend`` and the routes: the inference endpoints
  (``inference``), ``/health``, ``/v1/models``, ``/metrics``, the ``/_dev/*`` controls and,
  last, ``unrouted``: any other method and path, recorded and answered 200 (so a test can
  tell that a request never reached the backend: it would have been recorded).
- ``metrics``: the backend's registry rendered as text, or the verbatim page ``PUT
  /_dev/metrics`` set, after ``DevState.metrics_delay_s``.
- ``_valved``: vLLM's admission valve in front of the endpoints vLLM 0.32 gates with it
  (``_preflight``: chat, completions, Responses, Anthropic messages, batch chat,
  ``/invocations``, ``/inference/v1/generate``; not embeddings, not SGLang's ``/generate``):
  while ``DevState.valve`` names a reason, each request is recorded, counted in
  ``vllm:admission_rejections_total`` and answered ``answers.valve_answer``.
- ``dev_state`` / ``dev_metrics`` / ``dev_requests``: set or read ``DevState``, set or clear
  the page override, list or clear the recorded requests.
- ``main`` / ``_serve``: ``--host``/``--port``/``--model``; serve until SIGINT/SIGTERM.

Invariants: every route but ``unrouted`` wins over it (aiohttp tries the exact paths
first), so control and metrics requests are never recorded, and an unknown ``/_dev/*``
request is a 404, not recorded; a ``PUT /_dev/state`` is applied whole or not at all:
every key must be a ``DevState`` field and every value of its field's type (bools are not
numbers; ints are taken for float fields; ``valve`` "" or a ``VALVE_REASONS`` value), else 400
and nothing changes; once the site
accepts connections ``_serve`` prints exactly one line ``devbackend listening on
http://H:P`` (the real port for ``--port 0``); the first line of this docstring is
``--help``'s description.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import signal
from typing import Any

from aiohttp import web
from prometheus_client import generate_latest

from ext_proc.lab.devbackend.answers import _anthropic_error, _openai_error, valve_answer
from ext_proc.lab.devbackend.inference import (
    Handler,
    chat_batch,
    chat_completions,
    completions,
    embeddings,
    generate_tokens,
    invocations,
    messages,
    record,
    responses,
    sglang_generate,
)
from ext_proc.lab.devbackend.state import (
    _DEFAULTS,
    BACKEND,
    METRICS_CONTENT_TYPE,
    VALVE_REASONS,
    _Backend,
)


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
        if (
            not isinstance(update, dict)
            or not all(_fits(k, v) for k, v in update.items())
            or update.get("valve", "") not in ("", *VALVE_REASONS)
        ):
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


async def unrouted(request: web.Request) -> web.Response:
    """Any request no other route takes: recorded, answered 200 (``/_dev/*``: 404)."""
    if request.path.startswith("/_dev/"):
        raise web.HTTPNotFound(text=f"no dev control {request.method} {request.path}")
    await record(request)
    return web.json_response(
        {"object": "devbackend.unrouted", "method": request.method, "path": request.path}
    )


# What reading an odd body can raise inside a handler (depth, types, values): a 400.
_UNREADABLE = (RecursionError, TypeError, ValueError, KeyError, AttributeError, IndexError)


def _readable(handler: Handler, anthropic: bool) -> Handler:
    """``handler``, answering 400 in its API's format to a body it cannot read (never 500).
    The request was recorded before the handler read it."""

    async def guarded(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except _UNREADABLE as exc:
            message = f"cannot read the request body: {type(exc).__name__}: {exc}"[:300]
            return _anthropic_error(message) if anthropic else _openai_error(message)

    return guarded


def _valved(handler: Handler, anthropic: bool) -> Handler:
    """``handler`` behind vLLM's admission valve: shut (``DevState.valve`` set), the request
    is recorded and refused with vLLM's 503; open, ``handler`` answers."""

    async def gated(request: web.Request) -> web.StreamResponse:
        backend = request.app[BACKEND]
        reason = backend.state.valve
        if not reason:
            return await handler(request)
        await record(request)
        backend.refused(reason)
        return valve_answer(reason, anthropic)

    return gated


# The endpoints vLLM 0.32 gates with its valve (their servers call _preflight).
VALVED = frozenset(
    (
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/messages",
        "/v1/responses",
        "/v1/chat/completions/batch",
        "/invocations",
        "/inference/v1/generate",
    )
)


def build_app(model: str) -> web.Application:
    """The devbackend application serving ``model``, with fresh state and metrics."""
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[BACKEND] = _Backend(model)
    for path, handler in [
        ("/v1/chat/completions", chat_completions),
        ("/v1/completions", completions),
        ("/v1/messages", messages),
        ("/v1/responses", responses),
        ("/v1/embeddings", embeddings),
        ("/v1/chat/completions/batch", chat_batch),
        ("/invocations", invocations),
        ("/inference/v1/generate", generate_tokens),
        ("/generate", sglang_generate),
    ]:
        anthropic = path == "/v1/messages"
        served = _readable(handler, anthropic)
        app.router.add_post(path, _valved(served, anthropic) if path in VALVED else served)
    for path, handler in [("/health", health), ("/v1/models", models), ("/metrics", metrics)]:
        app.router.add_get(path, handler)  # and HEAD
    for method, path, handler in [
        *(("GET", "/_dev/state", dev_state), ("PUT", "/_dev/state", dev_state)),
        *(("PUT", "/_dev/metrics", dev_metrics), ("DELETE", "/_dev/metrics", dev_metrics)),
        *(("GET", "/_dev/requests", dev_requests), ("DELETE", "/_dev/requests", dev_requests)),
    ]:
        app.router.add_route(method, path, handler)
    app.router.add_route("*", "/{tail:.*}", unrouted)
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
