"""Who is asking: the request's tenant, from a source Envoy vouches for (pure; docs/identity.md).

The route's ``identity`` (``IdentitySpec``) names the source:

- ``jwt``: a claim (``claim``, default ``sub``; a dotted path reads a nested claim) of the
  payload Envoy's ``jwt_authn`` filter verified and wrote to its dynamic metadata
  (``payload_in_metadata``), which the ext_proc filter forwards
  (``metadata_options.forwarding_namespaces``: ``envoy.filters.http.jwt_authn``). The payload
  is read under ``jwt.metadata_key`` (default ``payload``: ICE's local config, Istio), else
  under the issuer (Envoy Gateway's key), and only when its ``iss`` is the route's issuer.
  A claim counts when it is a string or an integer.
- ``mtls``: the client certificate's first URI SAN (a SPIFFE ID; ``san: uri``) or DNS SAN
  (``san: dns``), the ext_proc filter's ``request_attributes``
  ``connection.uri_san_peer_certificate`` / ``connection.dns_san_peer_certificate``.
- ``header``: the header a trusted ``ext_authz`` service sets (``header``); the generated
  configs remove any client copy before that filter runs, so the value ICE sees is the
  service's.
- ``trust``: the client's own tenant header: ``header`` when set (both tenants), else the
  profile's ``queue.tenant_header`` (the fair queue) and ``prefix_tracking.tenant_header``
  (the prefix scores), each as before identity sources.

Invariant: with any source but ``trust`` no header a client sends names the tenant: the
client's copies of the tenant headers are ignored and removed (``Identity`` carries them in
``strip``), as ``client_priority: cap`` treats a claimed priority. A ``required`` identity
that is absent is refused (``missing_message``: the 401's wording); an absent optional one
leaves the tenant empty (the route's name, ``request_tenant``).

``request_tenant`` is the one tenant a request counts under: the fair queue's turn and the
per-tenant accounting read it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ext_proc.policy.settings import IdentitySource, IdentitySpec

if TYPE_CHECKING:
    from ext_proc.admit.routing import Route
    from ext_proc.admit.verdict import RequestFacts

__all__ = [
    "IDENTITY_REQUIRED",
    "JWT_NAMESPACE",
    "MAX_TENANT_CHARS",
    "NOTHING_VOUCHED",
    "PEER_DNS_SAN",
    "PEER_URI_SAN",
    "Identity",
    "Vouched",
    "claim_value",
    "identify",
    "missing_message",
    "request_tenant",
    "tenant_key",
]

JWT_NAMESPACE = "envoy.filters.http.jwt_authn"  # jwt_authn's dynamic metadata
PEER_URI_SAN = "connection.uri_san_peer_certificate"  # Envoy's attributes (first SAN)
PEER_DNS_SAN = "connection.dns_san_peer_certificate"
IDENTITY_REQUIRED = "identity_required"  # the refusal's code (401)
MAX_TENANT_CHARS = 64


@dataclass(frozen=True, slots=True)
class Vouched:
    """What Envoy vouches for about one request, read from the ext_proc message (never from
    its headers): jwt_authn's verified payloads by metadata key, the peer certificate's
    first URI and DNS SANs ("" when the connection had none)."""

    jwt: Mapping[str, object] = field(default_factory=dict)
    uri_san: str = ""
    dns_san: str = ""


NOTHING_VOUCHED = Vouched()


@dataclass(frozen=True, slots=True)
class Identity:
    """The request's identity as found: ``tenant`` ("" none), from ``source``."""

    tenant: str
    source: IdentitySource


def claim_value(payload: Mapping[str, object], path: str) -> str:
    """The claim at ``path`` (dotted for nested objects) as text; "" when absent or neither
    a string nor an integer (a list or an object names no one tenant)."""
    value: object = payload
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return ""
        value = value[part]
    if isinstance(value, bool):
        return ""
    if isinstance(value, float) and value.is_integer():  # Struct numbers are doubles
        return str(int(value))
    if isinstance(value, int | str):
        return str(value)
    return ""


def _jwt_tenant(spec: IdentitySpec, vouched: Vouched) -> str:
    jwt = spec.jwt
    if jwt is None:
        return ""
    payload = vouched.jwt.get(jwt.metadata_key)
    if not isinstance(payload, Mapping):
        payload = vouched.jwt.get(jwt.issuer)
    if not isinstance(payload, Mapping) or payload.get("iss") != jwt.issuer:
        return ""
    return claim_value(payload, spec.claim)


def identify(spec: IdentitySpec, vouched: Vouched, header_value: str) -> Identity:
    """The identity the route's ``spec`` finds: from what Envoy vouches for, or (``header``
    and ``trust``) ``header_value``, the value of the spec's header ("" when absent)."""
    if spec.source == "jwt":
        tenant = _jwt_tenant(spec, vouched)
    elif spec.source == "mtls":
        tenant = vouched.uri_san if spec.san == "uri" else vouched.dns_san
    else:
        tenant = header_value
    return Identity(tenant.strip(), spec.source)


def missing_message(spec: IdentitySpec, trust_header: str) -> str:
    """The 401's message for a required identity that is absent (``trust_header``: the
    header a ``trust`` route reads)."""
    if spec.source == "jwt":
        issuer = spec.jwt.issuer if spec.jwt is not None else "its issuer"
        return (
            f"This endpoint needs a bearer token from {issuer} naming you in its "
            f"{spec.claim!r} claim (Authorization: Bearer <JWT>); none came with the request."
        )
    if spec.source == "mtls":
        kind = "URI (SPIFFE ID)" if spec.san == "uri" else "DNS"
        return (
            f"This endpoint needs a client certificate with a {kind} subject alternative "
            f"name; the connection presented none."
        )
    if spec.source == "header":
        return (
            f"This endpoint needs an identity set by the gateway's authorization service "
            f"({spec.header}); the request has none."
        )
    return f"This endpoint needs the tenant header {trust_header or 'of the route'}."


def tenant_key(value: str, fallback: str) -> str:
    """The tenant a value names: printable ASCII, at most MAX_TENANT_CHARS; else
    ``fallback``."""
    clean = "".join(c for c in value[: MAX_TENANT_CHARS * 4] if " " < c < "\x7f")
    return clean[:MAX_TENANT_CHARS] or fallback


def request_tenant(route: Route, facts: RequestFacts) -> str:
    """The tenant the request counts under: its identity (``facts.queue_tenant``: the source's
    value, or under ``trust`` the queue's tenant header), printable ASCII, at most
    ``MAX_TENANT_CHARS``; none: the route's name. The fair queue's turns and any per-tenant
    accounting key on it."""
    return tenant_key(facts.queue_tenant, route.name)
