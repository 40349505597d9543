"""Checks of one inference HCM's route table: what each kind of path meets.

Job: route the requests that matter through the table as Envoy would (``routing``) and say:
every judged path reaches the backend only through ICE and names its route
(``x-ice-route``); the read-only paths pass with ICE off; the policy's passthrough paths
are open with ICE off; any other path is closed (Envoy's own answer); the verdict reaches
the client (response headers from ICE's dynamic metadata); and, when a pool lets ICE pick
the endpoint, Envoy follows the pick.

Invariants: pure; one ``Check`` per item per HCM, detail prefixed with the listener's name;
a judged path that Envoy itself answers (no route, a direct response) is closed, which is
safe, and is listed in the detail but not failed.
"""

from __future__ import annotations

from typing import Any

from ext_proc.tools.doctor import expect as X
from ext_proc.tools.doctor.checks import Check, fail
from ext_proc.tools.doctor.dump import FilterView, HcmView, as_dict, as_list, type_name
from ext_proc.tools.doctor.envoy_filters import ext_proc_filters
from ext_proc.tools.doctor.routing import filter_on, route_to, select_vhost

__all__ = ["PROBE_PATHS", "route_checks"]

# Paths no shipped config forwards (docs/endpoints.md): any of them reaching the backend
# without ICE is a way around the gate.
PROBE_PATHS = ("/ice-doctor/not-an-endpoint", "/tokenize", "/pooling", "/v1/rerank")
OVERRIDE_HOST = "envoy.load_balancing_policies.override_host"


def _metadata(config: dict[str, Any]) -> dict[str, str]:
    items = as_list(as_dict(config.get("overrides")).get("grpc_initial_metadata"))
    return {str(as_dict(m).get("key", "")): str(as_dict(m).get("value", "")) for m in items}


def _on(
    filters: list[FilterView], route: dict[str, Any], vhost: dict[str, Any], table: dict[str, Any]
) -> list[tuple[FilterView, dict[str, Any]]]:
    out = []
    for f in filters:
        on, config = filter_on(f, route, vhost, table)
        if on:
            out.append((f, config))
    return out


def _echoed(route: dict[str, Any], vhost: dict[str, Any], table: dict[str, Any]) -> set[str]:
    """Response headers set from ICE's verdict metadata, at any level of the table."""
    marker = f"%DYNAMIC_METADATA({X.VERDICT_NAMESPACE}:"
    out = set()
    for level in (route, vhost, table):
        for item in as_list(level.get("response_headers_to_add")):
            header = as_dict(as_dict(item).get("header"))
            if marker in str(header.get("value", "")):
                out.add(str(header.get("key", "")).lower())
    return out


def _clusters_of(route: dict[str, Any]) -> list[str]:
    action = as_dict(route.get("route"))
    if "cluster" in action:
        return [str(action["cluster"])]
    weighted = as_dict(action.get("weighted_clusters"))
    return [str(as_dict(c).get("name", "")) for c in as_list(weighted.get("clusters"))]


def _picks(cluster: dict[str, Any]) -> bool:
    for p in as_list(as_dict(cluster.get("load_balancing_policy")).get("policies")):
        ext = as_dict(as_dict(p).get("typed_extension_config"))
        if ext.get("name") == OVERRIDE_HOST or type_name(ext.get("typed_config")).endswith(
            "override_host.v3.OverrideHost"
        ):
            return True
    return False


