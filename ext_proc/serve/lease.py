"""Leader election over a Kubernetes Lease (``ice serve --leader-elect``).

Job: run the Kubernetes Python client's own election (``kubernetes.leaderelection``: its
``LeaderElection`` loop and the Lease lock of its ``resourcelock.leaselock``) in a daemon
thread (``lease_elector``), and tell the server on its asyncio loop when this replica leads
and when it stands by. ``elect_serving`` turns that into gRPC health: the services
``ELECTED_SERVICES`` ("" and ext_proc's, what Envoy and the readiness probe check) are
SERVING only while leading; ``LIVENESS_SERVICE`` stays SERVING on a standby, for the
liveness and startup probes.

Here: the entry points (``elect_serving``, ``serve_elected``), the health they set
(``HealthFlip``), and the Kubernetes side: the client configured from the pod's service
account (``load_kubernetes``), the candidate's name and namespace (``pod_identity``,
``pod_namespace``), the client's ``LeaseLock`` (``kubernetes_lock``) and the release of a
held lease (``release_lease``). The election itself, its timings (``LeaseTimings``) and its
invariants (standby first, a lost lease reported at once, reports in order, ``stop``):
``lease_elector``.

Invariants:

- ``LIVENESS_SERVICE`` is SERVING and ``ELECTED_SERVICES`` NOT_SERVING before the election
  starts; then the elected services follow the elector's reports, the latest one winning.
- Every call on the API has a timeout (``LeaseLock`` passes none), and an error there is a
  failed try, never the end of the election thread.
- ``stop`` releases a held lease (holder cleared, as client-go's ReleaseOnCancel), so a
  standby takes over at its next retry instead of after the lease duration.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import functools
import logging
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from ext_proc.serve.lease_elector import ElectionLock, LeaderElector, LeaseTimings

__all__ = [
    "DEFAULT_LEASE_NAME",
    "ELECTED_SERVICES",
    "LIVENESS_SERVICE",
    "HealthFlip",
    "LeaseError",
    "elect_serving",
    "kubernetes_lock",
    "load_kubernetes",
    "pod_identity",
    "pod_namespace",
    "release_lease",
    "serve_elected",
]

log = logging.getLogger("ice.lease")

DEFAULT_LEASE_NAME = "ice-leader"
# SERVING only on the leader: Envoy's gRPC health check (service "") and the readiness probe.
ELECTED_SERVICES = ("", "envoy.service.ext_proc.v3.ExternalProcessor")
# SERVING on every replica that runs (the event loop answers): liveness and startup probes.
LIVENESS_SERVICE = "ice.liveness"
SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
SERVING, NOT_SERVING = 1, 2  # grpc.health.v1.HealthCheckResponse.ServingStatus


class LeaseError(RuntimeError):
    """``--leader-elect`` cannot run here; the message is one line for the operator."""


class _Health(Protocol):
    async def set(self, service: str, status: Any) -> None: ...


class HealthFlip:
    """The elected services' gRPC health, set on the loop in order: the latest call wins."""

    def __init__(self, health: _Health, services: tuple[str, ...] = ELECTED_SERVICES) -> None:
        self._health, self._services = health, services
        self._want: bool | None = None
        self._task: asyncio.Task[None] | None = None

    def __call__(self, serving: bool) -> None:
        """On the loop's thread."""
        self._want = serving
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self.settle())

    async def apply(self, serving: bool) -> None:
        """Set the services now, from a coroutine on the loop."""
        self._want = serving
        await self.settle()

    async def settle(self) -> None:
        """Set the services until they show the latest wish."""
        applied: bool | None = None
        while applied is not self._want:
            want = self._want
            for service in self._services:
                await self._health.set(service, SERVING if want else NOT_SERVING)
            applied = want


# --- Kubernetes ------------------------------------------------------------------------------


def load_kubernetes() -> None:
    """The ``kubernetes`` client, configured from this pod's service account; LeaseError
    (one line) without the package or outside a pod."""
    try:
        from kubernetes import config
    except ImportError:
        raise LeaseError(
            "--leader-elect needs the kubernetes package: pip install 'ice-ext-proc[k8s]'"
        ) from None
    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException as e:
        first = (str(e).splitlines() or [""])[0]
        raise LeaseError(
            f"--leader-elect runs in a Kubernetes pod with a service-account token: {first}"
        ) from None


def pod_identity() -> str:
    """This candidate's name in the Lease: env POD_NAME (the downward API), else the host
    name (a pod's host name is its name)."""
    return os.environ.get("POD_NAME") or socket.gethostname()


