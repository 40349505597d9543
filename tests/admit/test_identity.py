"""Who is asking: the tenant comes from what Envoy vouches for (a JWT claim jwt_authn verified,
the peer certificate's SAN, an ext_authz service's header) unless the route says ``trust``;
a client's own tenant headers then name no one and are removed; a required identity that is
absent is a 401 in the API's format; the fair queue takes turns by it, so a flood that
rotates its tenant header is one tenant (docs/identity.md)."""

from __future__ import annotations

import asyncio
import json

import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from google.protobuf import struct_pb2

from ext_proc.admit.backlog import Backlog
from ext_proc.admit.identity import (
    NOTHING_VOUCHED,
    Vouched,
    claim_value,
    identify,
    request_tenant,
)
from ext_proc.admit.pipeline import Pipeline
from ext_proc.admit.queue import Waiter
from ext_proc.admit.stream import Stream
from ext_proc.admit.verdict import RequestFacts
from ext_proc.policy.load import PolicyError, parse_policy
from ext_proc.policy.settings import IdentitySpec, JwtProviderSpec
from ext_proc.serve.messages import vouched
from ext_proc.tools.envoygen.hcm_settings import ACCESS_LOG_FIELDS
from tests.builders import QueueRig as Rig

ISSUER = "https://issuer.test"
POLICY = f"""
profiles:
  default:
    max_model_len: 8192
    output_buffer_tokens: 512
    queue: {{enabled: true, tenant_header: x-tenant}}
  jwt:
    max_model_len: 8192
    output_buffer_tokens: 512
    queue: {{enabled: true, tenant_header: x-tenant}}
    identity: {{source: jwt, claim: org.id, jwt: {{issuer: "{ISSUER}", audiences: [ice]}}}}
prefix_tracking: {{enabled: true, tenant_header: x-team}}
routes:
  chat: {{profile: default}}
  jwt: {{profile: jwt}}
  jwt_optional:
    profile: jwt
    identity: {{source: jwt, required: false, jwt: {{issuer: "{ISSUER}"}}}}
  mtls: {{profile: default, identity: {{source: mtls}}}}
  mtls_dns: {{profile: default, identity: {{source: mtls, san: dns}}}}
  authz: {{profile: default, identity: {{source: header, header: x-verified-tenant}}}}
  trust_required: {{profile: default, identity: {{source: trust, required: true}}}}
"""
CHAT = "/v1/chat/completions"
SPIFFE = "spiffe://example.org/ns/team-a/sa/client"


def _facts(
    route: str, headers: dict[str, str] | None = None, seen: Vouched = NOTHING_VOUCHED
) -> RequestFacts:
    pipeline = Pipeline(parse_policy(POLICY), lambda _pool: None)
    pairs = [(":path", CHAT.encode()), (":method", b"POST")]
    pairs += [(k, v.encode()) for k, v in (headers or {}).items()]
    r = pipeline.router.resolve([("x-ice-route", route)])
    return pipeline.on_headers(r, pairs, False, None, seen)


def _tenant(route: str, facts: RequestFacts) -> str:
    pipeline = Pipeline(parse_policy(POLICY), lambda _pool: None)
    return request_tenant(pipeline.router.resolve([("x-ice-route", route)]), facts)


def _jwt(payload: dict[str, object], key: str = "payload") -> Vouched:
    return Vouched(jwt={key: payload})


A_TOKEN = {"iss": ISSUER, "sub": "user-1", "aud": "ice", "org": {"id": "team-a"}}


@pytest.mark.parametrize(
    ("payload", "path", "want"),
    [
        ({"sub": "a"}, "sub", "a"),
        ({"org": {"id": "t"}}, "org.id", "t"),
        ({"n": 42.0}, "n", "42"),  # Struct numbers are doubles
        ({"n": 4.5}, "n", ""),
        ({"b": True}, "b", ""),
        ({"l": ["a", "b"]}, "l", ""),
        ({"o": {"x": 1}}, "o", ""),
        ({}, "sub", ""),
        ({"org": "flat"}, "org.id", ""),
    ],
    ids=["string", "nested", "integer", "fraction", "bool", "list", "object", "absent", "not-obj"],
)
def test_claim_value(payload: dict[str, object], path: str, want: str) -> None:
    assert claim_value(payload, path) == want


def test_a_jwt_claim_names_the_tenant_and_a_client_header_does_not() -> None:
    facts = _facts("jwt", {"x-tenant": "team-b", "x-team": "team-b"}, _jwt(A_TOKEN))
    assert (facts.queue_tenant, facts.tenant, facts.identity_source) == ("team-a",) * 2 + ("jwt",)
    assert _tenant("jwt", facts) == "team-a"
    assert set(facts.strip) >= {"x-tenant", "x-team"}  # the client's copies never go upstream
    assert facts.answer is None


