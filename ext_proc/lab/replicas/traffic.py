"""The requests of the replicas bench: the burst, the latency probe, the steady load.

- ``BurstPlan``: the burst's size: ``requests`` chat completions started at one instant, each
  ``prompt_words`` words of prompt and ``max_tokens`` of output, streamed (with
  ``x-dev-stream-delay-ms`` on the dev backend, so each stays in flight); ``prompt_tokens``
  is the prompt size as built (the dev backend counts words + 4 per message; for vLLM the
  filler words are one token each), used when an answer carries no ``usage``.
- ``prompt_text(kind, words, seed)``: seeded prompt text. Dev: three-letter words, so ICE's
  estimate (``ext_proc.schemas.estimate``: ceil(chars / 4) + 4 per message + 3) reads one token a
  word, as the dev backend does; vLLM: the tiny tokenizer's one-token filler words
  (``ext_proc.lab.vllm_local.filler_text``).
- ``Answer``: what one request got: when it started and ended (s after the run's t0), status
  (0: transport error), whether ICE judged it (``x-mem-pressure`` present: Envoy adds ICE's
  verdict headers only when ICE answered; failing open, it passes the request without them),
  ICE's decision and reason, ``x-downgraded``, the ``usage`` (prompt and completion tokens).
  ``Answer.blocks(plan, block_size)``: the request's KV need as ICE reserves it,
  ``accounting.blocks_for`` of the usage's prompt tokens (else the plan's) and the requested
  ``max_tokens`` (a downgraded request: its completion tokens, which vLLM with ``ignore_eos``
  generates up to the limit it was given).
- ``send`` (async): one request; fills its ``Answer`` as it goes (so a run can watch the
  answers while they stream); never raises.
- ``burst`` (async): ``plan.requests`` requests, each on its own connection, all released at
  one instant t0 (``answers`` pre-made, so a caller can watch them).
- ``steady`` (async): ``clients`` loops each sending tiny requests one after the other (a
  ``gap_s`` pause between) for ``duration_s``, with ``actions`` run at their times in a thread
  (the failover's kill); the answers, and when each action really ran.
- ``probe_latency``: ``count`` tiny requests (``max_tokens`` 1, not streamed), one at a time,
  alternately through Envoy and straight to the backend, each way over one kept-alive
  connection (``http.client``), after ``warmup`` of each; the latencies in seconds.

Invariants: nothing here starts or stops a process; ``send`` records a transport error in
``Answer.error`` and returns; ``burst`` releases every request at the same t0 (each sleeps
until it, none waits for another); every request but the latency probe's carries
``x-priority: standard`` (the probe: ``critical``, never shed, so it always measures a pass).
"""

from __future__ import annotations

import asyncio
import http.client
import json
import random
import time
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from ext_proc.lab.overload.run import sse_chunks
from ext_proc.lab.replicas.accounting import blocks_for

__all__ = [
    "CHAT",
    "JUDGED_HEADER",
    "Answer",
    "BurstPlan",
    "burst",
    "probe_latency",
    "prompt_text",
    "send",
    "steady",
    "tiny_body",
]

CHAT = "/v1/chat/completions"
# The header ICE sets on every request it judged (docs/headers.md); absent: it passed unjudged.
JUDGED_HEADER = "x-mem-pressure"
DEV_DELAY_HEADER = "x-dev-stream-delay-ms"
_WORDS3 = [
    "ant",
    "ape",
    "asp",
    "bat",
    "bee",
    "cat",
    "cod",
    "dog",
    "eel",
    "elk",
    "emu",
    "fox",
    "gnu",
    "hen",
    "jay",
    "koi",
    "owl",
    "pig",
    "ram",
    "yak",
]


def prompt_text(kind: str, words: int, seed: int) -> str:
    """``words`` seeded words: three letters each for the dev backend, the tiny tokenizer's
    one-token filler words for vLLM."""
    if kind == "vllm":
        from ext_proc.lab import vllm_local as vl

        return vl.filler_text(words, seed)
    rng = random.Random(seed)
    return " ".join(rng.choice(_WORDS3) for _ in range(words))


