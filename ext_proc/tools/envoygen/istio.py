"""Istio: ICE in the ingress gateway (context ``GATEWAY``) and in the inference pods' sidecars
(``SIDECAR_INBOUND``), as EnvoyFilters whose values are ``pieces``' typed objects, and ICE's
cluster settings as a DestinationRule (both flavours).

Istio (istiod's EnvoyFilter semantics, read in pilot/pkg/networking/core/envoyfilter): a
patch applies only under its own context (an outbound cluster such as ICE's is patched under
``SIDECAR_OUTBOUND`` or ``GATEWAY``, never ``SIDECAR_INBOUND``); a LISTENER patch matches the
listener's own port (a sidecar's inbound traffic all arrives on ``virtualInbound``, 15006),
while filter patches on ``virtualInbound`` match the filter chain's destination port, the
container's port, as do the inbound route table and cluster (``inbound|PORT||``); MERGE on a
map (``typed_extension_protocol_options``, ``typed_per_filter_config``) replaces the entry
whole. So:

- the listener's ``per_connection_buffer_limit_bytes`` (Envoy's default, 1 MiB, would 413 a
  larger body before ICE sees it) is raised to ``pieces.MAX_BODY_BYTES`` by a LISTENER
  patch: the gateway's listener by its pods' port (``gateway.target_port``), the sidecar's
  ``virtualInbound``;
- ICE's cluster (``outbound|PORT||ice.NS.svc.cluster.local``) is not patched: DestinationRule
  ``ice`` gives it the local cluster's connect timeout (1 s), up to 1,024 streams per HTTP/2
  connection and outlier detection, which istiod merges with what it builds (a MERGE would
  replace the HTTP protocol options entry, dropping istiod's and other rules' settings).

The ingress gateway (``ice-gateway`` in the gateway's namespace, its pods by label), which
other services share: ICE changes nothing they see.
- a ``Gateway`` and a ``VirtualService`` for the spec's ``gateway.hosts``, naming each route
  ``ice.<policy route>``: the judged paths (exact) to the backend Service, the read-only
  paths (GET/HEAD), then a 404 in the OpenAI error format for anything else on these hosts
  (closed by default: a path that Istio's normalisation leaves odd, ``//v1/...``, gets the
  404, never the backend). The hosts are named, never ``*`` unless the spec says ``*``:
  istiod merges every VirtualService bound to a gateway port for one host into one virtual
  host, routes in creation order, so a ``*`` beside another tenant's ``*`` either hands that
  tenant's paths ICE's 404 or hands ICE's unknown paths to the tenant;
- HCM: Envoy's 413 in the API's format and ICE's access log, both only for routes named
  ``ice.*`` (``hcm_settings.route_scope``); path normalisation is the mesh's own;
- filters before the router, all **disabled by default**: the spoofed-header stripping,
  ext_proc, the 404's body reader;
- per ICE route (``HTTP_ROUTE`` MERGE, by the VirtualService's route name): the stripping
  on; on judged routes ext_proc on with ``x-ice-route`` (and ``x-ice-profile``) as gRPC
  metadata and the verdict headers from dynamic metadata; the 404 reads the body first.

The sidecar (``ice-sidecar`` in the backend's namespace, the backend's pods), whose inbound
chain for the container's port serves the backend only: the HCM normalises paths as the
local bootstrap (merges slashes, decodes %2F) with the 413 and access log; the filters (the
stripping on); and, as Istio builds the inbound route table itself (one route, ``default``,
every path to ``inbound|PORT||``) and VirtualServices do not apply to inbound traffic, the
routes are patches: the judged endpoints and the read-only paths (with ``/metrics``: ICE
scrapes vLLM through this sidecar) inserted before ``default``, and ``default`` itself turned
into the 404. Istio applies the MERGE to ``default`` first, then the inserts, each just before
``default``: the patch order is the route table's order.

Invariant: a patch's value is exactly the object the local bootstrap uses (``pieces``), only
the cluster names differ; every match names the context, and the port, istiod keys by.
"""

from __future__ import annotations

from typing import Any

from envoy_data_plane.envoy.extensions.filters.network.http_connection_manager.v3 import (
    HttpConnectionManager,
    HttpConnectionManagerPathWithEscapedSlashesAction,
)
from envoy_data_plane.google.protobuf import Any as PbAny

from ext_proc.tools.envoygen import identity_mesh, identity_parts, pieces
from ext_proc.tools.envoygen.emit import as_dict, k8s_duration
from ext_proc.tools.envoygen.hcm_settings import access_log, route_scope, too_large_reply
from ext_proc.tools.envoygen.local import read_only_name
from ext_proc.tools.envoygen.spec import MeshSpec

