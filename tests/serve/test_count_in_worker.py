"""A long body whose text is mostly in the worker's piece cache is counted in the worker.

With a tokenizer configured, a body over ``exact_count_inline_bytes`` used to be judged in the
helper process, whatever it cost to count. Now (``ext_proc.serve.offload``): a body heavy
only by its size is judged in-process first, with its exact count bounded to
``exact_count_inline_bytes`` characters of text new to the cache
(``ext_proc.tokencount.pieces.new_text_bound``); past it nothing is encoded and the helper
judges it. The helper sends back the (digest, count) pairs of the pieces it counted
(``pieces.Lesson``), so the next turn of a conversation first counted there is counted in
the worker. The counts are the tokenizer's either way (checked against a counter of its own).

Hand-checkable: the tiny test tokenizer (its template cuts at ``<s>`` / ``</s>``, so each
turn is a piece), turns of ~1.5 KB, a 32 KiB bound.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from ext_proc.admit.pipeline import Pipeline
from ext_proc.admit.verdict import RequestFacts
from ext_proc.policy.load import load_policy
from ext_proc.schemas import BY_NAME
from ext_proc.serve.offload import Offload, weigh
from ext_proc.serve.servicer import ExtProcServicer
from ext_proc.tokencount import ExactCounter, TokenizerSpec
from ext_proc.tokencount.calibration import SAMPLE_WORDS
from ext_proc.tokencount.newtext import NewTextOverBound, lessons, new_text_bound, noting_pieces
from ext_proc.tokencount.pieces import ENTRY_BYTES
from tests.builders import FakeContext, body_msg, chatml, headers_msg

TINY = Path(__file__).parents[1] / "data" / "vllm_cpu" / "tokenizer"
BOUND = 32 * 1024  # exact_count_inline_bytes' default, as characters of new text
POLICY_TEXT = f"""
profiles:
  default: {{max_model_len: 1000000}}
tokenizers:
  tiny: {{model_dir: {TINY}}}
