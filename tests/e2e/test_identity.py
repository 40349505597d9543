"""Through real Envoy, configured as ``ice envoy-config`` generates it from the policy: the
tenant is what Envoy vouches for (docs/identity.md).

- ``source: jwt``: Envoy's jwt_authn verifies a JWT signed here (a local RSA key, its JWKS in a
  file); ICE reads the claim from the filter's metadata. A valid token names the tenant, even
  when the client also sends ``x-tenant`` for another one (which never reaches the backend);
  an expired token, a wrong signature, a wrong audience or issuer are refused; no token is
  ICE's 401 in the API's (Anthropic's) format.
- ``source: mtls``: a test CA, client certificates with SPIFFE IDs; the tenant is the
  certificate's URI SAN, whatever ``x-tenant`` says.
- ``source: header``: an ext_authz service (HTTP, here) sets ``x-verified-tenant``; a client's
  copy is removed before the filter runs, so it never names the tenant.
- ``trust``: the routes without an identity keep the client's ``x-tenant``, as before."""

from __future__ import annotations

import http.server
import ipaddress
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cryptography import x509

from .harness import CHAT, E2E, Reply, access_log_entry
from .identity_stack import (
    AUDIENCE,
    ISSUER,
    MESSAGES,
    Ca,
    Issued,
    Signer,
    identity_stack,
    tls_request,
)

ANTHROPIC = {
    "model": "dev-model",
    "max_tokens": 8,
    "messages": [{"role": "user", "content": "hello"}],
}
OPENAI = {"model": "dev-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


def _jwt_identity(jwks: Path) -> str:
    return (
        f'{{source: jwt, jwt: {{issuer: "{ISSUER}", audiences: [{AUDIENCE}], '
        f'jwks_file: "{jwks}"}}}}'
    )


def _bearer(token: str, **more: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}", "x-priority": "critical", **more}


def _metric(e2e: E2E, source: str, found: str) -> float:
    return e2e.ice_metric("ice_identities_total", route="messages", source=source, found=found)


def test_jwt_claims_name_the_tenant_and_bad_tokens_are_refused(tmp_path: Path) -> None:
    signer, stranger = Signer.new(), Signer.new()
    jwks = tmp_path / "jwks.json"
    jwks.write_text(signer.jwks())
    with identity_stack(tmp_path, _jwt_identity(jwks)) as e2e:
        # a valid token for team-a, with a header claiming team-b
        ok = e2e.post(
            f"{MESSAGES}?t=a", ANTHROPIC, _bearer(signer.token("team-a"), **{"x-tenant": "team-b"})
        )
        assert ok.status == 200, ok
        got = e2e.only_received()
        assert got.header("x-tenant") is None  # the client's claim never goes upstream
        assert got.header("authorization") is None  # jwt_authn does not forward the token
        entry = access_log_entry(e2e, f"{MESSAGES}?t=a")
        assert (entry["tenant"], entry["identity"]) == ("team-a", "jwt")
        assert _metric(e2e, "jwt", "yes") == 1
        e2e.clear_received()

        now = int(time.time())
        bad: dict[str, Reply] = {
            "expired": e2e.post(
                MESSAGES, ANTHROPIC, _bearer(signer.token("team-a", exp=now - 600, iat=now - 900))
            ),
            "signature": e2e.post(MESSAGES, ANTHROPIC, _bearer(stranger.token("team-a"))),
            "audience": e2e.post(MESSAGES, ANTHROPIC, _bearer(signer.token("team-a", aud="x"))),
            "issuer": e2e.post(
                MESSAGES, ANTHROPIC, _bearer(signer.token("team-a", iss="https://other.test"))
            ),
        }
        # Envoy's jwt_authn answers a token it cannot accept (401; 403 for an audience it
        # does not allow), in its own words
        statuses = {why: reply.status for why, reply in bad.items()}
        assert statuses == {"expired": 401, "signature": 401, "audience": 403, "issuer": 401}, bad
        assert b"expired" in bad["expired"].body
        assert b"verification fail" in bad["signature"].body
        assert b"udience" in bad["audience"].body
        assert b"issuer" in bad["issuer"].body.lower()

        # no token: ICE's 401 in the route's API format
        absent = e2e.post(f"{MESSAGES}?t=none", ANTHROPIC, {"x-tenant": "team-b"})
        assert absent.status == 401, absent
        body = json.loads(absent.body)
        assert body["type"] == "error" and body["error"]["type"] == "authentication_error"
        assert ISSUER in body["error"]["message"]
        assert absent.header("x-ice-reason") == "identity_required"
        assert e2e.received() == []  # none of the refused reached the backend
        assert _metric(e2e, "jwt", "no") >= 1

        # the routes that trust the client's header keep doing so
        trusted = e2e.post(
            f"{CHAT}?t=trust", OPENAI, {"x-tenant": "team-b", "x-priority": "critical"}
        )
        assert trusted.status == 200
        assert e2e.only_received().header("x-tenant") == "team-b"
        entry = access_log_entry(e2e, f"{CHAT}?t=trust")
        assert (entry["tenant"], entry["identity"]) == ("team-b", "trust")


def test_mtls_spiffe_ids_name_the_tenant(tmp_path: Path) -> None:
    ca = Ca.new(tmp_path / "tls")
    other = Ca.new(tmp_path / "other", "other-ca")
    server = ca.issue("server", [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))], server=True)
    spiffe_a = "spiffe://ice.test/ns/team-a/sa/client"
    client_a = ca.issue("client-a", [x509.UniformResourceIdentifier(spiffe_a)])
    client_dns = ca.issue("client-dns", [x509.DNSName("client.ice.test")])
    rogue = other.issue(
        "rogue", [x509.UniformResourceIdentifier("spiffe://ice.test/ns/team-b/sa/x")]
    )
    tls = {"cert": str(server.cert), "key": str(server.key), "client_ca": str(ca.pem)}
    with identity_stack(tmp_path, "{source: mtls}", tls=tls, probe=client_a) as e2e:

        def send(client: Issued, tag: str) -> Reply:
            headers = {"x-tenant": "team-b", "x-priority": "critical"}
            return tls_request(
                e2e.envoy_port, ca.pem, client, f"{MESSAGES}?t={tag}", ANTHROPIC, headers
            )

        ok = send(client_a, "a")
        assert ok.status == 200, ok
        assert e2e.only_received().header("x-tenant") is None
        entry = access_log_entry(e2e, f"{MESSAGES}?t=a")
        assert (entry["tenant"], entry["identity"]) == (spiffe_a, "mtls")
        e2e.clear_received()

        # a certificate without a URI SAN: no identity, ICE's 401
        no_uri = send(client_dns, "dns")
        assert no_uri.status == 401, no_uri
        assert json.loads(no_uri.body)["error"]["type"] == "authentication_error"
        # a certificate of another CA never completes the handshake
        try:
            refused: Reply | None = send(rogue, "rogue")
        except OSError:
            refused = None
        assert refused is None or refused.status >= 400
        assert e2e.received() == []
        assert _metric(e2e, "mtls", "yes") >= 1


