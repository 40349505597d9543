"""Envoy Gateway: ICE in front of the inference backend with Gateway API routes and Envoy
Gateway's policies, doing what the local bootstrap (``local.py``) does.

The objects (``objects``), in this order:
- ``Gateway`` (class ``eg``, one HTTP listener ``http`` on ``spec.gateway.port``, routes from
  its own namespace only): a gateway of its own, so that "closed by default" is this
  gateway's rule and the xDS names below are known; then a ``ReferenceGrant`` when the
  backend lives in another namespace than the routes.
- ``HTTPRoute`` ``llm-inference`` (``llm-inference-<profile>`` per profile when the routes
  name different profiles; at most 16 rules each): one rule per judged route (exact path, to
  the backend Service, 600 s), so each has a stable xDS route name; the rule's
  ``ResponseHeaderModifier`` sets ICE's verdict headers from dynamic metadata
  (``pieces.verdict_response_headers``).
- ``HTTPRoute`` ``llm-inference-closed``: the read-only paths (GET and HEAD), then every other
  path (``PathPrefix /``) to the ``HTTPRouteFilter`` ``unknown-endpoint``: a 404 in the
  OpenAI error format from the gateway itself. Exact beats PathPrefix: closed by default.
- ``EnvoyExtensionPolicy`` ``ice`` (``ice-<profile>`` per profile) on the judged routes:
  ``pieces.ext_proc_config`` as EG's API says it, ICE's cluster settings from
  ``pieces.ice_cluster`` (HTTP/2 at most 32 streams, 1 s connect, gRPC health checks).
- ``ClientTrafficPolicy`` ``ice`` on the listener: no spoofing, the 8 MiB buffer, the path
  normalisation of the local HCM.
- ``EnvoyPatchPolicy`` ``ice`` on the Gateway: what EG's API cannot say, per route.
- ``SecurityPolicy`` ``<HTTPRoute>-jwt`` on each judged HTTPRoute whose routes read a JWT
  (``identity_mesh.security_policies``; docs/identity.md).

No spoofing: ``headers.earlyRequestHeaders`` of the ClientTrafficPolicy, with ``remove`` for
the names and ``removeOnMatch`` (``Prefix``) for ICE's prefixes, taken from
``pieces.strip_spoofed_headers``. EG puts it in the HCM's ``early_header_mutation_extensions``,
which run before route selection and before every HTTP filter: before ext_proc, so ICE's own
headers (set by ext_proc later) survive, on every route of the listener (read-only and 404
too), while ICE is down too. It is EG's own API: no filter index to patch, no dependence on
EG's filter names or order (a patched header_mutation filter would have to be inserted at an
index of ``http_filters`` that EG may change), and prefixes cover headers ICE adds later. A
route's RequestHeaderModifier would run at the router, after ext_proc, and strip ICE's own.

What the patch adds (EG's ExtProc API has none of them): on each judged route, EG's ext_proc
filter's per-route ``config`` becomes ``pieces.judged_route_config`` (``x-ice-route``, and
``x-ice-profile`` when the route names one, as gRPC metadata); on each ext_proc filter,
``max_message_timeout`` (ICE extends one message's deadline for semantic truncation) and
``response_attributes`` (``pieces.RESPONSE_ATTRIBUTES``: where a response ICE asked for came
from; EG's ``processingMode.response.attributes`` would also send every response's headers).
Operations select by ``jsonPath`` with a name filter, never by array index.

Envoy Gateway facts relied on (github.com/envoyproxy/gateway v1.9.0, 39763b1c, and main
d32f2829; paths in that repository):
- The ext_proc filter of an EnvoyExtensionPolicy's ``extProc[i]`` is named
  ``envoy.filters.http.ext_proc/envoyextensionpolicy/<ns>/<name>/extproc/<i>``, sits in the
  HCM ``disabled: true`` and is enabled per route with an ``envoy.config.route.v3.FilterConfig``
  whose ``config`` is an empty Any (internal/xds/translator/extproc.go patchHCM/patchRoute,
  utils.go enableFilterOnRoute/perRouteFilterName, internal/gatewayapi/envoyextensionpolicy.go
  irConfigNameForExtProc; golden testdata/out/xds-ir/ext-proc.{listeners,routes}.yaml). Its
  cluster is named ``envoyextensionpolicy/<ns>/<name>/extproc/<i>``
  (internal/gatewayapi/testdata/envoyextensionpolicy-failopen.out.yaml).
- ExtProc's API (api/v1alpha1/ext_proc_types.go): ``processingMode.request`` present → request
  headers SEND, ``body`` → the body mode; no ``response`` → SKIP/NONE; trailers SKIP;
  ``allowModeOverride``; ``metadata.accessibleNamespaces`` → ``forwarding_namespaces.untyped``,
  ``writableNamespaces`` → ``receiving_namespaces.untyped``; no max_message_timeout, no
  grpc_initial_metadata (translator/extproc.go extProcConfig, buildProcessingMode;
  gatewayapi/envoyextensionpolicy.go buildExtProc). ``backendSettings`` are ClusterSettings
  (api/v1alpha1/shared_types.go).
- xDS names with XDSNameSchemeV2 off (the default through v1.9, api/v1alpha1/
  envoygateway_helpers.go; the EnvoyPatchPolicy task page says v1.10 turns it on, then
  ``http-<port>``/``tcp-<port>``): Listener and RouteConfiguration
  ``<gw-ns>/<gw-name>/<listener>`` (translator/listener.go xdsListenerName, routeConfigName;
  gatewayapi/helpers.go irListenerName), virtual host ``<listener-name>/<host>``
  (translator.go virtualHostName), route ``httproute/<ns>/<name>/rule/<i>/match/<j>/<host>``
  with ``.`` → ``_`` and ``*`` for no hostname (gatewayapi/helpers.go irRouteName, route.go),
  backend cluster per rule ``httproute/<ns>/<name>/rule/<i>`` (irRouteDestinationName;
  merged backend clusters are opt-in, EnvoyProxy ``mergeBackends``).
- Route order: Exact, RegularExpression, PathPrefix; then the longer path; then more header
  matches (a method match is a ``:method`` header match); stable otherwise
  (gatewayapi/sort.go, route.go).
- EnvoyPatchPolicy (api/v1alpha1/envoypatchpolicy_types.go, translator/jsonpatch.go,
  internal/utils/jsonpatch/): the resource is marshalled with protojson UseProtoNames
  (snake_case), ``jsonPath`` (RFC 9535, ojg) is expanded to JSON pointers and ``path`` is
  appended to each; none found is an error; ``add`` creates missing parents; the patched
  resource is validated. ``..routes[?(@.name=='…')]`` is EG's own testdata form
  (testdata/in/xds-ir/jsonpatch-with-jsonpath.yaml). Off unless
  ``extensionApis.enableEnvoyPatchPolicy: true``.
- ResponseHeaderModifier ``set`` → route ``response_headers_to_add``,
  OVERWRITE_IF_EXISTS_OR_ADD, the value as written (no ``%`` escaping: Envoy expands
  ``%DYNAMIC_METADATA(...)%``), checked against ``^[!-~]+([\\t ]?[!-~]+)*$``
  (gatewayapi/filters.go processResponseHeaderModifierFilter; translator/route.go
  buildXdsAddedHeaders).
- ClientTrafficPolicy ``headers.earlyRequestHeaders`` ``remove`` and ``removeOnMatch`` (since
  v1.7) → HCM ``early_header_mutation_extensions`` (translator/listener.go
  buildEarlyHeaderMutation, header_mutation.go buildHeaderMutationRules: removes, then
  matches; gatewayapi/clienttrafficpolicy.go). Listener buffer default 32768 bytes, set by
  ``connection.bufferLimit`` (listener.go); an ext_proc Buffered body over it is refused.
  Paths: normalised, slashes merged, escaped slashes UnescapeAndRedirect unless ``path``.
- HTTPRouteFilter ``directResponse``: the body is a format string (``text_format_source``,
  since v1.8), ``contentType`` a Content-Type response header (translator/route.go
  buildXdsDirectResponseAction, gatewayapi/filters.go).
- HTTP filter order: ext_proc 100+i, ties by name, the router last (translator/httpfilters.go).

Not carried (EG has no API for them, or needs more than this file): the endpoint pick
(``override_host`` from ``envoy.lb`` metadata; EG's ``endpointOverride`` reads a header only),
the retry-once on a failed connection, the 404 route's body reader, Envoy's 413 in the API's
format and the overload manager of the local bootstrap.

Invariants: pure (no I/O); the same spec gives the same objects in the same order; every
Envoy value is a ``pieces`` object rendered by ``as_dict`` (the EG fields are translated from
them and raise when EG cannot say what ``pieces`` asks); ``xds_like_bootstrap`` translates
only the shapes ``objects`` emits and raises on anything else.

Where: ``gateway_names`` (the names, EG's and ICE's, and the judged routes by profile),
``gateway_policies`` (the three policies); here the Gateway, the routes, the 404's filter,
and their order.
"""

