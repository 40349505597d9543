"""Heavy bodies are judged in the helper process with the same result as in-process."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from ext_proc.admit.pipeline import Pipeline, RequestFacts
from ext_proc.policy.evaluate import Shape
from ext_proc.policy.load import load_policy
from ext_proc.schemas import OPENAI_CHAT
from ext_proc.serve.offload import Offload
from ext_proc.signals.snapshot import BackendSignals, PoolSnapshot

PART = {"type": "text", "text": "a"}


def heavy_body(max_tokens: int, parts: int = 30_000) -> bytes:
    content = [PART] * parts
    return json.dumps(
        {"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens}
    ).encode()


@pytest.mark.parametrize("usage", [0.2, 0.97], ids=["low", "high"])
def test_offloaded_verdict_equals_in_process_verdict(usage: float) -> None:
    backend = BackendSignals(url="u", kv_cache_usage=usage, num_requests_waiting=3)
    snap = PoolSnapshot(pool="default", backends=(backend,), taken_at_s=time.monotonic())
    pipeline = Pipeline(load_policy(None), lambda _pool: snap)
    route = pipeline.router.resolve([("x-ice-route", "chat")])
    facts = RequestFacts(adapter=OPENAI_CHAT, priority="standard")
    body = heavy_body(4096)
    offload = Offload(None, pipeline.max_body_bytes, heavy_containers=10_000)
    assert offload.is_heavy(body) and not offload.is_heavy(b'{"messages": []}')
    try:
        remote = asyncio.run(offload.on_body(pipeline, route, facts, body))
    finally:
        offload.close()
    local = pipeline.on_body(route, facts, body)
    assert remote == local
    assert remote is not None and remote.decision is not None


def test_offloaded_verdict_counts_the_workers_inflight_blocks() -> None:
    # ~2,000 input tokens against 100,000 free blocks of 16 tokens; the worker has just passed
    # requests holding all but 100 of them (1,600 tokens), which the snapshot cannot show yet.
    backend = BackendSignals(
        url="u", kv_cache_usage=0.0, num_requests_waiting=0, num_gpu_blocks=100_001, block_size=16
    )
    snap = PoolSnapshot(pool="default", backends=(backend,), taken_at_s=time.monotonic())
    pipeline = Pipeline(load_policy(None), lambda _pool: snap)
    route = pipeline.router.resolve([("x-ice-route", "chat")])
    facts = RequestFacts(adapter=OPENAI_CHAT, priority="standard")
    body = heavy_body(4096, parts=2_000)
    before = pipeline.on_body(route, facts, body)
    assert before is not None and before.decision is not None
    assert before.decision.decision == "pass"
    time.sleep(0.001)  # the ledger counts requests passed after the snapshot was taken
    pipeline.views.hold(route.profile, snap, Shape.single((100_000 - 100) * 16), 0)
    assert pipeline.views.held(snap) == 100_000 - 100
    offload = Offload(None, pipeline.max_body_bytes, heavy_containers=1_000)
    assert offload.is_heavy(body)
    try:
        remote = asyncio.run(offload.on_body(pipeline, route, facts, body))
    finally:
        offload.close()
    local = pipeline.on_body(route, facts, body)
    assert local is not None and local.decision is not None
    assert local.decision.reason == "kv_exhausted", local.decision
    assert remote == local


def test_brackets_inside_strings_do_not_make_a_body_heavy() -> None:
    from ext_proc.serve.offload import containers_outside_strings

    offload = Offload(None, 8 * 1024 * 1024, heavy_containers=1_000)
    # 25,000 "[" in a string (the body): 3 containers outside it
    quoted = json.dumps({"metadata": {"x": "[" * 25_000}, "n": 16}).encode()
    assert containers_outside_strings(quoted, 1_000) == 2
    assert not offload.is_heavy(quoted)
    # escaped quotes and backslashes inside the string do not end it early
    tricky = json.dumps({"x": '\\"[' * 5_000 + '"{' * 5_000}).encode()
    assert containers_outside_strings(tricky, 1_000) == 1
    # a string dense in escapes is heavy for its decode: over 32 × 1,000 backslashes
    assert offload.is_heavy(json.dumps({"x": '"' * 32_001}).encode())
    assert not offload.is_heavy(json.dumps({"x": '"' * 31_999}).encode())
    # real containers count: 1,001 objects are heavy, 999 are not
    assert offload.is_heavy(json.dumps([{}] * 1_001).encode())
    assert not offload.is_heavy(json.dumps([{}] * 998).encode())


def test_a_body_of_many_or_large_media_payloads_is_heavy_and_a_long_text_is_not() -> None:
    offload = Offload(None, 8 * 1024 * 1024)
    part = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    # each data URL counts twice (data: and base64): 16 parts = 32 marks, 17 = 34 > 32
    few = json.dumps({"messages": [{"role": "user", "content": [part] * 16}]}).encode()
    many = json.dumps({"messages": [{"role": "user", "content": [part] * 17}]}).encode()
    assert not offload.is_heavy(few) and offload.is_heavy(many)
    # one large data URL goes too (its decode and edit are long); a long text does not
    long = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 2_000_000}}
    assert offload.is_heavy(json.dumps({"messages": [{"content": [long]}]}).encode())
    text = {"role": "user", "content": "A" * 2_000_000}
    assert not offload.is_heavy(json.dumps({"messages": [text]}).encode())
