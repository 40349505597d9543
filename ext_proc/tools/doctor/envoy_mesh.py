"""The mesh's own traps, read from what the proxy runs (a ``/config_dump``): Istio applies an
EnvoyFilter patch that matches nothing without a word, and can leave ICE's cluster out of a
proxy, and every such miss fails open or refuses large bodies.

Job: ``version_checks(node)``: the proxy's Envoy (``node.user_agent_build_version``) and
Istio (``node.metadata.ISTIO_VERSION``) at least the minimum the generated patches need
(``MIN_ENVOY`` / ``MIN_ISTIO``: older proxies reject fields the patches set);
``istio_checks(view, hcms, judged)``: on a proxy istiod built (``outbound|…`` clusters or a
``virtualInbound`` listener), which of ICE's patches are not in force: the filter patches (an
inference listener without ext_proc: a wrong context or port, e.g. the Service's port where
istiod keys the inbound chain by the container's), the route patches (ext_proc disabled by
default and no judged route turning it on), the listener patch (buffer limit below ICE's
``--max-body-bytes``), ICE's cluster (absent: a ``Sidecar`` resource's egress hosts without
ICE's namespace, or ``PILOT_FILTER_GATEWAY_CLUSTER_CONFIG=true`` on a gateway);
``port_checks(view, backend)`` and ``endpoint_port_checks(ports, backend)``: the mesh spec's
container port (``backend.target_port``, else ``backend.port``) against the pods' port as
istiod keys it. A sidecar's inbound route table is ``inbound|CONTAINER_PORT||`` with the
virtual host ``inbound|http|SERVICE_PORT``; a gateway's cluster for the Service's port
(``outbound|SERVICE_PORT||HOST``) has the pods' addresses at the container's port. A spec
whose Service port differs from the container port, with ``target_port`` unset, keys
``ice-sidecar``'s patches by the Service's port: only the listener patch applies, chats pass
unjudged and every path (``/v1/load_lora_adapter`` too) reaches the backend.

Invariants: pure; a dump without node information gets no version check (a bootstrap file);
a proxy that is not Istio's gets no Istio check; a port check speaks only when it saw the
pods' port (an inbound route table, or the gateway's endpoints) and a spec was read.
"""

from __future__ import annotations

import re
from typing import Any

from ext_proc.tools.doctor import expect as X
from ext_proc.tools.doctor.checks import Check, fail
from ext_proc.tools.doctor.dump import EnvoyView, HcmView, as_dict, as_list
from ext_proc.tools.doctor.envoy_filters import ext_proc_filters
from ext_proc.tools.doctor.routing import filter_on, route_to, select_vhost
from ext_proc.tools.envoygen.istio import MIN_ENVOY, MIN_ISTIO, VIRTUAL_INBOUND
from ext_proc.tools.envoygen.spec import Backend

__all__ = [
    "MIN_ENVOY",
    "MIN_ISTIO",
    "endpoint_port_checks",
    "endpoint_ports",
    "istio_checks",
    "node_of",
    "port_checks",
    "version_checks",
]

# The generator's floor: direct_response's body_format (Envoy 1.37), header_mutation's
# remove_on_match (1.36); Istio 1.29 is the first to bundle Envoy 1.37.
REGEN = "fix envoy/mesh.yaml and run `ice envoy-config` (docs/deploy-istio.md)"


def node_of(dump: dict[str, Any]) -> dict[str, Any]:
    """The dump's ``bootstrap.node`` ({} when there is none)."""
    for c in as_list(dump.get("configs")):
        if str(as_dict(c).get("@type", "")).endswith("envoy.admin.v3.BootstrapConfigDump"):
            return as_dict(as_dict(as_dict(c).get("bootstrap")).get("node"))
    return {}


def _version(text: str) -> tuple[int, int] | None:
    m = re.match(r"^v?(\d+)\.(\d+)", text.strip())
    return (int(m.group(1)), int(m.group(2))) if m else None


def _dotted(v: tuple[int, int]) -> str:
    return f"{v[0]}.{v[1]}"


