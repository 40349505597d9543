"""The gRPC shell, driven in-process with scripted ext_proc streams (no network).

Each case feeds a list of ProcessingRequests into ``ExtProcServicer.Process`` and checks the
whole list of responses, as Envoy would receive them.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from ext_proc.admit.pipeline import Pipeline
from ext_proc.policy.load import PolicyError, parse_policy
from ext_proc.serve.servicer import ExtProcServicer
from ext_proc.signals.snapshot import BackendSignals, PoolSnapshot
from tests.builders import (
    SERVICER_POLICY as POLICY,
)
from tests.builders import (
    FakeContext,
    body_msg,
    headers_msg,
    response_msg,
    set_headers,
)
from tests.builders import (
    servicer_snapshot as snapshot,
)


def STRAINED() -> PoolSnapshot:  # a value, built fresh per test
    """Medium pressure, 100 × 0.40 × 0.7 / 0.65 = 43.08: ICE asks for response headers."""
    return snapshot(0.7, 0)


def run(
    messages: list[pb.ProcessingRequest],
    snap: PoolSnapshot | None = None,
    metadata: tuple[tuple[str, str], ...] = (("x-ice-route", "chat"),),
    pipeline: Pipeline | None = None,
) -> list[pb.ProcessingResponse]:
    servicer = ExtProcServicer(pipeline or Pipeline(POLICY, lambda _pool: snap))

    async def requests() -> AsyncIterator[pb.ProcessingRequest]:
        for m in messages:
            yield m

    async def collect() -> list[pb.ProcessingResponse]:
        return [r async for r in servicer.Process(requests(), FakeContext(metadata))]  # type: ignore[arg-type]

    return asyncio.run(collect())


CHAT = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 64}'


def test_pass_is_headers_then_annotated_body_reply() -> None:
    out = run([headers_msg(), body_msg(CHAT)], snapshot(0.2, 0))
    assert [r.WhichOneof("response") for r in out] == ["request_headers", "request_body"]
    common = out[1].request_body.response
    assert set_headers(common.header_mutation) == {
        "x-mem-pressure": "low",
        "x-mem-pressure-score": "12",
        "x-ice-decision": "pass",
    }
    assert not common.HasField("body_mutation")


def test_downgrade_replaces_body_and_sets_content_length() -> None:
    body = CHAT.replace(b"64", b"100000")
    out = run([headers_msg(), body_msg(body)], snapshot(0.2, 0))
    common = out[1].request_body.response
    new = common.body_mutation.body
    assert json.loads(new)["max_tokens"] < 100000
    assert set_headers(common.header_mutation)["content-length"] == str(len(new))


def test_shed_is_an_immediate_response_in_openai_format() -> None:
    out = run([headers_msg(**{"x-priority": "sheddable"}), body_msg(CHAT)], snapshot(1.0, 8))
    ir = out[1].immediate_response
    assert ir.status.code == 429
    assert json.loads(ir.body)["error"]["code"] == "memory_pressure"
    assert set_headers(ir.headers)["retry-after"] == "2"


def test_route_metadata_priority_applies_without_header() -> None:
    meta = (("x-ice-route", "chat"), ("x-ice-priority", "sheddable"))
    out = run([headers_msg(), body_msg(CHAT)], snapshot(0.97, 3), metadata=meta)
    assert out[1].immediate_response.status.code == 429


def test_spoofed_headers_are_removed_in_the_headers_reply() -> None:
    out = run(
        [
            headers_msg(
                **{"x-mem-pressure": "low", "x-ice-decision": "pass", "x-downgraded": "true"}
            ),
            body_msg(CHAT),
        ],
        snapshot(0.2, 0),
    )
    removed = list(out[0].request_headers.response.header_mutation.remove_headers)
    assert sorted(removed) == ["x-downgraded", "x-ice-decision", "x-mem-pressure"]


def test_unknown_path_is_answered_404_at_the_headers_phase() -> None:
    out = run([headers_msg("/v1/load_lora_adapter")])
    ir = out[0].immediate_response
    err = json.loads(ir.body)["error"]
    assert ir.status.code == 404 and err["code"] == "unknown_endpoint"
    assert "/v1/load_lora_adapter" in err["message"]


def test_read_only_get_turns_the_body_phase_off() -> None:
    out = run([headers_msg("/v1/models", eos=True, **{":method": "GET"})])
    assert out[0].HasField("mode_override") and out[0].mode_override.request_body_mode == 0


def test_non_json_content_type_on_a_judged_path_is_answered_415() -> None:
    out = run([headers_msg(**{"content-type": "text/plain"})])
    ir = out[0].immediate_response
    assert ir.status.code == 415
    assert json.loads(ir.body)["error"]["code"] == "unsupported_media_type"


def test_a_content_types_pass_profile_forwards_non_json_unjudged() -> None:
    policy = parse_policy(
        "profiles:\n  default: {max_model_len: 8192, content_types: pass}\n"
        "routes:\n  chat: {profile: default}\n"
    )
    out = run(
        [headers_msg(**{"content-type": "text/plain"})], pipeline=Pipeline(policy, lambda _p: None)
    )
    assert not out[0].HasField("immediate_response")
    assert out[0].mode_override.request_body_mode == 0  # the body goes on, not to ICE
    with pytest.raises(PolicyError, match=r"profiles\.default\.content_types: must be"):
        parse_policy("profiles:\n  default: {content_types: lenient}\n")


def test_empty_body_is_answered_400_at_the_headers_phase() -> None:
    out = run([headers_msg(eos=True)])
    ir = out[0].immediate_response
    assert ir.status.code == 400 and json.loads(ir.body)["error"]["code"] == "empty_body"


def test_declared_oversize_body_is_answered_413_at_the_headers_phase() -> None:
    out = run([headers_msg(**{"content-length": str(9 * 1024 * 1024)})])
    assert out[0].immediate_response.status.code == 413


def test_invalid_json_is_a_400_with_the_position() -> None:
    out = run([headers_msg(), body_msg(b'{"messages": [}')], snapshot(0.2, 0))
    err = json.loads(out[1].immediate_response.body)["error"]
    assert err["code"] == "invalid_json" and "char 14" in err["message"]


class ExplodingLookup:
    def __call__(self, pool: str) -> PoolSnapshot | None:
        raise RuntimeError("boom")


def test_internal_fault_fails_open_by_default() -> None:
    pipeline = Pipeline(POLICY, ExplodingLookup())
    out = run([headers_msg(), body_msg(CHAT)], pipeline=pipeline)
    assert out[1].WhichOneof("response") == "request_body"
    assert not out[1].request_body.response.HasField("header_mutation")


def test_internal_fault_fails_closed_when_the_profile_says_so() -> None:
    pipeline = Pipeline(POLICY, ExplodingLookup())
    out = run(
        [headers_msg(), body_msg(CHAT)], pipeline=pipeline, metadata=(("x-ice-profile", "strict"),)
    )
    ir = out[1].immediate_response
    assert ir.status.code == 503 and json.loads(ir.body)["error"]["code"] == "ice_internal_error"


def test_unexpected_phases_get_a_matching_empty_reply() -> None:
    msg = pb.ProcessingRequest(response_headers=pb.HttpHeaders())
    out = run([msg])
    assert out[0].WhichOneof("response") == "response_headers"


def _processed(phase: str) -> float:
    from prometheus_client import REGISTRY

    value = REGISTRY.get_sample_value("ice_processing_seconds_count", {"phase": phase})
    return value or 0.0


def test_each_answered_message_is_timed_by_phase() -> None:
    before = {p: _processed(p) for p in ("request_headers", "request_body")}
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5})
    responses = run([headers_msg(), body_msg(body.encode())], snapshot(0.2, 0))
    assert len(responses) == 2
    assert _processed("request_headers") == before["request_headers"] + 1
    assert _processed("request_body") == before["request_body"] + 1


# --- the response phase: a backend's overload 503 (ext_proc.admit.overload_answer) ---------------

BASE_SEND, BUFFERED = 1, 2  # ProcessingMode: HeaderSendMode.SEND, BodySendMode.BUFFERED


def _policy(profile: str) -> Pipeline:
    text = f"profiles:\n  default: {{max_model_len: 8192, {profile}}}\nroutes:\n  chat: {{}}\n"
    return Pipeline(parse_policy(text), lambda _pool: STRAINED())


def test_a_request_ice_judges_asks_envoy_for_its_response_headers() -> None:
    out = run([headers_msg(), body_msg(CHAT)], STRAINED())
    mode = out[0].mode_override
    assert (mode.response_header_mode, mode.request_body_mode) == (BASE_SEND, BUFFERED)
    assert mode.response_body_mode == 0  # NONE: the response body never comes to ICE


def test_at_low_pressure_without_valve_refusals_no_response_headers_are_asked() -> None:
    out = run([headers_msg(), body_msg(CHAT)], snapshot(0.2, 0))  # 12.31: low
    assert not out[0].HasField("mode_override")


def test_a_valve_that_refused_within_the_window_is_watched_even_at_low_pressure() -> None:
    from ext_proc.signals.scrapes import Derived

    derived = Derived(window_s=10.0, admission_rejections_per_s=0.5)
    backend = BackendSignals(url="u", kv_cache_usage=0.2, num_requests_waiting=0, derived=derived)
    snap = PoolSnapshot(pool="default", backends=(backend,), taken_at_s=time.monotonic())
    out = run([headers_msg(), body_msg(CHAT)], snap)
    assert out[0].mode_override.response_header_mode == BASE_SEND


@pytest.mark.parametrize(
    "profile", ["backend_overload_status: 0", "mode: shadow"], ids=["off", "shadow"]
)
def test_a_profile_that_does_not_watch_asks_for_nothing(profile: str) -> None:
    out = run([headers_msg(), body_msg(CHAT)], pipeline=_policy(profile))
    assert not out[0].HasField("mode_override")


def test_a_backends_overload_503_becomes_ices_answer() -> None:
    out = run([headers_msg(), body_msg(CHAT), response_msg()], STRAINED())
    assert [r.WhichOneof("response") for r in out] == [
        "request_headers",
        "request_body",
        "immediate_response",
    ]
    ir = out[2].immediate_response
    assert ir.status.code == 503 and ir.details == "ice_backend_overloaded"
    headers = set_headers(ir.headers)
    assert headers["retry-after"] == "2"  # no drain rate in the snapshot: retry_after_s
    assert headers["x-ice-decision"] == "reject"
    assert headers["x-ice-reason"] == "backend_overloaded"
    assert headers["x-mem-pressure"] == "medium"  # STRAINED: 43.08
    err = json.loads(ir.body)["error"]
    assert err["code"] == "backend_overloaded" and err["type"] == "server_error"
    md = out[2].dynamic_metadata.fields["ice"].struct_value.fields
    assert md["x-ice-decision"].string_value == "reject"  # the access log's decision too
    assert md["profile"].string_value == "default"


def test_the_profile_maps_the_503_to_429() -> None:
    out = run(
        [headers_msg(), body_msg(CHAT), response_msg()],
        pipeline=_policy("backend_overload_status: 429"),
    )
    ir = out[2].immediate_response
    assert ir.status.code == 429
    assert json.loads(ir.body)["error"]["type"] == "rate_limit_error"


@pytest.mark.parametrize(
    "message",
    [
        response_msg("200"),
        response_msg("500"),
        response_msg(details="upstream_reset_before_response_started{connection_failure}"),
        response_msg(details="via_upstream", **{"content-type": "text/plain"}),
    ],
    ids=["200", "500", "envoys-own-503", "plain-text-503"],
)
def test_any_other_response_goes_on_untouched(message: pb.ProcessingRequest) -> None:
    out = run([headers_msg(), body_msg(CHAT), message], STRAINED())
    assert out[2] == pb.ProcessingResponse(response_headers=pb.HeadersResponse())


def test_a_fault_in_the_response_phase_continues_even_when_failing_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from prometheus_client import REGISTRY

    from ext_proc.admit import overload_answer

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(overload_answer, "answer", broken)
    labels = {"phase": "response_headers", "fail_mode": "open"}  # whatever the profile says
    before = REGISTRY.get_sample_value("ice_internal_errors_total", labels) or 0.0
    out = run(
        [headers_msg(), body_msg(CHAT), response_msg()],
        STRAINED(),
        metadata=(("x-ice-route", "chat"), ("x-ice-profile", "strict")),
    )
    assert out[2] == pb.ProcessingResponse(response_headers=pb.HeadersResponse())
    assert REGISTRY.get_sample_value("ice_internal_errors_total", labels) == before + 1


def test_a_queued_body_asks_envoy_for_the_wait_before_it_waits() -> None:
    """The timeout extension goes out at once; the verdict only when the queue answers (Envoy
    would otherwise fail the request open at its message timeout)."""
    policy = parse_policy(
        """
