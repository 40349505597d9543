"""Latency targets (docs/slo.md): a profile's ``slo: {ttft_ms, tpot_ms}``, which a client's
llm-d headers (``x-llm-d-slo-ttft-ms``, ``x-llm-d-slo-tpot-ms``) may only tighten, and the
verdict headers that say the target used (``x-ice-slo-ttft-ms``, ``x-ice-slo-tpot-ms``).
No decision reads them yet: a target changes no verdict."""

from __future__ import annotations

import json

import pytest

from ext_proc.admit.admission import with_profile
from ext_proc.admit.headers import judged_slo
from ext_proc.admit.outcome import Continue, Respond, slo_headers
from ext_proc.admit.pipeline import Pipeline
from ext_proc.admit.verdict import RequestFacts
from ext_proc.policy.load import PolicyError, parse_policy
from ext_proc.policy.settings import SloTarget

POLICY = """
profiles:
  default: {max_model_len: 8192, output_buffer_tokens: 512}
  timed: {max_model_len: 8192, output_buffer_tokens: 512, slo: {ttft_ms: 2000, tpot_ms: 50}}
  first_only: {max_model_len: 8192, output_buffer_tokens: 512, slo: {ttft_ms: 800.5}}
routes:
  chat: {profile: default}
  timed: {profile: timed}
  first_only: {profile: first_only}
"""
CHAT = "/v1/chat/completions"
BODY = json.dumps(
    {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
).encode()


def _facts(route: str, headers: list[tuple[str, bytes]]) -> RequestFacts:
    pipeline = Pipeline(parse_policy(POLICY), lambda _pool: None)
    r = pipeline.router.resolve([("x-ice-route", route)])
    base = [(":path", CHAT.encode()), (":method", b"POST")]
    return pipeline.on_headers(r, [*base, *headers], False)


def test_a_profile_loads_its_targets_and_defaults_to_none() -> None:
    policy = parse_policy(POLICY)
    assert policy.profiles["default"].slo == SloTarget(None, None)
    assert policy.profiles["timed"].slo == SloTarget(2000.0, 50.0)
    assert policy.profiles["first_only"].slo == SloTarget(800.5, None)


@pytest.mark.parametrize(
    ("slo", "field"),
    [
        ("{ttft_ms: 0}", "slo.ttft_ms"),
        ("{ttft_ms: -5}", "slo.ttft_ms"),
        ("{tpot_ms: 0}", "slo.tpot_ms"),
        ("{tpot_ms: 3600001}", "slo.tpot_ms"),
        ('{ttft_ms: "NaN"}', "slo.ttft_ms"),
    ],
    ids=["ttft-zero", "ttft-negative", "tpot-zero", "tpot-over-an-hour", "ttft-nan"],
)
def test_a_bad_target_names_its_field(slo: str, field: str) -> None:
    text = f"profiles:\n  default: {{max_model_len: 8192, slo: {slo}}}\n"
    with pytest.raises(PolicyError, match=rf"profiles\.default\.{field}"):
        parse_policy(text)


def test_an_unknown_target_field_is_refused() -> None:
    with pytest.raises(PolicyError, match="ttft_s"):
        parse_policy("profiles:\n  default: {max_model_len: 8192, slo: {ttft_s: 2}}\n")


ROUTE = SloTarget(2000.0, 50.0)


@pytest.mark.parametrize(
    ("ttft", "tpot", "want"),
    [
        (b"", b"", ROUTE),
        (b"500", b"", SloTarget(500.0, 50.0)),
        (b"", b" 20.5 ", SloTarget(2000.0, 20.5)),
        (b"5000", b"100", ROUTE),  # asking for more time: the route's
        (b"fast", b"1e400", ROUTE),  # malformed, infinite: ignored
        (b"0", b"-3", ROUTE),  # not positive: ignored
        (b"nan", b"", ROUTE),
    ],
    ids=["none", "tighter-ttft", "tighter-tpot", "looser", "malformed", "non-positive", "nan"],
)
def test_the_llm_d_headers_only_tighten(ttft: bytes, tpot: bytes, want: SloTarget) -> None:
    assert judged_slo(ROUTE, ttft, tpot) == want


def test_a_header_sets_a_target_the_route_leaves_unset() -> None:
    # no target is no limit: any valid header is tighter
    assert judged_slo(SloTarget(), b"300", b"") == SloTarget(300.0, None)
    assert judged_slo(SloTarget(), b"x", b"") == SloTarget()


def test_the_headers_phase_reads_the_targets_and_leaves_the_clients_headers() -> None:
    sent = [("x-llm-d-slo-ttft-ms", b"900"), ("x-llm-d-slo-tpot-ms", b"80")]
    facts = _facts("timed", sent)
    assert facts.slo == SloTarget(900.0, 50.0)
    assert "x-llm-d-slo-ttft-ms" not in facts.strip
    assert _facts("chat", []).slo == SloTarget()
    assert _facts("chat", sent).slo == SloTarget(900.0, 80.0)
    # ICE's own verdict headers are still the client's to lose
    spoofed = _facts("timed", [("x-ice-slo-ttft-ms", b"1")])
    assert "x-ice-slo-ttft-ms" in spoofed.strip
    assert spoofed.slo == ROUTE


def test_the_verdict_headers_say_the_target_used() -> None:
    assert slo_headers(SloTarget()) == ()
    assert slo_headers(SloTarget(2000.0, 12.5)) == (
        ("x-ice-slo-ttft-ms", "2000"),
        ("x-ice-slo-tpot-ms", "12.5"),
    )
    assert slo_headers(SloTarget(None, 1 / 3)) == (("x-ice-slo-tpot-ms", "0.333"),)


def test_a_judged_request_carries_its_targets_and_its_verdict_is_unchanged() -> None:
    pipeline = Pipeline(parse_policy(POLICY), lambda _pool: None)
    for route_name, sent, want in [
        (
            "timed",
            [("x-llm-d-slo-ttft-ms", b"700")],
            {"x-ice-slo-ttft-ms": "700", "x-ice-slo-tpot-ms": "50"},
        ),
        ("chat", [], {}),
    ]:
        r = pipeline.router.resolve([("x-ice-route", route_name)])
        base = [(":path", CHAT.encode()), (":method", b"POST")]
        facts = pipeline.on_headers(r, [*base, *sent], False)
        verdict = pipeline.on_body(r, facts, BODY)
        assert verdict is not None
        plain = pipeline.on_body(r, _facts("chat", []), BODY)
        assert plain is not None and verdict.decision == plain.decision  # no verdict changes
        out = with_profile(verdict.outcome, r, facts)
        assert isinstance(out, Continue)
        got = {k: v for k, v in out.headers if k.startswith("x-ice-slo-")}
        assert got == want
    refused = with_profile(Respond(429, [], b""), r, RequestFacts(slo=SloTarget(100.0)))
    assert refused.headers == [("x-ice-slo-ttft-ms", "100")]