__all__ = [
    "HEADER",
    "MIN_ENVOY",
    "MIN_ISTIO",
    "VIRTUAL_INBOUND",
    "buffer_limit_patch",
    "ice_cluster_name",
    "inbound_cluster_name",
    "objects",
]

HEADER = [
    "Istio: ICE in the ingress gateway (Gateway, VirtualService, EnvoyFilter `ice-gateway`)",
    "and in the inference pods' sidecars (EnvoyFilter `ice-sidecar`). Use one of the two, or",
    "both (a request judged at the gateway is judged again in the sidecar: give the sidecar a",
    "profile without shedding, or drop its EnvoyFilter); DestinationRule `ice` sets ICE's",
    "cluster (1 s connect, 1,024 streams per connection) and ejects a dead ICE pod at once.",
    "Istio 1.29 or later (Envoy 1.37). How: docs/deploy-istio.md; why each piece is there:",
    "ext_proc/tools/envoygen/istio.py. Remove an EnvoyFilter to roll back.",
]
# The oldest Istio whose Envoy has every field the patches use: direct_response's
# body_format (the sidecar's 404, Envoy 1.37), header_mutation's remove_on_match (1.36).
MIN_ISTIO = (1, 29)
MIN_ENVOY = (1, 37)
HCM = "envoy.filters.network.http_connection_manager"
NETWORKING = "networking.istio.io/v1"
ENVOY_FILTER_API = "networking.istio.io/v1alpha3"
HCM_TYPE = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3."
ROUTE_PREFIX = "ice."  # the VirtualService's route names: apart from other services' routes
CLOSED = "closed"
SIDECAR_CLOSED = "default"  # Istio's own inbound route, turned into the 404
VIRTUAL_INBOUND = "virtualInbound"  # istiod's inbound listener (15006): all inbound traffic
H2_OPTIONS = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"


def ice_cluster_name(spec: MeshSpec) -> str:
    return f"outbound|{spec.ice.port}||{spec.ice.host}"


def inbound_cluster_name(spec: MeshSpec) -> str:
    return f"inbound|{spec.backend.container_port}||"


def backend_host(spec: MeshSpec) -> str:
    return spec.backend.host


def _hcm_merge(*, normalise: bool, scope: str | None) -> dict[str, Any]:
    """The HCM fields ICE needs, as a MERGE value: Envoy's 413 in the API's format and ICE's
    access log (beside Istio's own), only for routes named ``scope*`` when given;
    ``normalise``: path normalisation as the local bootstrap."""
    where = route_scope(scope) if scope is not None else None
    hcm = HttpConnectionManager(
        local_reply_config=too_large_reply(where), access_log=[access_log(scope=where)]
    )
    if normalise:
        hcm.normalize_path = True
        hcm.merge_slashes = True
        hcm.path_with_escaped_slashes_action = (
            HttpConnectionManagerPathWithEscapedSlashesAction.UNESCAPE_AND_FORWARD
        )
    return {"name": HCM, "typed_config": as_dict(PbAny.pack(hcm))}


def _filters_before_router(spec: MeshSpec, *, shared: bool) -> list[dict[str, Any]]:
    """``shared``: a proxy that serves other services too: every filter off by default."""
    cluster = ice_cluster_name(spec)
    extra = identity_parts.identity_headers(spec.routes)
    return [
        as_dict(pieces.strip_spoofed_headers(disabled=shared, extra=extra)),
        as_dict(identity_parts.ext_proc_filter(cluster, spec.routes, disabled=shared)),
        as_dict(pieces.buffer_filter()),
    ]


def _listener_match(context: str, port: int, sub_filter: str | None) -> dict[str, Any]:
    flt: dict[str, Any] = {"name": HCM}
    if sub_filter:
        flt["subFilter"] = {"name": sub_filter}
    return {"context": context, "listener": {"portNumber": port, "filterChain": {"filter": flt}}}


def buffer_limit_patch(context: str, listener: dict[str, Any]) -> dict[str, Any]:
    """The listener's buffer limit up to the largest body a route accepts (8 MiB)."""
    return {
        "applyTo": "LISTENER",
        "match": {"context": context, "listener": listener},
        "patch": {
            "operation": "MERGE",
            "value": {"per_connection_buffer_limit_bytes": pieces.MAX_BODY_BYTES},
        },
    }