def test_the_payload_is_read_under_the_issuer_as_envoy_gateway_keys_it() -> None:
    facts = _facts("jwt", {}, _jwt(A_TOKEN, key=ISSUER))
    assert (facts.queue_tenant, facts.identity_source) == ("team-a", "jwt")


def test_a_payload_of_another_issuer_is_no_identity() -> None:
    facts = _facts("jwt", {}, _jwt({**A_TOKEN, "iss": "https://other.test"}))
    assert facts.identity_source == "" and facts.answer is not None
    assert facts.answer.status == 401


def test_a_missing_required_token_is_a_401_in_the_apis_format() -> None:
    facts = _facts("jwt", {"x-tenant": "team-b"})
    assert facts.answer is not None
    assert facts.answer.status == 401
    body = json.loads(facts.answer.body)
    assert body["error"]["code"] == "identity_required"
    assert body["error"]["type"] == "invalid_request_error"
    assert ISSUER in body["error"]["message"] and "'org.id'" in body["error"]["message"]
    assert ("x-ice-reason", "identity_required") in facts.answer.headers


def test_an_anthropic_route_refuses_in_anthropics_format() -> None:
    pipeline = Pipeline(parse_policy(POLICY), lambda _pool: None)
    r = pipeline.router.resolve([("x-ice-route", "jwt")])
    facts = pipeline.on_headers(r, [(":path", b"/v1/messages"), (":method", b"POST")], False)
    assert facts.answer is not None
    body = json.loads(facts.answer.body)
    assert body["type"] == "error" and body["error"]["type"] == "authentication_error"


def test_an_optional_identity_absent_is_the_routes_tenant_never_the_clients() -> None:
    facts = _facts("jwt_optional", {"x-tenant": "team-b"})
    assert facts.answer is None
    assert (facts.queue_tenant, facts.identity_source) == ("", "")
    assert _tenant("jwt_optional", facts) == "jwt_optional"
    assert "x-tenant" in facts.strip
    # its claim is the default, sub
    assert _facts("jwt_optional", {}, _jwt(A_TOKEN)).queue_tenant == "user-1"


def test_mtls_reads_the_peer_certificates_san() -> None:
    seen = Vouched(uri_san=SPIFFE, dns_san="client.example.org")
    facts = _facts("mtls", {"x-tenant": "team-b"}, seen)
    assert (facts.queue_tenant, facts.identity_source) == (SPIFFE, "mtls")
    assert _facts("mtls_dns", {}, seen).queue_tenant == "client.example.org"
    refused = _facts("mtls", {"x-tenant": "team-b"})
    assert refused.answer is not None and refused.answer.status == 401
    assert "client certificate" in json.loads(refused.answer.body)["error"]["message"]


def test_a_header_source_reads_its_header_and_ignores_the_clients_tenant_header() -> None:
    facts = _facts("authz", {"x-verified-tenant": "team-a", "x-tenant": "team-b"})
    assert (facts.queue_tenant, facts.tenant, facts.identity_source) == (
        "team-a",
        "team-a",
        "header",
    )
    assert "x-tenant" in facts.strip and "x-verified-tenant" not in facts.strip


def test_trust_is_the_behaviour_before_identity_sources() -> None:
    facts = _facts("chat", {"x-tenant": "team-b", "x-team": "team-c"})
    assert (facts.queue_tenant, facts.tenant, facts.identity_source) == (
        "team-b",
        "team-c",
        "trust",
    )
    assert facts.strip == ()
    # an unset identity is trust, and a JWT Envoy vouches for changes nothing there
    assert _facts("chat", {"x-tenant": "team-b"}, _jwt(A_TOKEN)).queue_tenant == "team-b"
    absent = _facts("chat", {})
    assert absent.answer is None and absent.identity_source == ""
    required = _facts("trust_required", {})
    assert required.answer is not None and required.answer.status == 401
    assert "x-tenant" in json.loads(required.answer.body)["error"]["message"]


def test_identify_by_source() -> None:
    jwt = IdentitySpec(source="jwt", required=True, jwt=JwtProviderSpec(issuer=ISSUER))
    assert identify(jwt, _jwt(A_TOKEN), "team-b").tenant == "user-1"
    assert identify(jwt, NOTHING_VOUCHED, "team-b").tenant == ""
    mtls = IdentitySpec(source="mtls")
    assert identify(mtls, Vouched(uri_san=f" {SPIFFE} "), "x").tenant == SPIFFE
    assert identify(IdentitySpec(source="header", header="h"), NOTHING_VOUCHED, "t").tenant == "t"


def _message(jwt: dict[str, object] | None, uri: str = "", dns: str = "") -> pb.ProcessingRequest:
    request = pb.ProcessingRequest()
    if jwt is not None:
        payload = struct_pb2.Struct()
        payload.update(jwt)
        request.metadata_context.filter_metadata["envoy.filters.http.jwt_authn"].CopyFrom(payload)
    attrs = request.attributes["envoy.filters.http.ext_proc"]
    if uri:
        attrs.fields["connection.uri_san_peer_certificate"].string_value = uri
    if dns:
        attrs.fields["connection.dns_san_peer_certificate"].string_value = dns
    return request


