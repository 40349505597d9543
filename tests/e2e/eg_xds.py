"""An Envoy bootstrap shaped as Envoy Gateway translates ``ext_proc.tools.envoygen.gateway``'s
objects, for ``tests/e2e/test_mesh.py``: EG's listener and route names, its route order, its
ext_proc filters disabled in the HCM and enabled per route, the EnvoyPatchPolicy's JSON
patches applied with ``jsonpatch`` (EG's facts, with their sources, are in ``gateway``'s
docstring). What EG builds itself is built here; what ICE adds comes from the objects.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import jsonpatch
from envoy_data_plane.envoy.config.bootstrap.v3 import Admin, Bootstrap, BootstrapStaticResources
from envoy_data_plane.envoy.config.common.mutation_rules.v3 import (
    HeaderMutation as Mutation,
)
from envoy_data_plane.envoy.config.common.mutation_rules.v3 import (
    HeaderMutationRemoveOnMatch,
)
from envoy_data_plane.envoy.config.core.v3 import (
    Address,
    DataSource,
    GrpcService,
    GrpcServiceEnvoyGrpc,
    HeaderValue,
    HeaderValueOption,
    HeaderValueOptionHeaderAppendAction,
    HttpProtocolOptionsHeadersWithUnderscoresAction,
    SocketAddress,
    SubstitutionFormatString,
    TypedExtensionConfig,
)
from envoy_data_plane.envoy.config.core.v3 import HttpProtocolOptions as CommonHttpOptions
from envoy_data_plane.envoy.config.listener.v3 import Filter, FilterChain, Listener
from envoy_data_plane.envoy.config.route.v3 import (
    DirectResponseAction,
    HeaderMatcher,
    Route,
    RouteAction,
    RouteConfiguration,
    RouteMatch,
    VirtualHost,
)
from envoy_data_plane.envoy.extensions.filters.http.ext_proc.v3 import (
    ExternalProcessor,
    MetadataOptions,
    MetadataOptionsMetadataNamespaces,
    ProcessingMode,
    ProcessingModeBodySendMode,
    ProcessingModeHeaderSendMode,
)
from envoy_data_plane.envoy.extensions.filters.http.router.v3 import Router
from envoy_data_plane.envoy.extensions.filters.network.http_connection_manager.v3 import (
    HttpConnectionManager,
    HttpConnectionManagerPathWithEscapedSlashesAction,
    HttpFilter,
)
from envoy_data_plane.envoy.extensions.http.early_header_mutation.header_mutation.v3 import (
    HeaderMutation as EarlyHeaderMutation,
)
from envoy_data_plane.envoy.type.matcher.v3 import StringMatcher
from envoy_data_plane.google.protobuf import Any as PbAny

from ext_proc.tools.envoygen import pieces
from ext_proc.tools.envoygen.emit import as_dict
from ext_proc.tools.envoygen.gateway_names import (
    CLUSTER_TYPE,
    EARLY_MUTATION,
    FILTER_CONFIG_TYPE,
    HCM,
    LISTENER_TYPE,
    ROUTE_CONFIG_TYPE,
    _pointer,
    backend_cluster_name,
    ext_proc_cluster_name,
    ext_proc_filter_name,
    xds_route_name,
)
from ext_proc.tools.envoygen.gateway_policies import BODY_MODES, EG_GRPC_TIMEOUT, JSON_PATH

# --- an Envoy bootstrap shaped as EG would translate the objects ---------------------------


@dataclass(frozen=True, slots=True)
class _XdsRoute:
    """One xDS route before EG's sort, with what the sort looks at."""

    route: Route
    filters: tuple[str, ...]  # EG's ext_proc filters enabled on it
    rank: tuple[int, int, int, int]