def _common_patches(
    spec: MeshSpec, context: str, port: int, *, shared: bool, listener: dict[str, Any]
) -> list[dict[str, Any]]:
    """The buffer limit, the HCM merge and the filters before the router."""
    patches = [
        buffer_limit_patch(context, listener),
        {
            "applyTo": "NETWORK_FILTER",
            "match": _listener_match(context, port, None),
            "patch": {
                "operation": "MERGE",
                "value": _hcm_merge(normalise=not shared, scope=ROUTE_PREFIX if shared else None),
            },
        },
    ]
    for value in _filters_before_router(spec, shared=shared):
        patches.append(
            {
                "applyTo": "HTTP_FILTER",
                "match": _listener_match(context, port, pieces.ROUTER),
                "patch": {"operation": "INSERT_BEFORE", "value": value},
            }
        )
    return patches


def judged_route_merge(name: str, profile: str | None) -> dict[str, Any]:
    """What a judged route gets: ICE on with its name as metadata, the verdict headers."""
    return {
        "typed_per_filter_config": {
            pieces.EXT_PROC: as_dict(PbAny.pack(pieces.judged_route_config(name, profile)))
        },
        "response_headers_to_add": [as_dict(h) for h in pieces.verdict_response_headers()],
    }


def _stripping_on() -> dict[str, Any]:
    return {pieces.HEADER_MUTATION: as_dict(PbAny.pack(pieces.strip_spoofed_headers_on_route()))}


def _gateway_objects(spec: MeshSpec) -> list[dict[str, Any]]:
    gw = spec.gateway
    if not gw.hosts:
        raise ValueError("gateway.hosts is empty: load the spec with load_spec / parse_spec")
    selector = dict(gw.istio_selector)
    gateway = {
        "apiVersion": NETWORKING,
        "kind": "Gateway",
        "metadata": {"name": gw.name, "namespace": gw.namespace},
        "spec": {
            "selector": selector,
            "servers": [
                {
                    "port": {"number": gw.port, "name": "http", "protocol": "HTTP"},
                    "hosts": list(gw.hosts),
                }
            ],
        },
    }
    host = backend_host(spec)
    destination = [{"destination": {"host": host, "port": {"number": spec.backend.port}}}]
    http: list[dict[str, Any]] = [
        {
            "name": ROUTE_PREFIX + r.name,
            "match": [{"uri": {"exact": r.path}}],
            "route": destination,
            "timeout": k8s_duration(
                as_dict(pieces.judged_route("x", "/", "x"))["route"]["timeout"]
            ),
        }
        for r in spec.routes
    ]
    http += [
        {
            "name": ROUTE_PREFIX + read_only_name(p),
            "match": [{"uri": {"exact": p}, "method": {"regex": pieces.READ_METHODS}}],
            "route": destination,
        }
        for p in spec.read_only
    ]
    http.append(
        {
            "name": ROUTE_PREFIX + CLOSED,
            "directResponse": {
                "status": 404,
                "body": {
                    "string": '{"error":{"message":"This path is not served by this gateway.",'
                    '"type":"invalid_request_error","param":null,"code":"unknown_endpoint"}}'
                },
            },
            "headers": {"response": {"set": {"content-type": "application/json"}}},
        }
    )
    virtual_service = {
        "apiVersion": NETWORKING,
        "kind": "VirtualService",
        "metadata": {"name": "llm-inference", "namespace": gw.namespace},
        "spec": {"hosts": list(gw.hosts), "gateways": [gw.name], "http": http},
    }
    listener = {"portNumber": gw.target_port}
    patches = _common_patches(spec, "GATEWAY", gw.target_port, shared=True, listener=listener)
    for r in spec.routes:
        value = judged_route_merge(r.name, r.profile)
        value["typed_per_filter_config"].update(_stripping_on())
        patches.append(_route_patch("GATEWAY", ROUTE_PREFIX + r.name, "MERGE", value))
    for p in spec.read_only:
        value = {"typed_per_filter_config": _stripping_on()}
        patches.append(_route_patch("GATEWAY", ROUTE_PREFIX + read_only_name(p), "MERGE", value))
    closed_on = {
        pieces.BUFFER: as_dict(PbAny.pack(pieces.buffer_on())),
        **_stripping_on(),
    }
    value = {"typed_per_filter_config": closed_on}
    patches.append(_route_patch("GATEWAY", ROUTE_PREFIX + CLOSED, "MERGE", value))
    envoy_filter = {
        "apiVersion": ENVOY_FILTER_API,
        "kind": "EnvoyFilter",
        "metadata": {"name": "ice-gateway", "namespace": gw.istio_namespace},
        "spec": {"workloadSelector": {"labels": selector}, "configPatches": patches},
    }
    return [gateway, virtual_service, envoy_filter]


