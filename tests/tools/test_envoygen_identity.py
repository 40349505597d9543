"""``ice envoy-config`` from a policy whose routes name an identity source (docs/identity.md):
each flavour gets what its control plane needs, and nothing changes without one.

- local: jwt_authn (local or remote JWKS, its cluster), its metadata forwarded to ICE, each
  judged route's requirement; the peer certificate's SANs and the listener's TLS for mtls;
  the ext_authz header stripped first. ``envoy --mode validate`` accepts each.
- Istio: RequestAuthentication for the gateway's and the backend's pods, PeerAuthentication
  STRICT for mtls; Envoy Gateway: a SecurityPolicy per HTTPRoute, the forwarded namespace,
  the attributes patched in. The objects pass the validators of tests/test_k8s_manifests.py.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from ext_proc.lab.stack import envoy_binary
from ext_proc.tools.envoygen import gateway, istio
from ext_proc.tools.envoygen.local import local_bootstrap
from ext_proc.tools.envoygen.spec import MeshSpec, SpecError, parse_spec
from tests.e2e.identity_stack import Signer
from tests.test_k8s_manifests import node_validate
from tests.test_k8s_manifests import node_validator as node_validator  # noqa: PLC0414 (a fixture)

ISSUER = "https://issuer.example.com"
JWKS = Signer.new().jwks()  # a real key: Envoy refuses a JWKS without one


def _policy(tmp: Path, identity: str) -> Path:
    jwks = tmp / "jwks.json"
    jwks.write_text(JWKS)
    text = f"""
profiles:
  default: {{max_model_len: 8192}}
  secure:
    max_model_len: 8192
    identity: {identity.replace("JWKS_FILE", str(jwks))}
routes:
  chat: {{profile: default}}
  messages: {{profile: secure}}
