"""The Envoy objects ICE needs in any proxy, as typed ``envoy-data-plane`` messages.

Every Envoy-facing configuration ICE ships (the local bootstrap, the benchmark's, Istio's
EnvoyFilters, Envoy Gateway's patch) takes its filters, per-route configs, response headers
and clusters from here, so that the ways ICE runs in each proxy cannot drift apart.

- ``strip_spoofed_headers``: the header_mutation filter ahead of ext_proc: a client cannot set
  ICE's verdict headers nor pick the endpoint (also while ICE is down).
- ``ext_proc_filter``: fail-open, headers then the buffered body; responses are sent to ICE
  only when ICE asks for a request's response headers (a mode override, for a backend's
  overload 503: ``ext_proc.admit.overload_answer``), with Envoy's ``response.code_details``; the
  metadata namespaces ICE writes (``ice``: the verdict; ``envoy.lb``: its endpoint pick).
- ``judged_route_config`` / ``ice_off``: per-route ext_proc config: the route's name (and
  profile) as gRPC metadata, or ICE off.
- ``verdict_response_headers``: the client-side verdict headers, from dynamic metadata.
- ``ice_cluster`` / ``backend_cluster``: ICE's gRPC cluster (HTTP/2, health-checked) and the
  backend with the endpoint-picker's override_host policy. ``ice_cluster(standby=True)``:
  active-passive, one priority level per ICE address (the first judges, the others stand by)
  with faster health checks (``cluster_parts.STANDBY_*``) and no panic mode.

Invariants: pure (no I/O); every value is a typed message, rendered only by ``render.as_dict``;
names and numbers that other code reads (filter names, header names) are module constants.

Beside it: ``cluster_parts`` (the clusters' endpoints, load assignments and health checks),
``hcm_settings`` (the connection manager's 413 reply and access log) and ``late_guard`` (the
RBAC filter after ext_proc that answers 429 to a request ICE judged too late).
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence

from envoy_data_plane.envoy.config.cluster.v3 import (
    Cluster,
    ClusterCommonLbConfig,
    ClusterDiscoveryType,
    LoadBalancingPolicy,
    LoadBalancingPolicyPolicy,
)
from envoy_data_plane.envoy.config.common.mutation_rules.v3 import (
    HeaderMutation as Mutation,
)
from envoy_data_plane.envoy.config.common.mutation_rules.v3 import (
    HeaderMutationRemoveOnMatch,
)
from envoy_data_plane.envoy.config.core.v3 import (
    GrpcService,
    GrpcServiceEnvoyGrpc,
    HeaderValue,
    HeaderValueOption,
    HeaderValueOptionHeaderAppendAction,
    Http2ProtocolOptions,
    SubstitutionFormatString,
    TypedExtensionConfig,
)
from envoy_data_plane.envoy.config.route.v3 import (
    DirectResponseAction,
    HeaderMatcher,
    Route,
    RouteAction,
    RouteMatch,
)
from envoy_data_plane.envoy.extensions.filters.http.buffer.v3 import Buffer, BufferPerRoute
from envoy_data_plane.envoy.extensions.filters.http.ext_proc.v3 import (
    ExternalProcessor,
    ExtProcOverrides,
    ExtProcPerRoute,
    MetadataOptions,
    MetadataOptionsMetadataNamespaces,
    ProcessingMode,
    ProcessingModeBodySendMode,
    ProcessingModeHeaderSendMode,
)
from envoy_data_plane.envoy.extensions.filters.http.header_mutation.v3 import (
    HeaderMutation,
    HeaderMutationPerRoute,
    Mutations,
)
from envoy_data_plane.envoy.extensions.filters.http.router.v3 import Router
from envoy_data_plane.envoy.extensions.filters.network.http_connection_manager.v3 import HttpFilter
from envoy_data_plane.envoy.extensions.load_balancing_policies.override_host.v3 import (
    OverrideHost,
    OverrideHostOverrideHostSource,
)
from envoy_data_plane.envoy.extensions.load_balancing_policies.round_robin.v3 import RoundRobin
from envoy_data_plane.envoy.extensions.upstreams.http.v3 import (
    HttpProtocolOptions,
    HttpProtocolOptionsExplicitHttpConfig,
)
from envoy_data_plane.envoy.type.matcher.v3 import RegexMatcher, StringMatcher
from envoy_data_plane.envoy.type.metadata.v3 import MetadataKey
from envoy_data_plane.envoy.type.metadata.v3 import MetadataKeyPathSegment as Seg
from envoy_data_plane.envoy.type.v3 import Percent
from envoy_data_plane.google.protobuf import Any, Struct

from ext_proc.tools.envoygen.cluster_parts import (
    _assignment,
    _health_check,
    _outlier_detection,
    _priorities,
    stream_retry_policy,
)

__all__ = [
    "BUFFER",
    "ECHOED_HEADERS",
    "EXT_PROC",
    "HEADER_MUTATION",
    "ICE_STREAMS_PER_CONNECTION",
    "LISTENER_READ_BYTES",
    "MAX_BODY_BYTES",
    "RESPONSE_ATTRIBUTES",
    "ROUTER",
    "backend_cluster",
    "buffer_filter",
    "buffer_on",
    "closed_route",
    "ext_proc_filter",
    "ice_cluster",
    "ice_off",
    "judged_route",
    "judged_route_config",
    "read_only_route",
    "router_filter",
    "spoof_mutations",
    "strip_spoofed_headers",
    "strip_spoofed_headers_on_route",
    "verdict_response_headers",
]

EXT_PROC = "envoy.filters.http.ext_proc"
HEADER_MUTATION = "envoy.filters.http.header_mutation"
BUFFER = "envoy.filters.http.buffer"
ROUTER = "envoy.filters.http.router"
MAX_BODY_BYTES = 8 * 1024 * 1024  # ICE's --max-body-bytes default; Envoy's buffer limit
# What Envoy reads from one downstream connection per read event (the listener's
# per_connection_buffer_limit_bytes; the routes buffer up to MAX_BODY_BYTES through their
# virtual host's request_body_buffer_limit). Under a flood of long uploads Envoy's workers
# read every ready client in one pass of their loop, and the ext_proc messages of other
# requests wait for the pass to end. 512 clients × 2.76 MB at once (with 1,024 streams per
# ICE connection) let some through unjudged in 2 runs of 5 at 8 MiB, in 1 of 10 at 1 MiB
# (Envoy's default), in none of 14 at 256 KiB (bench/flood.py, docs/flood.md).
LISTENER_READ_BYTES = 256 * 1024
# Streams per HTTP/2 connection to one ICE address: as many as Envoy's default circuit
# breaker lets the cluster have in flight (1,024), so a flood never waits for new
# connections to ICE (at 32, Envoy opened them while its workers were busy and new
# requests' headers waited behind that; docs/flood.md).
ICE_STREAMS_PER_CONNECTION = 1024
ROUTE_TIMEOUT = datetime.timedelta(seconds=600)  # a long generation, streamed or not
MESSAGE_TIMEOUT = datetime.timedelta(seconds=1)  # ICE's --message-timeout-ms default
# ICE extends one message's timeout for truncation (deadline_ms + 1 s) and for a queued
# request (max_queue_wait_ms + 1 s, at most 59 s + 1 s: ext_proc.policy.load_queue)
MAX_MESSAGE_TIMEOUT = datetime.timedelta(seconds=60)
VERDICT_NAMESPACE = "ice"  # ext_proc.serve.render.METADATA_NAMESPACE
LB_NAMESPACE = "envoy.lb"  # ext_proc.serve.render.LB_NAMESPACE
DESTINATION = "x-gateway-destination-endpoint"  # ext_proc.placement.endpoints.DESTINATION_HEADER

# The verdict headers Envoy echoes to the client from ICE's dynamic metadata (docs/headers.md).
ECHOED_HEADERS = (
    "x-mem-pressure",
    "x-mem-pressure-score",
    "x-ice-decision",
    "x-ice-reason",
    "x-downgraded",
    "x-ice-original-max-tokens",
    "x-ice-stale",
    "x-ice-truncated",
    "x-ice-sequences",
    "x-ice-judged",
    "x-ice-tokens",
    "x-ice-endpoint",
    "x-ice-shadow-decision",
    "x-ice-shadow-reason",
    "x-ice-compacted",
    "x-ice-queued-ms",
)
# Sent with the response headers ICE asks for: where the response came from (``via_upstream``:
# the backend's own; ext_proc.admit.overload_answer.CODE_DETAILS).
RESPONSE_ATTRIBUTES = ("response.code_details",)
# What a client may not send: ICE's own headers (prefixes and names) and the endpoint pick.
SPOOF_PREFIXES = ("x-ice-", "x-mem-pressure", DESTINATION)
SPOOF_NAMES = ("x-downgraded",)
READ_METHODS = "GET|HEAD"


def _any(message: object) -> Any:
    return Any.pack(message)  # type: ignore[arg-type]


def spoof_mutations(extra: Sequence[str] = ()) -> Mutations:
    """The removals of ``strip_spoofed_headers``: ICE's own prefixes, the names, the pick;
    then ``extra`` names (identity headers a trusted service sets, docs/identity.md)."""
    removals = [
        Mutation(remove_on_match=HeaderMutationRemoveOnMatch(key_matcher=StringMatcher(prefix=p)))
        for p in SPOOF_PREFIXES
    ]
    removals += [Mutation(remove=name) for name in SPOOF_NAMES]
    # Order as the checked-in configs: prefixes of ICE's own, the names, then the pick.
    ordered = [removals[0], removals[1], removals[3], removals[2]]
    return Mutations(request_mutations=ordered + [Mutation(remove=name) for name in extra])


def strip_spoofed_headers(*, disabled: bool = False, extra: Sequence[str] = ()) -> HttpFilter:
    """No spoofing: only ICE may set its verdict headers, and only ICE picks the endpoint.
    ``disabled``: off unless a route turns it on (``strip_spoofed_headers_on_route``: a
    shared gateway, where other services' requests keep their headers). ``extra``: header
    names removed too (``spoof_mutations``)."""
    config = HeaderMutation(mutations=spoof_mutations(extra))
    return HttpFilter(name=HEADER_MUTATION, typed_config=_any(config), disabled=disabled)


def strip_spoofed_headers_on_route() -> HeaderMutationPerRoute:
    """The per-route config that turns a disabled ``strip_spoofed_headers`` on for a route."""
    return HeaderMutationPerRoute(mutations=spoof_mutations())


def ext_proc_config(cluster: str) -> ExternalProcessor:
    """ICE's ext_proc settings (docs/performance.md, "Round trips"): two messages per inference
    request, headers (answered at once) then the buffered body (the verdict); responses not sent
    unless ICE asks for them per request (``allow_mode_override``: a third message, the response
    headers, with ``RESPONSE_ATTRIBUTES``), and ICE may turn the body phase off; fail-open; ICE
    may extend one message's timeout for truncation and queueing up to ``MAX_MESSAGE_TIMEOUT``."""
    return ExternalProcessor(
        grpc_service=GrpcService(
            envoy_grpc=GrpcServiceEnvoyGrpc(cluster_name=cluster),
            retry_policy=stream_retry_policy(),
        ),
        failure_mode_allow=True,
        message_timeout=MESSAGE_TIMEOUT,
        max_message_timeout=MAX_MESSAGE_TIMEOUT,
        processing_mode=ProcessingMode(
            request_header_mode=ProcessingModeHeaderSendMode.SEND,
            request_body_mode=ProcessingModeBodySendMode.BUFFERED,
            request_trailer_mode=ProcessingModeHeaderSendMode.SKIP,
            response_header_mode=ProcessingModeHeaderSendMode.SKIP,
            response_body_mode=ProcessingModeBodySendMode.NONE,
            response_trailer_mode=ProcessingModeHeaderSendMode.SKIP,
        ),
        allow_mode_override=True,
        response_attributes=list(RESPONSE_ATTRIBUTES),
        metadata_options=MetadataOptions(
            receiving_namespaces=MetadataOptionsMetadataNamespaces(
                untyped=[VERDICT_NAMESPACE, LB_NAMESPACE]
            ),
            forwarding_namespaces=MetadataOptionsMetadataNamespaces(
                untyped=[f"{LB_NAMESPACE}.subset_hint"]
            ),
        ),
    )


def ext_proc_filter(cluster: str = "ice", *, disabled: bool = False) -> HttpFilter:
    """The ext_proc filter; ``disabled``: off unless a route turns it on (the mesh flavours,
    where the proxy carries other services' routes too)."""
    return HttpFilter(name=EXT_PROC, typed_config=_any(ext_proc_config(cluster)), disabled=disabled)


def buffer_filter() -> HttpFilter:
    """Off by default; the 404 route turns it on to read a request's body before answering,
    so a client that sends its whole body first gets the 404, not a reset connection."""
    config = Buffer(max_request_bytes=MAX_BODY_BYTES)
    return HttpFilter(name=BUFFER, typed_config=_any(config), disabled=True)


def router_filter() -> HttpFilter:
    return HttpFilter(name=ROUTER, typed_config=_any(Router()))


def judged_route_config(route: str, profile: str | None = None) -> ExtProcPerRoute:
    """ICE on, with the route's name (and, when given, its profile) as gRPC metadata."""
    metadata = [HeaderValue(key="x-ice-route", value=route)]
    if profile:
        metadata.append(HeaderValue(key="x-ice-profile", value=profile))
    return ExtProcPerRoute(overrides=ExtProcOverrides(grpc_initial_metadata=metadata))


def ice_off() -> ExtProcPerRoute:
    return ExtProcPerRoute(disabled=True)


def buffer_on() -> BufferPerRoute:
    return BufferPerRoute(buffer=Buffer(max_request_bytes=MAX_BODY_BYTES))


def judged_route(name: str, path: str, cluster: str, profile: str | None = None) -> Route:
    """An inference endpoint: its exact path (after normalisation; the query string is not
    part of the match) to the backend, through ICE."""
    return Route(
        name=name,
        match=RouteMatch(path=path),
        route=RouteAction(cluster=cluster, timeout=ROUTE_TIMEOUT),
        typed_per_filter_config={EXT_PROC: _any(judged_route_config(name, profile))},
    )


def read_only_route(name: str, path: str, cluster: str) -> Route:
    """A read-only path, GET and HEAD only, straight to the backend with ICE off."""
    method = HeaderMatcher(
        name=":method",
        string_match=StringMatcher(safe_regex=RegexMatcher(regex=READ_METHODS)),
    )
    return Route(
        name=name,
        match=RouteMatch(path=path, headers=[method]),
        route=RouteAction(cluster=cluster),
        typed_per_filter_config={EXT_PROC: _any(ice_off())},
    )


UNKNOWN_ENDPOINT = {
    "error": {
        "message": "%REQ(:METHOD)% %PATH(NQ)% is not served by this gateway.",
        "type": "invalid_request_error",
        "param": None,
        "code": "unknown_endpoint",
    }
}


def closed_route(name: str = "closed") -> Route:
    """Everything else: Envoy's own 404 in the OpenAI error format; the backend never sees
    the request. The buffer filter reads the body first (``buffer_filter``)."""
    return Route(
        name=name,
        match=RouteMatch(prefix="/"),
        direct_response=DirectResponseAction(
            status=404,
            body_format=SubstitutionFormatString(
                content_type="application/json", json_format=Struct.from_dict(UNKNOWN_ENDPOINT)
            ),
        ),
        typed_per_filter_config={EXT_PROC: _any(ice_off()), BUFFER: _any(buffer_on())},
    )


def verdict_response_headers() -> list[HeaderValueOption]:
    """ICE's verdict for the client, from dynamic metadata: no response-phase round trip.
    Empty values (ICE did not judge the request) add nothing."""
    return [
        HeaderValueOption(
            header=HeaderValue(key=h, value=f"%DYNAMIC_METADATA({VERDICT_NAMESPACE}:{h})%"),
            append_action=HeaderValueOptionHeaderAppendAction.OVERWRITE_IF_EXISTS_OR_ADD,
        )
        for h in ECHOED_HEADERS
    ]


def ice_cluster(
    name: str, addresses: Sequence[str], *, dns: bool = False, standby: bool = False
) -> Cluster:
    """ICE's gRPC cluster: HTTP/2 with up to ``ICE_STREAMS_PER_CONNECTION`` streams per
    connection (one connection per Envoy worker and ICE address carries a flood: no stream
    waits for a connection to open), a 1 s connect timeout (0.25 s ejected pending streams
    under a flood), gRPC health checks (a worker that stops answering is left out), and no
    panic mode: with every ICE host flagged Envoy sends no stream to ICE and the ext_proc
    filter fails open at once (status UNAVAILABLE). In panic mode it would keep sending
    streams to a hung ICE, and the late guard (``late_guard``) would answer each 429 after
    the message timeout for as long as the hang lasts. ``dns``: STRICT_DNS (a Kubernetes
    Service name) instead of STATIC addresses.

    ``standby``: active-passive. Address i gets priority i: every Envoy sends every stream to
    the first healthy address in order, so one ICE judges and keeps the whole in-flight
    account. With one host per level, Envoy's default overprovisioning factor (1.4: a level
    keeps all its traffic while at least 72 % of its hosts are healthy) makes it all or
    nothing: the active has all the streams until its health check fails, then the next
    level has them. Faster health checks (``STANDBY_*``) make that failover quick; with every
    level unhealthy (no panic mode: it would spread the streams over the unhealthy priority-0
    hosts) the ext_proc filter fails open at once instead of waiting on a dead address."""
    h2 = HttpProtocolOptions(
        explicit_http_config=HttpProtocolOptionsExplicitHttpConfig(
            http2_protocol_options=Http2ProtocolOptions(
                max_concurrent_streams=ICE_STREAMS_PER_CONNECTION
            )
        )
    )
    return Cluster(
        name=name,
        type=ClusterDiscoveryType.STRICT_DNS if dns else ClusterDiscoveryType.STATIC,
        connect_timeout=datetime.timedelta(seconds=1),
        typed_extension_protocol_options={
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": _any(h2)
        },
        health_checks=[_health_check(standby=standby)],
        outlier_detection=_outlier_detection(),
        common_lb_config=ClusterCommonLbConfig(healthy_panic_threshold=Percent(value=0.0)),
        load_assignment=(_priorities if standby else _assignment)(name, addresses),
    )


def override_host_policy() -> LoadBalancingPolicy:
    """The endpoint-picker protocol (``endpoint_pick: ice``): a request whose ext_proc reply
    put a pool member's ip:port in ``envoy.lb`` ``x-gateway-destination-endpoint`` goes
    there; with no pick, or a pick that is not one of the cluster's endpoints, round robin.
    Only ``envoy.lb`` is a source: ICE's header would make the pick a list of two."""

    def key(name: str) -> MetadataKey:
        return MetadataKey(key=LB_NAMESPACE, path=[Seg(key=name)])

    override = OverrideHost(
        override_host_sources=[OverrideHostOverrideHostSource(metadata=key(DESTINATION))],
        selected_host_key=key(f"{DESTINATION}-served"),
        fallback_policy=LoadBalancingPolicy(
            policies=[
                LoadBalancingPolicyPolicy(
                    typed_extension_config=TypedExtensionConfig(
                        name="envoy.load_balancing_policies.round_robin",
                        typed_config=_any(RoundRobin()),
                    )
                )
            ]
        ),
    )
    return LoadBalancingPolicy(
        policies=[
            LoadBalancingPolicyPolicy(
                typed_extension_config=TypedExtensionConfig(
                    name="envoy.load_balancing_policies.override_host",
                    typed_config=_any(override),
                )
            )
        ]
    )


def backend_cluster(name: str, addresses: Sequence[str], *, pick: bool = True) -> Cluster:
    """The inference backends; ``pick``: with the endpoint-picker's override_host policy."""
    return Cluster(
        name=name,
        type=ClusterDiscoveryType.STATIC,
        connect_timeout=datetime.timedelta(seconds=1),
        load_balancing_policy=override_host_policy() if pick else None,
        load_assignment=_assignment(name, addresses),
    )