def _route_patch(
    context: str, route: str, operation: str, value: dict[str, Any], port: int | None = None
) -> dict[str, Any]:
    config: dict[str, Any] = {"vhost": {"route": {"name": route}}}
    if port is not None:
        config = {"portNumber": port, **config}
    return {
        "applyTo": "HTTP_ROUTE",
        "match": {"context": context, "routeConfiguration": config},
        "patch": {"operation": operation, "value": value},
    }


def _sidecar_objects(spec: MeshSpec) -> list[dict[str, Any]]:
    port = spec.backend.container_port  # istiod's inbound chain, route table and cluster
    inbound = inbound_cluster_name(spec)
    listener = {"name": VIRTUAL_INBOUND}  # a LISTENER patch matches the listener's own port
    patches = _common_patches(spec, "SIDECAR_INBOUND", port, shared=False, listener=listener)
    closed = as_dict(pieces.closed_route(SIDECAR_CLOSED))
    del closed["match"]  # keep Istio's own match (prefix /) on `default`
    patches.append(_route_patch("SIDECAR_INBOUND", SIDECAR_CLOSED, "MERGE", closed, port))
    for r in spec.routes:
        value = as_dict(pieces.judged_route(r.name, r.path, inbound, r.profile))
        value["response_headers_to_add"] = [as_dict(h) for h in pieces.verdict_response_headers()]
        patches.append(
            _route_patch("SIDECAR_INBOUND", SIDECAR_CLOSED, "INSERT_BEFORE", value, port)
        )
    for p in (*spec.read_only, "/metrics"):
        value = as_dict(pieces.read_only_route(read_only_name(p), p, inbound))
        patches.append(
            _route_patch("SIDECAR_INBOUND", SIDECAR_CLOSED, "INSERT_BEFORE", value, port)
        )
    return [
        {
            "apiVersion": ENVOY_FILTER_API,
            "kind": "EnvoyFilter",
            "metadata": {"name": "ice-sidecar", "namespace": spec.backend.namespace},
            "spec": {
                "workloadSelector": {"labels": dict(spec.backend.selector)},
                "configPatches": patches,
            },
        }
    ]


def ice_destination_rule(spec: MeshSpec) -> dict[str, Any]:
    """ICE's cluster belongs to istiod: its settings come from a DestinationRule, which
    istiod merges into the cluster it builds (an EnvoyFilter MERGE would replace the HTTP
    protocol options entry whole). As the local cluster (``pieces.ice_cluster``): a 1 s
    connect timeout, up to 1,024 streams per HTTP/2 connection (the Service's port is
    ``appProtocol: grpc``), and outlier detection: the first refused or reset connection
    ejects a replica (local-origin failures apart), so a dead ICE pod gets no second stream
    while Kubernetes takes it out of the endpoints."""
    local = as_dict(pieces.ice_cluster("ice", ["127.0.0.1:1"]))
    od = local["outlier_detection"]
    h2 = local["typed_extension_protocol_options"][H2_OPTIONS]["explicit_http_config"]
    streams = h2["http2_protocol_options"]["max_concurrent_streams"]
    return {
        "apiVersion": NETWORKING,
        "kind": "DestinationRule",
        "metadata": {"name": "ice", "namespace": spec.ice.namespace},
        "spec": {
            "host": spec.ice.host,
            "trafficPolicy": {
                "connectionPool": {
                    "tcp": {"connectTimeout": k8s_duration(local["connect_timeout"])},
                    "http": {"maxConcurrentStreams": streams},
                },
                "outlierDetection": {
                    "splitExternalLocalOriginErrors": od["split_external_local_origin_errors"],
                    "consecutiveLocalOriginFailures": od["consecutive_local_origin_failure"],
                    "interval": k8s_duration(od["interval"]),
                    "baseEjectionTime": k8s_duration(od["base_ejection_time"]),
                    "maxEjectionPercent": od["max_ejection_percent"],
                },
            },
        },
    }


def objects(spec: MeshSpec) -> list[dict[str, Any]]:
    """The Istio objects, in a fixed order: gateway flavour, then sidecar flavour, then ICE's
    own DestinationRule (both flavours' outbound cluster to ICE), then what the routes'
    identities need (``identity_mesh.istio_objects``: RequestAuthentication,
    PeerAuthentication)."""
    return [
        *_gateway_objects(spec),
        *_sidecar_objects(spec),
        ice_destination_rule(spec),
        *identity_mesh.istio_objects(spec),
    ]