# --- source: header, set by an ext_authz service --------------------------------------------

KEYS = {"Bearer key-a": "team-a", "": ""}  # the service's callers (none: anonymous)


class _Authz(http.server.BaseHTTPRequestHandler):
    """An HTTP ext_authz service: 200 with ``x-verified-tenant`` for a known key, 200 without
    it for an anonymous caller (no key), 403 for an unknown key."""

    def do_POST(self) -> None:
        self._answer()

    def do_GET(self) -> None:
        self._answer()

    def _answer(self) -> None:
        key = self.headers.get("authorization", "")
        if key not in KEYS:
            self.send_response(403)
            self.send_header("content-length", "0")
            self.end_headers()
            return
        self.send_response(200)
        if KEYS[key]:
            self.send_header("x-verified-tenant", KEYS[key])
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def _with_authz(port: int) -> Callable[[dict[str, Any]], None]:
    """The operator's ext_authz filter, after ICE's stripping filter and before ext_proc."""

    def edit(bootstrap: dict[str, Any]) -> None:
        res = bootstrap["static_resources"]
        chain = res["listeners"][0]["filter_chains"][0]
        filters = chain["filters"][0]["typed_config"]["http_filters"]
        authz = {
            "name": "envoy.filters.http.ext_authz",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3.ExtAuthz",
                "http_service": {
                    "server_uri": {
                        "uri": f"http://127.0.0.1:{port}",
                        "cluster": "authz",
                        "timeout": "1s",
                    },
                    "authorization_response": {
                        "allowed_upstream_headers": {"patterns": [{"exact": "x-verified-tenant"}]}
                    },
                },
                "allowed_headers": {"patterns": [{"exact": "authorization"}]},
                "transport_api_version": "V3",
            },
        }
        filters.insert(1, authz)
        res["clusters"].append(
            {
                "name": "authz",
                "type": "STATIC",
                "connect_timeout": "1s",
                "load_assignment": {
                    "cluster_name": "authz",
                    "endpoints": [
                        {
                            "lb_endpoints": [
                                {
                                    "endpoint": {
                                        "address": {
                                            "socket_address": {
                                                "address": "127.0.0.1",
                                                "port_value": port,
                                            }
                                        }
                                    }
                                }
                            ]
                        }
                    ],
                },
            }
        )

    return edit


def test_an_ext_authz_header_names_the_tenant_and_a_clients_copy_never_does(tmp_path: Path) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Authz)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    identity = "{source: header, header: x-verified-tenant}"
    try:
        with identity_stack(tmp_path, identity, edit=_with_authz(server.server_address[1])) as e2e:
            spoof = {"x-verified-tenant": "team-b", "x-tenant": "team-b", "x-priority": "critical"}
            ok = e2e.post(f"{MESSAGES}?t=a", ANTHROPIC, {"authorization": "Bearer key-a", **spoof})
            assert ok.status == 200, ok
            got = e2e.only_received()
            assert got.header("x-verified-tenant") == "team-a"  # the service's, not the client's
            assert got.header("x-tenant") is None
            entry = access_log_entry(e2e, f"{MESSAGES}?t=a")
            assert (entry["tenant"], entry["identity"]) == ("team-a", "header")
            e2e.clear_received()

            # the service lets the caller in without naming a tenant: the client's copy was
            # removed before ext_authz ran, so ICE finds none and refuses
            anon = e2e.post(MESSAGES, ANTHROPIC, spoof)
            assert anon.status == 401, anon
            assert json.loads(anon.body)["error"]["type"] == "authentication_error"
            wrong = {"authorization": "Bearer wrong", **spoof}
            assert e2e.post(MESSAGES, ANTHROPIC, wrong).status == 403  # the service's refusal
            assert e2e.received() == []
    finally:
        server.shutdown()
        server.server_close()