from __future__ import annotations

import json
from typing import Any

from ext_proc.tools.envoygen import pieces
from ext_proc.tools.envoygen.emit import as_dict
from ext_proc.tools.envoygen.gateway_names import (
    CLOSED,
    EG_API,
    EG_GROUP,
    GATEWAY_API,
    GATEWAY_CLASS,
    GATEWAY_GROUP,
    LISTENER,
    MAX_MATCHES,
    UNKNOWN,
    _chunks,
    _meta,
    judged_groups,
)
from ext_proc.tools.envoygen.gateway_policies import (
    client_traffic_policy,
    extension_policies,
    patch_policy,
)
from ext_proc.tools.envoygen.identity_mesh import security_policies
from ext_proc.tools.envoygen.spec import MeshSpec

__all__ = [
    "CLOSED_MESSAGE",
    "HEADER",
    "objects",
    "unknown_endpoint_body",
    "verdict_headers",
]

HEADER = [
    "Envoy Gateway: ICE on the inference gateway's judged endpoints, closed by default.",
    "A Gateway of its own (class `eg`, listener `http`), HTTPRoutes (one rule per judged route,",
    "the verdict headers on its responses; read-only paths GET/HEAD; a 404 in the OpenAI error",
    "format for anything else), EnvoyExtensionPolicy `ice` (one per profile when the routes",
    "name different profiles), ClientTrafficPolicy `ice` (strips spoofed ICE headers before",
    "ext_proc, 8 MiB bodies) and EnvoyPatchPolicy `ice` (each route's name and profile for ICE;",
    "needs `enableEnvoyPatchPolicy: true` in Envoy Gateway's config). How: docs/",
    "deploy-envoy-gateway.md; why each piece is there: ext_proc/tools/envoygen/gateway.py.",
    "Delete the EnvoyExtensionPolicy to roll back.",
]