@dataclass(frozen=True)
class BurstPlan:
    """The burst: ``requests`` at once, each ``prompt_words`` words + ``max_tokens`` output."""

    requests: int
    prompt_words: int
    max_tokens: int
    stream_delay_ms: float  # per SSE event, dev backend only (0: none)
    prompt_tokens: int  # the prompt as built, in the backend's tokens (no usage: this)

    def blocks(self, block_size: int) -> int:
        """One request's KV need at the planned size."""
        return blocks_for(self.prompt_tokens, self.max_tokens, block_size)


@dataclass
class Answer:
    """What one request got (times in s after the run's t0; None: not yet)."""

    index: int
    max_tokens: int
    start_s: float | None = None
    headers_s: float | None = None
    end_s: float | None = None
    status: int = 0  # 0: no answer (a transport error)
    judged: bool = False  # ICE's verdict headers came back
    pressure: str | None = None
    decision: str | None = None
    reason: str | None = None
    downgraded: bool = False
    prompt_tokens: int | None = None  # usage.prompt_tokens
    completion_tokens: int = 0
    error: str | None = None

    @property
    def admitted(self) -> bool:
        """Not a 429 (the brief's count: ICE did not refuse it for memory)."""
        return self.status != 429

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300 and self.error is None

    def blocks(self, plan: BurstPlan, block_size: int) -> int:
        """The KV need ICE reserved for it (see the module docstring)."""
        prompt = self.prompt_tokens if self.prompt_tokens else plan.prompt_tokens
        output = self.completion_tokens if self.downgraded and self.completion_tokens else None
        return blocks_for(prompt, output if output is not None else self.max_tokens, block_size)

    def record(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


def _read_headers(answer: Answer, resp: aiohttp.ClientResponse) -> None:
    answer.status = resp.status
    answer.pressure = resp.headers.get(JUDGED_HEADER) or None
    answer.judged = answer.pressure is not None
    answer.decision = resp.headers.get("x-ice-decision") or None
    answer.reason = resp.headers.get("x-ice-reason") or None
    answer.downgraded = resp.headers.get("x-downgraded") == "true"


def _read_usage(answer: Answer, usage: Any) -> None:
    if isinstance(usage, dict):
        prompt = usage.get("prompt_tokens")
        answer.prompt_tokens = int(prompt) if isinstance(prompt, int) else answer.prompt_tokens
        answer.completion_tokens = int(usage.get("completion_tokens") or 0)


async def send(
    session: aiohttp.ClientSession,
    url: str,
    body: dict[str, Any],
    headers: dict[str, str],
    t0: float,
    answer: Answer,
    at_s: float = 0.0,
) -> Answer:
    """Send ``body`` to ``url`` at ``t0 + at_s``, filling ``answer`` as it goes; never
    raises (a transport error is ``answer.error``)."""
    await asyncio.sleep(max(0.0, t0 + at_s - time.monotonic()))
    answer.start_s = time.monotonic() - t0
    try:
        async with session.post(url, json=body, headers=headers) as resp:
            answer.headers_s = time.monotonic() - t0
            _read_headers(answer, resp)
            if body.get("stream") is True and resp.status == 200:
                async for chunk in sse_chunks(resp):
                    if isinstance(chunk.get("error"), dict):
                        answer.error = json.dumps(chunk)[:500]
                        break
                    _read_usage(answer, chunk.get("usage"))
            else:
                text = await resp.text()
                if resp.status == 200:
                    _read_usage(answer, json.loads(text).get("usage"))
                else:
                    answer.error = text[:500]
    except (aiohttp.ClientError, TimeoutError, ValueError) as e:
        answer.error = f"{type(e).__name__}: {e}"
    answer.end_s = time.monotonic() - t0
    return answer


def _burst_body(kind: str, model: str, plan: BurstPlan, seed: int) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": prompt_text(kind, plan.prompt_words, seed)}],
        "max_tokens": plan.max_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def burst_headers(kind: str, plan: BurstPlan) -> dict[str, str]:
    headers = {"x-priority": "standard"}
    if kind == "dev" and plan.stream_delay_ms > 0:
        headers[DEV_DELAY_HEADER] = f"{plan.stream_delay_ms:g}"
    return headers


async def burst(
    base_url: str,
    kind: str,
    model: str,
    plan: BurstPlan,
    seed: int,
    answers: list[Answer] | None = None,
    t0: float | None = None,
) -> list[Answer]:
    """``plan.requests`` streamed requests to ``base_url``, all released at ``t0`` (default:
    50 ms from now), each on a connection of its own; ``answers`` (made here when not given)
    are filled as the requests go."""
    answers = answers or [Answer(i, plan.max_tokens) for i in range(plan.requests)]
    t0 = time.monotonic() + 0.05 if t0 is None else t0
    headers = burst_headers(kind, plan)
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=600)
    ) as session:
        await asyncio.gather(
            *(
                send(
                    session,
                    base_url + CHAT,
                    _burst_body(kind, model, plan, seed + a.index),
                    headers,
                    t0,
                    a,
                )
                for a in answers
            )
        )
    return answers


