"""One step of the vLLM walkthrough: send a request through Envoy + ICE and print the
request, ICE's verdict headers and vLLM's (or ICE's) answer; plus the 429 probe that keeps
vLLM busy first, the wait for vLLM to go idle, and the chat longer than the tiny context.

Invariant: output goes through ``_say`` (flushed, so it interleaves with progress lines);
the long requests ``_shed_while_busy`` starts are cancelled before it returns.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import TYPE_CHECKING, Any

from ext_proc.lab.demo.common import _QUESTION, _TURNS, ENVOY_URL, SHOWN, _http

if TYPE_CHECKING:
    from ext_proc.lab.overload import Setup

CHAT = "/v1/chat/completions"
# Long requests sent straight to vLLM to give it a queue for the 429 step: three ~887-token
# prompts fill 21 of the 23 usable KV blocks, the rest wait (and preempted ones rejoin them).
# Each asks for BUSY_OUTPUT_TOKENS (887 + 1,000 < the 2,048-token context), so the queue lasts
# several seconds even on a fast machine (with the burst's 200 it could drain within the tries).
BUSY_REQUESTS = 6
BUSY_OUTPUT_TOKENS = 1000
PROBE_TRIES = 10


def _say(text: str = "") -> None:
    print(text, flush=True)


def _brief(body: dict[str, Any]) -> str:
    """The request body, a long message shown by its size."""
    shown = dict(body)
    messages = body.get("messages")
    if isinstance(messages, list):
        text = " ".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
        if len(text) > 60:
            shown["messages"] = f"<{len(messages)} message, {len(text.split())} words>"
    return json.dumps(shown, ensure_ascii=False)


def _answer(status: int, raw: bytes) -> str:
    """What the backend (or ICE, for a rejection) answered, in one line."""
    try:
        body = json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")[:300]
    if status == 200 and isinstance(body, dict) and body.get("choices"):
        choice = body["choices"][0]
        text = str((choice.get("message") or {}).get("content") or "")
        usage = body.get("usage") or {}
        return (
            f"vLLM: {usage.get('prompt_tokens')} prompt + {usage.get('completion_tokens')} "
            f"output tokens, finish_reason {choice.get('finish_reason')!r}, "
            f"text {text[:48]!r}{'…' if len(text) > 48 else ''}"
        )
    return json.dumps(body, ensure_ascii=False)[:400]


def _vllm_step(
    title: str,
    body: dict[str, Any],
    headers: dict[str, str] | None = None,
    note: str = "",
) -> tuple[int, dict[str, str], bytes]:
    """Send ``body`` through Envoy + ICE; print the request, the verdict and the answer."""
    _say(f"\n=== {title}")
    extra = f"  headers {headers}" if headers else ""
    _say(f"  → POST {CHAT} {_brief(body)}{extra}")
    status, resp_headers, raw = _http("POST", ENVOY_URL + CHAT, body, headers, timeout_s=300)
    verdict = {k: resp_headers[k] for k in SHOWN if k in resp_headers}
    _say(f"  ← {status}  {verdict}")
    _say(f"  ← {_answer(status, raw)}")
    if note:
        _say(f"  {note}")
    return status, resp_headers, raw


def _gauges(page: str) -> dict[str, float]:
    from ext_proc.lab import vllm_local as vl

    return {
        "running": sum(vl.metric_values(page, "vllm:num_requests_running")),
        "waiting": sum(vl.metric_values(page, "vllm:num_requests_waiting")),
        "kv_usage": max(vl.metric_values(page, "vllm:kv_cache_usage_perc") or [0.0]),
    }


async def _shed_while_busy(
    vllm_url: str, model: str, probe: dict[str, Any], headers: dict[str, str]
) -> tuple[dict[str, float], int, tuple[int, dict[str, str], bytes]]:
    """Keep vLLM busy with ``BUSY_REQUESTS`` long streamed requests sent straight to it; once
    vLLM reports a queue (ICE scrapes it every 0.1 s), send ``probe`` through ICE, up to
    ``PROBE_TRIES`` times 0.3 s apart until it gets 429; then drop the long requests (vLLM
    aborts them). Returns vLLM's gauges just before the answered try, the number of tries,
    the answer."""
    import aiohttp

    from ext_proc.lab import overload

    metrics = f"{vllm_url}/metrics"
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        aiohttp.ClientSession() as probes,  # gauges and the probe never queue behind `busy`
    ):

        async def busy(i: int) -> None:
            plan = overload.Planned(i, 0.0, "standard", overload.PROMPT_TOKENS, BUSY_OUTPUT_TOKENS)
            body = overload.request_body(plan, model, seed=7_000 + i)
            async with session.post(vllm_url + CHAT, json=body) as resp:
                async for _ in resp.content:
                    pass

        async def gauges() -> dict[str, float]:
            return _gauges(await overload.fetch(probes, metrics))

        async def send() -> tuple[int, dict[str, str], bytes]:
            async with probes.post(ENVOY_URL + CHAT, json=probe, headers=headers) as resp:
                got = {k.lower(): v for k, v in resp.headers.items()}
                return resp.status, got, await resp.read()

        tasks = [asyncio.create_task(busy(i)) for i in range(BUSY_REQUESTS)]
        try:
            deadline = time.monotonic() + 60
            while (await gauges())["waiting"] < 1:
                if time.monotonic() > deadline:
                    raise RuntimeError("vLLM never queued a request")
                await asyncio.sleep(0.1)
            await asyncio.sleep(0.3)  # three of ICE's scrapes
            tries = 0
            while True:
                tries += 1
                seen = await gauges()
                answer = await send()
                if answer[0] == 429 or tries == PROBE_TRIES:
                    return seen, tries, answer
                await asyncio.sleep(0.3)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


def _settle(setup: Setup) -> None:
    """Until vLLM is idle and ICE has scraped it since: a long answer can hold vLLM's /metrics
    past the pool's max_age_s (ICE then says ``x-mem-pressure: unknown``)."""
    from ext_proc.lab import overload

    overload.wait_idle(setup.metrics_url)
    time.sleep(0.4)  # four of ICE's scrapes (scrape_interval_s 0.1)


def _long_chat(filler: Any) -> list[dict[str, str]]:
    """~2,300 tokens for the tiny model: the demo's turns, each answered with ~210 filler
    tokens, then the question that needs the first turn."""
    msgs = [{"role": "system", "content": "You are a helpful assistant."}]
    for i, (user, _) in enumerate(_TURNS):
        msgs += [
            {"role": "user", "content": user},
            {"role": "assistant", "content": filler(210, 100 + i)},
        ]
    return [*msgs, {"role": "user", "content": _QUESTION}]
