"""Istio: ICE in the ingress gateway (context ``GATEWAY``) and in the inference pods' sidecars
(``SIDECAR_INBOUND``), as EnvoyFilters whose values are ``pieces``' typed objects.

The ingress gateway (``ice-gateway`` in the gateway's namespace, its pods by label):
- a ``Gateway`` and a ``VirtualService`` naming each route ``ice.<policy route>``: the judged
  paths (exact) to the backend Service, the read-only paths (GET/HEAD), then a 404 in the
  OpenAI error format for anything else on these hosts (closed by default);
- HCM: path normalisation as the local bootstrap (Istio's default, BASE, neither merges
  slashes nor decodes %2F) and Envoy's 413 in the API's format;
- filters before the router: the spoofed-header stripping, ext_proc **disabled by default**
  (the gateway carries other services' routes: they never meet ICE), the 404's body reader;
- per judged route (``HTTP_ROUTE`` MERGE, by the VirtualService's route name): ext_proc on
  with ``x-ice-route`` (and ``x-ice-profile``) as gRPC metadata, and the verdict headers
  from dynamic metadata for the client; the 404 route reads the body first;
- ICE's cluster (Istio's ``outbound|PORT||ice.NS.svc.cluster.local``): at most 32 streams
  per HTTP/2 connection, as the local bootstrap; its outlier detection from a
  ``DestinationRule`` ``ice`` in ICE's namespace (a replica ejected on its first refused
  connection), and the ext_proc stream's retry on another replica (in the filter's config).

The sidecar (``ice-sidecar`` in the backend's namespace, the backend's pods): Istio builds
the inbound route table itself (one route, ``default``, every path to ``inbound|PORT||``)
and VirtualServices do not apply to inbound traffic, so the routes are patches: the judged
endpoints and the read-only paths (with ``/metrics``: ICE scrapes vLLM through this sidecar)
inserted before ``default``, and ``default`` itself turned into the 404. Istio applies the
MERGE to ``default`` first, then the inserts, each just before ``default``: the patch order
is the route table's order.

Invariant: a patch's value is exactly the object the local bootstrap uses (``pieces``), only
the cluster names differ.
"""

from __future__ import annotations

from typing import Any

from envoy_data_plane.envoy.extensions.filters.network.http_connection_manager.v3 import (
    HttpConnectionManager,
    HttpConnectionManagerPathWithEscapedSlashesAction,
)
from envoy_data_plane.google.protobuf import Any as PbAny

from ext_proc.tools.envoygen import pieces
from ext_proc.tools.envoygen.emit import as_dict, k8s_duration
from ext_proc.tools.envoygen.hcm_settings import access_log, too_large_reply
from ext_proc.tools.envoygen.local import read_only_name
from ext_proc.tools.envoygen.spec import MeshSpec

__all__ = ["HEADER", "ice_cluster_name", "inbound_cluster_name", "objects"]

HEADER = [
    "Istio: ICE in the ingress gateway (Gateway, VirtualService, EnvoyFilter `ice-gateway`)",
    "and in the inference pods' sidecars (EnvoyFilter `ice-sidecar`). Use one of the two, or",
    "both (a request judged at the gateway is judged again in the sidecar: give the sidecar a",
    "profile without shedding, or drop its EnvoyFilter); DestinationRule `ice` ejects a dead",
    "ICE pod at once. How: docs/deploy-istio.md; why each piece is there:",
    "ext_proc/tools/envoygen/istio.py. Remove an EnvoyFilter to roll back.",
]
HCM = "envoy.filters.network.http_connection_manager"
NETWORKING = "networking.istio.io/v1"
ENVOY_FILTER_API = "networking.istio.io/v1alpha3"
HCM_TYPE = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3."
ROUTE_PREFIX = "ice."  # the VirtualService's route names: apart from other services' routes
CLOSED = "closed"
SIDECAR_CLOSED = "default"  # Istio's own inbound route, turned into the 404


def ice_cluster_name(spec: MeshSpec) -> str:
    return f"outbound|{spec.ice.port}||{spec.ice.host}"


def inbound_cluster_name(spec: MeshSpec) -> str:
    return f"inbound|{spec.backend.port}||"


def backend_host(spec: MeshSpec) -> str:
    b = spec.backend
    return f"{b.service}.{b.namespace}.svc.cluster.local"


def _normalising_hcm(local_reply: bool = True) -> dict[str, Any]:
    """The HCM fields ICE needs, as a MERGE value."""
    hcm = HttpConnectionManager(
        normalize_path=True,
        merge_slashes=True,
        path_with_escaped_slashes_action=(
            HttpConnectionManagerPathWithEscapedSlashesAction.UNESCAPE_AND_FORWARD
        ),
    )
    if local_reply:
        hcm.local_reply_config = too_large_reply()
    hcm.access_log = [access_log()]  # beside Istio's own, with ICE's verdict
    return {"name": HCM, "typed_config": as_dict(PbAny.pack(hcm))}


def _filters_before_router(spec: MeshSpec, *, ice_on_by_default: bool) -> list[dict[str, Any]]:
    cluster = ice_cluster_name(spec)
    return [
        as_dict(pieces.strip_spoofed_headers()),
        as_dict(pieces.ext_proc_filter(cluster, disabled=not ice_on_by_default)),
        as_dict(pieces.buffer_filter()),
    ]


