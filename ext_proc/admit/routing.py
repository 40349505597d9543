"""Routes: what the gRPC metadata Envoy sends with each stream selects in the policy.

``Router.resolve`` maps ``x-ice-route``, ``x-ice-profile``, ``x-ice-pool`` and
``x-ice-priority`` (set per route in Envoy's ext_proc ``grpc_service.initial_metadata``) to a
``Route``: the route's binding in the policy, overridden field by field by explicit metadata.
What a client's priority header may do on the route (``client_priority``: cap, trust or
ignore) is the binding's, else its profile's; metadata does not change it.

Invariants: an unknown profile or pool falls back to the policy's default, with one warning
per name (never a failed request); a ``Route`` is immutable and rebuilt from its ``key`` by
``route_for`` (the offload helper does so from plain data); at most 1,024 distinct keys are
cached, so metadata cannot grow the cache without bound.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from ext_proc.policy.settings import (
    PRIORITIES,
    ClientPriority,
    IdentitySpec,
    Policy,
    Priority,
    Profile,
)
from ext_proc.schemas import SCHEMAS, SchemaAdapter

__all__ = ["Route", "Router"]

log = logging.getLogger("ice.pipeline")


@dataclass(frozen=True, slots=True)
class Route:
    """What a route's gRPC metadata selects. ``key`` rebuilds it: ``Router.route_for(key)``.
    ``default_priority``: the route's priority; ``client_priority``: what a client's priority
    header may do to it (``ext_proc.admit.headers.judged_priority``)."""

    name: str
    profile: Profile
    pool: str
    default_priority: Priority
    key: tuple[str, str, str, str] = ("", "", "", "")
    schema: SchemaAdapter | None = None  # the binding's schema; None: chosen by path
    client_priority: ClientPriority = "cap"
    # who is asking (ext_proc.admit.identity): the binding's, else the profile's
    identity: IdentitySpec = field(default_factory=IdentitySpec)


class Router:
    """Resolves route metadata against the policy; unknown names fall back to defaults."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self._cache: dict[tuple[str, str, str, str], Route] = {}
        self._warned: set[str] = set()

    def resolve(self, metadata: Iterable[tuple[str, str | bytes]]) -> Route:
        name = profile = pool = priority = ""
        for key, value in metadata:
            if not key.startswith("x-ice-") or not isinstance(value, str):
                continue
            if key == "x-ice-route":
                name = value
            elif key == "x-ice-profile":
                profile = value
            elif key == "x-ice-pool":
                pool = value
            elif key == "x-ice-priority":
                priority = value
        return self.route_for((name, profile, pool, priority))

    def route_for(self, key: tuple[str, str, str, str]) -> Route:
        """The route for metadata values (route, profile, pool, priority)."""
        route = self._cache.get(key)
        if route is None:
            route = self._build(*key)
            if len(self._cache) < 1024:
                self._cache[key] = route
        return route

    def _warn_once(self, what: str) -> None:
        if what not in self._warned:
            self._warned.add(what)
            log.warning("%s; using the default", what)

    def _build(self, name: str, profile: str, pool: str, priority: str) -> Route:
        p = self.policy
        binding = p.routes.get(name)
        schema = SCHEMAS.get(binding.schema) if binding is not None else None
        if binding is not None:
            profile = profile or binding.profile
            pool = pool or binding.pool
            priority = priority or (binding.priority or "")
        if profile and profile not in p.profiles:
            self._warn_once(f"route {name or '?'} names unknown profile {profile!r}")
            profile = ""
        if pool and pool not in p.pools:
            self._warn_once(f"route {name or '?'} names unknown pool {pool!r}")
            pool = ""
        prof = p.profiles[profile or p.default_profile]
        prio: Priority = prof.default_priority
        client = prof.client_priority
        if binding is not None and binding.client_priority is not None:
            client = binding.client_priority
        for candidate in PRIORITIES:
            if candidate == priority:
                prio = candidate
        return Route(
            name=name or "default",
            profile=prof,
            pool=pool or p.default_pool,
            default_priority=prio,
            key=(name, profile, pool, priority),
            schema=schema,
            client_priority=client,
            identity=binding.identity
            if binding is not None and binding.identity is not None
            else prof.identity,
        )
