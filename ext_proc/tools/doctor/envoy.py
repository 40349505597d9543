"""The Envoy half of ``ice doctor``: read the admin interface, find the listeners that
serve inference, run the filter, route and cluster checks on each.

Job: ``envoy_checks(admin_url, ex, fetch)`` (live: ``/config_dump`` and ``/clusters``) and
``view_checks(view, ex)`` (any ``EnvoyView``: a dump or a bootstrap file, for tests and
offline use), with the mesh's own traps (``envoy_mesh``: the proxy's versions, Istio patches
not in force, ICE's cluster left out of the proxy, the mesh spec's container port against the
pods' port: a sidecar's inbound table, else the backend cluster's endpoints, from the view or,
live, from ``/clusters``).

An HCM serves inference when it has an ext_proc filter or routes a judged path to a
cluster; every such HCM is checked. None found is a FAIL (the doctor was pointed at the
wrong Envoy, or ICE is not in it).

Invariants: an unreachable or unreadable admin interface is one FAIL naming the reason,
never an exception; ``/clusters`` and the health-check counters of ``/stats`` are read only
for the health of ICE's hosts, as Envoy sees them (``envoy_hosts``), and for the ports of the
backend's endpoints.
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any

from ext_proc.tools.doctor import expect as X
from ext_proc.tools.doctor.checks import Check, fail
from ext_proc.tools.doctor.dump import EnvoyView, HcmView, as_dict, as_list, from_config_dump
from ext_proc.tools.doctor.envoy_cluster import ice_cluster_checks
from ext_proc.tools.doctor.envoy_filters import ext_proc_filters, filter_checks
from ext_proc.tools.doctor.envoy_hosts import hosts_check
from ext_proc.tools.doctor.envoy_mesh import (
    PORTS,
    endpoint_port_checks,
    endpoint_ports,
    istio_checks,
    node_of,
    port_checks,
    version_checks,
)
from ext_proc.tools.doctor.envoy_routes import route_checks
from ext_proc.tools.doctor.fetch import Fetch, FetchError
from ext_proc.tools.doctor.routing import route_to, select_vhost

__all__ = ["envoy_checks", "inference_hcms", "view_checks"]

# The generated clusters check ICE every 0.5 s: a host flagged at the first read that is back
# two checks later was starting (Envoy's flag lags ICE by up to one check), not failing.
RECHECK_S = 1.0


def _serves_inference(hcm: HcmView, ex: X.Expected, host: str | None) -> bool:
    if ext_proc_filters(hcm):
        return True
    if hcm.route_config is None:
        return False
    vhost = select_vhost(hcm.route_config, host)
    return any(route_to(vhost, "POST", p).upstream for p in ex.judged)


def inference_hcms(view: EnvoyView, ex: X.Expected, host: str | None = None) -> list[HcmView]:
    return [h for h in view.hcms if _serves_inference(h, ex, host)]


def view_checks(
    view: EnvoyView, ex: X.Expected, host: str | None = None, node: dict[str, Any] | None = None
) -> list[Check]:
    """Every configuration check of ``view``; ``node``: the proxy's identity from a dump
    (its Envoy and Istio versions); ``host``: the Host routed as (None: the mesh spec's)."""
    host = host if host is not None else ex.host
    ex = dataclasses.replace(ex, host=host)  # every check routes as this Host
    out = [Check("MANUAL", "envoy.note", note) for note in view.notes]
    out += version_checks(node or {})
    hcms = inference_hcms(view, ex, host)
    if not hcms:
        listeners = sorted({h.listener for h in view.hcms}) or ["none"]
        out.append(
            fail(
                "envoy.inference_listener",
                f"no listener has ext_proc or routes a judged path (listeners: "
                f"{', '.join(listeners)}; judged paths from {ex.mesh_source})",
                "point --envoy-admin at the gateway that fronts the backends, or add ICE to it "
                "(ice envoy-config)",
            )
        )
        return out
    for hcm in hcms:
        out.append(
            Check(
                "PASS",
                "envoy.inference_listener",
                f"{hcm.listener}: routes from {hcm.route_source}"
                + (f" (route table {hcm.route_config.get('name')})" if hcm.route_config else ""),
            )
        )
        out += filter_checks(hcm, ex)
        out += route_checks(hcm, ex, view.clusters, host)
        out += ice_cluster_checks(hcm, view.clusters)
    out += istio_checks(view, hcms, tuple(ex.judged), node or {}, host)
    out += port_checks(view, ex.backend) or endpoint_port_checks(
        endpoint_ports(view, {}), ex.backend
    )
    return out


def _host_checks(
    statuses: dict[str, Any],
    stats: dict[str, Any],
    view: EnvoyView,
    ex: X.Expected,
    host: str | None,
) -> list[Check]:
    names = sorted(
        {
            str(
                as_dict(as_dict(f.config.get("grpc_service")).get("envoy_grpc")).get("cluster_name")
            )
            for h in inference_hcms(view, ex, host)
            for _, f in ext_proc_filters(h)
            if "envoy_grpc" in as_dict(f.config.get("grpc_service"))
        }
    )
    by_name = {
        str(as_dict(c).get("name")): as_dict(c) for c in as_list(statuses.get("cluster_statuses"))
    }
    out = []
    for name in names:
        hosts = [as_dict(h) for h in as_list(by_name.get(name, {}).get("host_statuses"))]
        cluster = as_dict(view.clusters.get(name))
        out.append(hosts_check(name, hosts, cluster, stats))
    return out


def _read_json(fetch: Fetch, url: str, timeout_s: float) -> dict[str, Any]:
    text = fetch(url, timeout_s)
    try:
        doc = json.loads(text)
    except ValueError:
        raise FetchError(f"{url}: not JSON") from None
    if not isinstance(doc, dict):
        raise FetchError(f"{url}: not a JSON object")
    return doc


def envoy_checks(
    admin_url: str, ex: X.Expected, fetch: Fetch, timeout_s: float, host: str | None = None
) -> list[Check]:
    """Read Envoy's admin interface at ``admin_url`` and check what is in force."""
    host = host if host is not None else ex.host
    base = admin_url.rstrip("/").removesuffix("/config_dump")
    try:
        dump = _read_json(fetch, f"{base}/config_dump", timeout_s)
    except FetchError as e:
        return [
            fail(
                "envoy.config_dump",
                f"cannot read Envoy's configuration: {e}",
                "pass --envoy-admin http://HOST:ADMIN_PORT (Envoy's admin address; "
                "kubectl port-forward for a pod)",
            )
        ]
    view = from_config_dump(dump)
    out = [
        Check(
            "PASS",
            "envoy.config_dump",
            f"{base}: {len(view.hcms)} HTTP connection managers, {len(view.clusters)} clusters",
        )
    ]
    out += view_checks(view, ex, host, node_of(dump))
    hosts, statuses = _read_hosts(base, fetch, timeout_s, view, ex, host)
    if any(c.status == "FAIL" for c in hosts):  # a FAIL only if it lasts two health checks
        time.sleep(RECHECK_S)
        hosts, statuses = _read_hosts(base, fetch, timeout_s, view, ex, host)
    if not any(c.name == PORTS for c in out):  # the gateway's endpoints (EDS) say the pods' port
        hosts += endpoint_port_checks(endpoint_ports(view, statuses), ex.backend)
    return out + hosts


def _read_hosts(
    base: str, fetch: Fetch, timeout_s: float, view: EnvoyView, ex: X.Expected, host: str | None
) -> tuple[list[Check], dict[str, Any]]:
    """The health of ICE's hosts, and ``/clusters`` as read ({} when it could not be)."""
    try:
        statuses = _read_json(fetch, f"{base}/clusters?format=json", timeout_s)
    except FetchError as e:
        return [Check("WARN", "envoy.ice_hosts", f"cannot read /clusters: {e}", "")], {}
    try:  # the health checks' counters say why a host is out
        stats = _read_json(fetch, f"{base}/stats?format=json&filter=health_check", timeout_s)
    except FetchError:
        stats = {}
    return _host_checks(statuses, stats, view, ex, host), statuses
