"""Judging never fails open by accident (issue 30, item 1).

A body of a shape its API does not allow gets the API's 400 (a content part whose ``type``
is not a string; an integer of more digits than Python converts); any other exception while
reading or judging a body is ICE's own fault: answered by the profile's ``fail_mode``,
counted in ``ice_judge_errors_total{route,stage}`` and logged once with the request id.
"""

from __future__ import annotations

import asyncio
import json
import logging
import pickle
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from prometheus_client import REGISTRY

from ext_proc.admit import pipeline as pipeline_module
from ext_proc.admit.faults import JudgeFault, judging
from ext_proc.admit.outcome import Respond
from ext_proc.admit.pipeline import Pipeline, RequestFacts
from ext_proc.policy.load import parse_policy
from ext_proc.schemas import ADAPTERS, BadRequest, rawjson
from ext_proc.schemas.openai import OPENAI_CHAT
from ext_proc.serve.servicer import ExtProcServicer
from ext_proc.signals.snapshot import BackendSignals, PoolSnapshot

POLICY = parse_policy(
    """
profiles:
  default: {max_model_len: 8192, output_buffer_tokens: 512}
  strict: {max_model_len: 8192, fail_mode: closed}
routes:
  chat: {profile: default}
  tight: {profile: strict}
exact_count: always
"""
)
ODD = {"type": [], "text": "hi"}
PART_TYPE_BODIES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"messages": [{"role": "user", "content": [ODD]}]},
    "/v1/chat/completions/batch": {"messages": [[{"role": "user", "content": [ODD]}]]},
    "/v1/messages": {"messages": [{"role": "user", "content": [ODD]}], "max_tokens": 5},
    "/v1/responses": {"input": [{"role": "user", "content": [ODD]}]},
    "/inference/v1/generate": {"token_ids": [1, 2], "content_parts": [ODD], "sampling_params": {}},
    "/invocations": {"messages": [{"role": "user", "content": [ODD]}]},
    "/v1/embeddings": {"messages": [{"role": "user", "content": [ODD]}]},
}
HUGE = "7" * (sys.get_int_max_str_digits() + 1)


def snap() -> PoolSnapshot:
    backend = BackendSignals(url="u", kv_cache_usage=0.1, num_requests_waiting=0)
    return PoolSnapshot(pool="default", backends=(backend,), taken_at_s=time.monotonic())


def judge(path: str, body: bytes) -> Respond:
    p = Pipeline(POLICY, lambda _pool: snap())
    verdict = p.on_body(p.router.resolve([]), RequestFacts(adapter=ADAPTERS[path]), body)
    assert verdict is not None
    assert isinstance(verdict.outcome, Respond), verdict.outcome
    return verdict.outcome


def error_code(path: str, outcome: Respond) -> str:
    doc = json.loads(outcome.body)
    if path == "/v1/messages":
        assert doc["type"] == "error"
    return str(doc["error"]["code"])


# --- the API's 400 ---------------------------------------------------------------------------


@pytest.mark.parametrize("path", sorted(PART_TYPE_BODIES))
@pytest.mark.parametrize("kind", [[], {}, 3, True], ids=["array", "object", "number", "bool"])
def test_a_content_part_whose_type_is_not_a_string_is_a_400_in_the_apis_format(
    path: str, kind: Any
) -> None:
    body = json.dumps(PART_TYPE_BODIES[path]).replace("[]", json.dumps(kind), 1)
    if path == "/inference/v1/generate":
        body = json.dumps({**PART_TYPE_BODIES[path], "content_parts": [{"type": kind}]})
    outcome = judge(path, body.encode())
    assert outcome.status == 400
    assert error_code(path, outcome) == "invalid_type"
    assert ".type' must be a string" in json.loads(outcome.body)["error"]["message"]


def test_a_responses_item_whose_type_is_not_a_string_is_a_400() -> None:
    body = b'{"input": [{"type": ["message"], "content": "hi"}]}'
    outcome = judge("/v1/responses", body)
    assert (outcome.status, error_code("/v1/responses", outcome)) == (400, "invalid_type")


@pytest.mark.parametrize("path", sorted(PART_TYPE_BODIES))
def test_an_integer_of_more_than_4300_digits_anywhere_is_a_400_invalid_json(path: str) -> None:
    doc = json.dumps(PART_TYPE_BODIES[path]).replace('[{"type": [], "text": "hi"}]', '"hi"')
    body = (doc[:-1] + f', "n": 64, "max_tokens": 100000000, "x": [{{"y": {HUGE}}}]}}').encode()
    outcome = judge(path, body)
    assert outcome.status == 400
    assert error_code(path, outcome) == "invalid_json"
    message = json.loads(outcome.body)["error"]["message"]
    assert f"more than {sys.get_int_max_str_digits()} digits" in message


@pytest.mark.parametrize("negative", [False, True])
def test_every_decoder_turns_a_too_long_integer_into_invalid_json(negative: bool) -> None:
    body = b'{"max_tokens": ' + (b"-" if negative else b"") + HUGE.encode() + b"}"
    with pytest.raises(rawjson.InvalidJSON, match="digits"):
        rawjson.parse_object(body)
    with pytest.raises(rawjson.InvalidJSON, match="digits"):
        rawjson.parse_object(body, frozenset({"messages"}))
    with pytest.raises(rawjson.InvalidJSON, match="digits"):
        rawjson.decode_object(body)
    at_the_limit = b'{"x": ' + HUGE[1:].encode() + b', "messages": [], "max_tokens": 5}'
    assert rawjson.parse_object(at_the_limit).values["max_tokens"] == 5


