"""Envoy Gateway's three policies for ICE, each translated from ``pieces``.

- ``extension_policies``: one EnvoyExtensionPolicy per judged group (``gateway_names``):
  ``pieces.ext_proc_config`` in EG's ExtProc API (``_processing_mode``, what EG cannot say
  raises), ICE's cluster settings from ``pieces.ice_cluster`` as EG's ClusterSettings.
- ``client_traffic_policy``: on the listener: ``pieces.strip_spoofed_headers`` as
  ``earlyRequestHeaders`` (no spoofing, before ext_proc), the 8 MiB buffer
  (``pieces.MAX_BODY_BYTES``), the local HCM's escaped-slashes action.
- ``patch_policy``: the EnvoyPatchPolicy: what EG's API cannot say (each judged route's
  ``pieces.judged_route_config``; ``max_message_timeout`` and ``response_attributes`` on each
  ext_proc filter), selected by ``jsonPath`` with a name filter (``JSON_PATH``'s form).

Why each is there and the EG facts relied on: ``gateway``'s docstring.

Invariants: pure (no I/O); every value is a ``pieces`` object rendered by ``as_dict`` and
translated here, raising ValueError when EG's API cannot say what ``pieces`` asks; a patch
never selects by array index.
"""

from __future__ import annotations

import re
from typing import Any

from envoy_data_plane.google.protobuf import Any as PbAny

from ext_proc.tools.envoygen import identity_parts, pieces
from ext_proc.tools.envoygen.emit import as_dict, k8s_duration
from ext_proc.tools.envoygen.gateway_names import (
    CLUSTER_TYPE,
    EG_API,
    GATEWAY_GROUP,
    LISTENER,
    LISTENER_TYPE,
    POLICY,
    ROUTE_CONFIG_TYPE,
    _meta,
    _pointer,
    ext_proc_cluster_name,
    ext_proc_filter_name,
    judged_groups,
    listener_name,
    route_config_name,
    xds_route_name,
)
from ext_proc.tools.envoygen.spec import MeshSpec

__all__ = [
    "BODY_MODES",
    "EG_GRPC_TIMEOUT",
    "JSON_PATH",
    "client_traffic_policy",
    "extension_policies",
    "patch_policy",
]

EG_GRPC_TIMEOUT = "10s"  # EG's defaultExtServiceRequestTimeout on the ext_proc gRPC service
ESCAPED_SLASHES = "UnescapeAndForward"  # as local.py's HCM (EG's default redirects instead)
BODY_MODES = {
    "BUFFERED": "Buffered",
    "STREAMED": "Streamed",
    "BUFFERED_PARTIAL": "BufferedPartial",
    "FULL_DUPLEX_STREAMED": "FullDuplexStreamed",
}
JSON_PATH = re.compile(r"^\.\.(?P<key>\w+)\[\?\(@\.name=='(?P<name>[^']*)'\)\]$")


def _processing_mode(mode: dict[str, Any]) -> dict[str, Any]:
    """``pieces``' processing mode in EG's terms; what EG cannot say raises."""
    skip = {
        "request_trailer_mode": "SKIP",
        "response_header_mode": "SKIP",
        "response_trailer_mode": "SKIP",
    }
    if mode.get("request_header_mode") != "SEND" or any(mode.get(k) != v for k, v in skip.items()):
        raise ValueError(f"processing mode {mode}: not expressible with EG's ExtProc API")
    if mode.get("response_body_mode", "NONE") != "NONE":
        raise ValueError(f"processing mode {mode}: responses are never sent to ICE")
    return {"request": {"body": BODY_MODES[mode["request_body_mode"]]}}


