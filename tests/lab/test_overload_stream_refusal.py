"""vLLM's valve refuses a *streamed* request with status 200 and an error event instead of
tokens; the overload bench's client (``ext_proc.lab.overload.run.send``) must read that as the
503 it says, not as a completed request. Against a real aiohttp server on loopback."""

from __future__ import annotations

import asyncio
import json

import aiohttp
from aiohttp import web

from ext_proc.lab.overload.burst import Planned
from ext_proc.lab.overload.run import send
from ext_proc.lab.overload.shots import Shot, answered, is_ok

REFUSAL = {
    "error": {
        "message": "The engine is currently busy and cannot accept new requests.",
        "type": "Service Unavailable",
        "param": None,
        "code": 503,
    }
}


async def _stream(events: list[bytes]) -> Shot:
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(status=200, headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        for event in events:
            await resp.write(b"data: " + event + b"\n\n")
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        async with aiohttp.ClientSession() as session:
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            p = Planned(index=0, at_s=0.0, priority="standard", prompt_tokens=10, max_tokens=5)
            return await send(session, url, p, {"stream": True}, 0.0)  # t0 long past: at once
    finally:
        await runner.cleanup()


def test_a_200_stream_that_carries_the_valves_error_is_a_503_refusal() -> None:
    shot = asyncio.run(_stream([json.dumps(REFUSAL).encode(), b"[DONE]"]))
    assert shot.status == 200 and shot.stream_code == 503
    assert not is_ok(shot) and answered(shot) == 503
    assert shot.completion_tokens == 0 and "busy" in (shot.error or "")


def test_a_200_stream_with_tokens_is_ok() -> None:
    chunk = {"choices": [{"delta": {"content": "hi"}}]}
    usage = {"choices": [], "usage": {"completion_tokens": 5, "prompt_tokens": 10}}
    shot = asyncio.run(_stream([json.dumps(chunk).encode(), json.dumps(usage).encode(), b"[DONE]"]))
    assert is_ok(shot) and answered(shot) == 200 and shot.stream_code is None
    assert shot.completion_tokens == 5
