"""A request's body is decoded once, whatever way it takes through ICE: passed, downgraded
(the edit reuses the decode's spans), compacted (the compacted body is judged and edited
without a parse), truncated (the shorter body is built on the decode), queued and judged
again, reserved again after a conflict (``Pipeline.rejudge``), and judged in the helper
process (the worker does not decode it again, not even to edit it after a re-judgement).

A decode is a call of a body-level JSON decoder: ``rawjson.parse_object``,
``rawjson.decode_object`` or the compaction scan's ``top_members``.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace
from typing import Any

import pytest

from ext_proc.admit.backlog import Backlog
from ext_proc.admit.outcome import Continue
from ext_proc.admit.pipeline import Pipeline, RequestFacts
from ext_proc.admit.queue import AdmissionQueue, Waiter
from ext_proc.admit.stream import Stream
from ext_proc.admit.truncation import finish_truncation
from ext_proc.policy.decision import Downgrade, Pass, Truncated
from ext_proc.policy.load import default_policy_text, parse_policy
from ext_proc.schemas import OPENAI_CHAT, rawjson
from ext_proc.serve.offload import Offload
from ext_proc.signals.snapshot import BackendSignals, PoolSnapshot
from ext_proc.sysprompt import scan
from tests.builders import admission

CONFIG = json.dumps({"units": "metric", "lang": ["en", "fr"], "tz": "UTC"}, indent=4)


def _snapshot(usage: float, waiting: int = 3, blocks: int | None = None) -> PoolSnapshot:
    backend = BackendSignals(
        url="u",
        kv_cache_usage=usage,
        num_requests_waiting=waiting,
        num_gpu_blocks=blocks,
        block_size=16 if blocks else None,
    )
    return PoolSnapshot(pool="default", backends=(backend,), taken_at_s=time.monotonic())


CALM = _snapshot(0.1, waiting=0)
HIGH = _snapshot(0.97)  # pressure high: the default profile caps max_tokens at 1024


def _chat(max_tokens: int, turns: int = 1, system: str = "Be brief.") -> bytes:
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
    for i in range(turns):
        messages += [
            {"role": "user", "content": f"Question {i} about topic {i}?"},
            {"role": "assistant", "content": f"Answer {i}."},
        ]
    messages.append({"role": "user", "content": "And the last one?"})
    body = {"model": "m", "messages": messages, "max_tokens": max_tokens}
    body["max_completion_tokens"] = max_tokens  # two limit fields: one edit pass lowers both
    return json.dumps(body, indent=1).encode()


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the bodies decoded, in order."""
    seen: list[int] = []
    parse, decode, top = rawjson.parse_object, rawjson.decode_object, scan.top_members

    def counted_parse(body: bytes, arrays: frozenset[str] = frozenset()) -> rawjson.TopLevel:
        seen.append(len(body))
        return parse(body, arrays)

    def counted_decode(body: bytes) -> dict[str, Any]:
        seen.append(len(body))
        return decode(body)

    def counted_top(text: str) -> Any:
        seen.append(len(text))
        return top(text)

    monkeypatch.setattr(rawjson, "parse_object", counted_parse)
    monkeypatch.setattr(rawjson, "decode_object", counted_decode)
    monkeypatch.setattr(scan, "top_members", counted_top)
    return seen


def _pipeline(snapshot: PoolSnapshot, extra: str = "") -> Pipeline:
    text = default_policy_text().replace("    fail_mode: open", "    fail_mode: open\n" + extra)
    return Pipeline(parse_policy(text), lambda _pool: snapshot)


def test_a_passed_body_is_decoded_once(decodes: list[int]) -> None:
    pipeline = _pipeline(CALM)
    verdict = pipeline.on_body(
        pipeline.router.resolve([]), RequestFacts(adapter=OPENAI_CHAT), _chat(64)
    )
    assert verdict is not None and isinstance(verdict.decision, Pass)
    assert len(decodes) == 1


def test_a_downgraded_body_is_edited_on_its_one_decode(decodes: list[int]) -> None:
    pipeline = _pipeline(HIGH)
    raw = _chat(8000)
    verdict = pipeline.on_body(pipeline.router.resolve([]), RequestFacts(adapter=OPENAI_CHAT), raw)
    assert verdict is not None and isinstance(verdict.decision, Downgrade)
    assert isinstance(verdict.outcome, Continue) and verdict.outcome.body is not None
    sent = json.loads(verdict.outcome.body)
    assert sent["max_tokens"] == sent["max_completion_tokens"] == 1024
    assert decodes == [len(raw)]


def test_a_compacted_body_is_judged_and_edited_without_another_decode(
    decodes: list[int],
) -> None:
    pipeline = _pipeline(HIGH, "    compact_system_json: true")
    raw = _chat(8000, system="Use this config:\n" + CONFIG)
    verdict = pipeline.on_body(pipeline.router.resolve([]), RequestFacts(adapter=OPENAI_CHAT), raw)
    assert verdict is not None and isinstance(verdict.decision, Downgrade)
    assert isinstance(verdict.outcome, Continue) and verdict.outcome.body is not None
    sent = json.loads(verdict.outcome.body)
    assert sent["messages"][0]["content"] == "Use this config:\n" + json.dumps(
        json.loads(CONFIG), separators=(",", ":")
    )
    assert sent["max_tokens"] == 1024
    assert dict(verdict.outcome.headers)["x-ice-compacted"].startswith("tokens=")
    assert decodes == [len(raw)]


