"""The parts of ICE's and the backend's clusters (``pieces.ice_cluster``,
``pieces.backend_cluster``), as typed messages.

- ``endpoint``: ``host:port`` → an endpoint; ``_assignment``: the addresses in one locality;
  ``_priorities``: one priority level per address, in order (active-passive: 0 is the active).
- ``_health_check``: ICE's gRPC health check, every shape (``HEALTH_*``: interval, timeout
  and thresholds, and why each); with ``standby``, one failed check is enough (``STANDBY_*``).
- ``_outlier_detection``: a replica that refuses a stream's connection is ejected at once
  (``OUTLIER_*``).

Invariants: pure (no I/O); every value is a typed message, rendered only by ``emit.as_dict``;
the same addresses give the same assignment, in their order.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable

from envoy_data_plane.envoy.config.cluster.v3 import OutlierDetection
from envoy_data_plane.envoy.config.core.v3 import (
    Address,
    BackoffStrategy,
    HealthCheck,
    HealthCheckGrpcHealthCheck,
    RetryPolicy,
    RetryPolicyRetryHostPredicate,
    SocketAddress,
)
from envoy_data_plane.envoy.config.endpoint.v3 import (
    ClusterLoadAssignment,
    Endpoint,
    LbEndpoint,
    LocalityLbEndpoints,
)
from envoy_data_plane.envoy.extensions.retry.host.previous_hosts.v3 import (
    PreviousHostsPredicate,
)
from envoy_data_plane.google.protobuf import Any as PbAny

__all__ = [
    "HEALTHY_THRESHOLD",
    "HEALTH_INTERVAL",
    "HEALTH_TIMEOUT",
    "OUTLIER_EJECTION",
    "OUTLIER_INTERVAL",
    "OUTLIER_MAX_EJECTION",
    "OUTLIER_MAX_EJECTION_PERCENT",
    "STANDBY_HEALTHY_THRESHOLD",
    "STANDBY_HEALTH_INTERVAL",
    "STANDBY_HEALTH_TIMEOUT",
    "STANDBY_UNHEALTHY_THRESHOLD",
    "UNHEALTHY_THRESHOLD",
    "endpoint",
]


def endpoint(address: str) -> LbEndpoint:
    """``host:port`` → an endpoint."""
    host, _, port = address.rpartition(":")
    return LbEndpoint(
        endpoint=Endpoint(
            address=Address(socket_address=SocketAddress(address=host, port_value=int(port)))
        )
    )


def _assignment(name: str, addresses: Iterable[str]) -> ClusterLoadAssignment:
    return ClusterLoadAssignment(
        cluster_name=name,
        endpoints=[LocalityLbEndpoints(lb_endpoints=[endpoint(a) for a in addresses])],
    )


def _priorities(name: str, addresses: Iterable[str]) -> ClusterLoadAssignment:
    """One priority level per address, in order: 0 (the active) first."""
    return ClusterLoadAssignment(
        cluster_name=name,
        endpoints=[
            LocalityLbEndpoints(lb_endpoints=[endpoint(a)], priority=i)
            for i, a in enumerate(addresses)
        ],
    )


# Every ICE cluster's health checks (Envoy's gRPC health, which ICE answers on the event loop
# that judges). Envoy checks a cluster it thinks idle only every ``no_traffic_interval`` (60 s
# by default), and ext_proc streams do not count as traffic for it: so the interval applies
# without traffic too, or a replica that died (or started) while Envoy thought the cluster
# idle would keep its old state for a minute.
# - A dead ICE refuses the check's connection at once: out after UNHEALTHY_THRESHOLD checks,
#   HEALTH_INTERVAL apart (≤ 1 s; with traffic, outlier detection ejects it on the first
#   refused stream, before any check).
# - A hung ICE (or a lost node) accepts and never answers: each check waits HEALTH_TIMEOUT,
#   so it is out after about UNHEALTHY_THRESHOLD × (HEALTH_INTERVAL + HEALTH_TIMEOUT) ≤ 3 s;
#   meanwhile the streams sent to it wait Envoy's message timeout and pass unjudged.
# - A busy event loop (a heavy body held it a few hundred ms) answers late but answers: a
#   check fails only past HEALTH_TIMEOUT, and it takes UNHEALTHY_THRESHOLD such checks in a
#   row, so a replica is taken out only after about 1.5 s of silence.
# - A restarted ICE is back after HEALTHY_THRESHOLD passing checks (≈ 1 s; its outlier
#   ejection ends with the first passing check).
HEALTH_INTERVAL = datetime.timedelta(seconds=0.5)
HEALTH_TIMEOUT = datetime.timedelta(seconds=1)
UNHEALTHY_THRESHOLD = 2
HEALTHY_THRESHOLD = 2

# Active-passive (``ice_cluster(standby=True)``). The same checks, but one failed check is
# enough: every Envoy must leave a failing active at once, since streams sent to it in the
# meantime pass unjudged (fail-open). Each spurious miss moves the traffic (and the in-flight
# accounting) to the standby, which the timeout of 1 s keeps rare.
STANDBY_HEALTH_INTERVAL = HEALTH_INTERVAL
STANDBY_HEALTH_TIMEOUT = HEALTH_TIMEOUT
STANDBY_UNHEALTHY_THRESHOLD = 1
STANDBY_HEALTHY_THRESHOLD = HEALTHY_THRESHOLD

# Outlier detection, local-origin failures apart (a refused or reset connection, a connect
# timeout): the first one ejects the replica, so a crashed ICE gets no second stream. ICE's own
# gRPC errors (a 5xx for Envoy) eject only as Envoy's default says, after 5 in a row (a
# replica shutting down answers UNAVAILABLE); success-rate rules are off. An ejected replica
# comes back with its first passing health check (Envoy's default
# ``successful_active_health_check_uneject_host``), else after OUTLIER_EJECTION (×n for its
# n-th ejection, at most OUTLIER_MAX_EJECTION). At most half a cluster is ejected this way;
# the health checks take out the rest.
OUTLIER_INTERVAL = datetime.timedelta(seconds=1)
OUTLIER_EJECTION = datetime.timedelta(seconds=5)
OUTLIER_MAX_EJECTION = datetime.timedelta(seconds=30)
OUTLIER_MAX_EJECTION_PERCENT = 50


# A stream Envoy opens to a replica that refuses it (dead, not yet ejected) is opened again on
# another replica, before any message of it went out: the request is still judged. Only
# failures before the stream exists are retried (a stream ICE has answered on is never sent
# twice); STREAM_RETRIES other replicas are tried, STREAM_RETRY_BACKOFF apart.
STREAM_RETRY_ON = "connect-failure,refused-stream,reset-before-request"
STREAM_RETRIES = 2
STREAM_RETRY_BACKOFF = datetime.timedelta(milliseconds=5)
STREAM_RETRY_BACKOFF_MAX = datetime.timedelta(milliseconds=20)


def _previous_hosts() -> PbAny:
    return PbAny.pack(PreviousHostsPredicate())


def stream_retry_policy() -> RetryPolicy:
    """The ext_proc stream's retry policy (``GrpcService.retry_policy``), as above."""
    return RetryPolicy(
        retry_on=STREAM_RETRY_ON,
        num_retries=STREAM_RETRIES,
        retry_back_off=BackoffStrategy(
            base_interval=STREAM_RETRY_BACKOFF, max_interval=STREAM_RETRY_BACKOFF_MAX
        ),
        retry_host_predicate=[
            RetryPolicyRetryHostPredicate(
                name="envoy.retry_host_predicates.previous_hosts",
                typed_config=_previous_hosts(),
            )
        ],
        host_selection_retry_max_attempts=3,
    )


def _health_check(*, standby: bool) -> HealthCheck:
    return HealthCheck(
        timeout=HEALTH_TIMEOUT,
        interval=HEALTH_INTERVAL,
        unhealthy_threshold=STANDBY_UNHEALTHY_THRESHOLD if standby else UNHEALTHY_THRESHOLD,
        healthy_threshold=HEALTHY_THRESHOLD,
        no_traffic_interval=HEALTH_INTERVAL,
        grpc_health_check=HealthCheckGrpcHealthCheck(),
    )


def _outlier_detection() -> OutlierDetection:
    return OutlierDetection(
        split_external_local_origin_errors=True,
        consecutive_local_origin_failure=1,
        enforcing_consecutive_local_origin_failure=100,
        enforcing_consecutive_gateway_failure=0,
        enforcing_success_rate=0,
        enforcing_local_origin_success_rate=0,
        interval=OUTLIER_INTERVAL,
        base_ejection_time=OUTLIER_EJECTION,
        max_ejection_time=OUTLIER_MAX_EJECTION,
        max_ejection_percent=OUTLIER_MAX_EJECTION_PERCENT,
    )