# --- ICE's own fault, stage by stage --------------------------------------------------------


class _Broken:
    """A tokenizer registry whose counter breaks (not a TokenCountError: ICE's fault)."""

    def counter_for(self, model: object) -> _Broken:
        return self

    def prompt_counts(self, *args: object) -> tuple[int, ...]:
        raise RuntimeError("tokenizer broke")


def _boom(*args: object, **kwargs: object) -> Any:
    raise RuntimeError("boom")


STAGES = ("decode", "features", "count", "judge", "plan", "admit")


@pytest.fixture
def break_stage(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    def brake(stage: str, p: Pipeline) -> None:
        if stage == "decode":
            monkeypatch.setattr(rawjson, "parse_object", _boom)
        elif stage == "features":
            monkeypatch.setattr(type(OPENAI_CHAT), "features", _boom)
        elif stage == "count":
            p.counters = _Broken()
        elif stage == "judge":
            monkeypatch.setattr(pipeline_module, "evaluate", _boom)
        elif stage == "plan":
            monkeypatch.setattr(pipeline_module, "make_verdict", _boom)
        else:
            monkeypatch.setattr(p.recorder, "record", _boom)

    yield brake


class FakeContext:
    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self._metadata = metadata

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata


def stream_messages(body: bytes, **extra: str) -> list[pb.ProcessingRequest]:
    pairs = {":path": "/v1/chat/completions", ":method": "POST", **extra}
    hs = [base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs.items()]
    headers = pb.HttpHeaders(headers=base_pb2.HeaderMap(headers=hs))
    return [
        pb.ProcessingRequest(request_headers=headers),
        pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=True)),
    ]


def run_stream(
    p: Pipeline | ExtProcServicer, route: str, request_id: str = ""
) -> list[pb.ProcessingResponse]:
    servicer = p if isinstance(p, ExtProcServicer) else ExtProcServicer(p)
    extra = {"x-request-id": request_id} if request_id else {}
    body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 9}'
    messages = stream_messages(body, **extra)

    async def requests() -> Any:
        for m in messages:
            yield m

    async def collect() -> list[pb.ProcessingResponse]:
        ctx = FakeContext((("x-ice-route", route),))
        return [r async for r in servicer.Process(requests(), ctx)]  # type: ignore[arg-type]

    return asyncio.run(collect())


def judge_errors(route: str, stage: str) -> float:
    labels = {"route": route, "stage": stage}
    return REGISTRY.get_sample_value("ice_judge_errors_total", labels) or 0.0


@pytest.mark.parametrize("stage", STAGES)
def test_a_fault_at_each_stage_fails_open_on_an_open_profile_and_is_counted(
    stage: str, break_stage: Any
) -> None:
    p = Pipeline(POLICY, lambda _pool: snap())
    break_stage(stage, p)
    before = judge_errors("chat", stage)
    out = run_stream(p, "chat")
    assert out[1] == pb.ProcessingResponse(request_body=pb.BodyResponse())
    assert judge_errors("chat", stage) == before + 1


@pytest.mark.parametrize("stage", STAGES)
def test_a_fault_at_each_stage_is_a_503_on_a_closed_profile_and_is_counted(
    stage: str, break_stage: Any
) -> None:
    p = Pipeline(POLICY, lambda _pool: snap())
    break_stage(stage, p)
    before = judge_errors("tight", stage)
    out = run_stream(p, "tight")
    ir = out[1].immediate_response
    assert ir.status.code == 503
    assert json.loads(ir.body)["error"]["code"] == "ice_internal_error"
    assert judge_errors("tight", stage) == before + 1


def test_a_fault_is_logged_once_per_stage_and_kind_with_the_request_id(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    class Odd(Exception):
        """An error type no other test raises (the log is once per process)."""

    def odd(*args: object, **kwargs: object) -> Any:
        raise Odd("odd")

    monkeypatch.setattr(pipeline_module, "make_verdict", odd)
    servicer = ExtProcServicer(Pipeline(POLICY, lambda _pool: snap()))
    with caplog.at_level(logging.ERROR, logger="ice.servicer"):
        run_stream(servicer, "chat", request_id="req-first")
        run_stream(servicer, "chat", request_id="req-second")
    logged = [r.getMessage() for r in caplog.records if "stage plan" in r.getMessage()]
    assert len(logged) == 1
    assert "req-first" in logged[0]


def test_a_judge_fault_crosses_from_the_helper_process_with_its_stage() -> None:
    fault = pickle.loads(pickle.dumps(JudgeFault("count", "RuntimeError", "tokenizer broke")))
    assert (fault.stage, fault.kind) == ("count", "RuntimeError")
    assert "tokenizer broke" in str(fault)


def test_a_stage_lets_the_apis_own_refusals_through_and_names_its_own_faults() -> None:
    with pytest.raises(BadRequest), judging("features", client=True):
        raise BadRequest("bad")
    with pytest.raises(JudgeFault) as got, judging("judge"):
        raise BadRequest("not the client's, here")
    assert got.value.stage == "judge"
    with pytest.raises(JudgeFault) as got, judging("plan"), judging("count"):
        raise KeyError("inner")
    assert got.value.stage == "count"
