"""istiod's EnvoyFilter and DestinationRule semantics on plain Envoy config dicts: the
stand-in's patch applier (tests/e2e/meshes.py builds the proxies it patches).

Written from istiod's source (pilot/pkg/networking/core/envoyfilter: listener_patch.go,
rc_patch.go, cluster_patch.go; pkg/proto/merge; cluster_traffic_policy.go), only what the
generated EnvoyFilters and DestinationRule can meet:

- **Context.** A patch applies where its ``match.context`` is the one istiod builds the object
  under, or ``ANY``. A sidecar's ``virtualInbound`` listener, its route tables and its
  ``inbound|`` clusters are ``SIDECAR_INBOUND``; its other listeners and every other cluster
  (``outbound|…`` to ICE among them) ``SIDECAR_OUTBOUND``; everything in a gateway
  ``GATEWAY``. A CLUSTER patch for ICE's cluster under ``SIDECAR_INBOUND`` matches nothing.
- **Listener.** ``name`` must equal; ``portNumber`` is the listener's own port, except for
  patches below the listener (filter chain, network and HTTP filters) on ``virtualInbound``
  / ``virtualOutbound``, where it is the filter chain's ``destination_port``. A LISTENER
  patch with the container's port never meets ``virtualInbound`` (15006).
- **Filter chain / filter / subFilter.** By name (and the chain's match fields).
- **Route configuration.** Sidecar: ``name``, and ``portNumber`` read from the table's name
  (``inbound|8000||`` → 8000, the container port); gateway: ``name`` and the port of
  ``http.PORT``. Then the vhost by name, then the route by name. On one vhost, every route's
  MERGE/REMOVE first, then the inserts in patch order (``INSERT_BEFORE`` just before the
  first route that matches).
- **Cluster.** ``name``, or ``service``/``portNumber``/``subset`` read from
  ``direction|port|subset|host``; MERGE and REMOVE only.
- **MERGE** is protobuf's merge: messages merge field by field, lists append, a map's entry
  (``typed_per_filter_config``, ``typed_extension_protocol_options``) is *replaced* whole, an
  ``Any`` is replaced whole except a network or HTTP filter's own ``typed_config`` (istiod
  unpacks both and merges), setting one member of a oneof (a route's action) clears the
  others.

``apply`` returns the patches that matched nothing (istiod's ``envoy_filter_status``/metric
reports them; nothing else does). ``apply_destination_rule``: the fields of ICE's rule.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

__all__ = ["apply", "apply_destination_rule", "merge", "parse_cluster_name"]

VIRTUAL = ("virtualInbound", "virtualOutbound")
HCM = "envoy.filters.network.http_connection_manager"
MAP_FIELDS = frozenset(
    {"typed_per_filter_config", "typed_extension_protocol_options", "filter_metadata"}
)
ONEOFS = (frozenset({"route", "direct_response", "redirect", "filter_action"}),)
MERGES = ("MERGE", "MERGE_AND_REPLACE_LIST")


def merge(into: dict[str, Any], patch: dict[str, Any], *, unpack_any: bool = False) -> None:
    """Protobuf's merge of ``patch`` into ``into`` (istiod's ``merge.Merge``); ``unpack_any``:
    ``into`` and ``patch`` are a filter's ``typed_config`` (merged field by field when both
    have the same type, as istiod's ``MergeAnyWithAny``)."""
    for key, value in patch.items():
        for group in ONEOFS:
            if key in group:
                for other in group - {key}:
                    into.pop(other, None)
        old = into.get(key)
        if key in MAP_FIELDS and isinstance(value, dict):
            entries = into.setdefault(key, {})
            for name, entry in value.items():
                entries[name] = copy.deepcopy(entry)  # the entry replaced, never merged
        elif isinstance(value, dict) and isinstance(old, dict):
            if "@type" in value and not unpack_any:
                into[key] = copy.deepcopy(value)  # an Any: type and bytes replaced
            else:
                merge(old, value)
        elif isinstance(value, list) and isinstance(old, list):
            into[key] = old + copy.deepcopy(value)
        else:
            into[key] = copy.deepcopy(value)


