"""The Envoy pieces a route's identity needs (docs/identity.md), from the policy's
``identity`` of each route (``RouteSpec.identity``):

- ``source: jwt``: Envoy's ``jwt_authn`` filter before ext_proc, one provider per distinct
  ``jwt`` block (issuer, audiences, the JWKS: ``jwks_file`` as ``local_jwks`` or ``jwks_uri``
  as ``remote_jwks`` through a cluster of its own), writing the verified payload to its
  dynamic metadata under ``metadata_key`` (``payload_in_metadata``); the ext_proc filter
  forwards that namespace to ICE (``forwarding_namespaces``). Each route names its
  requirement (``PerRouteConfig``): the provider, or no token at all (``allow_missing``), so
  a bad token (expired, wrong signature, issuer or audience) is Envoy's 401, and a missing one
  reaches ICE, which answers a required identity's absence with a 401 in the API's format.
  Routes without ``jwt`` turn the filter off.
- ``source: mtls``: the ext_proc filter asks for the peer certificate's first URI and DNS
  SAN (``request_attributes``); the listener's TLS requires a client certificate signed by
  ``tls.client_ca`` (``downstream_tls``).
- ``source: header``: the identity header is removed from every request before any other
  filter runs (with ICE's own headers, ``pieces.strip_spoofed_headers``); the operator's
  ``ext_authz`` filter, after it, sets it.

Invariant: with no route using a source, nothing here changes the generated config.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import urlsplit

from envoy_data_plane.envoy.config.cluster.v3 import Cluster, ClusterDiscoveryType
from envoy_data_plane.envoy.config.core.v3 import DataSource, HttpUri, TransportSocket
from envoy_data_plane.envoy.extensions.filters.http.ext_proc.v3 import ExternalProcessor
from envoy_data_plane.envoy.extensions.filters.http.jwt_authn.v3 import (
    JwtAuthentication,
    JwtProvider,
    JwtRequirement,
    JwtRequirementOrList,
    PerRouteConfig,
    RemoteJwks,
)
from envoy_data_plane.envoy.extensions.filters.network.http_connection_manager.v3 import HttpFilter
from envoy_data_plane.envoy.extensions.transport_sockets.tls.v3 import (
    CertificateValidationContext,
    CommonTlsContext,
    DownstreamTlsContext,
    TlsCertificate,
    UpstreamTlsContext,
)
from envoy_data_plane.google.protobuf import Any, Empty

from ext_proc.policy.settings import IdentitySpec, JwtProviderSpec
from ext_proc.tools.envoygen import pieces
from ext_proc.tools.envoygen.cluster_parts import _assignment
from ext_proc.tools.envoygen.spec import ListenerTls, RouteSpec

__all__ = [
    "JWT_AUTHN",
    "JWT_NAMESPACE",
    "PEER_ATTRIBUTES",
    "downstream_tls",
    "ext_proc_config",
    "ext_proc_filter",
    "identity_headers",
    "jwks_clusters",
    "jwks_text",
    "jwt_filter",
    "jwt_route_config",
    "provider_name",
    "providers",
    "with_identity",
]

JWT_AUTHN = "envoy.filters.http.jwt_authn"
JWT_NAMESPACE = JWT_AUTHN  # jwt_authn's dynamic metadata (ext_proc.admit.identity)
PEER_ATTRIBUTES = ("connection.uri_san_peer_certificate", "connection.dns_san_peer_certificate")
JWKS_TIMEOUT = datetime.timedelta(seconds=5)
JWKS_CACHE = datetime.timedelta(minutes=5)


def _any(message: object) -> Any:
    return Any.pack(message)  # type: ignore[arg-type]


def providers(routes: Iterable[RouteSpec]) -> list[JwtProviderSpec]:
    """The distinct JWT providers of the routes, in route order."""
    out: list[JwtProviderSpec] = []
    for r in routes:
        jwt = r.identity.jwt
        if r.identity.source == "jwt" and jwt is not None and jwt not in out:
            out.append(jwt)
    return out


def provider_name(index: int) -> str:
    """The i-th provider's name (jwt_authn's provider and requirement, its JWKS cluster)."""
    return f"ice-jwt-{index}"


def _jwks_cluster(index: int, uri: str) -> Cluster:
    """The JWKS host: logical DNS, TLS (with SNI) for https."""
    parts = urlsplit(uri)
    host = parts.hostname or ""
    tls = parts.scheme == "https"
    port = parts.port or (443 if tls else 80)
    cluster = Cluster(
        name=provider_name(index),
        type=ClusterDiscoveryType.LOGICAL_DNS,
        connect_timeout=datetime.timedelta(seconds=2),
        load_assignment=_assignment(provider_name(index), [f"{host}:{port}"]),
    )
    if tls:
        context = UpstreamTlsContext(sni=host)
        cluster.transport_socket = TransportSocket(
            name="envoy.transport_sockets.tls", typed_config=_any(context)
        )
    return cluster


def jwks_clusters(routes: Iterable[RouteSpec]) -> list[Cluster]:
    """One cluster per provider whose keys are fetched (``jwks_uri``)."""
    return [_jwks_cluster(i, p.jwks_uri) for i, p in enumerate(providers(routes)) if p.jwks_uri]


def _provider(index: int, spec: JwtProviderSpec) -> JwtProvider:
    provider = JwtProvider(
        issuer=spec.issuer,
        audiences=list(spec.audiences),
        payload_in_metadata=spec.metadata_key,
    )
    if spec.jwks_uri:
        provider.remote_jwks = RemoteJwks(
            http_uri=HttpUri(uri=spec.jwks_uri, cluster=provider_name(index), timeout=JWKS_TIMEOUT),
            cache_duration=JWKS_CACHE,
        )
    else:
        provider.local_jwks = DataSource(filename=spec.jwks_file)
    return provider


def jwt_filter(routes: Iterable[RouteSpec]) -> HttpFilter | None:
    """Envoy's jwt_authn for the routes' providers (None: no route reads a JWT). Off unless
    a route names its requirement (``jwt_route_config``)."""
    found = providers(routes)
    if not found:
        return None
    config = JwtAuthentication(
        providers={provider_name(i): _provider(i, p) for i, p in enumerate(found)},
        requirement_map={
            provider_name(i): JwtRequirement(
                requires_any=JwtRequirementOrList(
                    requirements=[
                        JwtRequirement(provider_name=provider_name(i)),
                        JwtRequirement(allow_missing=Empty()),
                    ]
                )
            )
            for i in range(len(found))
        },
    )
    return HttpFilter(name=JWT_AUTHN, typed_config=_any(config))


def jwt_route_config(route: RouteSpec, routes: Iterable[RouteSpec]) -> PerRouteConfig:
    """The route's requirement: its provider's (a token, when sent, must verify), or off."""
    jwt = route.identity.jwt
    if route.identity.source != "jwt" or jwt is None:
        return PerRouteConfig(disabled=True)
    return PerRouteConfig(requirement_name=provider_name(providers(routes).index(jwt)))


def identity_headers(routes: Iterable[RouteSpec]) -> list[str]:
    """The headers a trusted service sets (``source: header``): removed from each request
    before any filter reads it."""
    out: list[str] = []
    for r in routes:
        if r.identity.source == "header" and r.identity.header not in out:
            out.append(r.identity.header)
    return out


def ext_proc_config(cluster: str, routes: Iterable[RouteSpec]) -> ExternalProcessor:
    """``pieces.ext_proc_config`` with what the routes' identities need (``with_identity``)."""
    config = pieces.ext_proc_config(cluster)
    with_identity(config, (r.identity for r in routes))
    return config


