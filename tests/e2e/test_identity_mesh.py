"""Through real Envoy shaped as Istio's ingress gateway and as Envoy Gateway's proxy, with the
generated objects applied as those control planes apply them (ICE's EnvoyFilter / policies
by tests/e2e/meshes.py and eg_xds.py; the JWT by tests/e2e/authn_standin.py from the
generated RequestAuthentication / SecurityPolicy): a JWT signed here names the tenant, a
client's ``x-tenant`` does not (it never reaches the backend), a bad token is refused, and
the claim reaches ICE under each control plane's own metadata key (Istio: ``payload``; Envoy
Gateway: the issuer): ICE counts it found (``ice_identities_total``), and at Istio's gateway,
whose access log is ICE's, the log names the tenant.

The profile's identity is not required here (the harness's readiness probe has no token);
tests/e2e/test_identity.py covers the 401 for a missing one."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from ext_proc.lab.stack import free_port
from ext_proc.tools.envoygen import gateway, gateway_names, istio
from ext_proc.tools.envoygen.spec import parse_spec

from . import authn_standin, eg_xds, meshes
from .harness import CHAT, E2E, access_log_entry, running_stack, write_policy
from .identity_stack import AUDIENCE, ISSUER, Signer

REPO = Path(__file__).resolve().parents[2]
BODY = {"model": "dev-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


def _profile_extra(jwks: Path) -> str:
    return (
        "    queue: {enabled: true, tenant_header: x-tenant}\n"
        f'    identity: {{source: jwt, required: false, jwt: {{issuer: "{ISSUER}", '
        f'audiences: [{AUDIENCE}], jwks_file: "{jwks}"}}}}\n'
    )


@contextlib.contextmanager
def _mesh(tmp: Path, flavour: str, signer: Signer) -> Iterator[E2E]:
    jwks = tmp / "jwks.json"
    jwks.write_text(signer.jwks())
    extra = _profile_extra(jwks)
    policy = write_policy(tmp / "policy-for-spec.yaml", 1, extra)
    doc = yaml.safe_load((REPO / "envoy" / "mesh.yaml").read_text())
    doc["policy"] = str(policy)
    spec = parse_spec(doc, REPO / "envoy")
    envoy_port, backend_port = free_port(), free_port()
    kwargs: dict[str, Any]
    if flavour == "istio-gateway":
        boot = meshes.istio_gateway(spec)
        gw = spec.gateway
        objs = istio.objects(spec)
        authn_standin.istio_jwt(boot, objs, gw.istio_namespace, dict(gw.istio_selector), {})
        kwargs = {
            "listener": meshes.GATEWAY_LISTENER,
            "ice_cluster": meshes.ISTIO_ICE,
            "backend_cluster": (meshes.ISTIO_BACKEND, meshes.TENANT_CLUSTER),
            "host": meshes.GATEWAY_HOST,
        }
    else:
        docs = gateway.objects(spec)
        boot = eg_xds.xds_like_bootstrap(docs, "127.0.0.1:1", "127.0.0.1:2", 18081, 15001)
        authn_standin.eg_jwt(boot, docs)
        kwargs = {
            "listener": gateway_names.listener_name(spec),
            "ice_cluster": eg_xds.ice_clusters(docs)[0],
            "backend_cluster": tuple(eg_xds.backend_clusters(docs)),
        }
    template = tmp / f"{flavour}.json"
    template.write_text(json.dumps(boot))
    with running_stack(
        tmp,
        envoy_template=template,
        envoy_port=envoy_port,
        backend_port=backend_port,
        profile_extra=extra,
        **kwargs,
    ) as e2e:
        yield e2e


@pytest.mark.parametrize("flavour", ["istio-gateway", "envoy-gateway"])
def test_a_jwt_claim_names_the_tenant_through_the_mesh(tmp_path: Path, flavour: str) -> None:
    signer, stranger = Signer.new(), Signer.new()
    with _mesh(tmp_path, flavour, signer) as e2e:
        token = signer.token("team-a")
        headers = {
            "authorization": f"Bearer {token}",
            "x-tenant": "team-b",
            "x-priority": "critical",
        }
        ok = e2e.post(f"{CHAT}?t=a", BODY, headers)
        assert ok.status == 200, ok
        assert e2e.only_received().header("x-tenant") is None
        assert e2e.ice_metric("ice_identities_total", route="chat", source="jwt", found="yes") == 1
        if flavour == "istio-gateway":  # ICE's access log (EG's proxy keeps EG's own)
            entry = access_log_entry(e2e, f"{CHAT}?t=a")
            assert (entry["tenant"], entry["identity"]) == ("team-a", "jwt")
        e2e.clear_received()

        now = int(time.time())
        expired = signer.token("team-a", exp=now - 600, iat=now - 900)
        for bad in (expired, stranger.token("team-a")):
            reply = e2e.post(CHAT, BODY, {"authorization": f"Bearer {bad}"})
            assert reply.status == 401, reply
        assert e2e.received() == []

        # no token on a route that does not require one: the route's tenant, never the header
        plain = e2e.post(f"{CHAT}?t=none", BODY, {"x-tenant": "team-b", "x-priority": "critical"})
        assert plain.status == 200
        assert e2e.only_received().header("x-tenant") is None
        if flavour == "istio-gateway":
            entry = access_log_entry(e2e, f"{CHAT}?t=none")
            assert (entry["tenant"], entry["identity"]) == ("chat", None)
