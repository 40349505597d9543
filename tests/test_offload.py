"""Heavy bodies are judged in the helper process with the same result as in-process."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from ext_proc.offload import Offload
from ext_proc.pipeline import HeaderFacts, Pipeline
from ext_proc.policy.load import load_policy
from ext_proc.schemas import OPENAI_CHAT
from ext_proc.signals.snapshot import BackendSignals, PoolSnapshot

PART = {"type": "text", "text": "a"}


def heavy_body(max_tokens: int) -> bytes:
    content = [PART] * 30_000
    return json.dumps(
        {"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens}
    ).encode()


@pytest.mark.parametrize("usage", [0.2, 0.97], ids=["low", "high"])
def test_offloaded_verdict_equals_in_process_verdict(usage: float) -> None:
    backend = BackendSignals(url="u", kv_cache_usage=usage, num_requests_waiting=3)
    snap = PoolSnapshot(pool="default", backends=(backend,), taken_at_s=time.monotonic())
    pipeline = Pipeline(load_policy(None), lambda _pool: snap)
    route = pipeline.router.resolve([("x-ice-route", "chat")])
    facts = HeaderFacts(adapter=OPENAI_CHAT, priority="standard")
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
