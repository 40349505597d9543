"""Checks of ICE's cluster as each ext_proc filter names it: defined, HTTP/2 (gRPC),
health-checked with gRPC health (what ``pieces.ice_cluster`` builds), and how its ICE
replicas share the judging (``envoy.ice_replicas``: one ICE, the workers of one host, priority
levels for active-passive, or several hosts at one level, which over-admit unless they share
``--ledger``; docs/high-availability.md).

Invariants: pure; a ``google_grpc`` service needs no cluster (gRPC's own client, HTTP/2).
"""

from __future__ import annotations

from typing import Any

from ext_proc.tools.doctor.checks import Check, fail
from ext_proc.tools.doctor.dump import HcmView, as_dict, as_list, unwrap
from ext_proc.tools.doctor.envoy_filters import ext_proc_filters

__all__ = ["ice_cluster_checks"]

H2_OPTIONS = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"


def _is_h2(cluster: dict[str, Any]) -> str | None:
    """ "h2", "auto" or None (HTTP/1.1)."""
    if "http2_protocol_options" in cluster:
        return "h2"
    opts = as_dict(cluster.get("typed_extension_protocol_options")).get(H2_OPTIONS)
    _, fields = unwrap(opts)
    if "http2_protocol_options" in as_dict(fields.get("explicit_http_config")):
        return "h2"
    if "auto_config" in fields or "use_downstream_protocol_config" in fields:
        return "auto"
    return None


def ice_cluster_checks(hcm: HcmView, clusters: dict[str, dict[str, Any]]) -> list[Check]:
    """ICE's cluster of each ext_proc filter: there, HTTP/2, health-checked."""
    out = []
    for _, f in ext_proc_filters(hcm):
        grpc = as_dict(f.config.get("grpc_service"))
        if "google_grpc" in grpc:
            out.append(Check("PASS", "envoy.ice_cluster", f"{f.name}: google_grpc (HTTP/2)"))
            continue
        name = str(as_dict(grpc.get("envoy_grpc")).get("cluster_name", ""))
        cluster = clusters.get(name)
        if cluster is None:
            out.append(
                fail(
                    "envoy.ice_cluster",
                    f"{f.name}: its cluster {name!r} is not defined: every request fails open",
                    "define the cluster (pieces.ice_cluster)",
                )
            )
            continue
        proto = _is_h2(cluster)
        if proto is None:
            out.append(
                fail(
                    "envoy.ice_cluster",
                    f"cluster {name}: HTTP/1.1: gRPC needs HTTP/2",
                    "explicit_http_config.http2_protocol_options (pieces.ice_cluster)",
                )
            )
        elif proto == "auto":
            out.append(
                Check(
                    "WARN",
                    "envoy.ice_cluster",
                    f"cluster {name}: HTTP version negotiated (auto_config): plaintext ICE "
                    "gets HTTP/1.1",
                    "explicit_http_config.http2_protocol_options (pieces.ice_cluster)",
                )
            )
        else:
            out.append(Check("PASS", "envoy.ice_cluster", f"cluster {name}: HTTP/2"))
        checks = [as_dict(h) for h in as_list(cluster.get("health_checks"))]
        if any("grpc_health_check" in h for h in checks):
            out.append(Check("PASS", "envoy.ice_health_checks", f"cluster {name}: gRPC health"))
        else:
            out.append(
                Check(
                    "WARN",
                    "envoy.ice_health_checks",
                    f"cluster {name}: no gRPC health check: a stuck ICE worker is found only "
                    "by requests timing out on it",
                    "health_checks with grpc_health_check (pieces.ice_cluster)",
                )
            )
        out.append(_replicas_check(name, cluster))
    return out


def _levels(cluster: dict[str, Any]) -> dict[int, list[str]]:
    """priority → the ``host`` of each endpoint at it."""
    levels: dict[int, list[str]] = {}
    for group in as_list(as_dict(cluster.get("load_assignment")).get("endpoints")):
        g = as_dict(group)
        hosts = levels.setdefault(int(g.get("priority", 0) or 0), [])
        for lb in as_list(g.get("lb_endpoints")):
            sock = as_dict(
                as_dict(as_dict(as_dict(lb).get("endpoint")).get("address")).get("socket_address")
            )
            hosts.append(str(sock.get("address", "")))
    return levels


def _replicas_check(name: str, cluster: dict[str, Any]) -> Check:
    """How the cluster spreads streams over ICE replicas (each keeps its own in-flight
    ledger unless they share ``--ledger``)."""
    check = "envoy.ice_replicas"
    levels = _levels(cluster)
    dns = str(cluster.get("type", "STATIC")) in ("STRICT_DNS", "LOGICAL_DNS")
    if len(levels) > 1 and all(len(h) == 1 for h in levels.values()):
        return Check(
            "PASS", check, f"cluster {name}: active-passive, {len(levels)} priority levels"
        )
    widest = max((len(h) for h in levels.values()), default=0)
    if dns:
        return Check(
            "MANUAL",
            check,
            f"cluster {name}: resolved by DNS: if the name has several ICE replicas, each keeps "
            "its own ledger and together they can admit up to N× what fits",
            "--ledger redis://… on every replica, or one leader (--leader-elect), "
            "docs/high-availability.md",
        )
    if widest <= 1:
        return Check("PASS", check, f"cluster {name}: one ICE")
    hosts = {h for hs in levels.values() for h in hs}
    if len(hosts) == 1:
        return Check(
            "PASS",
            check,
            f"cluster {name}: {widest} endpoints on {hosts.pop()}: the workers of one ice serve "
            "--workers share a ledger (separate ice serve processes there would not)",
        )
    return Check(
        "WARN",
        check,
        f"cluster {name}: {widest} ICE endpoints on {len(hosts)} hosts at one priority: each "
        "keeps its own ledger, and together they can admit up to that many times what fits",
        "--ledger redis://… on every replica (ice.ledger shows it with --ice-metrics), or "
        "priority levels (pieces.ice_cluster(standby=True))",
    )
