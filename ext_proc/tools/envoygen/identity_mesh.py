"""The control planes' own objects for the routes' identities (docs/identity.md): what Istio
and Envoy Gateway turn into the filters ``identity_parts`` builds for the local bootstrap.

Istio (``istio_objects``):
- ``RequestAuthentication`` ``ice-jwt`` for the ingress gateway's pods (in the gateway's
  namespace, ``gateway.istio_namespace``, by its ``istio_selector``) and one for the backend's
  pods (the sidecar flavour), when a route reads a JWT: one ``jwtRules`` entry per provider
  (issuer, audiences, ``jwksUri``, or the ``jwks_file``'s keys inline as ``jwks``; the token
  forwarded, so that a sidecar behind the gateway verifies it again). istiod
  turns it into the proxy's jwt_authn filter, first among its HTTP filters, with each
  provider's requirement "this provider, or no token" (a bad token is Istio's 401, a missing
  one reaches ICE) and the verified payload in the filter's metadata under ``payload``
  (older Istio: under the issuer; ICE reads both). ICE's EnvoyFilter forwards that namespace
  to ICE (``identity_parts.with_identity``). A RequestAuthentication selects the whole proxy:
  on a shared gateway a bearer token that another service's clients send is checked against
  these issuers too.
- ``PeerAuthentication`` ``ice-mtls`` (``STRICT``) for the backend's pods, when a route's
  identity is ``mtls``: every connection to the sidecar then carries the caller's mesh
  certificate, whose SPIFFE ID (``spiffe://<trust domain>/ns/<ns>/sa/<service account>``)
  ICE reads (``connection.uri_san_peer_certificate``). At the ingress gateway a client's own
  certificate exists only where the operator's Gateway server has ``tls.mode: MUTUAL``.

Envoy Gateway (``security_policies``): a ``SecurityPolicy`` per judged HTTPRoute whose routes
read a JWT (``gateway_names.judged_groups``: the routes of one HTTPRoute must then share one
identity), with ``jwt.optional: true`` (a missing token reaches ICE; EG's requirement is
"these providers, or no token") and the provider as EG's API says it (``remoteJWKS`` or
``localJWKS`` inline). EG writes the payload to jwt_authn's metadata under the issuer, which
ICE reads; ``claimToHeaders`` is not used: without a token, a header of that name from the
client would go through (``source: header`` is for a header an ext_authz service always sets).
"""

from __future__ import annotations

from typing import Any

from ext_proc.policy.settings import JwtProviderSpec
from ext_proc.tools.envoygen.gateway_names import (
    EG_API,
    GATEWAY_GROUP,
    LABELS,
    judged_groups,
)
from ext_proc.tools.envoygen.identity_parts import jwks_text, provider_name, providers
from ext_proc.tools.envoygen.spec import MeshSpec, RouteSpec, SpecError

__all__ = ["JWT_POLICY", "MTLS_POLICY", "istio_objects", "security_policies"]

SECURITY = "security.istio.io/v1"
JWT_POLICY = "ice-jwt"
MTLS_POLICY = "ice-mtls"


def _istio_rule(spec: JwtProviderSpec) -> dict[str, Any]:
    # forwardOriginalToken: a request judged at the gateway keeps its token for the sidecar's
    # jwt_authn (the sidecar flavour, or both), which would otherwise find none
    rule: dict[str, Any] = {"issuer": spec.issuer, "forwardOriginalToken": True}
    if spec.audiences:
        rule["audiences"] = list(spec.audiences)
    if spec.jwks_uri:
        rule["jwksUri"] = spec.jwks_uri
    else:
        rule["jwks"] = jwks_text(spec)
    return rule


def istio_objects(spec: MeshSpec) -> list[dict[str, Any]]:
    """RequestAuthentication (a route reads a JWT) and PeerAuthentication (a route's
    identity is its peer certificate); none when every route trusts its client."""
    out: list[dict[str, Any]] = []
    found = providers(spec.routes)
    if found:
        rules = [_istio_rule(p) for p in found]
        gw, be = spec.gateway, spec.backend
        for namespace, labels in (
            (gw.istio_namespace, gw.istio_selector),
            (be.namespace, be.selector),
        ):
            out.append(
                {
                    "apiVersion": SECURITY,
                    "kind": "RequestAuthentication",
                    "metadata": {"name": JWT_POLICY, "namespace": namespace},
                    "spec": {"selector": {"matchLabels": dict(labels)}, "jwtRules": rules},
                }
            )
    if any(r.identity.source == "mtls" for r in spec.routes):
        out.append(
            {
                "apiVersion": SECURITY,
                "kind": "PeerAuthentication",
                "metadata": {"name": MTLS_POLICY, "namespace": spec.backend.namespace},
                "spec": {
                    "selector": {"matchLabels": dict(spec.backend.selector)},
                    "mtls": {"mode": "STRICT"},
                },
            }
        )
    return out


def _eg_provider(index: int, spec: JwtProviderSpec) -> dict[str, Any]:
    provider: dict[str, Any] = {"name": provider_name(index), "issuer": spec.issuer}
    if spec.audiences:
        provider["audiences"] = list(spec.audiences)
    if spec.jwks_uri:
        provider["remoteJWKS"] = {"uri": spec.jwks_uri}
    else:
        provider["localJWKS"] = {"type": "Inline", "inline": jwks_text(spec)}
    return provider


def _shared_identity(name: str, routes: tuple[RouteSpec, ...]) -> JwtProviderSpec | None:
    """The JWT provider of an HTTPRoute's routes (None: none reads a JWT); SpecError when
    they differ (a SecurityPolicy applies to the whole HTTPRoute)."""
    kinds = {(r.identity.source, r.identity.jwt) for r in routes}
    if len(kinds) > 1 and any(source == "jwt" for source, _ in kinds):
        names = ", ".join(r.name for r in routes)
        raise SpecError(
            f"routes: {names} share HTTPRoute {name} but not their identity: give the routes "
            "that read a JWT a profile of their own in the spec (docs/identity.md)"
        )
    source, jwt = next(iter(kinds))
    return jwt if source == "jwt" else None


def security_policies(spec: MeshSpec) -> list[dict[str, Any]]:
    """One SecurityPolicy per judged HTTPRoute whose routes read a JWT."""
    out = []
    known = providers(spec.routes)
    for group in judged_groups(spec):
        for name, routes in group.routes:
            jwt = _shared_identity(name, routes)
            if jwt is None:
                continue
            target = {"group": GATEWAY_GROUP, "kind": "HTTPRoute", "name": name}
            out.append(
                {
                    "apiVersion": EG_API,
                    "kind": "SecurityPolicy",
                    "metadata": {
                        "name": f"{name}-jwt",
                        "namespace": spec.gateway.namespace,
                        "labels": dict(LABELS),
                    },
                    "spec": {
                        "targetRefs": [target],
                        "jwt": {
                            "optional": True,
                            "providers": [_eg_provider(known.index(jwt), jwt)],
                        },
                    },
                }
            )
    return out
