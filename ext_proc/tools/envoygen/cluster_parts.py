"""The parts of ICE's and the backend's clusters (``pieces.ice_cluster``,
``pieces.backend_cluster``), as typed messages.

- ``endpoint``: ``host:port`` → an endpoint; ``_assignment``: the addresses in one locality;
  ``_priorities``: one priority level per address, in order (active-passive: 0 is the active).
- ``_health_check``: ICE's gRPC health check; with ``standby``, the active-passive's faster
  one (``STANDBY_*``: interval, timeout and thresholds, and why each).

Invariants: pure (no I/O); every value is a typed message, rendered only by ``emit.as_dict``;
the same addresses give the same assignment, in their order.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable

from envoy_data_plane.envoy.config.core.v3 import (
    Address,
    HealthCheck,
    HealthCheckGrpcHealthCheck,
    SocketAddress,
)
from envoy_data_plane.envoy.config.endpoint.v3 import (
    ClusterLoadAssignment,
    Endpoint,
    LbEndpoint,
    LocalityLbEndpoints,
)

__all__ = [
    "STANDBY_HEALTHY_THRESHOLD",
    "STANDBY_HEALTH_INTERVAL",
    "STANDBY_HEALTH_TIMEOUT",
    "STANDBY_UNHEALTHY_THRESHOLD",
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


# Active-passive (``ice_cluster(standby=True)``). A crashed ICE refuses the next check's
# connection, so it is out after at most one interval (0.5 s); a hung one or a lost node after
# interval + timeout (1.5 s). One failed check is enough: every Envoy must leave a failing
# active at once, since streams sent to it in the meantime pass unjudged (fail-open). The
# timeout stays at 1 s, not lower: ICE answers health on the event loop that judges, which a
# heavy body can hold for a few hundred ms, and each spurious miss moves the traffic (and the
# in-flight accounting) to the standby. Two passing checks (1 s) bring a restarted active back.
STANDBY_HEALTH_INTERVAL = datetime.timedelta(seconds=0.5)
STANDBY_HEALTH_TIMEOUT = datetime.timedelta(seconds=1)
STANDBY_UNHEALTHY_THRESHOLD = 1
STANDBY_HEALTHY_THRESHOLD = 2


def _health_check(*, standby: bool) -> HealthCheck:
    if not standby:
        return HealthCheck(
            timeout=datetime.timedelta(seconds=1),
            interval=datetime.timedelta(seconds=2),
            unhealthy_threshold=2,
            healthy_threshold=1,
            grpc_health_check=HealthCheckGrpcHealthCheck(),
        )
    return HealthCheck(
        timeout=STANDBY_HEALTH_TIMEOUT,
        interval=STANDBY_HEALTH_INTERVAL,
        unhealthy_threshold=STANDBY_UNHEALTHY_THRESHOLD,
        healthy_threshold=STANDBY_HEALTHY_THRESHOLD,
        # Envoy checks a cluster that has never carried traffic every 60 s by default: a fresh
        # Envoy whose active dies before its first request would keep it for up to a minute.
        no_traffic_interval=STANDBY_HEALTH_INTERVAL,
        grpc_health_check=HealthCheckGrpcHealthCheck(),
    )