def route_checks(
    hcm: HcmView, ex: X.Expected, clusters: dict[str, dict[str, Any]], host: str | None
) -> list[Check]:
    where = hcm.listener
    table = hcm.route_config
    if table is None:
        return [
            fail(
                "envoy.routes",
                f"{where}: route table not found ({hcm.route_source}): routes not checked",
                "serve the routes inline or by RDS (scoped routes are not read by the doctor)",
            )
        ]
    vhost = select_vhost(table, host)
    if vhost is None:
        return [
            fail(
                "envoy.routes",
                f"{where}: no virtual host serves {host or 'any host'} in {table.get('name')}",
                "pass --host with the host clients use",
            )
        ]
    filters = [f for _, f in ext_proc_filters(hcm)]
    out: list[Check] = []

    # Judged paths: through ICE, named.
    unjudged: list[str] = []
    unnamed: list[str] = []
    warn: list[str] = []
    closed: list[str] = []
    named: list[str] = []
    echo_missing: set[str] = set()
    backends: set[str] = set()
    for path, want in ex.judged.items():
        hit = route_to(vhost, "POST", path)
        if not hit.upstream or hit.route is None:
            closed.append(path)
            continue
        backends.update(_clusters_of(hit.route))
        on = _on(filters, hit.route, vhost, table)
        if not on:
            unjudged.append(f"{path} (route {hit.name or '?'})")
            continue
        meta = _metadata(on[0][1])
        name = meta.get(X.ROUTE_KEY)
        if not name:
            unnamed.append(f"{path} (route {hit.name or '?'})")
            continue
        named.append(f"{path}={name}")
        if want is not None and name != want:
            warn.append(f"{path}: {X.ROUTE_KEY} {name}, the mesh spec says {want}")
        elif name not in ex.policy.routes:
            warn.append(f"{path}: route {name} is not in the policy (its defaults apply)")
        echo_missing |= set(X.ECHOED_HEADERS) - _echoed(hit.route, vhost, table)
    tail = f"; closed by Envoy: {', '.join(closed)}" if closed else ""
    bad = [f"reach the backend unjudged (ICE off): {', '.join(unjudged)}"] if unjudged else []
    if unnamed:
        bad.append(f"judged without {X.ROUTE_KEY} (as an unnamed route): {', '.join(unnamed)}")
    if not named and not bad:
        out.append(
            fail(
                "envoy.judged_routes",
                f"{where}: no judged path reaches a backend{tail}",
                "route the judged paths (envoy/mesh.yaml) through ICE",
            )
        )
    elif bad:
        out.append(
            fail(
                "envoy.judged_routes",
                f"{where}: {'; '.join(bad)}{tail}",
                f"each judged route: ExtProcPerRoute overrides.grpc_initial_metadata "
                f"{X.ROUTE_KEY}: <route> (pieces.judged_route)",
            )
        )
    elif warn:
        out.append(
            Check(
                "WARN",
                "envoy.judged_routes",
                f"{where}: {'; '.join(warn)}{tail}",
                "name each route as the policy's routes",
            )
        )
    else:
        out.append(
            Check(
                "PASS",
                "envoy.judged_routes",
                f"{where}: {len(named)} through ICE with {X.ROUTE_KEY}: {', '.join(named)}{tail}",
            )
        )

    # Read-only paths: ICE off.
    judged_ro = []
    for path in ex.read_only:
        hit = route_to(vhost, "GET", path)
        if hit.upstream and hit.route is not None and _on(filters, hit.route, vhost, table):
            judged_ro.append(f"{path} (route {hit.name or '?'})")
    if judged_ro:
        out.append(
            fail(
                "envoy.read_only_routes",
                f"{where}: ext_proc runs on {', '.join(judged_ro)}: health checks and model "
                "lists wait on ICE (and fail with it when it fails closed)",
                "ExtProcPerRoute disabled: true on the read-only routes (pieces.read_only_route)",
            )
        )
    else:
        out.append(
            Check(
                "PASS",
                "envoy.read_only_routes",
                f"{where}: ICE off on {', '.join(ex.read_only)}",
            )
        )

    # The policy's passthrough paths: open, ICE off.
    if ex.passthrough:
        shut: list[str] = []
        judged_pt: list[str] = []
        for path in ex.passthrough:
            hit = route_to(vhost, "POST", path)
            if not hit.upstream or hit.route is None:
                shut.append(path)
            elif _on(filters, hit.route, vhost, table):
                judged_pt.append(path)
        if shut or judged_pt:
            detail = "; ".join(
                s
                for s in (
                    f"closed by Envoy: {', '.join(shut)}" if shut else "",
                    f"through ICE: {', '.join(judged_pt)}" if judged_pt else "",
                )
                if s
            )
            out.append(
                Check(
                    "WARN",
                    "envoy.passthrough_routes",
                    f"{where}: the policy's passthrough_paths: {detail}",
                    "a route per passthrough path with ICE off (ext_proc/lab/stack.py renders "
                    "them), before the 404",
                )
            )
        else:
            out.append(
                Check(
                    "PASS", "envoy.passthrough_routes", f"{where}: open, ICE off: {ex.passthrough}"
                )
            )

    # Everything else: closed.
    leaks: list[str] = []
    judged_probe: list[str] = []
    for path in PROBE_PATHS:
        if path in ex.passthrough:
            continue
        hit = route_to(vhost, "POST", path)
        if hit.upstream and hit.route is not None:
            on = _on(filters, hit.route, vhost, table)
            (judged_probe if on else leaks).append(f"{path} (route {hit.name or '?'})")
    if leaks:
        out.append(
            fail(
                "envoy.closed_by_default",
                f"{where}: unjudged paths reach the backend: {', '.join(leaks)}",
                "end the table with Envoy's 404 (pieces.closed_route) and route only the "
                "judged and read-only paths",
            )
        )
    elif judged_probe:
        out.append(
            Check(
                "WARN",
                "envoy.closed_by_default",
                f"{where}: other paths go to the backend through ICE, which answers them 404: "
                f"{', '.join(judged_probe)}",
                "end the table with Envoy's 404 (pieces.closed_route)",
            )
        )
    else:
        out.append(
            Check("PASS", "envoy.closed_by_default", f"{where}: other paths get Envoy's own answer")
        )

    # The verdict, for the client.
    no_ns = [
        f.name
        for f in filters
        if X.VERDICT_NAMESPACE
        not in as_list(
            as_dict(as_dict(f.config.get("metadata_options")).get("receiving_namespaces")).get(
                "untyped"
            )
        )
    ]
    if named and (echo_missing or no_ns):
        problems = []
        if echo_missing:
            problems.append(f"not echoed: {', '.join(sorted(echo_missing))}")
        if no_ns:
            problems.append(f"{', '.join(no_ns)} does not receive namespace {X.VERDICT_NAMESPACE}")
        out.append(
            Check(
                "WARN",
                "envoy.verdict_headers",
                f"{where}: clients do not see ICE's verdict: {'; '.join(problems)}",
                "response_headers_to_add: pieces.verdict_response_headers(); "
                f"metadata_options.receiving_namespaces.untyped: [{X.VERDICT_NAMESPACE}]",
            )
        )
    elif named:
        out.append(
            Check(
                "PASS",
                "envoy.verdict_headers",
                f"{where}: {len(X.ECHOED_HEADERS)} verdict headers from dynamic metadata",
            )
        )

    # Endpoint picks.
    pickers = sorted(n for n, p in ex.policy.pools.items() if p.endpoint_pick == "ice")
    if not pickers:
        out.append(
            Check("PASS", "envoy.endpoint_pick", f"{where}: no pool uses endpoint_pick: ice")
        )
    else:
        problems = [
            f"{f.name} does not receive namespace {X.LB_NAMESPACE}"
            for f in filters
            if X.LB_NAMESPACE
            not in as_list(
                as_dict(as_dict(f.config.get("metadata_options")).get("receiving_namespaces")).get(
                    "untyped"
                )
            )
        ]
        problems += [
            f"cluster {c} has no override_host policy"
            for c in sorted(backends)
            if not _picks(clusters.get(c, {}))
        ]
        if problems:
            out.append(
                fail(
                    "envoy.endpoint_pick",
                    f"{where}: pools {', '.join(pickers)} pick endpoints, but {'; '.join(problems)}"
                    ": requests land elsewhere than where ICE judged them",
                    "the backend cluster of pieces.backend_cluster (override_host) and "
                    f"receiving_namespaces [{X.VERDICT_NAMESPACE}, {X.LB_NAMESPACE}]",
                )
            )
        else:
            out.append(Check("PASS", "envoy.endpoint_pick", f"{where}: Envoy follows ICE's picks"))
    return out