def tiny_body(model: str, max_tokens: int = 1) -> dict[str, Any]:
    """A request that needs one block: a one-word prompt, ``max_tokens`` output, no stream."""
    return {
        "model": model,
        "messages": [{"role": "user", "content": "ping"}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
    }


async def steady(
    base_url: str,
    model: str,
    *,
    clients: int,
    duration_s: float,
    gap_s: float,
    actions: Sequence[tuple[float, Callable[[], None]]] = (),
    t0: float | None = None,
) -> tuple[list[Answer], list[float]]:
    """``clients`` loops of tiny requests (``x-priority: standard``) for ``duration_s``,
    ``gap_s`` between one's answer and its next request; each action of ``actions`` (at_s,
    callable) runs in a thread at its time. The answers in start order, and each action's
    real time (s after ``t0``: the given monotonic time, else now)."""
    t0 = time.monotonic() if t0 is None else t0
    out: list[Answer] = []
    done_at: list[float] = []
    headers = {"x-priority": "standard"}

    async def client(session: aiohttp.ClientSession) -> None:
        while time.monotonic() - t0 < duration_s:
            answer = Answer(len(out), 1)
            out.append(answer)
            await send(session, base_url + CHAT, tiny_body(model), headers, t0, answer)
            await asyncio.sleep(gap_s)

    async def act(at_s: float, action: Callable[[], None]) -> None:
        await asyncio.sleep(max(0.0, t0 + at_s - time.monotonic()))
        started = time.monotonic() - t0
        await asyncio.to_thread(action)
        done_at.append(round(started, 3))

    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), timeout=timeout
    ) as session:
        await asyncio.gather(
            *(client(session) for _ in range(clients)), *(act(t, f) for t, f in actions)
        )
    return sorted(out, key=lambda a: a.start_s or 0.0), done_at


def _timed_post(conn: http.client.HTTPConnection, body: bytes, headers: dict[str, str]) -> float:
    start = time.perf_counter()
    conn.request("POST", CHAT, body=body, headers=headers)
    resp = conn.getresponse()
    resp.read()
    took = time.perf_counter() - start
    if resp.status != 200:
        raise http.client.HTTPException(f"probe answered {resp.status}")
    return took


def _connection(base_url: str) -> http.client.HTTPConnection:
    parts = urllib.parse.urlsplit(base_url)
    return http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=30)


def probe_latency(
    through_url: str, direct_url: str, model: str, count: int, warmup: int = 10
) -> tuple[list[float], list[float], int]:
    """``count`` tiny requests each way, alternating through Envoy (``through_url``) and
    straight (``direct_url``), one at a time over one connection each way; the latencies (s)
    through, direct, and how many failed (reconnected, not counted)."""
    body = json.dumps(tiny_body(model)).encode()
    headers = {"content-type": "application/json", "x-priority": "critical"}
    conns = {"through": _connection(through_url), "direct": _connection(direct_url)}
    urls = {"through": through_url, "direct": direct_url}
    times: dict[str, list[float]] = {"through": [], "direct": []}
    failed = 0
    try:
        for i in range(warmup + count):
            for way in ("direct", "through") if i % 2 else ("through", "direct"):
                try:
                    took = _timed_post(conns[way], body, headers)
                except (OSError, http.client.HTTPException):
                    failed += 1
                    conns[way].close()
                    conns[way] = _connection(urls[way])
                    continue
                if i >= warmup:
                    times[way].append(took)
    finally:
        for conn in conns.values():
            conn.close()
    return times["through"], times["direct"], failed
