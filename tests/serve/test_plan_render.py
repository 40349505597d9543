"""plan (Decision → edits, pure) and render (edits → ext_proc protobufs)."""

from __future__ import annotations

import json

import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from ext_proc.admit.outcome import Continue, Respond, plan
from ext_proc.policy.decision import Downgrade, Pass, Reject
from ext_proc.policy.pressure import Pressure
from ext_proc.policy.settings import Level
from ext_proc.schemas import OPENAI_CHAT, OPENAI_COMPLETIONS, rawjson
from ext_proc.schemas.anthropic_messages import ANTHROPIC_MESSAGES
from ext_proc.serve import render

HIGH = Pressure(70.0, Level.HIGH)


def _plan(body: bytes, decision: Pass | Downgrade | Reject, adapter=OPENAI_CHAT):  # type: ignore[no-untyped-def]
    return plan(decision, adapter, body, adapter.features(rawjson.decode_object(body)))


def test_pass_leaves_the_body_untouched() -> None:
    out = _plan(b'{"messages": [], "max_tokens": 5}', Pass(HIGH))
    assert isinstance(out, Continue) and out.body is None
    assert ("x-ice-decision", "pass") in out.headers


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"messages":[],"max_tokens":4096,"z":1}', b'{"messages":[],"max_tokens":1024,"z":1}'),
        (
            b'{"messages":[], "max_completion_tokens" : 4096}',
            b'{"messages":[], "max_completion_tokens" : 1024}',
        ),
        # both present and both over: both rewritten (a backend may read either)
        (
            b'{"max_tokens": 5000, "messages": [], "max_completion_tokens": 4096}',
            b'{"max_tokens": 1024, "messages": [], "max_completion_tokens": 1024}',
        ),
        # both present, only one over
        (
            b'{"max_tokens": 512, "messages": [], "max_completion_tokens": 4096}',
            b'{"max_tokens": 512, "messages": [], "max_completion_tokens": 1024}',
        ),
        # no limit: injected as the last member, everything else byte-identical
        (b'{"messages": [] }', b'{"messages": [], "max_tokens": 1024 }'),
    ],
    ids=["max_tokens", "max_completion_tokens", "both-over", "one-over", "inject"],
)
def test_downgrade_patches_only_the_limit(body: bytes, expected: bytes) -> None:
    out = _plan(body, Downgrade(HIGH, 1024, 4096, "pressure_cap"))
    assert isinstance(out, Continue)
    assert out.body == expected


@pytest.mark.parametrize("adapter", [OPENAI_COMPLETIONS, ANTHROPIC_MESSAGES], ids=lambda a: a.name)
def test_downgrade_other_schemas(adapter) -> None:  # type: ignore[no-untyped-def]
    body = b'{"prompt": "x", "messages": [], "max_tokens": 9000, "extra": {"k": [1]}}'
    out = _plan(body, Downgrade(HIGH, 100, 9000, "context_budget"), adapter)
    assert isinstance(out, Continue) and out.body == body.replace(b"9000", b"100")


def test_reject_renders_the_api_error_with_retry_after() -> None:
    out = _plan(b'{"messages": []}', Reject(HIGH, 429, "memory_pressure", "busy", retry_after_s=3))
    assert isinstance(out, Respond) and out.status == 429
    headers = dict(out.headers)
    assert headers["retry-after"] == "3" and headers["x-ice-decision"] == "reject"
    assert json.loads(out.body)["error"]["code"] == "memory_pressure"


def _headers(mutation: pb.HeaderMutation) -> dict[str, bytes]:
    return {h.header.key: h.header.raw_value for h in mutation.set_headers}


def test_render_continue_sets_headers_length_and_metadata() -> None:
    outcome = Continue([("x-ice-decision", "downgrade"), ("x-downgraded", "true")], b'{"a": 1}')
    resp = render.render_body_outcome(outcome)
    common = resp.request_body.response
    headers = _headers(common.header_mutation)
    assert headers == {
        "x-ice-decision": b"downgrade",
        "x-downgraded": b"true",
        "content-length": b"8",
    }
    assert all(not h.header.value for h in common.header_mutation.set_headers)  # raw_value only
    assert common.body_mutation.body == b'{"a": 1}'
    md = resp.dynamic_metadata.fields["ice"].struct_value.fields
    assert md["x-ice-decision"].string_value == "downgrade"


def test_render_untouched_body_has_no_body_mutation() -> None:
    resp = render.render_body_outcome(Continue([("x-ice-decision", "pass")], None))
    assert not resp.request_body.response.HasField("body_mutation")
    assert "content-length" not in _headers(resp.request_body.response.header_mutation)


