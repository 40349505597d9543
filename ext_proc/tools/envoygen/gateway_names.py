"""Envoy Gateway's names: the kinds ICE's objects use, the names ICE gives its objects, the
xDS names Envoy Gateway gives them in turn, and the judged routes grouped by profile.

- Constants: the Gateway API and EG API groups, the GatewayClass and listener, ICE's object
  names (``JUDGED``, ``CLOSED``, ``UNKNOWN``, ``POLICY``), the Gateway API's limits
  (``MAX_RULES``, ``MAX_MATCHES``), the labels, and the xDS type URLs and names an
  EnvoyPatchPolicy addresses.
- ``route_config_name``, ``listener_name``, ``xds_route_name``, ``ext_proc_filter_name`` and
  the cluster names: what EG calls the xDS resources it makes from ``gateway``'s objects
  (XDSNameSchemeV2 off; the EG sources each relies on are in ``gateway``'s docstring).
- ``judged_groups``: the judged routes by profile, each group one EnvoyExtensionPolicy
  (``ice``, ``ice-<profile>``) and its HTTPRoutes of at most ``MAX_RULES`` rules each.

Invariants: pure (no I/O); the same spec gives the same groups in the same order; HTTPRoute
names never collide (ValueError otherwise); a name here is the one EG derives, so that the
patches of ``gateway_policies`` find what they patch.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from ext_proc.tools.envoygen import pieces
from ext_proc.tools.envoygen.spec import MeshSpec, RouteSpec

__all__ = [
    "CLOSED",
    "CLUSTER_TYPE",
    "EARLY_MUTATION",
    "EG_API",
    "EG_GROUP",
    "FILTER_CONFIG_TYPE",
    "GATEWAY_API",
    "GATEWAY_CLASS",
    "GATEWAY_GROUP",
    "HCM",
    "JUDGED",
    "LABELS",
    "LISTENER",
    "LISTENER_TYPE",
    "MAX_MATCHES",
    "MAX_RULES",
    "POLICY",
    "ROUTE_CONFIG_TYPE",
    "UNKNOWN",
    "JudgedGroup",
    "backend_cluster_name",
    "ext_proc_cluster_name",
    "ext_proc_filter_name",
    "judged_groups",
    "listener_name",
    "route_config_name",
    "xds_route_name",
]

GATEWAY_API = "gateway.networking.k8s.io/v1"
GATEWAY_GROUP = "gateway.networking.k8s.io"
EG_API = "gateway.envoyproxy.io/v1alpha1"
EG_GROUP = "gateway.envoyproxy.io"
GATEWAY_CLASS = "eg"  # Envoy Gateway's quickstart GatewayClass
LISTENER = "http"
JUDGED = "llm-inference"
CLOSED = "llm-inference-closed"
UNKNOWN = "unknown-endpoint"
POLICY = "ice"
MAX_RULES = 16  # Gateway API: rules per HTTPRoute
MAX_MATCHES = 64  # Gateway API: matches per rule
LABELS = {
    "app.kubernetes.io/name": "ice",
    "app.kubernetes.io/component": "envoy-gateway",
    "app.kubernetes.io/managed-by": "ice-envoy-config",
}
TYPE = "type.googleapis.com/"
ROUTE_CONFIG_TYPE = f"{TYPE}envoy.config.route.v3.RouteConfiguration"
LISTENER_TYPE = f"{TYPE}envoy.config.listener.v3.Listener"
CLUSTER_TYPE = f"{TYPE}envoy.config.cluster.v3.Cluster"
FILTER_CONFIG_TYPE = f"{TYPE}envoy.config.route.v3.FilterConfig"
HCM = "envoy.filters.network.http_connection_manager"
EARLY_MUTATION = "envoy.http.early_header_mutation.header_mutation"

T = TypeVar("T")


# --- names: what EG calls things ---------------------------------------------------------


def route_config_name(spec: MeshSpec) -> str:
    """EG's RouteConfiguration for the listener (XDSNameSchemeV2 off)."""
    return f"{spec.gateway.namespace}/{spec.gateway.name}/{LISTENER}"


def listener_name(spec: MeshSpec) -> str:
    """EG's Listener for the Gateway's listener (XDSNameSchemeV2 off)."""
    return f"{spec.gateway.namespace}/{spec.gateway.name}/{LISTENER}"


def xds_route_name(namespace: str, route: str, rule: int, match: int = 0) -> str:
    """EG's xDS route for an HTTPRoute's rule and match, no hostnames (``*``)."""
    return f"httproute/{namespace}/{route}/rule/{rule}/match/{match}/*"


def ext_proc_filter_name(namespace: str, policy: str, index: int = 0) -> str:
    """EG's ext_proc filter for an EnvoyExtensionPolicy's ``extProc[index]``."""
    return f"{pieces.EXT_PROC}/{ext_proc_cluster_name(namespace, policy, index)}"


def ext_proc_cluster_name(namespace: str, policy: str, index: int = 0) -> str:
    return f"envoyextensionpolicy/{namespace}/{policy}/extproc/{index}"


def backend_cluster_name(namespace: str, route: str, rule: int) -> str:
    return f"httproute/{namespace}/{route}/rule/{rule}"


def _pointer(key: str) -> str:
    """A JSON pointer segment (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")


# --- the judged routes, grouped by profile -----------------------------------------------


@dataclass(frozen=True, slots=True)
class JudgedGroup:
    """The judged routes of one profile: one EnvoyExtensionPolicy, its HTTPRoutes."""

    profile: str | None
    policy: str
    routes: tuple[tuple[str, tuple[RouteSpec, ...]], ...]  # HTTPRoute name → one rule each


def _chunks(items: Sequence[T], size: int) -> Iterator[tuple[T, ...]]:
    for start in range(0, len(items), size):
        yield tuple(items[start : start + size])


def _slug(profile: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", profile.lower()).strip("-") or "profile"


def _suffixes(profiles: Sequence[str | None]) -> list[str]:
    """``""`` for the policy's binding (or a single group), ``-<profile>`` otherwise, unique."""
    if len(profiles) == 1:
        return [""]
    out: list[str] = []
    for i, profile in enumerate(profiles):
        suffix = "" if profile is None else f"-{_slug(profile)}"
        out.append(f"{suffix}-{i}" if suffix in out else suffix)
    return out


def judged_groups(spec: MeshSpec) -> list[JudgedGroup]:
    """The judged routes by profile, in the order the spec first names each profile."""
    by_profile: dict[str | None, list[RouteSpec]] = {}
    for r in spec.routes:
        by_profile.setdefault(r.profile, []).append(r)
    groups = []
    for (profile, routes), suffix in zip(
        by_profile.items(), _suffixes(list(by_profile)), strict=True
    ):
        chunks = list(_chunks(routes, MAX_RULES))
        names = [f"{JUDGED}{suffix}" + (f"-{k + 1}" if k else "") for k in range(len(chunks))]
        groups.append(
            JudgedGroup(profile, f"{POLICY}{suffix}", tuple(zip(names, chunks, strict=True)))
        )
    names = [name for g in groups for name, _ in g.routes]
    if len(set(names)) != len(names):
        raise ValueError(f"HTTPRoute names collide (profile names like the parts' -N): {names}")
    return groups


def _meta(name: str, namespace: str) -> dict[str, Any]:
    return {"name": name, "namespace": namespace, "labels": dict(LABELS)}