def _ice_backend_settings(spec: MeshSpec) -> dict[str, Any]:
    """``pieces.ice_cluster``'s settings as EG's ClusterSettings."""
    cluster = as_dict(pieces.ice_cluster("ice", [f"{spec.ice.host}:{spec.ice.port}"], dns=True))
    (check,) = cluster["health_checks"]
    if set(check) != {"timeout", "interval", "unhealthy_threshold", "healthy_threshold",
                      "grpc_health_check", *PATCHED_CHECK_FIELDS}:  # fmt: skip
        raise ValueError(f"health check {check}: not expressible as EG's active GRPC check")
    options = cluster["typed_extension_protocol_options"]
    h2 = next(iter(options.values()))["explicit_http_config"]["http2_protocol_options"]
    return {
        "timeout": {"tcp": {"connectTimeout": cluster["connect_timeout"]}},
        "http2": {"maxConcurrentStreams": h2["max_concurrent_streams"]},
        "healthCheck": {
            "active": {
                "type": "GRPC",
                "timeout": k8s_duration(check["timeout"]),
                "interval": k8s_duration(check["interval"]),
                "unhealthyThreshold": check["unhealthy_threshold"],
                "healthyThreshold": check["healthy_threshold"],
                "grpc": {},
            }
        },
    }


# What EG's ClusterSettings cannot say of ``pieces.ice_cluster`` and ``ext_proc_config``, set
# by the EnvoyPatchPolicy instead: the health check's interval without traffic, outlier
# detection on local-origin failures (EG's passive check cannot turn the 5xx rules off), and
# the ext_proc stream's retry on another replica.
PATCHED_CHECK_FIELDS = ("no_traffic_interval",)


def _cluster_patches(spec: MeshSpec, policy: str) -> list[dict[str, Any]]:
    """``pieces.ice_cluster``'s settings EG cannot express, on EG's ext_proc cluster."""
    cluster = as_dict(pieces.ice_cluster("ice", [f"{spec.ice.host}:{spec.ice.port}"], dns=True))
    name = ext_proc_cluster_name(spec.gateway.namespace, policy)
    # whole fields (an add replaces): EG's own active check, with the fields it cannot say
    values = [("/health_checks", cluster["health_checks"])]
    values.append(("/outlier_detection", cluster["outlier_detection"]))
    return [
        {
            "type": CLUSTER_TYPE,
            "name": name,
            "operation": {"op": "add", "path": path, "value": value},
        }
        for path, value in values
    ]


def _ext_proc_entry(spec: MeshSpec) -> dict[str, Any]:
    """``pieces.ext_proc_config`` in EG's ExtProc API (less max_message_timeout and
    response_attributes: patched)."""
    cfg = as_dict(identity_parts.ext_proc_config("ice", spec.routes))
    metadata = cfg["metadata_options"]
    processing = _processing_mode(cfg["processing_mode"])
    processing["allowModeOverride"] = cfg["allow_mode_override"]
    ice = spec.ice
    return {
        "backendRefs": [{"name": ice.service, "namespace": ice.namespace, "port": ice.port}],
        "backendSettings": _ice_backend_settings(spec),
        "failOpen": cfg["failure_mode_allow"],
        "messageTimeout": cfg["message_timeout"],
        "processingMode": processing,
        "metadata": {
            "accessibleNamespaces": metadata["forwarding_namespaces"]["untyped"],
            "writableNamespaces": metadata["receiving_namespaces"]["untyped"],
        },
    }


def extension_policies(spec: MeshSpec) -> list[dict[str, Any]]:
    out = []
    for group in judged_groups(spec):
        targets = [
            {"group": GATEWAY_GROUP, "kind": "HTTPRoute", "name": n} for n, _ in group.routes
        ]
        out.append(
            {
                "apiVersion": EG_API,
                "kind": "EnvoyExtensionPolicy",
                "metadata": _meta(group.policy, spec.gateway.namespace),
                "spec": {"targetRefs": targets, "extProc": [_ext_proc_entry(spec)]},
            }
        )
    return out


