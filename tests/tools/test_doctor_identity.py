"""``ice doctor`` sees a route whose identity source needs a filter the config lacks
(docs/identity.md): the generated local config passes; without its jwt_authn filter, the
forwarded namespace, the SAN attributes or an ext_authz filter (and the header stripped
before it), the route's check fails."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from ext_proc.policy.load import parse_policy
from ext_proc.tools.doctor.checks import Check
from ext_proc.tools.doctor.dump import from_bootstrap
from ext_proc.tools.doctor.envoy import view_checks
from ext_proc.tools.doctor.expect import Expected
from ext_proc.tools.envoygen.local import local_bootstrap
from tests.tools.test_envoygen_identity import JWT_FILE, _policy, _spec

TLS = {"cert": "s.pem", "key": "s.key", "client_ca": "ca.pem"}


def _expected(tmp: Path, identity: str) -> Expected:
    path = _policy(tmp, identity)
    text = path.read_text()
    return Expected(
        policy=parse_policy(text),
        policy_source=str(path),
        policy_bytes=text.encode(),
        judged={"/v1/chat/completions": "chat", "/v1/messages": "messages"},
        read_only=(),
        mesh_source="test",
    )


def _identity(boot: dict[str, Any], ex: Expected) -> list[Check]:
    return [c for c in view_checks(from_bootstrap(boot), ex) if c.name == "envoy.identity"]


def _filters(boot: dict[str, Any]) -> list[dict[str, Any]]:
    chain = boot["static_resources"]["listeners"][0]["filter_chains"][0]
    filters: list[dict[str, Any]] = chain["filters"][0]["typed_config"]["http_filters"]
    return filters


def _ext_proc(boot: dict[str, Any]) -> dict[str, Any]:
    (f,) = [f for f in _filters(boot) if f["name"] == "envoy.filters.http.ext_proc"]
    config: dict[str, Any] = f["typed_config"]
    return config


def test_a_trusting_policy_has_no_identity_check(tmp_path: Path) -> None:
    boot = local_bootstrap(_spec(tmp_path, "{source: trust}"))
    assert _identity(boot, _expected(tmp_path, "{source: trust}")) == []


def test_jwt_passes_generated_and_fails_without_its_filter_or_forwarding(tmp_path: Path) -> None:
    ex = _expected(tmp_path, JWT_FILE)
    boot = local_bootstrap(_spec(tmp_path, JWT_FILE))
    (ok,) = _identity(boot, ex)
    assert ok.status == "PASS" and "route messages" in ok.detail

    no_filter = copy.deepcopy(boot)
    filters = _filters(no_filter)
    filters[:] = [f for f in filters if f["name"] != "envoy.filters.http.jwt_authn"]
    (missing,) = _identity(no_filter, ex)
    assert missing.status == "FAIL" and "no jwt_authn" in missing.detail
    assert "RequestAuthentication" in missing.fix and "SecurityPolicy" in missing.fix

    unforwarded = copy.deepcopy(boot)
    _ext_proc(unforwarded)["metadata_options"]["forwarding_namespaces"]["untyped"] = []
    (silent,) = _identity(unforwarded, ex)
    assert silent.status == "FAIL" and "does not forward" in silent.detail

    elsewhere = copy.deepcopy(boot)
    for f in _filters(elsewhere):
        if f["name"] == "envoy.filters.http.jwt_authn":
            f["typed_config"]["providers"]["ice-jwt-0"]["payload_in_metadata"] = "claims"
    (wrong,) = _identity(elsewhere, ex)
    assert wrong.status == "FAIL" and "under claims" in wrong.detail


def test_mtls_needs_the_peer_attributes(tmp_path: Path) -> None:
    ex = _expected(tmp_path, "{source: mtls}")
    boot = local_bootstrap(_spec(tmp_path, "{source: mtls}", tls=TLS))
    (ok,) = _identity(boot, ex)
    assert ok.status == "MANUAL" and "connection.uri_san_peer_certificate" in ok.detail
    del _ext_proc(boot)["request_attributes"]
    (bad,) = _identity(boot, ex)
    assert bad.status == "FAIL" and "does not ask for" in bad.detail


def test_a_header_source_needs_ext_authz_after_the_strip(tmp_path: Path) -> None:
    identity = "{source: header, header: x-verified-tenant}"
    ex = _expected(tmp_path, identity)
    boot = local_bootstrap(_spec(tmp_path, identity))
    (none,) = _identity(boot, ex)  # ICE generates the strip; the operator adds ext_authz
    assert none.status == "FAIL" and "no ext_authz" in none.detail
    authz = {
        "name": "envoy.filters.http.ext_authz",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3.ExtAuthz",
            "grpc_service": {"envoy_grpc": {"cluster_name": "authz"}},
        },
    }
    _filters(boot).insert(1, authz)  # after the strip, before ext_proc
    (ok,) = _identity(boot, ex)
    assert ok.status == "PASS", ok
    _filters(boot).insert(0, _filters(boot).pop(1))  # ext_authz before the strip
    (late,) = _identity(boot, ex)
    assert late.status == "FAIL" and "not removed before ext_authz" in late.detail