"""
    path = tmp / "policy.yaml"
    path.write_text(text)
    return path


def _spec(tmp: Path, identity: str, **extra: Any) -> MeshSpec:
    doc = {
        "policy": str(_policy(tmp, identity)),
        "gateway": {"hosts": ["llm.example.com"]},
        "routes": [
            {"name": "chat", "path": "/v1/chat/completions"},
            {"name": "messages", "path": "/v1/messages", "profile": "secure"},
        ],
        **extra,
    }
    return parse_spec(doc, tmp)


JWT_FILE = f'{{source: jwt, jwt: {{issuer: "{ISSUER}", audiences: [ice], jwks_file: JWKS_FILE}}}}'
JWT_URI = (
    f'{{source: jwt, claim: org.id, jwt: {{issuer: "{ISSUER}", '
    'jwks_uri: "https://keys.example.com:8443/jwks.json"}}'
)


def _hcm(bootstrap: dict[str, Any]) -> dict[str, Any]:
    chain = bootstrap["static_resources"]["listeners"][0]["filter_chains"][0]
    config: dict[str, Any] = chain["filters"][0]["typed_config"]
    return config


def _filter(hcm: dict[str, Any], name: str) -> dict[str, Any]:
    found = [f for f in hcm["http_filters"] if f["name"] == name]
    assert len(found) == 1, [f["name"] for f in hcm["http_filters"]]
    config: dict[str, Any] = found[0]["typed_config"]
    return config


def _routes(hcm: dict[str, Any]) -> dict[str, dict[str, Any]]:
    vhost = hcm["route_config"]["virtual_hosts"][0]
    return {r["name"]: r for r in vhost["routes"]}


def _validate(tmp: Path, bootstrap: dict[str, Any]) -> None:
    path = tmp / "envoy.json"
    path.write_text(json.dumps(bootstrap))
    proc = subprocess.run(
        [envoy_binary(), "--mode", "validate", "-c", str(path), "-l", "error"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_local_jwt_with_a_jwks_file(tmp_path: Path) -> None:
    boot = local_bootstrap(_spec(tmp_path, JWT_FILE))
    hcm = _hcm(boot)
    names = [f["name"] for f in hcm["http_filters"]]
    assert names.index("envoy.filters.http.jwt_authn") < names.index("envoy.filters.http.ext_proc")
    jwt = _filter(hcm, "envoy.filters.http.jwt_authn")
    provider = jwt["providers"]["ice-jwt-0"]
    assert provider["issuer"] == ISSUER and provider["audiences"] == ["ice"]
    assert provider["payload_in_metadata"] == "payload"
    assert provider["local_jwks"]["filename"] == str(tmp_path / "jwks.json")
    anyof = jwt["requirement_map"]["ice-jwt-0"]["requires_any"]["requirements"]
    assert anyof == [{"provider_name": "ice-jwt-0"}, {"allow_missing": {}}]
    ext_proc = _filter(hcm, "envoy.filters.http.ext_proc")
    forwarded = ext_proc["metadata_options"]["forwarding_namespaces"]["untyped"]
    assert "envoy.filters.http.jwt_authn" in forwarded
    assert "request_attributes" not in ext_proc
    routes = _routes(hcm)
    per_route = "envoy.filters.http.jwt_authn"
    assert routes["messages"]["typed_per_filter_config"][per_route]["requirement_name"] == (
        "ice-jwt-0"
    )
    assert routes["chat"]["typed_per_filter_config"][per_route]["disabled"] is True
    _validate(tmp_path, boot)


def test_local_jwt_with_a_remote_jwks_gets_its_cluster(tmp_path: Path) -> None:
    boot = local_bootstrap(_spec(tmp_path, JWT_URI))
    jwt = _filter(_hcm(boot), "envoy.filters.http.jwt_authn")
    remote = jwt["providers"]["ice-jwt-0"]["remote_jwks"]["http_uri"]
    assert remote["cluster"] == "ice-jwt-0"
    clusters = {c["name"]: c for c in boot["static_resources"]["clusters"]}
    keys = clusters["ice-jwt-0"]
    address = keys["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
    assert address["socket_address"] == {"address": "keys.example.com", "port_value": 8443}
    assert keys["transport_socket"]["typed_config"]["sni"] == "keys.example.com"
    _validate(tmp_path, boot)


def test_local_mtls_needs_the_listeners_tls(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="tls: missing"):
        _spec(tmp_path, "{source: mtls}")
    tls = {"cert": "s.pem", "key": "s.key", "client_ca": "ca.pem"}
    boot = local_bootstrap(_spec(tmp_path, "{source: mtls}", tls=tls))
    hcm = _hcm(boot)
    ext_proc = _filter(hcm, "envoy.filters.http.ext_proc")
    assert ext_proc["request_attributes"] == [
        "connection.uri_san_peer_certificate",
        "connection.dns_san_peer_certificate",
    ]
    chain = boot["static_resources"]["listeners"][0]["filter_chains"][0]
    context = chain["transport_socket"]["typed_config"]
    assert context["require_client_certificate"] is True
    ca = context["common_tls_context"]["validation_context"]["trusted_ca"]["filename"]
    assert ca == str(tmp_path / "ca.pem")
    assert "envoy.filters.http.jwt_authn" not in [f["name"] for f in hcm["http_filters"]]


def test_local_header_source_strips_the_clients_copy_first(tmp_path: Path) -> None:
    boot = local_bootstrap(_spec(tmp_path, "{source: header, header: x-verified-tenant}"))
    hcm = _hcm(boot)
    first = hcm["http_filters"][0]
    assert first["name"] == "envoy.filters.http.header_mutation"
    removals = first["typed_config"]["mutations"]["request_mutations"]
    assert {"remove": "x-verified-tenant"} in removals


def test_no_identity_changes_nothing(tmp_path: Path) -> None:
    plain = _spec(tmp_path, "{source: trust}")
    boot = local_bootstrap(plain)
    names = [f["name"] for f in _hcm(boot)["http_filters"]]
    assert "envoy.filters.http.jwt_authn" not in names
    assert not [o for o in istio.objects(plain) if "Authentication" in o["kind"]]
    assert not [o for o in gateway.objects(plain) if o["kind"] == "SecurityPolicy"]


def _by_kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


def test_istio_request_authentication_for_the_gateway_and_the_sidecar(tmp_path: Path) -> None:
    spec = _spec(tmp_path, JWT_FILE)
    objs = istio.objects(spec)
    ras = _by_kind(objs, "RequestAuthentication")
    assert [(r["metadata"]["namespace"], r["spec"]["selector"]["matchLabels"]) for r in ras] == [
        ("istio-system", {"istio": "ingressgateway"}),
        ("llm", {"app": "vllm"}),
    ]
    rule = ras[0]["spec"]["jwtRules"][0]
    assert rule == {
        "issuer": ISSUER,
        "forwardOriginalToken": True,
        "audiences": ["ice"],
        "jwks": JWKS,
    }
    text = yaml.safe_dump_all(objs)
    assert "envoy.filters.http.jwt_authn" in text  # ICE's EnvoyFilters forward its metadata
    uri = _by_kind(istio.objects(_spec(tmp_path, JWT_URI)), "RequestAuthentication")[0]
    assert uri["spec"]["jwtRules"][0]["jwksUri"] == "https://keys.example.com:8443/jwks.json"


def test_istio_mtls_is_strict_for_the_backends_pods(tmp_path: Path) -> None:
    tls = {"cert": "s.pem", "key": "s.key", "client_ca": "ca.pem"}
    objs = istio.objects(_spec(tmp_path, "{source: mtls}", tls=tls))
    (peer,) = _by_kind(objs, "PeerAuthentication")
    assert peer["spec"] == {
        "selector": {"matchLabels": {"app": "vllm"}},
        "mtls": {"mode": "STRICT"},
    }
    assert "connection.uri_san_peer_certificate" in yaml.safe_dump_all(objs)


def test_envoy_gateway_security_policy(tmp_path: Path) -> None:
    objs = gateway.objects(_spec(tmp_path, JWT_FILE))
    (policy,) = _by_kind(objs, "SecurityPolicy")
    (judged,) = [
        o
        for o in _by_kind(objs, "HTTPRoute")
        if any(
            m["path"]["value"] == "/v1/messages" for r in o["spec"]["rules"] for m in r["matches"]
        )
    ]
    assert policy["spec"]["targetRefs"][0]["name"] == judged["metadata"]["name"]
    jwt = policy["spec"]["jwt"]
    assert jwt["optional"] is True
    assert jwt["providers"] == [
        {
            "name": "ice-jwt-0",
            "issuer": ISSUER,
            "audiences": ["ice"],
            "localJWKS": {"type": "Inline", "inline": JWKS},
        }
    ]
    extension = [
        o
        for o in _by_kind(objs, "EnvoyExtensionPolicy")
        if o["spec"]["targetRefs"][0]["name"] == judged["metadata"]["name"]
    ]
    namespaces = extension[0]["spec"]["extProc"][0]["metadata"]["accessibleNamespaces"]
    assert "envoy.filters.http.jwt_authn" in namespaces


def test_the_identity_objects_pass_the_control_planes_schemas(
    tmp_path: Path, node_validator: Path
) -> None:
    tls = {"cert": "s.pem", "key": "s.key", "client_ca": "ca.pem"}
    objs = [
        *_by_kind(istio.objects(_spec(tmp_path, JWT_FILE)), "RequestAuthentication"),
        *_by_kind(istio.objects(_spec(tmp_path, JWT_URI)), "RequestAuthentication"),
        *_by_kind(istio.objects(_spec(tmp_path, "{source: mtls}", tls=tls)), "PeerAuthentication"),
        *_by_kind(gateway.objects(_spec(tmp_path, JWT_FILE)), "SecurityPolicy"),
        *_by_kind(gateway.objects(_spec(tmp_path, JWT_URI)), "SecurityPolicy"),
        *_by_kind(gateway.objects(_spec(tmp_path, JWT_URI)), "EnvoyExtensionPolicy"),
    ]
    assert len(objs) == 9  # an EnvoyExtensionPolicy per profile
    for result in node_validate(node_validator, objs):
        assert result["ok"], result