exact_count: always
"""
CHAT = BY_NAME["openai.chat"]


def tiny(cache_bytes: int = 32 * 1024 * 1024) -> ExactCounter:
    return ExactCounter.load(TokenizerSpec.from_model_dir(TINY), cache_bytes)


def history(mark: str, turns: int = 40) -> list[dict[str, str]]:
    """``turns`` alternating turns of ~1.5 KB each (60 KB: over the bound when new)."""
    words = SAMPLE_WORDS
    out = []
    for i in range(turns):
        text = " ".join(words[(i + j) % len(words)] for j in range(250))
        out.append({"role": "user" if i % 2 == 0 else "assistant", "content": f"{mark}{i} {text}"})
    return out


def next_turn(messages: list[dict[str, str]]) -> list[dict[str, str]]:
    return [
        *messages,
        {"role": "assistant", "content": "Step done."},
        {"role": "user", "content": "Now do the next step."},
    ]


def body(messages: list[dict[str, str]]) -> bytes:
    return json.dumps({"model": "tiny", "messages": messages, "max_tokens": 16}).encode()


# --- the bound -----------------------------------------------------------------------------


def test_the_bound_trips_on_a_cold_body_and_not_on_its_cached_next_turn() -> None:
    counter, reference = tiny(), tiny()
    cold = history("a")
    assert sum(len(m["content"]) for m in cold) > BOUND
    with pytest.raises(NewTextOverBound), new_text_bound(BOUND):
        counter.count_chat(cold)
    counter.count_chat(cold)  # the turn before, unbounded: its pieces go into the cache
    turn = next_turn(cold)
    with new_text_bound(BOUND):
        counted = counter.count_chat(turn)
    assert counted == reference.count_chat(turn)


def test_a_tripped_bound_encodes_nothing_and_refuses_every_later_count() -> None:
    counter = tiny(cache_bytes=1000 * ENTRY_BYTES)
    with noting_pieces() as noted, new_text_bound(BOUND):
        with pytest.raises(NewTextOverBound):
            counter.count_chat(history("b"))
        with pytest.raises(NewTextOverBound):  # "hi" alone would fit: the bound is spent
            counter.count_chat([{"role": "user", "content": "hi"}])
    assert lessons(noted) == ()  # nothing was counted, so nothing is cached or noted
    with new_text_bound(BOUND):  # the next bound starts afresh, on an empty cache
        assert counter.count_chat([{"role": "user", "content": "hi"}]) > 0


# --- lessons -------------------------------------------------------------------------------


def test_a_lesson_teaches_a_counter_of_the_same_tokenizer_and_no_other(tmp_path: Path) -> None:
    helper, worker, reference = tiny(), tiny(), tiny()
    cold = history("c")
    with noting_pieces() as noted:
        helper.count_chat(cold)
    taught = lessons(noted)
    assert len(taught) == 1 and len(taught[0]) == len(cold)  # one piece per turn, no text
    assert b"memory" not in taught[0].digests
    assert chatml(tmp_path).learn(taught[0]) == 0  # other added tokens: not the same counts
    assert worker.learn(taught[0]) == len(cold)
    assert worker.learn(taught[0]) == 0  # already known
    turn = next_turn(cold)
    with new_text_bound(BOUND):
        counted = worker.count_chat(turn)
    assert counted == reference.count_chat(turn)


def test_a_lesson_keeps_the_cache_bound() -> None:
    helper, worker = tiny(), tiny(cache_bytes=10 * ENTRY_BYTES)
    with noting_pieces() as noted:
        helper.count_chat(history("d"))
    (taught,) = lessons(noted)
    assert len(taught) == 40
    assert worker.learn(taught) == 10  # at most max_entries; the cache holds 10


# --- through the helper and the servicer ---------------------------------------------------


def pipeline_and_offload(
    tmp_path: Path, policy_text: str = POLICY_TEXT
) -> tuple[Pipeline, Offload]:
    path = tmp_path / "policy.yaml"
    path.write_text(policy_text)
    pipeline = Pipeline(load_policy(str(path)), lambda _pool: None)
    offload = Offload(str(path), pipeline.max_body_bytes)
    route, facts = pipeline.router.resolve(()), RequestFacts(adapter=CHAT)
    asyncio.run(offload.count(route, facts, body(history("warm", 2))))  # the helper starts
    return pipeline, offload


def judge(pipeline: Pipeline, offload: Offload, raw: bytes) -> Any:
    route, facts = pipeline.router.resolve(()), RequestFacts(adapter=CHAT)
    return asyncio.run(offload.on_body(pipeline, route, facts, raw, weigh(offload, pipeline, raw)))


def test_a_conversation_counted_in_the_helper_is_counted_in_the_worker_next_turn(
    tmp_path: Path,
) -> None:
    reference = tiny()
    pipeline, offload = pipeline_and_offload(tmp_path)
    try:
        cold = history("e")
        assert weigh(offload, pipeline, body(cold)) == "size"
        first = judge(pipeline, offload, body(cold))
        assert offload.judged == {"worker": 0, "tripped": 1, "helper": 0}
        turn = next_turn(cold)
        second = judge(pipeline, offload, body(turn))
        assert offload.judged == {"worker": 1, "tripped": 1, "helper": 0}
    finally:
        offload.close()
    assert first.lessons == second.lessons == ()  # learned here, not carried on
    assert first.features.input_tokens == reference.count_chat(cold)
    assert second.features.input_tokens == reference.count_chat(turn)
    assert second.features.input_tokens_source == "exact"


def through_servicer(servicer: ExtProcServicer, raws: list[bytes]) -> list[dict[str, str]]:
    """Each body on its own stream, one after the other; the headers ICE answered with."""
    got: list[dict[str, str]] = []

    async def go() -> None:
        for raw in raws:

            async def requests(raw: bytes = raw) -> AsyncIterator[object]:
                yield headers_msg()
                yield body_msg(raw)

            async for r in servicer.Process(requests(), FakeContext(())):
                if r.WhichOneof("response") == "request_body":
                    mutation = r.request_body.response.header_mutation
                    got.append(
                        {h.header.key: h.header.raw_value.decode() for h in mutation.set_headers}
                    )

    asyncio.run(go())
    return got


def test_the_servicer_sends_a_cold_long_body_to_the_helper_and_its_next_turn_not(
    tmp_path: Path,
) -> None:
    pipeline, offload = pipeline_and_offload(tmp_path)
    try:
        cold = history("f")
        answers = through_servicer(
            ExtProcServicer(pipeline, offload), [body(cold), body(next_turn(cold))]
        )
        judged = dict(offload.judged)
    finally:
        offload.close()
    assert judged == {"worker": 1, "tripped": 1, "helper": 0}
    assert [a.get("x-ice-tokens") for a in answers] == ["exact", "exact"]


def test_a_body_heavy_by_shape_goes_to_the_helper_untried(tmp_path: Path) -> None:
    pipeline, offload = pipeline_and_offload(tmp_path)
    nested = body([{"role": "user", "content": [{"type": "text", "text": "x"}] * 20_001}])
    try:
        assert weigh(offload, pipeline, nested) == "shape"  # 20,003 containers outside strings
        verdict = judge(pipeline, offload, nested)
        assert offload.judged == {"worker": 0, "tripped": 0, "helper": 1}
    finally:
        offload.close()
    assert verdict.features.input_tokens_source == "exact"


def test_under_prefix_tracking_a_long_body_goes_to_the_helper_untried(tmp_path: Path) -> None:
    tracked = POLICY_TEXT + "prefix_tracking: {enabled: true}\n"
    pipeline, offload = pipeline_and_offload(tmp_path, tracked)
    try:
        cold = history("g")
        judge(pipeline, offload, body(cold))  # counted in the helper: the worker learns it
        judge(pipeline, offload, body(next_turn(cold)))  # a sampled one would need all ids
        assert offload.judged == {"worker": 0, "tripped": 0, "helper": 2}
    finally:
        offload.close()