def ext_proc_filter(
    cluster: str, routes: Iterable[RouteSpec], *, disabled: bool = False
) -> HttpFilter:
    """``pieces.ext_proc_filter`` with what the routes' identities need."""
    config = ext_proc_config(cluster, routes)
    return HttpFilter(name=pieces.EXT_PROC, typed_config=_any(config), disabled=disabled)


def jwks_text(spec: JwtProviderSpec) -> str:
    """A ``jwks_file``'s keys, for the flavours that carry them inline (Istio's ``jwks``,
    Envoy Gateway's ``localJWKS``); ValueError naming the file when it cannot be read."""
    try:
        return Path(spec.jwks_file).read_text()
    except OSError as e:
        raise ValueError(f"identity.jwt.jwks_file {spec.jwks_file!r}: {e.strerror}") from None


def with_identity(config: ExternalProcessor, identities: Iterable[IdentitySpec]) -> None:
    """ICE's ext_proc settings, completed for the routes' identities: jwt_authn's metadata
    forwarded (``jwt``), the peer certificate's SANs asked for (``mtls``)."""
    sources = {i.source for i in identities}
    options = config.metadata_options
    if "jwt" in sources and options is not None and options.forwarding_namespaces is not None:
        forwarded = options.forwarding_namespaces.untyped
        if JWT_NAMESPACE not in forwarded:
            forwarded.append(JWT_NAMESPACE)
    if "mtls" in sources:
        config.request_attributes = [
            *config.request_attributes,
            *(a for a in PEER_ATTRIBUTES if a not in config.request_attributes),
        ]


def downstream_tls(tls: ListenerTls) -> TransportSocket:
    """The local listener's TLS: its certificate, client certificates required and verified
    against ``client_ca`` (their SANs are the ``mtls`` identities)."""
    context = DownstreamTlsContext(
        require_client_certificate=True,
        common_tls_context=CommonTlsContext(
            tls_certificates=[
                TlsCertificate(
                    certificate_chain=DataSource(filename=tls.cert),
                    private_key=DataSource(filename=tls.key),
                )
            ],
            validation_context=CertificateValidationContext(
                trusted_ca=DataSource(filename=tls.client_ca)
            ),
        ),
    )
    return TransportSocket(name="envoy.transport_sockets.tls", typed_config=_any(context))