def version_checks(node: dict[str, Any]) -> list[Check]:
    out: list[Check] = []
    build = as_dict(as_dict(node.get("user_agent_build_version")).get("version"))
    if build:
        envoy = (int(build.get("major_number", 0)), int(build.get("minor_number", 0)))
        if envoy < MIN_ENVOY:
            out.append(
                fail(
                    "envoy.version",
                    f"Envoy {_dotted(envoy)} < {_dotted(MIN_ENVOY)}: it rejects fields ICE's "
                    "config uses (direct_response body_format, header_mutation remove_on_match)",
                    f"upgrade the proxy (Istio {_dotted(MIN_ISTIO)} bundles Envoy "
                    f"{_dotted(MIN_ENVOY)})",
                )
            )
        else:
            out.append(Check("PASS", "envoy.version", f"Envoy {_dotted(envoy)}"))
    istio = _version(str(as_dict(node.get("metadata")).get("ISTIO_VERSION", "")))
    if istio is not None:
        if istio < MIN_ISTIO:
            out.append(
                fail(
                    "envoy.istio_version",
                    f"Istio {_dotted(istio)} < {_dotted(MIN_ISTIO)}: its Envoy rejects fields "
                    "of ICE's EnvoyFilters",
                    f"upgrade Istio to {_dotted(MIN_ISTIO)} or later",
                )
            )
        else:
            out.append(Check("PASS", "envoy.istio_version", f"Istio {_dotted(istio)}"))
    return out


def _is_istio(view: EnvoyView, node: dict[str, Any]) -> bool:
    if "ISTIO_VERSION" in as_dict(node.get("metadata")):
        return True
    return any(n.startswith(("outbound|", "inbound|")) for n in view.clusters) or any(
        h.listener == "virtualInbound" for h in view.hcms
    )


def _route_patches_missed(hcm: HcmView, judged: tuple[str, ...], host: str | None) -> bool:
    """ext_proc off by default and no judged route turns it on."""
    table = hcm.route_config or {}
    vhost = select_vhost(table, host) if table else None
    for _, f in ext_proc_filters(hcm):
        if not f.disabled:
            return False
        for path in judged:
            hit = route_to(vhost, "POST", path)
            reached = hit.upstream and hit.route is not None and vhost is not None
            if reached and filter_on(f, hit.route or {}, vhost or {}, table)[0]:
                return False
    return bool(judged)


def istio_checks(
    view: EnvoyView,
    hcms: list[HcmView],
    judged: tuple[str, ...],
    node: dict[str, Any],
    host: str | None = None,
) -> list[Check]:
    """Which of ICE's Istio patches are not in force on this proxy (one check); ``host``: the
    Host the judged paths are routed as (None: the ``*`` virtual host)."""
    if not _is_istio(view, node):
        return []
    missed: list[str] = []
    for hcm in hcms:
        where = hcm.listener
        if not ext_proc_filters(hcm):
            missed.append(
                f"{where}: the filter patches (no ext_proc: their context or port matched "
                "nothing; the sidecar's port is the container's, not the Service's)"
            )
        elif _route_patches_missed(hcm, judged, host):
            missed.append(f"{where}: the route patches (no judged route turns ext_proc on)")
        if hcm.buffer_limit_bytes < X.MAX_BODY_BYTES:
            missed.append(
                f"{where}: the listener patch (buffer limit {hcm.buffer_limit_bytes} bytes)"
            )
        for _, f in ext_proc_filters(hcm):
            grpc = as_dict(as_dict(f.config.get("grpc_service")).get("envoy_grpc"))
            name = str(grpc.get("cluster_name", ""))
            if name and name not in view.clusters:
                missed.append(
                    f"{where}: ICE's cluster {name} is not in this proxy (a Sidecar resource "
                    "whose egress hosts leave out ICE's namespace, or "
                    "PILOT_FILTER_GATEWAY_CLUSTER_CONFIG=true on the gateway): every request "
                    "passes unjudged"
                )
    if missed:
        return [
            fail(
                "envoy.istio_patches",
                "not in force: " + "; ".join(missed),
                f"{REGEN}; for ICE's cluster, add ICE's namespace (`ice-system/*`) to the "
                "Sidecar's egress hosts, or leave PILOT_FILTER_GATEWAY_CLUSTER_CONFIG off",
            )
        ]
    return [Check("PASS", "envoy.istio_patches", "ICE's filters, routes, buffer limit, cluster")]


INBOUND_TABLE = re.compile(r"^inbound\|(\d+)\|\|$")
INBOUND_VHOST = re.compile(r"^inbound\|http\|(\d+)$")
PORTS = "envoy.istio_ports"
TARGET_FIX = "set backend.target_port: {port} in envoy/mesh.yaml, run `ice envoy-config`, apply"