def _early_request_headers(spec: MeshSpec) -> dict[str, Any]:
    """``pieces.strip_spoofed_headers`` as EG's ``earlyRequestHeaders`` (with the identity
    headers an ext_authz service sets, ``identity_parts.identity_headers``)."""
    extra = identity_parts.identity_headers(spec.routes)
    config = as_dict(pieces.strip_spoofed_headers(extra=extra))["typed_config"]
    remove: list[str] = []
    on_match: list[dict[str, str]] = []
    for mutation in config["mutations"]["request_mutations"]:
        if set(mutation) == {"remove"}:
            remove.append(mutation["remove"])
        elif set(mutation) == {"remove_on_match"} and set(
            matcher := mutation["remove_on_match"]["key_matcher"]
        ) == {"prefix"}:
            on_match.append({"type": "Prefix", "value": matcher["prefix"]})
        else:
            raise ValueError(f"{mutation}: not expressible as EG's earlyRequestHeaders")
    return {"remove": remove, "removeOnMatch": on_match}


def _quantity(n: int) -> str:
    return f"{n >> 20}Mi" if n % (1 << 20) == 0 else str(n)


def client_traffic_policy(spec: MeshSpec) -> dict[str, Any]:
    target = {"group": GATEWAY_GROUP, "kind": "Gateway", "name": spec.gateway.name}
    return {
        "apiVersion": EG_API,
        "kind": "ClientTrafficPolicy",
        "metadata": _meta(POLICY, spec.gateway.namespace),
        "spec": {
            "targetRefs": [{**target, "sectionName": LISTENER}],
            "headers": {"earlyRequestHeaders": _early_request_headers(spec)},
            "connection": {"bufferLimit": _quantity(pieces.MAX_BODY_BYTES)},
            "path": {"escapedSlashesAction": ESCAPED_SLASHES},
        },
    }


def _route_patch(spec: MeshSpec, route: str, config: dict[str, Any], flt: str) -> dict[str, Any]:
    return {
        "type": ROUTE_CONFIG_TYPE,
        "name": route_config_name(spec),
        "operation": {
            "op": "add",
            "jsonPath": f"..routes[?(@.name=='{route}')]",
            "path": f"/typed_per_filter_config/{_pointer(flt)}/config",
            "value": config,
        },
    }


def _patches(spec: MeshSpec) -> list[dict[str, Any]]:
    ns = spec.gateway.namespace
    patches = []
    for group in judged_groups(spec):
        flt = ext_proc_filter_name(ns, group.policy)
        for name, routes in group.routes:
            for i, r in enumerate(routes):
                config = as_dict(PbAny.pack(pieces.judged_route_config(r.name, r.profile)))
                patches.append(_route_patch(spec, xds_route_name(ns, name, i), config, flt))
    cfg = as_dict(identity_parts.ext_proc_config("ice", spec.routes))
    for group in judged_groups(spec):
        flt = ext_proc_filter_name(ns, group.policy)
        fields = [(f, cfg[f]) for f in ("max_message_timeout", "response_attributes")]
        if "request_attributes" in cfg:  # the peer certificate's SANs (identity: mtls)
            fields.append(("request_attributes", cfg["request_attributes"]))
        fields.append(("grpc_service/retry_policy", cfg["grpc_service"]["retry_policy"]))
        for field, value in fields:
            patches.append(
                {
                    "type": LISTENER_TYPE,
                    "name": listener_name(spec),
                    "operation": {
                        "op": "add",
                        "jsonPath": f"..http_filters[?(@.name=='{flt}')]",
                        "path": f"/typed_config/{field}",
                        "value": value,
                    },
                }
            )
        patches += _cluster_patches(spec, group.policy)
    return patches


def patch_policy(spec: MeshSpec) -> dict[str, Any]:
    return {
        "apiVersion": EG_API,
        "kind": "EnvoyPatchPolicy",
        "metadata": _meta(POLICY, spec.gateway.namespace),
        "spec": {
            "type": "JSONPatch",
            "targetRef": {"group": GATEWAY_GROUP, "kind": "Gateway", "name": spec.gateway.name},
            "jsonPatches": _patches(spec),
        },
    }