def pod_namespace(explicit: str | None = None) -> str:
    """The Lease's namespace: ``explicit``, else env POD_NAMESPACE, else the service
    account's namespace file; LeaseError when none says."""
    if explicit:
        return explicit
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    with contextlib.suppress(OSError):
        found = SA_NAMESPACE.read_text().strip()
        if found:
            return found
    raise LeaseError("--leader-elect: no namespace (--lease-namespace, or env POD_NAMESPACE)")


class _TimedLeases:
    """The three Lease calls ``LeaseLock`` makes on ``CoordinationV1Api``, with a timeout."""

    def __init__(self, api: Any, timeout_s: float) -> None:
        self.api, self.timeout_s = api, timeout_s

    def read_namespaced_lease(self, name: str, namespace: str) -> Any:
        return self.api.read_namespaced_lease(name, namespace, _request_timeout=self.timeout_s)

    def create_namespaced_lease(self, namespace: str, body: Any) -> Any:
        return self.api.create_namespaced_lease(namespace, body, _request_timeout=self.timeout_s)

    def replace_namespaced_lease(self, name: str, namespace: str, body: Any) -> Any:
        return self.api.replace_namespaced_lease(
            name=name, namespace=namespace, body=body, _request_timeout=self.timeout_s
        )


def kubernetes_lock(
    name: str, namespace: str, identity: str, *, timeout_s: float, api: Any = None
) -> Any:
    """The client's own ``LeaseLock`` (optimistic: a write carries the resourceVersion it
    read, a conflict is a failed try), its calls timed out after ``timeout_s``; ``api``: a
    ``CoordinationV1Api`` (default: the one of the loaded config)."""
    from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock

    lock: Any = LeaseLock(name, namespace, identity)  # type: ignore[no-untyped-call]
    lock.api_instance = _TimedLeases(api if api is not None else lock.api_instance, timeout_s)
    return lock


def release_lease(lock: Any) -> bool:
    """Clear the holder of ``lock``'s Lease when it is ``lock``'s identity (lease duration
    1 s, as client-go's release): the Python and Go clients then take it at their next try.
    False when another holds it."""
    api = lock.api_instance
    lease = api.read_namespaced_lease(lock.name, lock.namespace)
    spec = lease.spec
    if spec is None or spec.holder_identity != lock.identity:
        return False
    now = datetime.datetime.now(datetime.UTC)
    spec.holder_identity = None
    spec.lease_duration_seconds = 1
    spec.acquire_time = spec.renew_time = now
    api.replace_namespaced_lease(name=lock.name, namespace=lock.namespace, body=lease)
    return True


async def serve_elected(
    health: _Health,
    lock: ElectionLock,
    *,
    timings: LeaseTimings | None = None,
    release: Callable[[], object] | None = None,
) -> LeaderElector:
    """``LIVENESS_SERVICE`` SERVING, ``ELECTED_SERVICES`` NOT_SERVING, then the election over
    ``lock`` started: they turn SERVING while this replica leads. On the server's loop; the
    caller ``await``s ``aclose()`` at shutdown."""
    await health.set(LIVENESS_SERVICE, SERVING)
    flip = HealthFlip(health)
    await flip.apply(False)
    elector = LeaderElector(
        lock,
        on_leading=functools.partial(flip, True),
        on_standby=functools.partial(flip, False),
        loop=asyncio.get_running_loop(),
        timings=timings,
        release=release,
    )
    elector.start()
    return elector


async def elect_serving(
    health: _Health,
    *,
    lease_name: str = DEFAULT_LEASE_NAME,
    lease_namespace: str | None = None,
    timings: LeaseTimings | None = None,
) -> LeaderElector:
    """``ice serve --leader-elect``: ``serve_elected`` over the Lease ``lease_name`` (in
    ``pod_namespace(lease_namespace)``, as ``pod_identity()``). LeaseError (one line)
    without the kubernetes package or outside a pod."""
    load_kubernetes()
    namespace = pod_namespace(lease_namespace)
    identity = pod_identity()
    timings = timings or LeaseTimings()
    lock = kubernetes_lock(lease_name, namespace, identity, timeout_s=timings.retry_period_s)
    # The client logs every try at INFO (each renewal, each standby's look): ICE logs the
    # transitions instead.
    logging.getLogger("leaderelection").setLevel(logging.WARNING)
    elector = await serve_elected(
        health, lock, timings=timings, release=functools.partial(release_lease, lock)
    )
    log.info("lease %s/%s: standing for election as %s", namespace, lease_name, identity)
    return elector