def test_render_immediate_response() -> None:
    resp = render.render_immediate(
        Respond(
            429,
            [
                ("content-type", "application/json"),
                ("retry-after", "2"),
                ("x-ice-decision", "reject"),
            ],
            b"{}",
        )
    )
    ir = resp.immediate_response
    assert ir.status.code == 429 and ir.body == b"{}"
    assert _headers(ir.headers)["retry-after"] == b"2"
    md = resp.dynamic_metadata.fields["ice"].struct_value.fields
    assert set(md) == {"x-ice-decision"}  # only verdict headers travel as metadata


def test_skip_body_overrides_the_body_mode_and_strips_headers() -> None:
    resp = render.skip_body(["x-ice-foo"])
    assert resp.HasField("mode_override")
    assert resp.mode_override.request_body_mode == 0  # NONE
    assert list(resp.request_headers.response.header_mutation.remove_headers) == ["x-ice-foo"]


def test_untouched_replies_are_reused_and_equal_to_a_fresh_render() -> None:
    outcome = Continue([("x-mem-pressure", "low"), ("x-ice-decision", "pass")], None)
    first = render.render_body_outcome(outcome)
    again = render.render_body_outcome(Continue(list(outcome.headers), None))
    assert again is first
    assert first == render._render_continue(outcome)


ACCESS_BODY = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4096}'


def test_the_access_log_fields_ride_in_metadata_never_as_headers() -> None:
    """``input_tokens`` is the adapter's count; requested and granted are the client's limit
    and the one the request goes on with (none on a rejection)."""
    features = OPENAI_CHAT.features(rawjson.decode_object(ACCESS_BODY))
    tokens = str(features.input_tokens)
    passed = _plan(ACCESS_BODY, Pass(HIGH))
    assert passed.log == (
        ("input_tokens", tokens),
        ("max_tokens_requested", "4096"),
        ("max_tokens_granted", "4096"),
    )
    down = _plan(ACCESS_BODY, Downgrade(HIGH, 1024, 4096, "pressure_cap"))
    assert dict(down.log)["max_tokens_granted"] == "1024"
    shed = _plan(ACCESS_BODY, Reject(HIGH, 429, "memory_pressure", "busy", retry_after_s=3))
    assert "max_tokens_granted" not in dict(shed.log)
    for out in (passed, down, shed):
        assert not any(k in dict(out.log) for k, _ in out.headers)
    md = render.render_body_outcome(down).dynamic_metadata.fields["ice"].struct_value.fields
    assert md["input_tokens"].string_value == tokens
    assert md["max_tokens_granted"].string_value == "1024"
    assert md["x-ice-decision"].string_value == "downgrade"
    immediate = render.render_body_outcome(shed).dynamic_metadata.fields["ice"].struct_value
    assert immediate.fields["input_tokens"].string_value == tokens


def test_watch_asks_for_the_response_headers_and_restates_every_mode() -> None:
    # Envoy takes a mode override whole (body modes literally): every mode is restated
    plain, watched = render.headers_continue(), render.headers_continue(watch=True)
    assert not plain.HasField("mode_override")
    mode = watched.mode_override
    assert (mode.request_header_mode, mode.request_body_mode, mode.request_trailer_mode) == (
        1,  # SEND
        2,  # BUFFERED: the body still comes to ICE
        2,  # SKIP
    )
    assert (mode.response_header_mode, mode.response_body_mode, mode.response_trailer_mode) == (
        1,  # SEND: the one change
        0,  # NONE
        2,  # SKIP
    )
    stripped = render.headers_continue(["x-ice-foo"], watch=True)
    assert stripped.mode_override == mode
    assert list(stripped.request_headers.response.header_mutation.remove_headers) == ["x-ice-foo"]
    skipped = render.skip_body(watch=True).mode_override
    assert (skipped.request_body_mode, skipped.response_header_mode) == (0, 1)
    assert render.skip_body().mode_override.response_header_mode == 0  # DEFAULT: the config's


def test_the_response_phase_replies() -> None:
    assert render.response_headers_continue() == pb.ProcessingResponse(
        response_headers=pb.HeadersResponse()
    )
    respond = Respond(503, [("x-ice-decision", "reject")], b"{}", log=(("profile", "p"),))
    ir = render.render_immediate(respond, "ice_backend_overloaded").immediate_response
    assert ir.details == "ice_backend_overloaded"
    assert render.render_immediate(respond).immediate_response.details == "ice_503"