CLOSED_MESSAGE = "This path is not served by this gateway."


# --- the objects ---------------------------------------------------------------------------


def _gateway(spec: MeshSpec) -> dict[str, Any]:
    gw = spec.gateway
    listener = {
        "name": LISTENER,
        "protocol": "HTTP",
        "port": gw.port,
        "allowedRoutes": {"namespaces": {"from": "Same"}},
    }
    return {
        "apiVersion": GATEWAY_API,
        "kind": "Gateway",
        "metadata": _meta(gw.name, gw.namespace),
        "spec": {"gatewayClassName": GATEWAY_CLASS, "listeners": [listener]},
    }


def _reference_grant(spec: MeshSpec) -> list[dict[str, Any]]:
    """The routes' backendRefs into the backend's namespace, when it is another one."""
    gw, be = spec.gateway, spec.backend
    if be.namespace == gw.namespace:
        return []
    return [
        {
            "apiVersion": "gateway.networking.k8s.io/v1beta1",
            "kind": "ReferenceGrant",
            "metadata": _meta(f"ice-httproutes-from-{gw.namespace}", be.namespace),
            "spec": {
                "from": [{"group": GATEWAY_GROUP, "kind": "HTTPRoute", "namespace": gw.namespace}],
                "to": [{"group": "", "kind": "Service", "name": be.service}],
            },
        }
    ]


