"""Streamed replies flow through Envoy event by event (response bodies are not buffered)."""

from __future__ import annotations

import time
from typing import Any

import anthropic
import openai

from .harness import E2E

DELAY = {"x-dev-stream-delay-ms": "200"}
MSGS: Any = [{"role": "user", "content": "stream please"}]


def test_openai_stream_events_arrive_as_they_are_sent(stack: E2E) -> None:
    arrivals: list[float] = []
    texts: list[str] = []
    with openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key="x", max_retries=0) as client:
        start = time.monotonic()
        stream = client.chat.completions.create(
            model="dev-model", messages=MSGS, max_tokens=6, stream=True, extra_headers=DELAY
        )
        with stream:
            assert stream.response.headers["x-ice-decision"] == "pass"
            for chunk in stream:
                arrivals.append(time.monotonic() - start)
                if chunk.choices and chunk.choices[0].delta.content:
                    texts.append(chunk.choices[0].delta.content)
        total = time.monotonic() - start
    assert "".join(texts) == "tok0 tok1 tok2 tok3 tok4 tok5"
    assert len(arrivals) == 8  # role, six words, finish
    assert arrivals[0] < total - 0.5, (arrivals, total)  # not held back until the end
    rec = stack.only_received()
    assert rec.json()["stream"] is True
    assert rec.header("x-ice-decision") == "pass"


def test_anthropic_stream_events_arrive_as_they_are_sent(stack: E2E) -> None:
    arrivals: list[float] = []
    kinds: list[str] = []
    with anthropic.Anthropic(base_url=stack.base_url, api_key="x", max_retries=0) as client:
        start = time.monotonic()
        stream = client.messages.create(
            model="dev-model", messages=MSGS, max_tokens=4, stream=True, extra_headers=DELAY
        )
        with stream:
            assert stream.response.headers["x-ice-decision"] == "pass"
            for event in stream:
                arrivals.append(time.monotonic() - start)
                kinds.append(event.type)
        total = time.monotonic() - start
    assert kinds[0] == "message_start"
    assert kinds[-1] == "message_stop"
    assert kinds.count("content_block_delta") == 4
    assert arrivals[0] < total - 0.5, (arrivals, total)


def test_downgraded_stream_still_streams(stack: E2E) -> None:
    arrivals: list[float] = []
    with openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key="x", max_retries=0) as client:
        start = time.monotonic()
        stream = client.chat.completions.create(
            model="dev-model",
            messages=MSGS,
            max_tokens=100000,
            stream=True,
            extra_headers={"x-dev-stream-delay-ms": "100"},  # 16 words: 18 events
        )
        with stream:
            assert stream.response.headers["x-ice-decision"] == "downgrade"
            for _ in stream:
                arrivals.append(time.monotonic() - start)
        total = time.monotonic() - start
    assert arrivals[0] < total - 0.5, (arrivals, total)
    assert stack.only_received().json()["max_tokens"] < 100000
