"""The local bootstraps: ``envoy/envoy.yaml`` (the demo and the e2e tests) and
``envoy/bench.yaml`` (the throughput benchmark), built from ``pieces``.

The local stack: client → 127.0.0.1:10000 (Envoy) → ext_proc ICE on 127.0.0.1:50051 →
backend on 127.0.0.1:8000. Closed by default: only the judged inference endpoints (through
ICE) and the read-only paths (GET/HEAD, ICE off) reach the backend; anything else gets
Envoy's own 404 in the OpenAI error format (route ``closed``). ``ext_proc.lab.stack``
renders these files with other ports and endpoints; the names it keys on (listeners
``ingress``/``fast_upstream``, clusters ``ice``/``backend``/``fast_upstream``, the route
``closed``) are set here.

Retries (``envoy.yaml`` only): a failed connection is retried once on another endpoint (the
virtual host's policy). A judged route whose pool has several endpoints
(``RouteSpec.several_endpoints``) also retries a 503 once on another endpoint (its own
policy: vLLM's valve answers 503 "retry on a different instance"; the body is buffered
already for ext_proc); with one endpoint the retry would meet the same full backend, so the
503 goes to the client (as ICE's answer: ``ext_proc.admit.overload_answer``).

Active-passive (``local_bootstrap(spec, ice=[...], ice_standby=True)``): ICE's cluster in
priority levels, one address each (``pieces.ice_cluster``); the checked-in file has one ICE.

Both ingresses refuse what ICE judged too late (``late_guard``: an RBAC filter after
ext_proc, its 429 in ``local_reply_config``) and speak HTTP/2 to clients as Envoy recommends
at the edge (``EDGE_H2_*``; docs/flood.md measures both).

The benchmark's config has the same HCM filters and ``ice`` cluster (the benchmark measures
the production configuration), its routes go to ``fast_upstream`` (a static, very fast
inference server in Envoy itself), plus the ICE-off baseline ``chat_direct``; no retries.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any

from envoy_data_plane.envoy.config.bootstrap.v3 import Admin, Bootstrap, BootstrapStaticResources
from envoy_data_plane.envoy.config.core.v3 import (
    Address,
    DataSource,
    HeaderValue,
    HeaderValueOption,
    HeaderValueOptionHeaderAppendAction,
    Http2ProtocolOptions,
    SocketAddress,
)
from envoy_data_plane.envoy.config.listener.v3 import Filter, FilterChain, Listener
from envoy_data_plane.envoy.config.overload.v3 import (
    BufferFactoryConfig,
    OverloadAction,
    OverloadManager,
    ResourceMonitor,
    ScaledTrigger,
    ThresholdTrigger,
    Trigger,
)
from envoy_data_plane.envoy.config.route.v3 import (
    DirectResponseAction,
    HeaderMatcher,
    RetryPolicy,
    RetryPolicyRetryHostPredicate,
    Route,
    RouteAction,
    RouteConfiguration,
    RouteMatch,
    VirtualHost,
)
from envoy_data_plane.envoy.extensions.filters.http.buffer.v3 import Buffer
from envoy_data_plane.envoy.extensions.filters.network.http_connection_manager.v3 import (
    HttpConnectionManager,
    HttpConnectionManagerPathWithEscapedSlashesAction,
    HttpFilter,
    LocalReplyConfig,
)
from envoy_data_plane.envoy.extensions.resource_monitors.fixed_heap.v3 import FixedHeapConfig
from envoy_data_plane.envoy.extensions.retry.host.previous_hosts.v3 import PreviousHostsPredicate
from envoy_data_plane.envoy.type.matcher.v3 import StringMatcher
from envoy_data_plane.google.protobuf import Any as PbAny

from ext_proc.tools.envoygen import identity_parts, pieces
from ext_proc.tools.envoygen.emit import as_dict
from ext_proc.tools.envoygen.hcm_settings import access_log, too_large_reply
from ext_proc.tools.envoygen.late_guard import late_guard_filter, late_reply_mappers
from ext_proc.tools.envoygen.spec import MeshSpec

__all__ = ["bench_bootstrap", "local_bootstrap", "read_only_name"]

HCM = "envoy.filters.network.http_connection_manager"
HEAP = "envoy.resource_monitors.fixed_heap"
# Envoy's heap limit for the overload manager (docs/flood.md): set it to ~80 % of
# the container's memory limit.
MAX_HEAP_BYTES = 1 << 30


# Downstream HTTP/2 (a client's connection to the ingress): Envoy's own edge recommendation
# (docs "Configuring Envoy as an edge proxy"): at most 100 streams open per client connection
# (a client's further requests wait at the client, their ext_proc timers not started), 64 KiB
# stream and 1 MiB connection windows. 512 streams of 400 KB over one connection on a
# starved machine: 36 requests late in 10 runs, against 466 with Envoy's defaults (no stream
# limit, 256 MiB windows), runs alternated (docs/flood.md).
EDGE_H2_STREAMS = 100
EDGE_H2_STREAM_WINDOW_BYTES = 64 * 1024
EDGE_H2_CONNECTION_WINDOW_BYTES = 1024 * 1024


def edge_http2() -> Http2ProtocolOptions:
    return Http2ProtocolOptions(
        max_concurrent_streams=EDGE_H2_STREAMS,
        initial_stream_window_size=EDGE_H2_STREAM_WINDOW_BYTES,
        initial_connection_window_size=EDGE_H2_CONNECTION_WINDOW_BYTES,
    )


def read_only_name(path: str) -> str:
    """``/v1/models`` → ``readonly_models``."""
    return "readonly_" + path.rstrip("/").rsplit("/", 1)[-1].replace(".", "_")


def _address(port: int) -> Address:
    return Address(socket_address=SocketAddress(address="127.0.0.1", port_value=port))


def overload_manager() -> OverloadManager:
    """Envoy's own memory under a flood of long bodies: every buffered body lives in Envoy
    until ICE has judged it. At 85-95 % of the heap the streams holding the most buffered
    bytes (accounts of 1 MiB or more) are reset, from 90 % the heap is returned to the OS,
    from 95 % new requests get a 503 instead of being buffered."""
    heap = FixedHeapConfig(max_heap_size_bytes=MAX_HEAP_BYTES)

    def on(value: float) -> list[Trigger]:
        return [Trigger(name=HEAP, threshold=ThresholdTrigger(value=value))]

    return OverloadManager(
        refresh_interval=datetime.timedelta(seconds=0.25),
        resource_monitors=[ResourceMonitor(name=HEAP, typed_config=PbAny.pack(heap))],
        actions=[
            OverloadAction(
                name="envoy.overload_actions.reset_high_memory_stream",
                triggers=[
                    Trigger(
                        name=HEAP,
                        scaled=ScaledTrigger(scaling_threshold=0.85, saturation_threshold=0.95),
                    )
                ],
            ),
            OverloadAction(name="envoy.overload_actions.shrink_heap", triggers=on(0.90)),
            OverloadAction(
                name="envoy.overload_actions.stop_accepting_requests", triggers=on(0.95)
            ),
        ],
        buffer_factory_config=BufferFactoryConfig(minimum_account_to_track_power_of_two=20),
    )


def inference_routes(
    spec: MeshSpec, cluster: str, timeout_s: int = 600, *, retry_503: bool = False
) -> list[Route]:
    """Closed by default, in this order: the judged endpoints, the read-only paths, the 404.
    ``retry_503``: judged routes whose pool has several endpoints retry a 503 on another."""
    routes = [pieces.judged_route(r.name, r.path, cluster, r.profile) for r in spec.routes]
    jwt = identity_parts.providers(spec.routes)
    for route, r in zip(routes, spec.routes, strict=True):
        assert route.route is not None
        if jwt:  # each judged route names its jwt_authn requirement (or turns it off)
            config = identity_parts.jwt_route_config(r, spec.routes)
            route.typed_per_filter_config[identity_parts.JWT_AUTHN] = PbAny.pack(config)
        if timeout_s != 600:
            route.route.timeout = datetime.timedelta(seconds=timeout_s)
        if retry_503 and r.several_endpoints:
            route.route.retry_policy = _retry_once(status_503=True)
    routes += [pieces.read_only_route(read_only_name(p), p, cluster) for p in spec.read_only]
    routes.append(pieces.closed_route())
    return routes


def http_filters(spec: MeshSpec) -> list[HttpFilter]:
    """The ingress HCM's filters: no spoofing (with the identity headers a trusted service
    sets), the routes' JWT verification (when any reads a JWT), ICE (with what the routes'
    identities need), the refusal of what ICE judged too late (``late_guard``), the 404's body
    reader, the router."""
    jwt = identity_parts.jwt_filter(spec.routes)
    return [
        pieces.strip_spoofed_headers(extra=identity_parts.identity_headers(spec.routes)),
        *([jwt] if jwt is not None else []),
        identity_parts.ext_proc_filter("ice", spec.routes),
        late_guard_filter(),
        pieces.buffer_filter(),
        pieces.router_filter(),
    ]


def _hcm(
    stat_prefix: str,
    route_config: RouteConfiguration,
    filters: list[HttpFilter],
    *,
    normalise: bool = True,
    local_reply: bool = False,
    ingress: bool = False,
    log: bool = False,
) -> Filter:
    """The connection manager; ``ingress``: the clients' one (edge HTTP/2 settings, the late
    guard's 429), not the benchmark's upstream."""
    hcm = HttpConnectionManager(
        stat_prefix=stat_prefix,
        route_config=route_config,
        http_filters=filters,
    )
    if log:  # one JSON line per request with ICE's verdict, on Envoy's stdout
        hcm.access_log = [access_log()]
    if normalise:
        # Route on the path the backend will act on: /v1/chat/%63ompletions,
        # /v1/chat%2Fcompletions and //v1//chat/completions are judged as chat.
        hcm.normalize_path = True
        hcm.merge_slashes = True
        hcm.path_with_escaped_slashes_action = (
            HttpConnectionManagerPathWithEscapedSlashesAction.UNESCAPE_AND_FORWARD
        )
    if ingress:  # clients' HTTP/2 as Envoy recommends at the edge
        hcm.http2_protocol_options = edge_http2()
    # the late guard's 429, then Envoy's 413 in the API's format
    mappers = [
        *(late_reply_mappers() if ingress else []),
        *(too_large_reply().mappers if local_reply else []),
    ]
    if mappers:
        hcm.local_reply_config = LocalReplyConfig(mappers=mappers)
    return Filter(name=HCM, typed_config=PbAny.pack(hcm))


def _retry_once(*, status_503: bool = False) -> RetryPolicy:
    """A failed connection to an endpoint (ICE's pick or round robin's) is retried once on
    another: previous_hosts makes the backend cluster's policy choose again without it;
    ``status_503``: a 503 from the endpoint too (at most one retry in all)."""
    return RetryPolicy(
        retry_on="connect-failure,retriable-status-codes" if status_503 else "connect-failure",
        retriable_status_codes=[503] if status_503 else [],
        num_retries=1,
        retry_host_predicate=[
            RetryPolicyRetryHostPredicate(
                name="envoy.retry_host_predicates.previous_hosts",
                typed_config=PbAny.pack(PreviousHostsPredicate()),
            )
        ],
        host_selection_retry_max_attempts=5,
    )


def _ingress(
    spec: MeshSpec,
    port: int,
    name: str,
    routes: list[Route],
    *,
    retry: bool,
    local_reply: bool,
    log: bool,
) -> Listener:
    # Buffered request bodies up to 8 MiB (ICE's --max-body-bytes matches; larger → 413),
    # while Envoy reads at most LISTENER_READ_BYTES from one client per read event.
    vhost = VirtualHost(
        name=name,
        domains=["*"],
        routes=routes,
        request_body_buffer_limit=pieces.MAX_BODY_BYTES,
    )
    if retry:
        vhost.retry_policy = _retry_once()
    config = RouteConfiguration(
        name=name,
        response_headers_to_add=pieces.verdict_response_headers(),
        virtual_hosts=[vhost],
    )
    hcm = _hcm(
        "ingress", config, http_filters(spec), local_reply=local_reply, ingress=True, log=log
    )
    chain = FilterChain(filters=[hcm])
    if spec.tls is not None:  # client certificates required (identity source: mtls)
        chain.transport_socket = identity_parts.downstream_tls(spec.tls)
    return Listener(
        name="ingress",
        address=_address(port),
        per_connection_buffer_limit_bytes=pieces.LISTENER_READ_BYTES,
        filter_chains=[chain],
    )


def local_bootstrap(
    spec: MeshSpec,
    *,
    ice: Sequence[str] = ("127.0.0.1:50051",),
    ice_standby: bool = False,
) -> dict[str, Any]:
    """``envoy/envoy.yaml``; ``ice``: ICE's addresses (``host:port``); ``ice_standby``: in
    priority levels, the first judging and the others standing by (``pieces.ice_cluster``).
    The defaults give the checked-in file."""
    routes = inference_routes(spec, "backend", retry_503=True)
    listener = _ingress(spec, 10000, "llm", routes, retry=True, local_reply=True, log=True)
    bootstrap = Bootstrap(
        admin=Admin(address=_address(9901)),
        overload_manager=overload_manager(),
        static_resources=BootstrapStaticResources(
            listeners=[listener],
            clusters=[
                pieces.ice_cluster("ice", ice, standby=ice_standby),
                pieces.backend_cluster("backend", ["127.0.0.1:8000"]),
                *identity_parts.jwks_clusters(spec.routes),
            ],
        ),
    )
    return as_dict(bootstrap)


# The benchmark's upstream: a static low-pressure vLLM page with a big pool (4M blocks: ICE
# counts the blocks of the requests it passed since its last scrape against the free blocks,
# and this page never shows them finishing), and a fixed chat.completion.
FAST_METRICS = """\
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.3
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 4.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 0.0
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",enable_prefix_caching="True",engine="0",\
num_gpu_blocks="4000000"} 1.0
"""
FAST_CHAT = (
    '{"id":"chatcmpl-bench","object":"chat.completion","created":1764374400,"model":"m",'
    '"choices":[{"index":0,"message":{"role":"assistant","content":"Hello! How can I help you'
    ' today?"},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":80,'
    '"completion_tokens":9,"total_tokens":89}}'
)


def _content_type(value: str) -> list[HeaderValueOption]:
    return [
        HeaderValueOption(
            header=HeaderValue(key="content-type", value=value),
            append_action=HeaderValueOptionHeaderAppendAction.OVERWRITE_IF_EXISTS_OR_ADD,
        )
    ]


def _fast_upstream(port: int) -> Listener:
    def static(match: RouteMatch, content_type: str, body: str) -> Route:
        return Route(
            match=match,
            response_headers_to_add=_content_type(content_type),
            direct_response=DirectResponseAction(status=200, body=DataSource(inline_string=body)),
        )

    routes = [
        static(
            RouteMatch(path="/metrics"), "text/plain; version=0.0.4; charset=utf-8", FAST_METRICS
        ),
        static(RouteMatch(prefix="/"), "application/json", FAST_CHAT),
    ]
    config = RouteConfiguration(
        name="fast_upstream",
        virtual_hosts=[VirtualHost(name="fast_upstream", domains=["*"], routes=routes)],
    )
    # Read the whole request before answering: a direct_response otherwise answers before the
    # body arrives and closes the connection (the benchmark would measure connection set-up).
    buffer = HttpFilter(
        name=pieces.BUFFER,
        typed_config=PbAny.pack(Buffer(max_request_bytes=pieces.MAX_BODY_BYTES)),
    )
    return Listener(
        name="fast_upstream",
        address=_address(port),
        filter_chains=[
            FilterChain(
                filters=[
                    _hcm("fast_upstream", config, [buffer, pieces.router_filter()], normalise=False)
                ]
            )
        ],
    )


def bench_bootstrap(spec: MeshSpec) -> dict[str, Any]:
    """``envoy/bench.yaml``: the ingress of ``envoy.yaml`` to ``fast_upstream``, plus the
    ICE-off baseline ``chat_direct`` (header ``x-bench-route: direct``)."""
    direct = Route(
        name="chat_direct",
        match=RouteMatch(
            path="/v1/chat/completions",
            headers=[
                HeaderMatcher(name="x-bench-route", string_match=StringMatcher(exact="direct"))
            ],
        ),
        route=RouteAction(cluster="fast_upstream", timeout=datetime.timedelta(seconds=60)),
        typed_per_filter_config={pieces.EXT_PROC: PbAny.pack(pieces.ice_off())},
    )
    routes = [direct, *inference_routes(spec, "fast_upstream", timeout_s=60)]
    bootstrap = Bootstrap(
        admin=Admin(address=_address(9911)),
        overload_manager=overload_manager(),
        static_resources=BootstrapStaticResources(
            listeners=[
                # no access log: the benchmark measures ICE, not Envoy's log writing
                _ingress(spec, 10100, "bench", routes, retry=False, local_reply=False, log=False),
                _fast_upstream(10101),
            ],
            clusters=[
                pieces.ice_cluster("ice", ["127.0.0.1:50151"]),
                pieces.backend_cluster("fast_upstream", ["127.0.0.1:10101"], pick=False),
            ],
        ),
    )
    return as_dict(bootstrap)