def _backend_ref(spec: MeshSpec) -> list[dict[str, Any]]:
    ref: dict[str, Any] = {"name": spec.backend.service, "port": spec.backend.port}
    if spec.backend.namespace != spec.gateway.namespace:
        ref["namespace"] = spec.backend.namespace
    return [ref]


def verdict_headers() -> list[dict[str, str]]:
    """``pieces.verdict_response_headers`` as a ResponseHeaderModifier's ``set``."""
    out = []
    for option in map(as_dict, pieces.verdict_response_headers()):
        if option["append_action"] != "OVERWRITE_IF_EXISTS_OR_ADD":
            raise ValueError(f"{option}: EG's `set` overwrites; `add` appends")
        out.append({"name": option["header"]["key"], "value": option["header"]["value"]})
    return out


def _verdict_modifier() -> dict[str, Any]:
    return {"type": "ResponseHeaderModifier", "responseHeaderModifier": {"set": verdict_headers()}}


def _route_timeout() -> str:
    timeout: str = as_dict(pieces.judged_route("x", "/", "x"))["route"]["timeout"]
    return timeout


def _http_route(spec: MeshSpec, name: str, rules: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": GATEWAY_API,
        "kind": "HTTPRoute",
        "metadata": _meta(name, spec.gateway.namespace),
        "spec": {
            "parentRefs": [{"name": spec.gateway.name, "sectionName": LISTENER}],
            "rules": rules,
        },
    }


def _judged_routes(spec: MeshSpec) -> list[dict[str, Any]]:
    """One rule per judged route: each its own xDS route, named by its rule's index."""
    out = []
    for group in judged_groups(spec):
        for name, routes in group.routes:
            rules = [
                {
                    "matches": [{"path": {"type": "Exact", "value": r.path}}],
                    "filters": [_verdict_modifier()],
                    "backendRefs": _backend_ref(spec),
                    "timeouts": {"request": _route_timeout()},
                }
                for r in routes
            ]
            out.append(_http_route(spec, name, rules))
    return out


def _closed_route(spec: MeshSpec) -> dict[str, Any]:
    """The read-only paths (GET, HEAD), then everything else to the 404."""
    methods = pieces.READ_METHODS.split("|")
    matches = [
        {"path": {"type": "Exact", "value": p}, "method": m}
        for p in spec.read_only
        for m in methods
    ]
    rules: list[dict[str, Any]] = [
        {"matches": list(chunk), "backendRefs": _backend_ref(spec)}
        for chunk in _chunks(matches, MAX_MATCHES)
    ]
    ref = {"group": EG_GROUP, "kind": "HTTPRouteFilter", "name": UNKNOWN}
    rules.append(
        {
            "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
            "filters": [{"type": "ExtensionRef", "extensionRef": ref}],
        }
    )
    return _http_route(spec, CLOSED, rules)


def unknown_endpoint_body() -> str:
    """``pieces.UNKNOWN_ENDPOINT`` with a fixed message: EG's body is a text format string,
    where ``%PATH%`` could put a quote into the JSON."""
    error = {**pieces.UNKNOWN_ENDPOINT["error"], "message": CLOSED_MESSAGE}
    return json.dumps({"error": error}, separators=(",", ":"))


def _unknown_endpoint(spec: MeshSpec) -> dict[str, Any]:
    closed = as_dict(pieces.closed_route())
    return {
        "apiVersion": EG_API,
        "kind": "HTTPRouteFilter",
        "metadata": _meta(UNKNOWN, spec.gateway.namespace),
        "spec": {
            "directResponse": {
                "statusCode": closed["direct_response"]["status"],
                "contentType": closed["direct_response"]["body_format"]["content_type"],
                "body": {"type": "Inline", "inline": unknown_endpoint_body()},
            }
        },
    }


def objects(spec: MeshSpec) -> list[dict[str, Any]]:
    """The Envoy Gateway objects, in a fixed order (see the module's docstring)."""
    return [
        _gateway(spec),
        *_reference_grant(spec),
        *_judged_routes(spec),
        _closed_route(spec),
        _unknown_endpoint(spec),
        *extension_policies(spec),
        client_traffic_policy(spec),
        patch_policy(spec),
        *security_policies(spec),
    ]
