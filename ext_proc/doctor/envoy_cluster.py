"""Checks of ICE's cluster as each ext_proc filter names it: defined, HTTP/2 (gRPC),
health-checked with gRPC health (what ``pieces.ice_cluster`` builds).

Invariants: pure; a ``google_grpc`` service needs no cluster (gRPC's own client, HTTP/2).
"""

from __future__ import annotations

from typing import Any

from ext_proc.doctor.dump import HcmView, as_dict, as_list, unwrap
from ext_proc.doctor.envoy_filters import ext_proc_filters
from ext_proc.doctor.model import Check, fail

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
    return out
