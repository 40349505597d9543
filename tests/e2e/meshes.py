"""Bootstraps shaped like a mesh's proxy, with the generated manifests' objects applied.

What the mesh would build itself is built here, as that mesh builds it; what ICE adds is
taken from the generated files (``envoy/k8s/overlays/*/generated/``), not copied:

- ``istio_gateway``: an Istio ingress gateway's HTTP listener (``0.0.0.0_8080``, route
  config ``http.8080``, vhost ``*:80``, Istio's cors and fault filters before the router),
  its routes translated from the generated VirtualService as Istio does (route name = the
  http route's name, exact ``uri`` → ``path``, ``method`` regex → a ``:method`` header
  matcher, ``directResponse`` → ``direct_response``), then the ``ice-gateway`` EnvoyFilter's
  patches applied as Istio applies them.
- ``istio_sidecar``: a sidecar's inbound listener for the backend's port (route config
  ``inbound|PORT||``, one route ``default`` to ``inbound|PORT||``), then ``ice-sidecar``.
- ``envoy_gateway``: Envoy Gateway's translation of the generated objects (``eg_xds``).
- Istio's cluster for ICE (``outbound|PORT||HOST``, HTTP/2 for ``appProtocol: grpc``, its
  10 s connect timeout, no health checks), then the CLUSTER patch.

Patch semantics (Istio's): MERGE is a protobuf merge (messages merge, lists append, setting
one member of a oneof such as a route's action clears the others); INSERT_BEFORE puts the
value just before the matched element; on one route table Istio applies the MERGEs first,
then the inserts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from ext_proc.tools.envoygen import gateway_names, istio, pieces
from ext_proc.tools.envoygen.emit import as_dict
from ext_proc.tools.envoygen.spec import load_spec

from . import eg_xds

REPO = Path(__file__).resolve().parents[2]
SPEC = load_spec(REPO / "envoy" / "mesh.yaml")
ISTIO_FILE = REPO / "envoy" / "k8s" / "overlays" / "istio" / "generated" / "istio.yaml"
TYPE = "type.googleapis.com/"
HCM_TYPE = (
    f"{TYPE}envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
)
HCM = "envoy.filters.network.http_connection_manager"
ROUTE_ACTIONS = {"route", "direct_response", "redirect"}

ISTIO_ICE = istio.ice_cluster_name(SPEC)
ISTIO_INBOUND = istio.inbound_cluster_name(SPEC)
ISTIO_BACKEND = f"outbound|{SPEC.backend.port}||{istio.backend_host(SPEC)}"
GATEWAY_LISTENER = "0.0.0.0_8080"
SIDECAR_LISTENER = "virtualInbound"


def generated_istio() -> dict[tuple[str, str], dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all(ISTIO_FILE.read_text()) if d]
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def proto_merge(into: dict[str, Any], patch: dict[str, Any]) -> None:
    for key, value in patch.items():
        if key in ROUTE_ACTIONS:
            for other in ROUTE_ACTIONS - {key}:
                into.pop(other, None)
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            if "@type" in value and value.get("@type") != into[key].get("@type"):
                into[key] = value
            else:
                proto_merge(into[key], value)
        elif isinstance(value, list) and isinstance(into.get(key), list):
            into[key] = into[key] + value
        else:
            into[key] = value


def _filter(name: str, type_name: str) -> dict[str, Any]:
    return {"name": name, "typed_config": {"@type": f"{TYPE}{type_name}"}}


def _istio_filters() -> list[dict[str, Any]]:
    return [
        _filter("envoy.filters.http.cors", "envoy.extensions.filters.http.cors.v3.Cors"),
        _filter("envoy.filters.http.fault", "envoy.extensions.filters.http.fault.v3.HTTPFault"),
        _filter(pieces.ROUTER, "envoy.extensions.filters.http.router.v3.Router"),
    ]


def _apply(
    patches: list[dict[str, Any]], context: str, hcm: dict[str, Any], clusters: list[dict[str, Any]]
) -> None:
    """The EnvoyFilter's patches on one HCM and the clusters, in Istio's order."""
    routes = hcm["route_config"]["virtual_hosts"][0]["routes"]
    by_name = {r["name"]: r for r in routes}
    for p in patches:
        assert p["match"]["context"] == context, p["match"]
        op, value, kind = p["patch"]["operation"], p["patch"]["value"], p["applyTo"]
        if kind == "NETWORK_FILTER":
            assert op == "MERGE" and value["name"] == HCM
            proto_merge(hcm, value["typed_config"])
        elif kind == "HTTP_FILTER":
            anchor = p["match"]["listener"]["filterChain"]["filter"]["subFilter"]["name"]
            assert op == "INSERT_BEFORE"
            at = next(i for i, f in enumerate(hcm["http_filters"]) if f["name"] == anchor)
            hcm["http_filters"].insert(at, value)
        elif kind == "CLUSTER":
            assert op == "MERGE"
            want = p["match"]["cluster"]
            name = f"outbound|{want['portNumber']}||{want['service']}"
            proto_merge(next(c for c in clusters if c["name"] == name), value)
    on_routes = [p for p in patches if p["applyTo"] == "HTTP_ROUTE"]
    for p in on_routes:
        if p["patch"]["operation"] == "MERGE":
            proto_merge(
                by_name[p["match"]["routeConfiguration"]["vhost"]["route"]["name"]],
                p["patch"]["value"],
            )
    for p in on_routes:
        if p["patch"]["operation"] == "INSERT_BEFORE":
            anchor = by_name[p["match"]["routeConfiguration"]["vhost"]["route"]["name"]]
            routes.insert(routes.index(anchor), p["patch"]["value"])


def _istio_ice_cluster() -> dict[str, Any]:
    """ICE's cluster as Istio builds it for a Service port with ``appProtocol: grpc``."""
    return {
        "name": ISTIO_ICE,
        "type": "STATIC",
        "connect_timeout": "10s",
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": f"{TYPE}envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        },
        "load_assignment": {"cluster_name": ISTIO_ICE, "endpoints": []},
    }


