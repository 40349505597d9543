"""``ext_proc.admit.overload_answer``: which responses are a backend's own overload 503, what ICE
answers instead (status, Retry-After, verdict headers, the API's error body), which requests
it watches and what they need of the pool. Plain data: no gRPC, no Envoy."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from ext_proc.admit.outcome import Continue
from ext_proc.admit.overload_answer import REASON, answer, from_backend, need_tokens, watches
from ext_proc.admit.verdict import BodyVerdict
from ext_proc.policy.decision import Downgrade, Pass, Reject, Truncated
from ext_proc.policy.pressure import Pressure
from ext_proc.policy.scores import DrainInputs
from ext_proc.policy.settings import Level, Profile
from ext_proc.schemas import OPENAI_CHAT, OPENAI_COMPLETIONS, RequestFeatures
from ext_proc.schemas.anthropic_messages import ANTHROPIC_MESSAGES

PROFILE = Profile(name="p", min_output_tokens=16, retry_after_s=2)
HIGH = Pressure(score=74.0, level=Level.HIGH)
VALVE_HEADERS = [
    (":status", b"503"),
    ("server", b"uvicorn"),
    ("content-type", b"application/json"),
    ("content-length", b"170"),
    ("x-envoy-upstream-service-time", b"3"),
]


def _without(name: str) -> list[tuple[str, bytes]]:
    return [h for h in VALVE_HEADERS if h[0] != name]


def _with(name: str, value: bytes) -> list[tuple[str, bytes]]:
    return [*_without(name), (name, value)]


@pytest.mark.parametrize(
    ("headers", "details", "expected"),
    [
        (VALVE_HEADERS, "via_upstream", True),
        (_with("content-type", b"application/json; charset=utf-8"), "via_upstream", True),
        (_with("content-type", b"application/problem+json"), "via_upstream", True),
        # a configuration without response_attributes: the router's upstream-time header
        (VALVE_HEADERS, None, True),
        (_without("x-envoy-upstream-service-time"), None, False),
        # Envoy's own 503s: a failed connection, no healthy upstream (text/plain local replies)
        (
            [(":status", b"503"), ("content-type", b"text/plain")],
            "upstream_reset_before_response_started{remote_connection_failure}",
            False,
        ),
        ([(":status", b"503"), ("content-type", b"text/plain")], "no_healthy_upstream", False),
        # a JSON 503 Envoy made itself (a local_reply_config mapping) is still Envoy's
        (_without("x-envoy-upstream-service-time"), "no_healthy_upstream", False),
        # Envoy's attribute wins over the header: a backend behind another Envoy sends it too
        (VALVE_HEADERS, "upstream_reset_after_response_started", False),
        # a proxy one hop further (a backend pod's sidecar): via_upstream, but plain text
        (_with("content-type", b"text/plain"), "via_upstream", False),
        (_without("content-type"), "via_upstream", False),
        (_with(":status", b"500"), "via_upstream", False),
        (_with(":status", b"429"), "via_upstream", False),
        (_with(":status", b"200"), "via_upstream", False),
    ],
    ids=[
        "vllm-valve",
        "json-charset",
        "problem-json",
        "no-attribute-upstream-time",
        "no-attribute-no-upstream-time",
        "envoy-connect-failure",
        "envoy-no-healthy-upstream",
        "envoy-json-local-reply",
        "attribute-wins",
        "sidecar-plain-text",
        "no-content-type",
        "500",
        "429",
        "200",
    ],
)
def test_from_backend_is_a_503_in_json_that_came_from_the_upstream(
    headers: list[tuple[str, bytes]], details: str | None, expected: bool
) -> None:
    assert from_backend(headers, details) is expected


@pytest.mark.parametrize(
    ("status", "adapter", "error_type"),
    [
        (503, OPENAI_CHAT, "server_error"),
        (429, OPENAI_CHAT, "rate_limit_error"),
        (503, ANTHROPIC_MESSAGES, "overloaded_error"),
        (429, ANTHROPIC_MESSAGES, "rate_limit_error"),
    ],
    ids=["openai-503", "openai-429", "anthropic-503", "anthropic-429"],
)
def test_the_answer_is_ices_refusal_in_the_apis_format(
    status: int, adapter: object, error_type: str
) -> None:
    profile = replace(PROFILE, backend_overload_status=status)
    got = answer(profile, adapter, HIGH, None, 1000)  # type: ignore[arg-type]
    assert got.status == status
    headers = dict(got.headers)
    assert headers == {
        "content-type": "application/json",
        "retry-after": "2",  # no drain rate yet: the profile's retry_after_s
        "x-mem-pressure": "high",
        "x-mem-pressure-score": "74",
        "x-ice-decision": "reject",
        "x-ice-reason": REASON,
    }
    doc = json.loads(got.body)
    err = doc["error"]
    if adapter is ANTHROPIC_MESSAGES:
        assert doc["type"] == "error"
    else:
        assert err["param"] is None
    assert (err["type"], err["code"]) == (error_type, "backend_overloaded")
    assert err["message"].endswith("Retry after 2 s.")
    assert got.log == (("profile", "p"),)


def test_retry_after_is_the_drain_rate_arithmetic_of_ices_own_429s() -> None:
    # 1,000 tokens/s drain (800 prompt + 200 generated), 2 completions/s → 500 tokens a
    # request; 4 waiting + 3,000 needed − 1,000 free = 4,000 tokens → 4 s
    drain = DrainInputs(800.0, 200.0, 2.0, 4.0, 1000.0)
    profile = replace(PROFILE, retry_after_min_s=1, retry_after_max_s=60)
    got = answer(profile, OPENAI_CHAT, HIGH, drain, 3000)
    assert dict(got.headers)["retry-after"] == "4"
    bounded = answer(replace(profile, retry_after_max_s=3), OPENAI_CHAT, HIGH, drain, 3000)
    assert dict(bounded.headers)["retry-after"] == "3"


def test_an_unknown_or_stale_pressure_shows_as_ices_other_answers_do() -> None:
    got = dict(answer(PROFILE, OPENAI_CHAT, None, None, 10).headers)
    assert got["x-mem-pressure"] == "unknown" and "x-mem-pressure-score" not in got
    stale = Pressure(score=10.0, level=Level.LOW, stale=True)
    assert dict(answer(PROFILE, OPENAI_CHAT, stale, None, 10).headers)["x-ice-stale"] == "true"


@pytest.mark.parametrize(
    ("status", "mode", "expected"),
    [(503, "enforce", True), (429, "enforce", True), (0, "enforce", False), (503, "shadow", False)],
    ids=["503", "429", "off", "shadow"],
)
def test_watches_unless_off_or_shadow(status: int, mode: str, expected: bool) -> None:
    profile = replace(PROFILE, backend_overload_status=status, mode=mode)  # type: ignore[arg-type]
    assert watches(profile) is expected


def _features(**kw: object) -> RequestFeatures:
    base = {
        "schema": "openai.chat",
        "model": "m",
        "input_tokens": 100,
        "max_tokens": 50,
        "max_tokens_field": "max_tokens",
        "stream": False,
        "message_count": 1,
    }
    return RequestFeatures(**{**base, **kw})  # type: ignore[arg-type]


def _verdict(decision: object, features: RequestFeatures | None) -> BodyVerdict:
    return BodyVerdict(decision, features, Continue([], None))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("decision", "features", "expected"),
    [
        (Pass(None), _features(), 150),  # its prompt and the output it asked for
        (Pass(None), _features(max_tokens=None), 116),  # no limit: min_output_tokens
        (Downgrade(None, 20, 50, "pressure_cap"), _features(), 120),  # the granted output
        (
            Truncated(Downgrade(None, 30, 50, "pressure_cap"), "pressure_budget", 2, 40, "recency"),
            _features(),
            130,
        ),
        (Pass(None), _features(samples=3), 450),  # n=3: three sequences
        (Pass(None), _features(schema="openai.embeddings", generates=False), 100),
        (Reject(None, 429, "memory_pressure", "m"), _features(), None),  # never went on
        (Pass(None), None, None),
    ],
    ids=[
        "pass",
        "no-limit",
        "downgrade",
        "truncated",
        "n=3",
        "embeddings",
        "reject",
        "no-features",
    ],
)
def test_need_tokens_counts_what_the_request_goes_on_with(
    decision: object, features: RequestFeatures | None, expected: int | None
) -> None:
    assert need_tokens(PROFILE, _verdict(decision, features)) == expected


def test_need_tokens_of_no_verdict_or_a_shadow_one_is_none() -> None:
    assert need_tokens(PROFILE, None) is None
    shadow = replace(_verdict(Pass(None), _features()), shadow=("reject", "memory_pressure"))
    assert need_tokens(PROFILE, shadow) is None


def test_completions_answers_are_openais_too() -> None:
    err = json.loads(answer(PROFILE, OPENAI_COMPLETIONS, HIGH, None, 1).body)["error"]
    assert err["code"] == "backend_overloaded" and err["type"] == "server_error"
