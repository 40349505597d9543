"""Priority is the operator's, not the client's: a client's priority header may lower its
request below the route's priority (``client_priority: cap``, the default), set it where the
route trusts the header (``trust``: the mesh sets it from an authenticated identity), or do
nothing where the route fixes it (``ignore``). What ICE took, and a claim it did not, reach
the access log (``priority``, ``priority_claimed``)."""

from __future__ import annotations

import json
import time

import pytest

from ext_proc.admit.outcome import priority_fields
from ext_proc.admit.pipeline import Pipeline
from ext_proc.admit.verdict import RequestFacts
from ext_proc.policy.decision import Reject
from ext_proc.policy.load import PolicyError, load_policy, parse_policy
from ext_proc.signals.snapshot import BackendSignals, PoolSnapshot
from ext_proc.tools.envoygen.hcm_settings import ACCESS_LOG_FIELDS

POLICY = """
profiles:
  default: {max_model_len: 8192, output_buffer_tokens: 512}
  mesh: {max_model_len: 8192, output_buffer_tokens: 512, client_priority: trust}
routes:
  chat: {profile: default}
  trusted: {profile: default, client_priority: trust}
  fixed: {profile: default, client_priority: ignore}
  batch: {profile: default, priority: sheddable}
  urgent: {profile: default, priority: critical}
  behind_mesh: {profile: mesh}
  capped_in_mesh: {profile: mesh, client_priority: cap}
"""
CHAT = "/v1/chat/completions"
BODY = json.dumps(
    {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
).encode()


def _facts(
    route: str, claim: str | None, policy: str = POLICY, metadata: tuple[str, str] | None = None
) -> RequestFacts:
    pipeline = Pipeline(parse_policy(policy), lambda _pool: None)
    meta = [("x-ice-route", route), *([metadata] if metadata else [])]
    headers = [(":path", CHAT.encode()), (":method", b"POST")]
    if claim is not None:
        headers.append(("x-priority", claim.encode()))
    return pipeline.on_headers(pipeline.router.resolve(meta), headers, False)


def _judged(facts: RequestFacts) -> tuple[str, str | None]:
    return facts.priority, facts.priority_claimed


def test_a_client_critical_is_judged_standard_by_default() -> None:
    assert _judged(_facts("chat", "critical")) == ("standard", "critical")
    # the built-in policy too: its routes do not trust the header
    pipeline = Pipeline(load_policy(None), lambda _pool: None)
    route = pipeline.router.resolve([("x-ice-route", "chat")])
    assert route.client_priority == "cap"
    headers = [(":path", CHAT.encode()), (":method", b"POST"), ("x-priority", b"critical")]
    assert _judged(pipeline.on_headers(route, headers, False)) == ("standard", "critical")


def test_a_trusting_route_believes_the_client() -> None:
    assert _judged(_facts("trusted", "critical")) == ("critical", None)
    assert _judged(_facts("behind_mesh", "critical")) == ("critical", None)  # its profile's
    assert _judged(_facts("trusted", "sheddable")) == ("sheddable", None)


def test_a_route_binding_overrides_its_profiles_setting() -> None:
    assert _judged(_facts("capped_in_mesh", "critical")) == ("standard", "critical")


def test_a_fixed_route_ignores_the_header() -> None:
    assert _judged(_facts("fixed", "critical")) == ("standard", "critical")
    assert _judged(_facts("fixed", "sheddable")) == ("standard", "sheddable")
    assert _judged(_facts("fixed", None)) == ("standard", None)


def test_sheddable_still_lowers_a_request() -> None:
    assert _judged(_facts("chat", "sheddable")) == ("sheddable", None)
    assert _judged(_facts("chat", "standard")) == ("standard", None)
    assert _judged(_facts("chat", None)) == ("standard", None)
    assert _judged(_facts("chat", "urgent!")) == ("standard", None)  # not a priority: absent


def test_a_client_cannot_raise_a_request_above_its_routes_priority() -> None:
    # a sheddable route stays sheddable whatever the client says
    assert _judged(_facts("batch", "standard")) == ("sheddable", "standard")
    assert _judged(_facts("batch", "critical")) == ("sheddable", "critical")
    # a critical route's requests are critical; a client may still ask for less
    assert _judged(_facts("urgent", None)) == ("critical", None)
    assert _judged(_facts("urgent", "critical")) == ("critical", None)
    assert _judged(_facts("urgent", "sheddable")) == ("sheddable", None)
    # Envoy's per-route x-ice-priority sets the route's priority, which caps the header too
    meta = ("x-ice-priority", "critical")
    assert _judged(_facts("chat", None, metadata=meta)) == ("critical", None)
    meta = ("x-ice-priority", "sheddable")
    assert _judged(_facts("chat", "critical", metadata=meta)) == ("sheddable", "critical")


def _at_critical_pressure(route: str, claim: str) -> object:
    backend = BackendSignals(url="u", kv_cache_usage=1.0, num_requests_waiting=12)
    snap = PoolSnapshot(pool="default", backends=(backend,), taken_at_s=time.monotonic())
    pipeline = Pipeline(parse_policy(POLICY), lambda _pool: snap)
    r = pipeline.router.resolve([("x-ice-route", route)])
    headers = [(":path", CHAT.encode()), (":method", b"POST"), ("x-priority", claim.encode())]
    facts = pipeline.on_headers(r, headers, False)
    verdict = pipeline.on_body(r, facts, BODY)
    assert verdict is not None
    return verdict.decision


def test_a_client_critical_is_shed_at_critical_pressure_as_standard_is() -> None:
    shed = _at_critical_pressure("chat", "critical")
    assert isinstance(shed, Reject) and shed.reason == "memory_pressure"
    assert _at_critical_pressure("chat", "standard") == shed
    # where the route trusts the header, critical is never shed
    assert not isinstance(_at_critical_pressure("trusted", "critical"), Reject)


def test_the_access_log_shows_the_priority_and_a_claim_not_taken() -> None:
    assert priority_fields("standard", None) == (("priority", "standard"),)
    assert priority_fields("standard", "critical") == (
        ("priority", "standard"),
        ("priority_claimed", "critical"),
    )
    fields = dict(ACCESS_LOG_FIELDS)
    assert fields["priority"] == "%DYNAMIC_METADATA(ice:priority)%"
    assert fields["priority_claimed"] == "%DYNAMIC_METADATA(ice:priority_claimed)%"


def test_client_priority_defaults_to_cap_and_loads_per_profile_and_route() -> None:
    p = parse_policy(POLICY)
    assert p.profiles["default"].client_priority == "cap"
    assert p.profiles["mesh"].client_priority == "trust"
    assert p.routes["chat"].client_priority is None  # the profile's
    assert p.routes["fixed"].client_priority == "ignore"


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("profiles: {a: {client_priority: believe}}", "profiles.a.client_priority"),
        ("routes: {r: {client_priority: always}}", "routes.r.client_priority"),
    ],
    ids=["profile", "route"],
)
def test_a_bad_client_priority_names_its_field(text: str, field: str) -> None:
    with pytest.raises(PolicyError) as e:
        parse_policy(text)
    assert field in str(e.value) and "'cap', 'trust' or 'ignore'" in str(e.value)
