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
ICE's namespace, or ``PILOT_FILTER_GATEWAY_CLUSTER_CONFIG=true`` on a gateway).

Invariants: pure; a dump without node information gets no version check (a bootstrap file);
a proxy that is not Istio's gets no Istio check.
"""

from __future__ import annotations

import re
from typing import Any

from ext_proc.tools.doctor import expect as X
from ext_proc.tools.doctor.dump import EnvoyView, HcmView, as_dict, as_list
from ext_proc.tools.doctor.envoy_filters import ext_proc_filters
from ext_proc.tools.doctor.model import Check, fail
from ext_proc.tools.doctor.routing import filter_on, route_to, select_vhost
from ext_proc.tools.envoygen.istio import MIN_ENVOY, MIN_ISTIO

__all__ = ["MIN_ENVOY", "MIN_ISTIO", "istio_checks", "node_of", "version_checks"]

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


def _route_patches_missed(hcm: HcmView, judged: tuple[str, ...]) -> bool:
    """ext_proc off by default and no judged route turns it on."""
    table = hcm.route_config or {}
    vhost = select_vhost(table, None) if table else None
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
    view: EnvoyView, hcms: list[HcmView], judged: tuple[str, ...], node: dict[str, Any]
) -> list[Check]:
    """Which of ICE's Istio patches are not in force on this proxy (one check)."""
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
        elif _route_patches_missed(hcm, judged):
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
