"""Bootstraps shaped like a mesh's proxy, with the generated manifests' objects applied.

What the mesh would build itself is built here, as that mesh builds it; what ICE adds is
taken from the generated files (``envoy/k8s/overlays/*/generated/``), not copied, and applied
by ``istio_apply`` with istiod's EnvoyFilter semantics (context, listener and chain ports,
route tables, map entries replaced, insertion order). Nothing here sets what a patch should
set: the listener's buffer limit is Envoy's default (1 MiB) unless a patch raises it, and
ICE's cluster is istiod's (10 s connect timeout, no stream limit) unless the DestinationRule
changes it.

- ``istio_gateway``: an ingress gateway's HTTP listener on the gateway pods' port
  (``0.0.0.0_8080``), Istio's gateway HCM settings (BASE path normalisation, its access log),
  route table ``http.8080`` with a virtual host per VirtualService host, as istiod builds them
  (``HOST:80``; the VirtualServices naming one host merged into one virtual host, their
  routes in creation order): another tenant's (``other.example.com``, a route
  ``other.default`` to its own service, or the hosts a test gives it) and ICE's (the spec's
  ``gateway.hosts``) translated from the generated VirtualService as Istio does (route name =
  the http route's name, exact ``uri`` → ``path``, ``method`` regex → a ``:method`` header
  matcher, ``directResponse`` → ``direct_response``); istiod's filters (gRPC stats, fault,
  cors) before the router.
- ``istio_sidecar``: the sidecar's ``virtualInbound`` listener (15006) as istiod builds it:
  ``original_dst`` and ``tls_inspector`` listener filters, a blackhole chain for 15006, an
  mTLS-shaped chain and a plaintext chain for the container port (route table
  ``inbound|PORT||``, vhost ``inbound|http|SERVICE_PORT``, one route ``default`` to the
  ORIGINAL_DST cluster ``inbound|PORT||``, bound from 127.0.0.6), a passthrough chain.
  Without istio-init's iptables redirect, a connection's original destination is the
  listener's own port and Envoy cannot read it back: ``redirect_port`` moves the container
  port's chains to the listener's port after the patches, and ``app_port`` is the
  destination the ORIGINAL_DST cluster connects to (given in its ``use_http_header`` header
  by the vhosts, standing for the pod's address that iptables keeps). ``actual``: the Service
  and pods as the cluster runs them where a test makes them differ from the spec (istiod
  builds from them, the patches come from the spec; those that match nothing are skipped).
- Istio's cluster for ICE (``outbound|PORT||HOST``, HTTP/2 for ``appProtocol: grpc``, its
  10 s connect timeout, no health checks), then the DestinationRule ``ice``.
- ``envoy_gateway``: Envoy Gateway's translation of the generated objects (``eg_xds``).

Every builder refuses a patch that matched nothing (istiod would skip it silently), unless
given ``edit`` (patches changed on purpose: the doctor's tests of a broken deployment).
``config_dump`` wraps a bootstrap as Envoy's admin ``/config_dump`` shows it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from ext_proc.tools.envoygen import gateway_names, istio, pieces
from ext_proc.tools.envoygen.emit import as_dict
from ext_proc.tools.envoygen.spec import Backend, MeshSpec, load_spec

from . import eg_xds, istio_apply

REPO = Path(__file__).resolve().parents[2]
SPEC = load_spec(REPO / "envoy" / "mesh.yaml")
ISTIO_FILE = REPO / "envoy" / "k8s" / "overlays" / "istio" / "generated" / "istio.yaml"
TYPE = "type.googleapis.com/"
HCM_TYPE = (
    f"{TYPE}envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
)
HCM = "envoy.filters.network.http_connection_manager"
H2_OPTIONS = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"

ISTIO_ICE = istio.ice_cluster_name(SPEC)
ISTIO_INBOUND = istio.inbound_cluster_name(SPEC)
ISTIO_BACKEND = f"outbound|{SPEC.backend.port}||{istio.backend_host(SPEC)}"
GATEWAY_LISTENER = f"0.0.0.0_{SPEC.gateway.target_port}"
GATEWAY_HOST = SPEC.gateway.hosts[0]  # the Host a client of ICE's routes sends to the gateway
SIDECAR_LISTENER = istio.VIRTUAL_INBOUND
INBOUND_CAPTURE_PORT = 15006
ORIGINAL_DST_HEADER = "x-envoy-original-dst-host"
TENANT_HOST = "other.example.com"
TENANT_ROUTE = "other.default"
TENANT_CLUSTER = "outbound|8080||other.tenant.svc.cluster.local"


class PatchMissed(AssertionError):
    """A generated patch matched nothing in the proxy istiod would build."""


def generated_istio(spec: MeshSpec | None = None) -> dict[tuple[str, str], dict[str, Any]]:
    """The generated Istio objects: the checked-in file, or ``istio.objects(spec)``."""
    if spec is None:
        docs = [d for d in yaml.safe_load_all(ISTIO_FILE.read_text()) if d]
    else:
        docs = istio.objects(spec)
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def _typed(name: str, type_name: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "typed_config": {"@type": f"{TYPE}{type_name}", **fields}}


def _istio_filters() -> list[dict[str, Any]]:
    """istiod's HTTP filters in its order (listener_builder.go), the upstream ones: gRPC
    stats, fault, cors, the router last (metadata exchange and Istio's stats are Istio's)."""
    return [
        _typed(
            "envoy.filters.http.grpc_stats",
            "envoy.extensions.filters.http.grpc_stats.v3.FilterConfig",
            emit_filter_state=True,
            stats_for_all_methods=False,
        ),
        _typed("envoy.filters.http.fault", "envoy.extensions.filters.http.fault.v3.HTTPFault"),
        _typed("envoy.filters.http.cors", "envoy.extensions.filters.http.cors.v3.Cors"),
        _typed(pieces.ROUTER, "envoy.extensions.filters.http.router.v3.Router"),
    ]


def _istio_access_log() -> dict[str, Any]:
    """Istio's own access log (meshConfig ``accessLogFile: /dev/stdout``)."""
    return _typed(
        "envoy.access_loggers.file",
        "envoy.extensions.access_loggers.file.v3.FileAccessLog",
        path="/dev/stdout",
        log_format={"text_format_source": {"inline_string": "[%START_TIME%] %RESPONSE_CODE%\n"}},
    )