profiles:
  default:
    on_kv_shortfall: shed
    queue: {enabled: true, max_queue_wait_ms: 5000, poll_ms: 20}
"""
    )
    tight = BackendSignals(url="u", kv_cache_usage=0.95, num_requests_waiting=0,
                           num_gpu_blocks=11, block_size=16)  # fmt: skip
    view = {"now": PoolSnapshot("default", (tight,), time.monotonic())}
    servicer = ExtProcServicer(Pipeline(policy, lambda _pool: view["now"]))
    body = json.dumps({"messages": [{"role": "user", "content": "x" * 200}], "max_tokens": 40})

    async def scenario() -> tuple[pb.ProcessingResponse, pb.ProcessingResponse, float]:
        inbox: asyncio.Queue[pb.ProcessingRequest | None] = asyncio.Queue()

        async def requests() -> AsyncIterator[pb.ProcessingRequest]:
            while (m := await inbox.get()) is not None:
                yield m

        replies = servicer.Process(requests(), FakeContext(()))  # type: ignore[arg-type]
        await inbox.put(headers_msg())
        await anext(replies)
        await inbox.put(body_msg(body.encode()))
        extension = await asyncio.wait_for(anext(replies), 1.0)  # not after the wait
        started = time.monotonic()
        room = BackendSignals(url="u", kv_cache_usage=0.0, num_requests_waiting=0,
                              num_gpu_blocks=11, block_size=16)  # fmt: skip
        view["now"] = PoolSnapshot("default", (room,), time.monotonic())
        verdict = await asyncio.wait_for(anext(replies), 5.0)
        await inbox.put(None)
        await replies.aclose()
        return extension, verdict, time.monotonic() - started

    extension, verdict, waited = asyncio.run(scenario())
    assert extension.HasField("override_message_timeout")
    assert extension.override_message_timeout.ToMilliseconds() == 5000 + 1000
    assert verdict.HasField("request_body") and not verdict.HasField("override_message_timeout")
    sets = verdict.request_body.response.header_mutation.set_headers
    assert {h.header.key: h.header.raw_value for h in sets}["x-ice-decision"] == b"pass"
    assert waited < 5.0
