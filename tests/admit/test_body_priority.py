"""The body's own ``priority`` (vLLM's scheduling priority, lower first) follows the route's
``client_priority``: ``trust`` forwards it, ``ignore`` removes it, ``cap`` keeps only a value
that cannot move the request ahead of vLLM's default 0 (``ext_proc.admit.body_priority``).
Removal is a minimal edit: every other byte goes on as sent; a body with nothing to remove
goes on untouched (``Continue.body is None``)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ext_proc.admit.body_priority import keeps
from ext_proc.admit.outcome import Continue
from ext_proc.admit.pipeline import Pipeline
from ext_proc.admit.verdict import BodyVerdict
from ext_proc.policy.decision import Downgrade, Pass
from ext_proc.policy.load import parse_policy
from ext_proc.schemas import rawjson

POLICY = """
profiles:
  default: {max_model_len: 8192, output_buffer_tokens: 512}
pools:
  sglang_pool: {kind: sglang}
routes:
  capped: {profile: default}
  trusted: {profile: default, client_priority: trust}
  fixed: {profile: default, client_priority: ignore}
  sglang_chat: {profile: default, pool: sglang_pool}
  sglang: {profile: default, schema: sglang_generate}
"""
CHAT = "/v1/chat/completions"


def judge(route: str, raw: bytes, path: str = CHAT) -> BodyVerdict:
    pipeline = Pipeline(parse_policy(POLICY), lambda _pool: None)
    r = pipeline.router.resolve([("x-ice-route", route)])
    headers = [(":path", path.encode()), (":method", b"POST")]
    facts = pipeline.on_headers(r, headers, False)
    verdict = pipeline.on_body(r, facts, raw)
    assert verdict is not None
    return verdict


def sent(verdict: BodyVerdict, raw: bytes) -> bytes:
    outcome = verdict.outcome
    assert isinstance(outcome, Continue), outcome
    return raw if outcome.body is None else outcome.body


def chat(priority_text: str, tail: str = "") -> bytes:
    return (
        '{"model": "m",  "priority": ' + priority_text + ', "messages": '
        '[{"role": "user", "content": "hi"}], "max_tokens": 8' + tail + "}"
    ).encode()


WITHOUT = b'{"model": "m",  "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}'


@pytest.mark.parametrize(
    ("value", "mode", "server", "kept"),
    [
        (5, "cap", "vllm", True),  # later than the default: a client may ask for less
        (0, "cap", "vllm", True),
        (-1, "cap", "vllm", False),  # ahead of every default request
        (-(2**63), "cap", "vllm", False),
        (1.0, "cap", "vllm", False),  # vLLM's pydantic would take 1
        ("-5", "cap", "vllm", False),  # and -5 from a string
        (None, "cap", "vllm", False),
        (True, "cap", "vllm", False),
        (5, "cap", "sglang", False),  # larger first by default on SGLang: ICE cannot tell
        (-5, "trust", "vllm", True),
        (-5, "trust", "sglang", True),
        (5, "ignore", "vllm", False),
        (0, "ignore", "vllm", False),
    ],
)
def test_which_values_go_on(value: Any, mode: Any, server: str, kept: bool) -> None:
    assert keeps(value, mode, server) is kept


@pytest.mark.parametrize(
    ("route", "text", "stripped"),
    [
        ("capped", "-10", True),
        ("capped", "7", False),
        ("capped", '"-3"', True),
        ("trusted", "-10", False),
        ("fixed", "7", True),
        ("sglang_chat", "7", True),
    ],
)
def test_a_chat_body_goes_on_with_or_without_its_priority(
    route: str, text: str, stripped: bool
) -> None:
    raw = chat(text)
    verdict = judge(route, raw)
    assert isinstance(verdict.decision, Pass)
    out = sent(verdict, raw)
    if stripped:
        assert out == WITHOUT  # only the member and its comma went
        assert verdict.outcome.body is not None
    else:
        assert out == raw and verdict.outcome.body is None  # byte for byte, not re-serialised


def test_a_body_without_a_priority_is_untouched() -> None:
    verdict = judge("fixed", WITHOUT)
    assert verdict.outcome.body is None  # type: ignore[union-attr]


def test_the_strip_and_a_downgrade_compose() -> None:
    raw = chat("-10").replace(b'"max_tokens": 8', b'"max_tokens": 100000')
    verdict = judge("capped", raw)
    assert isinstance(verdict.decision, Downgrade)
    out = json.loads(sent(verdict, raw))
    assert "priority" not in out and out["max_tokens"] == verdict.decision.max_tokens


def test_the_last_member_and_its_comma_go() -> None:
    raw = WITHOUT[:-1] + b', "priority": -1}'
    assert sent(judge("capped", raw), raw) == WITHOUT


@pytest.mark.parametrize("route", ["capped", "fixed"])
def test_a_repeated_priority_is_a_400_unless_trusted(route: str) -> None:
    raw = chat("5", ', "priority": -9')
    verdict = judge(route, raw)
    assert verdict.bad == "duplicate_key"
    assert sent(judge("trusted", raw), raw) == raw


def test_other_keys_repeat_marks_survive_the_strip() -> None:
    """A strip must not hide a repeated limit from the adapter (a 400 before and after)."""
    raw = chat("-1", ', "max_tokens": 9')
    assert judge("capped", raw).bad == "duplicate_key"


@pytest.mark.parametrize(
    ("path", "route", "body"),
    [
        ("/inference/v1/generate", "capped", {"token_ids": [1, 2], "sampling_params": {}}),
        ("/v1/completions", "capped", {"prompt": "hi", "max_tokens": 4}),
        ("/v1/responses", "capped", {"input": "hi", "max_output_tokens": 4}),
        ("/v1/embeddings", "capped", {"input": "hi"}),
        ("/invocations", "capped", {"prompt": "hi", "max_tokens": 4}),
        (
            "/v1/chat/completions/batch",
            "capped",
            {"messages": [[{"role": "user", "content": "a"}]]},
        ),
        ("/generate", "sglang", {"text": "hi", "sampling_params": {"max_new_tokens": 4}}),
    ],
)
def test_every_api_that_reads_it_loses_a_negative_priority(
    path: str, route: str, body: dict[str, Any]
) -> None:
    raw = json.dumps({"model": "m", **body, "priority": -100}).encode()
    out = sent(judge(route, raw, path), raw)
    assert out == json.dumps({"model": "m", **body}).encode()


def test_anthropic_messages_keep_it_vllm_does_not_read_it() -> None:
    raw = json.dumps(
        {
            "model": "m",
            "max_tokens": 4,
            "messages": [{"role": "user", "content": "a"}],
            "priority": -100,
        }
    ).encode()
    verdict = judge("capped", raw, "/v1/messages")
    assert verdict.outcome.body is None  # type: ignore[union-attr]


def test_remove_member_steps_over_an_earlier_copy_of_another_key() -> None:
    doc = rawjson.parse_object(b'{"a": 1, "b": 2, "a": 3, "priority": -1, "c": 4}')
    out = rawjson.remove_member(doc, "priority")
    assert out.text == '{"a": 1, "b": 2, "a": 3, "c": 4}'
    again = rawjson.parse_object(out.text.encode())
    assert (again.values, again.spans, again.close_index) == (
        out.values,
        out.spans,
        out.close_index,
    )
    assert rawjson.duplicate_keys(out.values) == {"a"}


def test_a_heavy_body_judged_in_the_helper_process_loses_it_too() -> None:
    """The helper process decodes as the worker does: the stripped body comes back."""
    import asyncio

    from ext_proc.policy.load import load_policy
    from ext_proc.serve.offload import Offload

    pipeline = Pipeline(load_policy(None), lambda _pool: None)  # the built-in: cap
    route = pipeline.router.resolve([("x-ice-route", "chat")])
    headers = [(":path", CHAT.encode()), (":method", b"POST")]
    facts = pipeline.on_headers(route, headers, False)
    content = [{"type": "text", "text": "a"}] * 2_000
    doc = {"priority": -5, "messages": [{"role": "user", "content": content}], "max_tokens": 8}
    raw = json.dumps(doc).encode()
    offload = Offload(None, pipeline.max_body_bytes, heavy_containers=1_000)
    assert offload.is_heavy(raw)
    try:
        remote = asyncio.run(offload.on_body(pipeline, route, facts, raw))
    finally:
        offload.close()
    local = pipeline.on_body(route, facts, raw)
    assert remote is not None and local is not None
    del doc["priority"]
    assert sent(remote, raw) == sent(local, raw) == json.dumps(doc).encode()