def test_the_servicer_reads_what_envoy_vouches_for_from_the_message() -> None:
    assert vouched(pb.ProcessingRequest()) is NOTHING_VOUCHED
    seen = vouched(_message({"payload": A_TOKEN}, uri=SPIFFE, dns="c.example.org"))
    assert seen.jwt["payload"] == A_TOKEN
    assert (seen.uri_san, seen.dns_san) == (SPIFFE, "c.example.org")
    # Envoy sends an attribute it cannot read (no peer certificate) as an empty value
    assert vouched(_message(None, uri="")) is NOTHING_VOUCHED


@pytest.mark.parametrize(
    ("identity", "error"),
    [
        ("{source: oauth}", "identity.source: must be jwt, mtls, header or trust"),
        ("{source: jwt}", "identity.jwt: required with source: jwt"),
        ("{source: jwt, jwt: {audiences: [a]}}", "identity.jwt.issuer: required"),
        ("{source: header}", "identity.header: required with source: header"),
        ("{source: header, header: x-ice-tenant}", "identity.header: 'x-ice-tenant' is reserved"),
        ("{source: mtls, san: email}", "identity.san: must be uri or dns"),
        ("{source: mtls, claim: sub}", "identity.claim: means nothing with source: mtls"),
        ("{source: mtls, header: x-t}", "identity.header: means nothing with source: mtls"),
        ("{source: trust, jwt: {issuer: i}}", "identity.jwt: only with source: jwt"),
        (
            "{source: jwt, jwt: {issuer: i, jwks_file: f, jwks_uri: 'https://x'}}",
            "give jwks_file or jwks_uri, not both",
        ),
    ],
    ids=[
        "source",
        "no-jwt",
        "no-issuer",
        "no-header",
        "reserved",
        "san",
        "claim-mtls",
        "header-mtls",
        "jwt-trust",
        "two-jwks",
    ],
)
def test_a_bad_identity_block_names_its_field(identity: str, error: str) -> None:
    policy = f"profiles:\n  default: {{identity: {identity}}}\n"
    with pytest.raises(PolicyError, match=error.replace("(", r"\(").replace(")", r"\)")):
        parse_policy(policy)


def test_defaults() -> None:
    policy = parse_policy(POLICY)
    assert policy.profiles["default"].identity == IdentitySpec()  # trust, not required
    jwt = policy.profiles["jwt"].identity
    assert (jwt.source, jwt.required, jwt.claim) == ("jwt", True, "org.id")
    assert jwt.jwt == JwtProviderSpec(issuer=ISSUER, audiences=("ice",))
    assert policy.routes["mtls"].identity == IdentitySpec(source="mtls", required=True)
    assert policy.routes["chat"].identity is None  # the profile's


def test_the_access_log_names_the_tenant_and_its_source() -> None:
    names = [name for name, _ in ACCESS_LOG_FIELDS]
    assert "tenant" in names and "identity" in names


def _queued(rig: Rig, facts: RequestFacts) -> RequestFacts:
    """``facts`` (from the identity policy's headers) given a stream in the queue's rig."""
    rig.streams[id(facts)] = Stream(Backlog(), rig.pipeline.views, rig.queue)
    return facts


def _turns(route: str, heavy_seen: Vouched, light_seen: Vouched) -> list[str]:
    """The order in which the fair queue admits 4 requests of a heavy client, each with a new
    ``x-tenant``, queued before 1 of a light client, room for one request per view."""

    async def run() -> list[str]:
        rig = Rig()
        rig.pass_one()
        heavy = [_facts(route, {"x-tenant": f"rotated-{i}"}, heavy_seen) for i in range(4)]
        light = _facts(route, {"x-tenant": "light"}, light_seen)
        waiters = [(rig.offer(_queued(rig, f)), "heavy") for f in heavy]
        waiters.append((rig.offer(_queued(rig, light)), "light"))
        order: list[str] = []
        done: set[Waiter] = set()
        for _ in range(5):
            rig.newer_view()
            rig.queue.tick()
            order += [name for w, name in waiters if w.future.done() and w not in done]
            done.update(w for w, _ in waiters if w.future.done())
        return order

    return asyncio.run(run())


def test_a_flood_that_rotates_its_tenant_header_is_one_tenant_in_the_fair_queue() -> None:
    light_token = {**A_TOKEN, "org": {"id": "team-b"}}
    # trust: each new header value is a new tenant with a turn of its own: light goes last
    assert _turns("chat", NOTHING_VOUCHED, NOTHING_VOUCHED) == ["heavy"] * 4 + ["light"]
    # jwt: the flood is team-a whatever it sends: light goes second
    order = _turns("jwt", _jwt(A_TOKEN), _jwt(light_token))
    assert order == ["heavy", "light", "heavy", "heavy", "heavy"]