def _listener_match(context: str, port: int | None, sub_filter: str | None) -> dict[str, Any]:
    flt: dict[str, Any] = {"name": HCM}
    if sub_filter:
        flt["subFilter"] = {"name": sub_filter}
    listener: dict[str, Any] = {"filterChain": {"filter": flt}}
    if port is not None:
        listener = {"portNumber": port, **listener}
    return {"context": context, "listener": listener}


def _common_patches(spec: MeshSpec, context: str, port: int | None) -> list[dict[str, Any]]:
    """HCM merge, the filters before the router, and ICE's cluster."""
    patches: list[dict[str, Any]] = [
        {
            "applyTo": "NETWORK_FILTER",
            "match": _listener_match(context, port, None),
            "patch": {"operation": "MERGE", "value": _normalising_hcm()},
        }
    ]
    for value in _filters_before_router(spec, ice_on_by_default=context == "SIDECAR_INBOUND"):
        patches.append(
            {
                "applyTo": "HTTP_FILTER",
                "match": _listener_match(context, port, pieces.ROUTER),
                "patch": {"operation": "INSERT_BEFORE", "value": value},
            }
        )
    patches.append(
        {
            "applyTo": "CLUSTER",
            "match": {
                "context": context,
                "cluster": {"service": spec.ice.host, "portNumber": spec.ice.port},
            },
            "patch": {"operation": "MERGE", "value": ice_cluster_merge()},
        }
    )
    return patches


def ice_cluster_merge() -> dict[str, Any]:
    """The part of the local ``ice`` cluster Istio's own cluster lacks."""
    full = as_dict(pieces.ice_cluster("ice", ["127.0.0.1:1"]))
    return {
        "connect_timeout": full["connect_timeout"],
        "typed_extension_protocol_options": full["typed_extension_protocol_options"],
    }


def judged_route_merge(name: str, profile: str | None) -> dict[str, Any]:
    """What a judged route gets: ICE on with its name as metadata, the verdict headers."""
    return {
        "typed_per_filter_config": {
            pieces.EXT_PROC: as_dict(PbAny.pack(pieces.judged_route_config(name, profile)))
        },
        "response_headers_to_add": [as_dict(h) for h in pieces.verdict_response_headers()],
    }


def _gateway_objects(spec: MeshSpec) -> list[dict[str, Any]]:
    gw = spec.gateway
    selector = dict(gw.istio_selector)
    gateway = {
        "apiVersion": NETWORKING,
        "kind": "Gateway",
        "metadata": {"name": gw.name, "namespace": gw.namespace},
        "spec": {
            "selector": selector,
            "servers": [
                {"port": {"number": gw.port, "name": "http", "protocol": "HTTP"}, "hosts": ["*"]}
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
            "timeout": "600s",
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
        "spec": {"hosts": ["*"], "gateways": [gw.name], "http": http},
    }
    patches = _common_patches(spec, "GATEWAY", None)
    for r in spec.routes:
        value = judged_route_merge(r.name, r.profile)
        patches.append(_route_patch("GATEWAY", ROUTE_PREFIX + r.name, "MERGE", value))
    buffer_on = {
        "typed_per_filter_config": {pieces.BUFFER: as_dict(PbAny.pack(pieces.buffer_on()))}
    }
    patches.append(_route_patch("GATEWAY", ROUTE_PREFIX + CLOSED, "MERGE", buffer_on))
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
    port = spec.backend.port
    inbound = inbound_cluster_name(spec)
    patches = _common_patches(spec, "SIDECAR_INBOUND", port)
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
    """ICE's cluster belongs to istiod: its outlier detection comes from a DestinationRule,
    the same as the local cluster's (``pieces.ice_cluster``): the first refused or reset
    connection ejects a replica (local-origin failures apart), so a dead ICE pod gets no
    second stream while Kubernetes takes it out of the endpoints."""
    od = as_dict(pieces.ice_cluster("ice", ["127.0.0.1:1"]))["outlier_detection"]
    return {
        "apiVersion": NETWORKING,
        "kind": "DestinationRule",
        "metadata": {"name": "ice", "namespace": spec.ice.namespace},
        "spec": {
            "host": spec.ice.host,
            "trafficPolicy": {
                "outlierDetection": {
                    "splitExternalLocalOriginErrors": od["split_external_local_origin_errors"],
                    "consecutiveLocalOriginFailures": od["consecutive_local_origin_failure"],
                    "interval": k8s_duration(od["interval"]),
                    "baseEjectionTime": k8s_duration(od["base_ejection_time"]),
                    "maxEjectionPercent": od["max_ejection_percent"],
                }
            },
        },
    }


def objects(spec: MeshSpec) -> list[dict[str, Any]]:
    """The Istio objects, in a fixed order: gateway flavour, then sidecar flavour, then ICE's
    own DestinationRule (both flavours' outbound cluster to ICE)."""
    return [*_gateway_objects(spec), *_sidecar_objects(spec), ice_destination_rule(spec)]