def parse_cluster_name(name: str) -> tuple[str, int, str, str]:
    """``direction|port|subset|host`` → (direction, port, subset, host); others: port 0."""
    parts = name.split("|")
    if len(parts) != 4:
        return "", 0, "", ""
    try:
        port = int(parts[1])
    except ValueError:
        port = 0
    return parts[0], port, parts[2], parts[3]


def _context_ok(patch: dict[str, Any], context: str) -> bool:
    return patch["match"].get("context", "ANY") in (context, "ANY")


def _listener_context(listener: dict[str, Any], proxy: str) -> str:
    if proxy == "gateway":
        return "GATEWAY"
    return "SIDECAR_INBOUND" if listener["name"] == "virtualInbound" else "SIDECAR_OUTBOUND"


def _cluster_context(cluster: dict[str, Any], proxy: str) -> str:
    if proxy == "gateway":
        return "GATEWAY"
    inbound = parse_cluster_name(cluster["name"])[0] == "inbound"
    return "SIDECAR_INBOUND" if inbound else "SIDECAR_OUTBOUND"


def _listener_ok(listener: dict[str, Any], patch: dict[str, Any]) -> bool:
    want = patch["match"].get("listener")
    if want is None:
        return True
    if want.get("name") and want["name"] != listener["name"]:
        return False
    if patch["applyTo"] != "LISTENER" and listener["name"] in VIRTUAL:
        return True  # the port is the filter chain's, below
    port = want.get("portNumber")
    return not port or listener["address"]["socket_address"].get("port_value") == port


def _chain_ok(listener: dict[str, Any], chain: dict[str, Any], patch: dict[str, Any]) -> bool:
    want = patch["match"].get("listener") or {}
    fcm = chain.get("filter_chain_match") or {}
    port = want.get("portNumber")
    if listener["name"] in VIRTUAL and port and fcm.get("destination_port") != port:
        return False
    match = want.get("filterChain") or {}
    if match.get("name") and match["name"] != chain.get("name"):
        return False
    if match.get("transportProtocol") and match["transportProtocol"] != fcm.get(
        "transport_protocol"
    ):
        return False
    return (
        not match.get("destinationPort") or fcm.get("destination_port") == match["destinationPort"]
    )


def _filter_match(patch: dict[str, Any]) -> dict[str, Any]:
    return ((patch["match"].get("listener") or {}).get("filterChain") or {}).get("filter") or {}


def _insert(items: list[dict[str, Any]], at: int | None, op: str, value: dict[str, Any]) -> bool:
    if op == "INSERT_FIRST":
        items.insert(0, copy.deepcopy(value))
        return True
    if op == "ADD":
        items.append(copy.deepcopy(value))
        return True
    if at is None:
        return False
    items.insert(at if op == "INSERT_BEFORE" else at + 1, copy.deepcopy(value))
    return True


def _patch_http_filters(hcm: dict[str, Any], patch: dict[str, Any]) -> bool:
    filters: list[dict[str, Any]] = hcm.setdefault("http_filters", [])
    sub = (_filter_match(patch).get("subFilter") or {}).get("name")
    op, value = patch["patch"]["operation"], patch["patch"].get("value", {})
    at = next((i for i, f in enumerate(filters) if not sub or f["name"] == sub), None)
    if op in MERGES:
        if at is None:
            return False
        merge(filters[at]["typed_config"], value.get("typed_config", {}), unpack_any=True)
        return True
    if op == "REMOVE":
        if at is None:
            return False
        del filters[at]
        return True
    return _insert(filters, at, op, value)