def _by_kind(docs: Iterable[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def _one(docs: Iterable[dict[str, Any]], kind: str) -> dict[str, Any]:
    (doc,) = _by_kind(docs, kind)
    return doc


def _header_options(modifier: dict[str, Any]) -> list[HeaderValueOption]:
    """A ResponseHeaderModifier's ``set`` as EG writes it (buildXdsAddedHeaders)."""
    if set(modifier) != {"set"}:
        raise ValueError(f"{modifier}: only `set` is translated here")
    return [
        HeaderValueOption(
            header=HeaderValue(key=h["name"], value=h["value"]),
            append_action=HeaderValueOptionHeaderAppendAction.OVERWRITE_IF_EXISTS_OR_ADD,
        )
        for h in modifier["set"]
    ]


def _direct_response(flt: dict[str, Any]) -> tuple[DirectResponseAction, list[HeaderValueOption]]:
    spec = flt["spec"]["directResponse"]
    body = spec["body"]["inline"].encode()
    action = DirectResponseAction(
        status=spec["statusCode"],
        body_format=SubstitutionFormatString(text_format_source=DataSource(inline_bytes=body)),
    )
    content_type = HeaderValueOption(
        header=HeaderValue(key="Content-Type", value=spec["contentType"]),
        append_action=HeaderValueOptionHeaderAppendAction.OVERWRITE_IF_EXISTS_OR_ADD,
    )
    return action, [content_type]


def _match(match: dict[str, Any]) -> tuple[RouteMatch, tuple[int, int, int, int]]:
    """An HTTPRoute match as EG's xDS match (buildPathMatch), and its sort rank (sort.go)."""
    path = match["path"]
    if path["type"] == "Exact":
        out, rank = RouteMatch(path=path["value"]), (2, len(path["value"]))
    elif path["type"] == "PathPrefix" and path["value"] == "/":
        out, rank = RouteMatch(prefix="/"), (0, 0)
    else:
        raise ValueError(f"{path}: not a path type objects() emits")
    headers = []
    if "method" in match:
        headers.append(
            HeaderMatcher(name=":method", string_match=StringMatcher(exact=match["method"]))
        )
        out.headers = headers
    return out, (*rank, len(headers), len(headers))


def _xds_routes(
    route: dict[str, Any], docs: list[dict[str, Any]], enabled: dict[str, list[str]]
) -> Iterator[_XdsRoute]:
    """An HTTPRoute's rules and matches as EG's xDS routes, in the HTTPRoute's order."""
    ns, name = route["metadata"]["namespace"], route["metadata"]["name"]
    filters = {f["metadata"]["name"]: f for f in _by_kind(docs, "HTTPRouteFilter")}
    for i, rule in enumerate(route["spec"]["rules"]):
        headers: list[HeaderValueOption] = []
        direct: DirectResponseAction | None = None
        for flt in rule.get("filters", []):
            if flt["type"] == "ResponseHeaderModifier":
                headers += _header_options(flt["responseHeaderModifier"])
            elif flt["type"] == "ExtensionRef":
                direct, more = _direct_response(filters[flt["extensionRef"]["name"]])
                headers += more
            else:
                raise ValueError(f"{flt}: not a filter objects() emits")
        action = None
        if direct is None:
            action = RouteAction(cluster=backend_cluster_name(ns, name, i))
            if "timeouts" in rule:
                action.timeout = _duration(rule["timeouts"]["request"])
        for j, match in enumerate(rule["matches"]):
            xds_match, rank = _match(match)
            xds = Route(
                name=xds_route_name(ns, name, i, j),
                match=xds_match,
                route=action,
                direct_response=direct,
                response_headers_to_add=headers,
            )
            yield _XdsRoute(xds, tuple(enabled.get(name, ())), rank)


def _duration(value: str) -> datetime.timedelta:
    if not value.endswith("s") or not value[:-1].isdigit():
        raise ValueError(f"{value}: only whole seconds are translated here")
    return datetime.timedelta(seconds=int(value[:-1]))


def _enabled_filters(docs: list[dict[str, Any]]) -> dict[str, list[str]]:
    """HTTPRoute name → the ext_proc filters its EnvoyExtensionPolicies enable."""
    out: dict[str, list[str]] = {}
    for policy in _by_kind(docs, "EnvoyExtensionPolicy"):
        ns, name = policy["metadata"]["namespace"], policy["metadata"]["name"]
        for target in policy["spec"]["targetRefs"]:
            for i in range(len(policy["spec"]["extProc"])):
                out.setdefault(target["name"], []).append(ext_proc_filter_name(ns, name, i))
    return out


def _route_dict(xds: _XdsRoute) -> dict[str, Any]:
    """The route as protojson would show it, with EG's FilterConfig (empty config) per filter."""
    out = as_dict(xds.route)
    if xds.filters:
        enable = {"@type": FILTER_CONFIG_TYPE, "config": {}}
        out["typed_per_filter_config"] = {f: dict(enable) for f in xds.filters}
    return out


def _route_configuration(docs: list[dict[str, Any]], name: str) -> dict[str, Any]:
    enabled = _enabled_filters(docs)
    routes = [x for r in _by_kind(docs, "HTTPRoute") for x in _xds_routes(r, docs, enabled)]
    ordered = sorted(routes, key=lambda x: x.rank, reverse=True)  # stable: sort.Stable(Reverse)
    vhost = as_dict(VirtualHost(name=f"{name}/*", domains=["*"]))
    vhost["routes"] = [_route_dict(x) for x in ordered]
    config = as_dict(RouteConfiguration(name=name, ignore_port_in_host_matching=True))
    config["virtual_hosts"] = [vhost]
    return config


def _ext_proc_filters(docs: list[dict[str, Any]]) -> list[HttpFilter]:
    """Each EnvoyExtensionPolicy's ext_proc filter as EG builds it, disabled, by name."""
    out = []
    for policy in _by_kind(docs, "EnvoyExtensionPolicy"):
        ns, name = policy["metadata"]["namespace"], policy["metadata"]["name"]
        for i, entry in enumerate(policy["spec"]["extProc"]):
            ref = entry["backendRefs"][0]
            config = _ext_proc_config(entry, ext_proc_cluster_name(ns, name, i), ref)
            out.append(
                HttpFilter(
                    name=ext_proc_filter_name(ns, name, i),
                    typed_config=PbAny.pack(config),
                    disabled=True,
                )
            )
    return sorted(out, key=lambda f: f.name)


def _ext_proc_config(entry: dict[str, Any], cluster: str, ref: dict[str, Any]) -> ExternalProcessor:
    """EG's extProcConfig and buildProcessingMode for one ``extProc`` entry."""
    mode = entry["processingMode"]
    body = {v: k for k, v in BODY_MODES.items()}[mode["request"]["body"]]
    metadata = entry["metadata"]
    return ExternalProcessor(
        grpc_service=GrpcService(
            envoy_grpc=GrpcServiceEnvoyGrpc(
                cluster_name=cluster, authority=f"{ref['name']}.{ref['namespace']}:{ref['port']}"
            ),
            timeout=_duration(EG_GRPC_TIMEOUT),
        ),
        processing_mode=ProcessingMode(
            request_header_mode=ProcessingModeHeaderSendMode.SEND,
            response_header_mode=ProcessingModeHeaderSendMode.SKIP,
            request_body_mode=ProcessingModeBodySendMode[body],
            response_body_mode=ProcessingModeBodySendMode.NONE,
            request_trailer_mode=ProcessingModeHeaderSendMode.SKIP,
            response_trailer_mode=ProcessingModeHeaderSendMode.SKIP,
        ),
        failure_mode_allow=entry["failOpen"],
        message_timeout=_duration(entry["messageTimeout"]),
        metadata_options=MetadataOptions(
            forwarding_namespaces=MetadataOptionsMetadataNamespaces(
                untyped=metadata["accessibleNamespaces"]
            ),
            receiving_namespaces=MetadataOptionsMetadataNamespaces(
                untyped=metadata["writableNamespaces"]
            ),
        ),
        allow_mode_override=mode["allowModeOverride"],
    )


def _early_mutation(ctp: dict[str, Any]) -> TypedExtensionConfig:
    """``earlyRequestHeaders`` as EG builds it: the removes, then the matches."""
    early = ctp["spec"]["headers"]["earlyRequestHeaders"]
    mutations = [Mutation(remove=n) for n in early["remove"]]
    for m in early["removeOnMatch"]:
        if m["type"] != "Prefix":
            raise ValueError(f"{m}: only Prefix is translated here")
        matcher = StringMatcher(prefix=m["value"])
        mutations.append(Mutation(remove_on_match=HeaderMutationRemoveOnMatch(key_matcher=matcher)))
    config = EarlyHeaderMutation(mutations=mutations)
    return TypedExtensionConfig(name=EARLY_MUTATION, typed_config=PbAny.pack(config))


def _hcm(docs: list[dict[str, Any]], port: int) -> HttpConnectionManager:
    ctp = _one(docs, "ClientTrafficPolicy")
    escaped = ctp["spec"]["path"]["escapedSlashesAction"]
    action = re.sub(r"(?<!^)(?=[A-Z])", "_", escaped).upper()
    router = HttpFilter(
        name=pieces.ROUTER, typed_config=PbAny.pack(Router(suppress_envoy_headers=True))
    )
    return HttpConnectionManager(
        stat_prefix=f"http-{port}",
        http_filters=[*_ext_proc_filters(docs), router],
        use_remote_address=True,
        normalize_path=True,
        merge_slashes=True,
        path_with_escaped_slashes_action=HttpConnectionManagerPathWithEscapedSlashesAction[action],
        common_http_protocol_options=CommonHttpOptions(
            headers_with_underscores_action=HttpProtocolOptionsHeadersWithUnderscoresAction.REJECT_REQUEST
        ),
        early_header_mutation_extensions=[_early_mutation(ctp)],
    )


def _buffer_bytes(quantity: str) -> int:
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}
    for suffix, factor in units.items():
        if quantity.endswith(suffix):
            return int(quantity[: -len(suffix)]) * factor
    return int(quantity)


def _listener(docs: list[dict[str, Any]], name: str, port: int) -> dict[str, Any]:
    ctp = _one(docs, "ClientTrafficPolicy")
    hcm = Filter(name=HCM, typed_config=PbAny.pack(_hcm(docs, port)))
    listener = Listener(
        name=name,
        address=Address(socket_address=SocketAddress(address="127.0.0.1", port_value=port)),
        per_connection_buffer_limit_bytes=_buffer_bytes(ctp["spec"]["connection"]["bufferLimit"]),
        default_filter_chain=FilterChain(name=name, filters=[hcm]),
    )
    return as_dict(listener)


def resolve_json_path(doc: Any, json_path: str) -> list[str]:
    """EG's jsonPath → JSON pointers, for the form ``objects`` emits: ``..KEY[?(@.name=='V')]``."""
    m = JSON_PATH.match(json_path)
    if m is None:
        raise ValueError(f"{json_path}: not a jsonPath form translated here")
    key, name = m["key"], m["name"]

    def walk(node: Any, at: str) -> Iterator[str]:
        if isinstance(node, dict):
            for k, v in node.items():
                here = f"{at}/{_pointer(k)}"
                if k == key and isinstance(v, list):
                    for i, item in enumerate(v):
                        if isinstance(item, dict) and item.get("name") == name:
                            yield f"{here}/{i}"
                yield from walk(v, here)
        elif isinstance(node, list):
            for i, item in enumerate(node):
                yield from walk(item, f"{at}/{i}")

    found = list(walk(doc, ""))
    if not found:
        raise ValueError(f"{json_path}: no JSON pointer found (EG refuses the patch)")
    return found


def apply_patches(
    doc: dict[str, Any], patches: Iterable[dict[str, Any]], kind: str, name: str
) -> None:
    """An EnvoyPatchPolicy's JSONPatches for (``kind``, ``name``), in order, as EG applies them."""
    for p in patches:
        if (p["type"], p["name"]) != (kind, name):
            continue
        op = p["operation"]
        # no jsonPath: the path is from the resource's root (EG: a field, never an index)
        pointers = resolve_json_path(doc, op["jsonPath"]) if "jsonPath" in op else [""]
        for pointer in pointers:
            tail = op.get("path", "")
            path = f"{pointer.rstrip('/')}/{tail.lstrip('/')}" if tail else pointer
            step = {"op": op["op"], "path": path, "value": op["value"]}
            jsonpatch.JsonPatch([step]).apply(doc, in_place=True)


def _gateway_listener(docs: list[dict[str, Any]]) -> str:
    gw = _one(docs, "Gateway")
    (listener,) = gw["spec"]["listeners"]
    return f"{gw['metadata']['namespace']}/{gw['metadata']['name']}/{listener['name']}"


def ice_clusters(docs: list[dict[str, Any]]) -> list[str]:
    """EG's ICE cluster of each EnvoyExtensionPolicy's ``extProc`` entry."""
    return [
        ext_proc_cluster_name(p["metadata"]["namespace"], p["metadata"]["name"], i)
        for p in _by_kind(docs, "EnvoyExtensionPolicy")
        for i in range(len(p["spec"]["extProc"]))
    ]


def backend_clusters(docs: list[dict[str, Any]]) -> list[str]:
    """EG's backend cluster of each HTTPRoute rule that has backendRefs (one per rule)."""
    return [
        backend_cluster_name(r["metadata"]["namespace"], r["metadata"]["name"], i)
        for r in _by_kind(docs, "HTTPRoute")
        for i, rule in enumerate(r["spec"]["rules"])
        if "backendRefs" in rule
    ]


def _clusters(docs: list[dict[str, Any]], ice: str, backend: str) -> list[dict[str, Any]]:
    """ICE's (``pieces.ice_cluster``) and the backend's (no endpoint pick: EG cannot say it)."""
    out = [as_dict(pieces.ice_cluster(name, [ice])) for name in ice_clusters(docs)]
    out += [
        as_dict(pieces.backend_cluster(n, [backend], pick=False)) for n in backend_clusters(docs)
    ]
    return out


def xds_like_bootstrap(
    docs: list[dict[str, Any]],
    ice_address: str,
    backend_address: str,
    listener_port: int,
    admin_port: int,
) -> dict[str, Any]:
    """An Envoy bootstrap shaped as Envoy Gateway translates ``docs`` (from ``objects``): one
    listener and HCM named as EG names them (route config inline instead of RDS), EG's routes
    in EG's order, EG's ext_proc filters disabled in the HCM and enabled per route, the
    EnvoyPatchPolicy's patches applied with ``jsonpatch``, the router last; clusters for ICE
    (``pieces.ice_cluster``, ``host:port``) and the backend (``host:port``)."""
    name = _gateway_listener(docs)
    patches = _one(docs, "EnvoyPatchPolicy")["spec"]["jsonPatches"]
    routes = _route_configuration(docs, name)
    apply_patches(routes, patches, ROUTE_CONFIG_TYPE, name)
    listener = _listener(docs, name, listener_port)
    apply_patches(listener, patches, LISTENER_TYPE, name)
    listener["default_filter_chain"]["filters"][0]["typed_config"]["route_config"] = routes
    admin = Admin(
        address=Address(socket_address=SocketAddress(address="127.0.0.1", port_value=admin_port))
    )
    bootstrap = as_dict(Bootstrap(admin=admin, static_resources=BootstrapStaticResources()))
    clusters = _clusters(docs, ice_address, backend_address)
    for cluster in clusters:
        apply_patches(cluster, patches, CLUSTER_TYPE, cluster["name"])
    bootstrap["static_resources"] = {"listeners": [listener], "clusters": clusters}
    return bootstrap