def _spec_says(backend: Backend) -> str:
    if backend.target_port is None:
        return f"backend port {backend.port} and no target_port"
    return f"backend port {backend.port}, target_port {backend.target_port}"


def _mismatch(backend: Backend, pods: int, seen: str) -> Check:
    return fail(
        PORTS,
        f"the Service's port {backend.port} reaches the pods on {pods} ({seen}), but "
        f"envoy/mesh.yaml says {_spec_says(backend)}: ice-sidecar's patches are keyed by "
        f"{backend.container_port} and match nothing in the pods' sidecars (only the "
        "listener patch applies: chats pass unjudged, every path reaches the backend)",
        TARGET_FIX.format(port=pods),
    )


def port_checks(view: EnvoyView, backend: Backend | None) -> list[Check]:
    """On a sidecar (an inbound route table on ``virtualInbound``): the spec's container port
    is one istiod keys the inbound chain by (one check; none without a spec or such a table)."""
    if backend is None:
        return []
    service_port_of: dict[int, set[int]] = {}  # container port → the Service ports on it
    for hcm in view.hcms:
        m = INBOUND_TABLE.match(str((hcm.route_config or {}).get("name", "")))
        if hcm.listener != VIRTUAL_INBOUND or m is None:
            continue
        ports = service_port_of.setdefault(int(m.group(1)), set())
        for v in as_list((hcm.route_config or {}).get("virtual_hosts")):
            vm = INBOUND_VHOST.match(str(as_dict(v).get("name", "")))
            if vm:
                ports.add(int(vm.group(1)))
    if not service_port_of:
        return []
    if backend.container_port in service_port_of:
        return [
            Check(
                "PASS",
                PORTS,
                f"{VIRTUAL_INBOUND} has the inbound chain for container port "
                f"{backend.container_port} (envoy/mesh.yaml's backend)",
            )
        ]
    for pods, services in sorted(service_port_of.items()):
        if backend.port in services:
            seen = f"{VIRTUAL_INBOUND}'s route table inbound|{pods}||"
            return [_mismatch(backend, pods, seen)]
    known = ", ".join(str(p) for p in sorted(service_port_of))
    return [
        fail(
            PORTS,
            f"{VIRTUAL_INBOUND} has no inbound chain for container port "
            f"{backend.container_port} ({_spec_says(backend)} in envoy/mesh.yaml; the pods' "
            f"ports here: {known}): ice-sidecar's patches match nothing",
            "set backend.port to the Service's port and backend.target_port to the pods' "
            "port in envoy/mesh.yaml, run `ice envoy-config`, apply",
        )
    ]


def endpoint_ports(view: EnvoyView, statuses: dict[str, Any]) -> dict[str, set[int]]:
    """Each cluster's endpoint ports: from Envoy's ``/clusters?format=json`` (``statuses``)
    and from clusters that carry their endpoints (``load_assignment``)."""
    out: dict[str, set[int]] = {}

    def add(cluster: str, address: Any) -> None:
        port = as_dict(as_dict(address).get("socket_address")).get("port_value")
        if isinstance(port, int):
            out.setdefault(cluster, set()).add(port)

    for name, cluster in view.clusters.items():
        for group in as_list(as_dict(cluster.get("load_assignment")).get("endpoints")):
            for lb in as_list(as_dict(group).get("lb_endpoints")):
                add(name, as_dict(as_dict(lb).get("endpoint")).get("address"))
    for c in as_list(statuses.get("cluster_statuses")):
        for h in as_list(as_dict(c).get("host_statuses")):
            add(str(as_dict(c).get("name", "")), as_dict(h).get("address"))
    return out


def endpoint_port_checks(ports: dict[str, set[int]], backend: Backend | None) -> list[Check]:
    """On a gateway (its cluster for the backend's Service port, with endpoints): the pods'
    port is the spec's container port (one check; none when the gateway has no such cluster)."""
    if backend is None:
        return []
    name = f"outbound|{backend.port}||{backend.host}"
    seen = ports.get(name)
    if not seen:
        return []
    if seen == {backend.container_port}:
        return [
            Check(
                "PASS",
                PORTS,
                f"{name}'s endpoints are at container port {backend.container_port} "
                "(envoy/mesh.yaml's backend)",
            )
        ]
    pods = min(seen)
    return [_mismatch(backend, pods, f"{name}'s endpoints are at :{pods}")]