def _patch_chain(chain: dict[str, Any], patch: dict[str, Any]) -> bool:
    want = _filter_match(patch)
    kind, op = patch["applyTo"], patch["patch"]["operation"]
    if kind == "FILTER_CHAIN":
        if op in MERGES:
            merge(chain, patch["patch"]["value"])
            return True
        return False
    applied = False
    for f in chain.get("filters", []):
        if want.get("name") and f["name"] != want["name"]:
            continue
        if kind == "NETWORK_FILTER" and op in MERGES:
            merge(
                f["typed_config"], patch["patch"]["value"].get("typed_config", {}), unpack_any=True
            )
            applied = True
        elif kind == "HTTP_FILTER" and f["name"] == HCM:
            applied = _patch_http_filters(f["typed_config"], patch) or applied
    return applied


def _route_tables(listener: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for chain in listener.get("filter_chains", []):
        for f in chain.get("filters", []):
            if f["name"] == HCM and "route_config" in f["typed_config"]:
                yield f["typed_config"]["route_config"]


def _table_port(name: str, context: str) -> int:
    if context == "GATEWAY":
        tail = name.split(".")[1] if name.startswith("http.") else ""
        return int(tail) if tail.isdigit() else 0
    return parse_cluster_name(name)[1] if name.startswith("inbound|") else 0


def _table_ok(table: dict[str, Any], context: str, patch: dict[str, Any]) -> bool:
    want = patch["match"].get("routeConfiguration")
    if want is None:
        return True
    if want.get("name") and want["name"] != table.get("name"):
        return False
    port = want.get("portNumber")
    return not port or _table_port(table.get("name", ""), context) == port


def _vhost_ok(vhost: dict[str, Any], patch: dict[str, Any]) -> bool:
    want = (patch["match"].get("routeConfiguration") or {}).get("vhost") or {}
    return not want.get("name") or want["name"] == vhost.get("name")


def _route_name(patch: dict[str, Any]) -> str | None:
    want = ((patch["match"].get("routeConfiguration") or {}).get("vhost") or {}).get("route")
    return (want or {}).get("name")


def _patch_routes(vhost: dict[str, Any], patches: list[tuple[int, dict[str, Any]]]) -> set[int]:
    """istiod's patchHTTPRoutes on one vhost: each route's MERGE/REMOVE, then the inserts."""
    applied: set[int] = set()
    routes: list[dict[str, Any]] = vhost["routes"]
    for route in list(routes):
        for i, p in patches:
            name = _route_name(p)
            if name is not None and name != route.get("name"):
                continue
            op = p["patch"]["operation"]
            if op == "REMOVE":
                routes.remove(route)
                applied.add(i)
                break
            if op in MERGES:
                merge(route, p["patch"]["value"])
                applied.add(i)
    for i, p in patches:
        op, name = p["patch"]["operation"], _route_name(p)
        if op not in ("INSERT_BEFORE", "INSERT_AFTER", "INSERT_FIRST", "ADD"):
            continue
        at = next((k for k, r in enumerate(routes) if name is None or r.get("name") == name), None)
        if name is None and op in ("INSERT_BEFORE", "INSERT_FIRST"):
            at, op = 0, "INSERT_BEFORE"
        if _insert(routes, at, op, p["patch"]["value"]):
            applied.add(i)
    return applied


def apply(bootstrap: dict[str, Any], patches: list[dict[str, Any]], proxy: str) -> list[int]:
    """The EnvoyFilter's ``patches`` on a static bootstrap shaped as istiod builds ``proxy``
    ("sidecar" or "gateway"); returns the indices of the patches that matched nothing."""
    res = bootstrap["static_resources"]
    applied: set[int] = set()
    indexed = list(enumerate(patches))
    for listener in res.get("listeners", []):
        context = _listener_context(listener, proxy)
        here = [(i, p) for i, p in indexed if _context_ok(p, context) and _listener_ok(listener, p)]
        for i, p in here:
            if p["applyTo"] == "LISTENER" and p["patch"]["operation"] in MERGES:
                merge(listener, p["patch"]["value"])
                applied.add(i)
        for chain in listener.get("filter_chains", []):
            for i, p in here:
                below = p["applyTo"] in ("FILTER_CHAIN", "NETWORK_FILTER", "HTTP_FILTER")
                if below and _chain_ok(listener, chain, p) and _patch_chain(chain, p):
                    applied.add(i)
        for table in _route_tables(listener):
            on_table = [
                (i, p)
                for i, p in indexed
                if p["applyTo"] == "HTTP_ROUTE"
                and _context_ok(p, context)
                and _table_ok(table, context, p)
            ]
            for vhost in table.get("virtual_hosts", []):
                applied |= _patch_routes(
                    vhost, [(i, p) for i, p in on_table if _vhost_ok(vhost, p)]
                )
    for cluster in list(res.get("clusters", [])):
        context = _cluster_context(cluster, proxy)
        for i, p in indexed:
            if p["applyTo"] != "CLUSTER" or not _context_ok(p, context):
                continue
            if not _cluster_ok(cluster, p):
                continue
            op = p["patch"]["operation"]
            if op in MERGES:
                merge(cluster, p["patch"]["value"])
                applied.add(i)
            elif op == "REMOVE":
                res["clusters"].remove(cluster)
                applied.add(i)
                break
    return [i for i, _ in indexed if i not in applied]


def _cluster_ok(cluster: dict[str, Any], patch: dict[str, Any]) -> bool:
    want = patch["match"].get("cluster")
    if want is None:
        return True
    if want.get("name"):
        return bool(want["name"] == cluster["name"])
    _, port, subset, host = parse_cluster_name(cluster["name"])
    if want.get("subset") and want["subset"] != subset:
        return False
    if want.get("service") and want["service"] != host:
        return False
    return not want.get("portNumber") or want["portNumber"] == port


def _go_duration(text: str) -> str:
    """A Kubernetes duration ("1s", "500ms", "3m") as protobuf JSON ("1s", "0.500s")."""
    units = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    for unit in ("ms", "s", "m", "h"):
        if text.endswith(unit) and text[: -len(unit)].replace(".", "").isdigit():
            seconds = float(text[: -len(unit)]) * units[unit]
            return f"{seconds:g}s" if seconds == int(seconds) else f"{seconds:.3f}s"
    raise ValueError(f"not a duration: {text!r}")


H2_OPTIONS = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"


def apply_destination_rule(cluster: dict[str, Any], rule: dict[str, Any]) -> None:
    """A DestinationRule's traffic policy on istiod's cluster for its host, as istiod merges
    it (the fields ICE's rule sets): ``connectionPool.tcp.connectTimeout`` →
    ``connect_timeout``; ``http.maxConcurrentStreams`` → the HTTP/2 options' stream limit
    (HTTP/2 clusters only), kept with what else the options hold; ``outlierDetection``."""
    policy = rule["spec"].get("trafficPolicy", {})
    pool = policy.get("connectionPool", {})
    if "connectTimeout" in pool.get("tcp", {}):
        cluster["connect_timeout"] = _go_duration(pool["tcp"]["connectTimeout"])
    streams = pool.get("http", {}).get("maxConcurrentStreams")
    options = cluster.get("typed_extension_protocol_options", {}).get(H2_OPTIONS, {})
    h2 = options.get("explicit_http_config", {}).get("http2_protocol_options")
    if streams and h2 is not None:
        h2["max_concurrent_streams"] = streams
    od = policy.get("outlierDetection")
    if od:
        cluster["outlier_detection"] = {
            "split_external_local_origin_errors": od.get("splitExternalLocalOriginErrors", False),
            "consecutive_local_origin_failure": od.get("consecutiveLocalOriginFailures"),
            "interval": _go_duration(od.get("interval", "10s")),
            "base_ejection_time": _go_duration(od.get("baseEjectionTime", "30s")),
            "max_ejection_percent": od.get("maxEjectionPercent", 10),
        }