def test_a_truncated_body_is_built_on_its_one_decode(decodes: list[int]) -> None:
    truncating = """
    truncation:
      enabled: true
      budget_tokens: {high: 60}
      keep_last_turns: 1
      deadline_ms: 2000"""
    pipeline = _pipeline(HIGH, truncating)  # no embedding worker: recency
    route = pipeline.router.resolve([])
    facts = RequestFacts(adapter=OPENAI_CHAT, priority="critical")
    raw = _chat(8000, turns=12)
    first = pipeline.on_body(route, facts, raw)
    assert first is not None and first.pending is not None
    done = asyncio.run(finish_truncation(pipeline, route, facts, first))
    assert isinstance(done.decision, Truncated) and done.decision.dropped_messages > 0
    assert isinstance(done.outcome, Continue) and done.outcome.body is not None
    sent = json.loads(done.outcome.body)
    assert len(sent["messages"]) < 26 and sent["max_tokens"] == 1024
    assert decodes == [len(raw)]


def test_a_request_judged_again_is_not_decoded_again(decodes: list[int]) -> None:
    pipeline = _pipeline(HIGH, "    compact_system_json: true")
    route = pipeline.router.resolve([])
    facts = RequestFacts(adapter=OPENAI_CHAT)
    raw = _chat(8000, system="Use this config:\n" + CONFIG)
    first = pipeline.on_body(route, facts, raw)
    assert first is not None
    again = pipeline.rejudge(route, facts, first)  # the shared ledger's conflict, the queue
    assert isinstance(again.decision, Downgrade)
    assert again.outcome == first.outcome
    assert decodes == [len(raw)]


def test_a_queued_request_is_admitted_on_its_one_decode(decodes: list[int]) -> None:
    policy = """
profiles:
  default:
    on_kv_shortfall: shed
    compact_system_json: true
    queue: {enabled: true, max_queue_wait_ms: 59000, poll_ms: 59000}
"""
    view = {"now": _snapshot(0.95, waiting=0, blocks=11)}  # 0 free blocks: queued
    pipeline = Pipeline(parse_policy(policy), lambda _pool: view["now"])
    route = pipeline.router.resolve([])
    facts = RequestFacts(adapter=OPENAI_CHAT)
    raw = _chat(40, system="Use this config:\n" + CONFIG)

    async def run() -> None:
        queue = AdmissionQueue()
        first = pipeline.on_body(route, facts, raw)
        assert first is not None and first.decision is not None
        assert first.decision.reason == "kv_exhausted"
        stream = Stream(Backlog(), pipeline.views, queue)
        commit = admission(pipeline, route, facts, queue, stream).commit
        waiter = queue.offer(pipeline, route, facts, stream, first, commit=commit)
        assert isinstance(waiter, Waiter)
        view["now"] = _snapshot(0.0, waiting=0, blocks=11)  # room now
        queue.tick()
        verdict = waiter.future.result()
        assert isinstance(verdict.decision, Pass)
        assert isinstance(verdict.outcome, Continue) and verdict.outcome.body is not None
        assert "x-ice-compacted" in dict(verdict.outcome.headers)

    asyncio.run(run())
    assert decodes == [len(raw)]


def test_a_body_judged_in_the_helper_is_not_decoded_again_in_the_worker(
    decodes: list[int],
) -> None:
    pipeline = _pipeline(HIGH)
    route = pipeline.router.resolve([])
    facts = RequestFacts(adapter=OPENAI_CHAT)
    raw = _chat(8000, turns=40)
    offload = Offload(None, pipeline.max_body_bytes, heavy_containers=1)
    try:
        remote = asyncio.run(offload.on_body(pipeline, route, facts, raw))
    finally:
        offload.close()
    assert remote is not None and remote.body is not None
    assert remote.body.doc.values["messages"] is rawjson.DROPPED  # came back slim
    again = pipeline.rejudge(route, facts, replace(remote, outcome=Continue([], None)))
    assert isinstance(again.decision, Downgrade)
    assert isinstance(again.outcome, Continue) and again.outcome.body is not None
    assert json.loads(again.outcome.body)["max_tokens"] == 1024  # edited on the slim decode
    assert decodes == []  # the helper decoded it, in its own process


def test_the_system_prompt_is_scanned_once_for_its_score_and_its_compaction() -> None:
    text = default_policy_text().replace(
        "    fail_mode: open", "    fail_mode: open\n    compact_system_json: true"
    )
    text += "prefix_tracking: {enabled: true, sample_every: 1}\n"
    pipeline = Pipeline(parse_policy(text), lambda _pool: CALM)
    assert pipeline.prefix is not None  # the complexity score is computed for this request
    system = "Use this config:\n" + CONFIG
    scan.embedded_json_spans.cache_clear()
    scan.compact_text.cache_clear()
    verdict = pipeline.on_body(
        pipeline.router.resolve([]), RequestFacts(adapter=OPENAI_CHAT), _chat(64, system=system)
    )
    assert verdict is not None and isinstance(verdict.outcome, Continue)
    assert "x-ice-compacted" in dict(verdict.outcome.headers)
    compacted = "Use this config:\n" + json.dumps(json.loads(CONFIG), separators=(",", ":"))
    # each text is scanned once: the client's (compacted) and the compacted one (the score
    # reads the body as judged); the score's own second look at a text is a cache hit
    spans = scan.embedded_json_spans.cache_info()
    assert scan.compact_text.cache_info().misses == 2
    assert spans.misses == 2 and spans.hits >= 1
    assert scan.compact_text(system)[0] == compacted