def _plain_cluster(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "type": "STATIC",
        "connect_timeout": "10s",
        "load_assignment": {"cluster_name": name, "endpoints": []},
    }


def _bootstrap(
    listener: str, port: int, hcm: dict[str, Any], clusters: list[dict[str, Any]]
) -> dict[str, Any]:
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 15000}}},
        "static_resources": {
            "listeners": [
                {
                    "name": listener,
                    "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
                    "per_connection_buffer_limit_bytes": pieces.MAX_BODY_BYTES,
                    "filter_chains": [{"filters": [{"name": HCM, "typed_config": hcm}]}],
                }
            ],
            "clusters": clusters,
        },
    }


def _vs_route(http: dict[str, Any]) -> dict[str, Any]:
    """One VirtualService http route as Istio translates it (the parts used here)."""
    route: dict[str, Any] = {"name": http["name"]}
    (match,) = http.get("match", [{}]) or [{}]
    m: dict[str, Any] = {"prefix": "/"}
    if "uri" in match:
        m = {"path": match["uri"]["exact"]}
    if "method" in match:
        m["headers"] = [
            {"name": ":method", "string_match": {"safe_regex": {"regex": match["method"]["regex"]}}}
        ]
    route["match"] = m
    if "directResponse" in http:
        d = http["directResponse"]
        route["direct_response"] = {
            "status": d["status"],
            "body": {"inline_string": d["body"]["string"]},
        }
    else:
        (dest,) = http["route"]
        host, port = dest["destination"]["host"], dest["destination"]["port"]["number"]
        action: dict[str, Any] = {"cluster": f"outbound|{port}||{host}"}
        if "timeout" in http:
            action["timeout"] = http["timeout"]
        route["route"] = action
    response = http.get("headers", {}).get("response", {}).get("set", {})
    if response:
        route["response_headers_to_add"] = [
            {"header": {"key": k, "value": v}, "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}
            for k, v in sorted(response.items())
        ]
    return route


def istio_gateway(port: int = 18080) -> dict[str, Any]:
    objects = generated_istio()
    vs = objects["VirtualService", "llm-inference"]
    routes = [_vs_route(h) for h in vs["spec"]["http"]]
    hcm = {
        "@type": HCM_TYPE,
        "stat_prefix": f"outbound_{GATEWAY_LISTENER}",
        "route_config": {
            "name": "http.8080",
            "virtual_hosts": [
                {"name": f"*:{SPEC.gateway.port}", "domains": ["*"], "routes": routes}
            ],
        },
        "http_filters": _istio_filters(),
    }
    clusters = [_istio_ice_cluster(), _plain_cluster(ISTIO_BACKEND)]
    envoy_filter = objects["EnvoyFilter", "ice-gateway"]
    _apply(envoy_filter["spec"]["configPatches"], "GATEWAY", hcm, clusters)
    return _bootstrap(GATEWAY_LISTENER, port, hcm, clusters)


def istio_sidecar(port: int = 15006) -> dict[str, Any]:
    objects = generated_istio()
    default = {"name": "default", "match": {"prefix": "/"}, "route": {"cluster": ISTIO_INBOUND}}
    hcm = {
        "@type": HCM_TYPE,
        "stat_prefix": f"inbound_0.0.0.0_{SPEC.backend.port}",
        "route_config": {
            "name": ISTIO_INBOUND,
            "virtual_hosts": [
                {"name": f"inbound|http|{SPEC.backend.port}", "domains": ["*"], "routes": [default]}
            ],
        },
        "http_filters": _istio_filters(),
    }
    clusters = [_istio_ice_cluster(), _plain_cluster(ISTIO_INBOUND)]
    envoy_filter = objects["EnvoyFilter", "ice-sidecar"]
    _apply(envoy_filter["spec"]["configPatches"], "SIDECAR_INBOUND", hcm, clusters)
    return _bootstrap(SIDECAR_LISTENER, port, hcm, clusters)


def ext_proc_of(bootstrap: dict[str, Any]) -> dict[str, Any]:
    hcm = bootstrap["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    return next(f for f in hcm["typed_config"]["http_filters"] if f["name"] == pieces.EXT_PROC)


def local_ext_proc() -> dict[str, Any]:
    return as_dict(pieces.ext_proc_filter("ice"))


EG_FILE = REPO / "envoy" / "k8s" / "overlays" / "envoy-gateway" / "generated" / "envoy-gateway.yaml"


def generated_envoy_gateway() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(EG_FILE.read_text()) if d]


def envoy_gateway() -> dict[str, Any]:
    """Envoy Gateway's translation of the generated objects (``eg_xds``)."""
    return eg_xds.xds_like_bootstrap(
        generated_envoy_gateway(), "127.0.0.1:1", "127.0.0.1:2", 18081, 15001
    )


def envoy_gateway_flavours() -> dict[str, Any]:
    """test_mesh's flavour entry: (bootstrap, listener, ICE cluster, backend clusters)."""
    docs = generated_envoy_gateway()
    return {
        "envoy-gateway": (
            envoy_gateway,
            gateway_names.listener_name(SPEC),
            eg_xds.ice_clusters(docs)[0],
            tuple(eg_xds.backend_clusters(docs)),
        )
    }