def _istio_hcm(stat_prefix: str, table: dict[str, Any], *, gateway: bool) -> dict[str, Any]:
    """The HTTP connection manager with the settings istiod gives it (the upstream parts)."""
    hcm: dict[str, Any] = {
        "@type": HCM_TYPE,
        "stat_prefix": stat_prefix,
        "route_config": table,
        "http_filters": _istio_filters(),
        "access_log": [_istio_access_log()],
        "use_remote_address": gateway,
        "normalize_path": True,  # meshConfig pathNormalization BASE
        "path_with_escaped_slashes_action": "KEEP_UNCHANGED",
        "upgrade_configs": [{"upgrade_type": "websocket"}],
        "stream_idle_timeout": "0s",
        "server_name": "istio-envoy",
        "forward_client_cert_details": "SANITIZE_SET" if gateway else "APPEND_FORWARD",
    }
    return hcm


def _istio_ice_cluster() -> dict[str, Any]:
    """ICE's cluster as Istio builds it for a Service port with ``appProtocol: grpc``."""
    return {
        "name": ISTIO_ICE,
        "type": "STATIC",  # EDS in a mesh; static endpoints here
        "connect_timeout": "10s",
        "circuit_breakers": {"thresholds": [{"max_connections": 4294967295}]},
        "typed_extension_protocol_options": {
            H2_OPTIONS: {
                "@type": f"{TYPE}{H2_OPTIONS}",
                "common_http_protocol_options": {"idle_timeout": "3600s"},
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


Edit = Callable[[list[dict[str, Any]]], list[dict[str, Any]]]


def _patched(
    bootstrap: dict[str, Any],
    objects: dict[tuple[str, str], dict[str, Any]],
    name: str,
    proxy: str,
    edit: Edit | None = None,
    *,
    strict: bool = True,
) -> dict[str, Any]:
    """The EnvoyFilter ``name`` and DestinationRule ``ice`` applied as istiod applies them;
    ``edit``: the patches changed first (a broken deployment, for the doctor's tests), then
    a patch that matches nothing is skipped as istiod skips it (``strict``, without
    ``edit``: refused instead)."""
    patches = objects["EnvoyFilter", name]["spec"]["configPatches"]
    if edit is not None:
        patches = edit(copy.deepcopy(patches))
    missed = istio_apply.apply(bootstrap, patches, proxy)
    if missed and edit is None and strict:
        raise PatchMissed(f"{name}: patches {missed} matched nothing: {patches[missed[0]]}")
    for cluster in bootstrap["static_resources"]["clusters"]:
        if cluster["name"] == ISTIO_ICE:
            istio_apply.apply_destination_rule(cluster, objects["DestinationRule", "ice"])
    return bootstrap


def _bootstrap(listener: dict[str, Any], clusters: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 15000}}},
        "static_resources": {"listeners": [listener], "clusters": clusters},
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


def tenant_virtual_service(hosts: tuple[str, ...] = (TENANT_HOST,)) -> dict[str, Any]:
    """Another team's VirtualService on the same gateway: every path of ``hosts`` to its own
    service (route ``other.default``)."""
    host, port = TENANT_CLUSTER.split("|")[3], int(TENANT_CLUSTER.split("|")[1])
    return {
        "kind": "VirtualService",
        "metadata": {"name": "other", "namespace": "tenant"},
        "spec": {
            "hosts": list(hosts),
            "http": [
                {
                    "name": TENANT_ROUTE,
                    "route": [{"destination": {"host": host, "port": {"number": port}}}],
                }
            ],
        },
    }


def gateway_vhosts(virtual_services: list[dict[str, Any]], port: int) -> list[dict[str, Any]]:
    """The virtual hosts istiod builds on a gateway port from the VirtualServices bound to it,
    given in creation order: one per host, named ``HOST:PORT``, its domains the host (and
    ``HOST:*`` unless ``*``); the VirtualServices that name the same host are merged into one
    virtual host, their routes in creation order."""
    vhosts: dict[str, dict[str, Any]] = {}
    for vs in virtual_services:
        for host in vs["spec"]["hosts"]:
            vhost = vhosts.setdefault(
                host,
                {
                    "name": f"{host}:{port}",
                    "domains": [host] if host == "*" else [host, f"{host}:*"],
                    "routes": [],
                },
            )
            vhost["routes"] += [_vs_route(h) for h in vs["spec"]["http"]]
    return list(vhosts.values())


def tenant_vhost(port: int) -> dict[str, Any]:
    """Another team's virtual host, its own host and route, alone on it."""
    (vhost,) = gateway_vhosts([tenant_virtual_service()], port)
    return vhost


def istio_gateway(
    spec: MeshSpec | None = None,
    edit: Edit | None = None,
    *,
    tenant_hosts: tuple[str, ...] = (TENANT_HOST,),
    tenant_first: bool = True,
) -> dict[str, Any]:
    """The ingress gateway istiod builds for the generated Gateway and VirtualService beside
    another tenant's (for ``tenant_hosts``, created before ICE's unless ``tenant_first`` is
    false), with ``ice-gateway`` applied (``spec``: generated in memory)."""
    s = spec or SPEC
    objects = generated_istio(spec)
    mine, tenant = objects["VirtualService", "llm-inference"], tenant_virtual_service(tenant_hosts)
    port, target = s.gateway.port, s.gateway.target_port
    ordered = [tenant, mine] if tenant_first else [mine, tenant]
    table = {"name": f"http.{target}", "virtual_hosts": gateway_vhosts(ordered, port)}
    hcm = _istio_hcm(f"outbound_0.0.0.0_{target}", table, gateway=True)
    listener = {
        "name": f"0.0.0.0_{target}",
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": target}},
        "filter_chains": [{"filters": [{"name": HCM, "typed_config": hcm}]}],
    }
    backend = f"outbound|{s.backend.port}||{istio.backend_host(s)}"
    clusters = [_istio_ice_cluster(), _plain_cluster(backend), _plain_cluster(TENANT_CLUSTER)]
    return _patched(_bootstrap(listener, clusters), objects, "ice-gateway", "gateway", edit)


def _tcp_proxy(cluster: str) -> dict[str, Any]:
    return _typed(
        "envoy.filters.network.tcp_proxy",
        "envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
        stat_prefix=cluster,
        cluster=cluster,
    )


def _original_dst_cluster(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "type": "ORIGINAL_DST",
        "lb_policy": "CLUSTER_PROVIDED",
        "connect_timeout": "10s",
        "cleanup_interval": "60s",
        "upstream_bind_config": {"source_address": {"address": "127.0.0.6", "port_value": 0}},
    }


def _inbound_chains(b: Backend) -> list[dict[str, Any]]:
    """istiod's chains for the container port: mTLS-shaped (its certificates come over SDS,
    left out here) and plaintext (PERMISSIVE), each with its own HCM."""
    port, inbound = b.container_port, f"inbound|{b.container_port}||"
    default = {
        "name": "default",
        "match": {"prefix": "/"},
        "route": {"cluster": inbound, "timeout": "0s"},
        "decorator": {"operation": f"{b.host}:{b.port}/*"},
    }
    table = {
        "name": inbound,
        "validate_clusters": False,
        "virtual_hosts": [
            {"name": f"inbound|http|{b.port}", "domains": ["*"], "routes": [default]}
        ],
    }
    chains = []
    for transport, alpn in (
        ("tls", ["istio-http/1.0", "istio-http/1.1", "istio-h2"]),
        ("raw_buffer", []),
    ):
        match: dict[str, Any] = {"destination_port": port, "transport_protocol": transport}
        if alpn:
            match["application_protocols"] = alpn
        hcm = _istio_hcm(f"inbound_0.0.0.0_{port}", copy.deepcopy(table), gateway=False)
        chains.append(
            {
                "name": f"0.0.0.0_{port}",
                "filter_chain_match": match,
                "filters": [{"name": HCM, "typed_config": hcm}],
            }
        )
    return chains


def istio_sidecar(
    spec: MeshSpec | None = None,
    *,
    redirect_port: int | None = None,
    app_port: int | None = None,
    edit: Edit | None = None,
    actual: Backend | None = None,
) -> dict[str, Any]:
    """The sidecar's inbound side as istiod builds it, with ``ice-sidecar`` applied;
    ``actual``: the Service and pods as the cluster runs them, when they differ from what the
    spec says (istiod builds from them; the patches come from the spec, and those that match
    nothing are skipped, as istiod skips them)."""
    s = spec or SPEC
    b = actual or s.backend
    objects = generated_istio(spec)
    listener: dict[str, Any] = {
        "name": SIDECAR_LISTENER,
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": INBOUND_CAPTURE_PORT}},
        "traffic_direction": "INBOUND",
        "listener_filters": [
            _typed(
                "envoy.filters.listener.original_dst",
                "envoy.extensions.filters.listener.original_dst.v3.OriginalDst",
            ),
            _typed(
                "envoy.filters.listener.tls_inspector",
                "envoy.extensions.filters.listener.tls_inspector.v3.TlsInspector",
            ),
        ],
        "listener_filters_timeout": "0s",
        "continue_on_listener_filters_timeout": True,
        "filter_chains": [
            {
                "name": "virtualInbound-blackhole",
                "filter_chain_match": {"destination_port": INBOUND_CAPTURE_PORT},
                "filters": [_tcp_proxy("BlackHoleCluster")],
            },
            *_inbound_chains(b),
            {
                "name": "virtualInbound-ipv4-passthrough",
                "filter_chain_match": {
                    "prefix_ranges": [{"address_prefix": "0.0.0.0", "prefix_len": 0}]
                },
                "filters": [_tcp_proxy("InboundPassthroughCluster")],
            },
        ],
    }
    inbound = _original_dst_cluster(f"inbound|{b.container_port}||")
    clusters = [
        _istio_ice_cluster(),
        inbound,
        _plain_cluster("BlackHoleCluster"),
        _original_dst_cluster("InboundPassthroughCluster"),
    ]
    bootstrap = _patched(
        _bootstrap(listener, clusters), objects, "ice-sidecar", "sidecar", edit, strict=not actual
    )
    if redirect_port is not None:
        for chain in listener["filter_chains"]:
            if chain["filter_chain_match"].get("destination_port") == b.container_port:
                chain["filter_chain_match"]["destination_port"] = redirect_port
    if app_port is not None:  # the original destination, as iptables would have kept it
        inbound["original_dst_lb_config"] = {"use_http_header": True}
        for hcm in hcms_of(bootstrap):
            for vhost in hcm["route_config"]["virtual_hosts"]:
                vhost["request_headers_to_add"] = [
                    {
                        "header": {"key": ORIGINAL_DST_HEADER, "value": f"127.0.0.1:{app_port}"},
                        "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
                    }
                ]
    return bootstrap


def hcms_of(bootstrap: dict[str, Any]) -> list[dict[str, Any]]:
    """Every HTTP connection manager's config, in listener and chain order."""
    return [
        f["typed_config"]
        for listener in bootstrap["static_resources"]["listeners"]
        for chain in listener["filter_chains"]
        for f in chain["filters"]
        if f["name"] == HCM
    ]


def config_dump(bootstrap: dict[str, Any], node: dict[str, Any] | None = None) -> dict[str, Any]:
    """The static resources of ``bootstrap`` as Envoy's admin ``/config_dump`` lists them."""
    res = bootstrap["static_resources"]
    admin = "type.googleapis.com/envoy.admin.v3."
    return {
        "configs": [
            {"@type": f"{admin}BootstrapConfigDump", "bootstrap": {"node": node or {}}},
            {
                "@type": f"{admin}ClustersConfigDump",
                "static_clusters": [{"cluster": c} for c in res["clusters"]],
            },
            {
                "@type": f"{admin}ListenersConfigDump",
                "static_listeners": [{"listener": x} for x in res["listeners"]],
            },
        ]
    }


def ext_proc_of(bootstrap: dict[str, Any]) -> dict[str, Any]:
    hcm = hcms_of(bootstrap)[0]
    return next(f for f in hcm["http_filters"] if f["name"] == pieces.EXT_PROC)


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
