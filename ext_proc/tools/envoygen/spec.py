"""The input of ``ice envoy-config``: which paths ICE judges, as which route and profile, and
where ICE and the backend run (``envoy/mesh.yaml`` is the shipped one).

    policy: ../ext_proc/default_policy.yaml   # the routes and profiles are checked against it
    ice: {service: ice, namespace: ice-system, port: 50051}
    backend: {service: vllm, namespace: llm, port: 8000, selector: {app: vllm}}
                                 # target_port: the container's port (default: port)
    gateway: {name: llm-gateway, namespace: llm, istio_selector: {istio: ingressgateway},
              hosts: [llm.example.com]}   # required: the Host names clients send
                                 # port: 80, target_port: 8080 (the gateway pods' port)
    routes:
    - {name: chat, path: /v1/chat/completions}
    - {name: completions, path: /v1/completions, profile: batch}   # profile: optional
    read_only: [/v1/models, /health, /version, /ping]
    tls: {cert: tls/server.pem, key: tls/server.key, client_ca: tls/ca.pem}   # optional:
                                 # the local listener's TLS, client certificates required
                                 # (required when a route's identity is source: mtls)

Each route also learns from the policy whether its pool (the policy's binding for the route,
else its default pool) has several endpoints: more than one ``metrics_urls``, or endpoints
found by DNS or Prometheus (``RouteSpec.several_endpoints``; the local bootstrap retries a
backend's 503 on another endpoint there).

Invariants: ``load_spec`` either returns a complete, checked ``MeshSpec`` or raises
``SpecError`` with one line naming the field (``routes[2].profile: ...``); a route's name is
one of the policy's routes and its profile (when given) one of its profiles; paths are
exact, start with ``/``, carry no query and are unique; names are unique; ``gateway.hosts``
is given (the Istio Gateway's and VirtualService's hosts: on a shared ingress gateway, ``*``
puts ICE's routes in one virtual host with every other ``*`` VirtualService, so ``*`` is
never a default, only what a spec says) and holds DNS names (``*.`` prefix allowed) or ``*``
alone.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ext_proc.policy.settings import IdentitySpec

__all__ = [
    "Backend",
    "Gateway",
    "Ice",
    "ListenerTls",
    "MeshSpec",
    "RouteSpec",
    "SpecError",
    "load_spec",
]

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
ROUTE_NAME = re.compile(r"^[A-Za-z0-9_][-A-Za-z0-9_.]*$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
HOST = re.compile(
    r"^(\*\.)?[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*$"
)
ANY_HOST = "*"


class SpecError(ValueError):
    """A bad spec: one line, naming the field."""


@dataclass(frozen=True, slots=True)
class RouteSpec:
    name: str  # the policy's route (x-ice-route)
    path: str  # exact, after Envoy's path normalisation
    profile: str | None = None  # x-ice-profile; None: the policy's binding for the route
    several_endpoints: bool = False  # the route's pool has more than one endpoint
    # who is asking on the route (the policy's: the binding's, else the profile's;
    # docs/identity.md): the filters it needs (jwt_authn, the peer certificate's attributes)
    identity: IdentitySpec = field(default_factory=IdentitySpec)


@dataclass(frozen=True, slots=True)
class Ice:
    service: str = "ice"
    namespace: str = "ice-system"
    port: int = 50051

    @property
    def host(self) -> str:
        return f"{self.service}.{self.namespace}.svc.cluster.local"


@dataclass(frozen=True, slots=True)
class Backend:
    service: str = "vllm"
    namespace: str = "llm"
    port: int = 8000  # the Service's port (Istio's inbound vhost ``inbound|http|PORT``)
    selector: tuple[tuple[str, str], ...] = (("app", "vllm"),)
    target_port: int | None = None  # the container's port; None: ``port``

    @property
    def host(self) -> str:
        return f"{self.service}.{self.namespace}.svc.cluster.local"

    @property
    def container_port(self) -> int:
        """The port the pods listen on: Istio keys its inbound filter chain, route table
        (``inbound|PORT||``) and cluster by it, not by the Service's port."""
        return self.target_port if self.target_port is not None else self.port


@dataclass(frozen=True, slots=True)
class Gateway:
    name: str = "llm-gateway"
    namespace: str = "llm"
    istio_selector: tuple[tuple[str, str], ...] = (("istio", "ingressgateway"),)
    istio_namespace: str = "istio-system"
    port: int = 80  # the Gateway server's port (the gateway Service's port)
    target_port: int = 8080  # the gateway pods' port for it: Istio's listener ``0.0.0.0_PORT``
    # The Host names clients send (Istio's Gateway and VirtualService ``hosts``); required in
    # a spec (``()`` only before ``parse_spec``); ``("*",)`` only when the spec says so.
    hosts: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ListenerTls:
    """The local listener's TLS (files on Envoy's host): its certificate and key, and the CA
    that signs client certificates (required on every connection: identity ``source:
    mtls``)."""

    cert: str
    key: str
    client_ca: str


@dataclass(frozen=True, slots=True)
class MeshSpec:
    routes: tuple[RouteSpec, ...]
    read_only: tuple[str, ...] = ("/v1/models", "/health", "/version", "/ping")
    ice: Ice = field(default_factory=Ice)
    backend: Backend = field(default_factory=Backend)
    gateway: Gateway = field(default_factory=Gateway)
    policy: Path | None = None
    tls: ListenerTls | None = None  # the local listener's; None: plain HTTP

    @property
    def profiled(self) -> bool:
        """True when some route names its own profile."""
        return any(r.profile for r in self.routes)


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SpecError(f"{where}: expected a mapping, got {type(value).__name__}")
    return value


def _only(doc: dict[str, Any], where: str, allowed: set[str]) -> None:
    extra = sorted(set(doc) - allowed)
    if extra:
        raise SpecError(f"{where}{extra[0]}: unknown field (known: {', '.join(sorted(allowed))})")


def _name(value: Any, where: str, pattern: re.Pattern[str] = DNS_LABEL) -> str:
    if not isinstance(value, str) or not pattern.match(value):
        raise SpecError(f"{where}: {value!r} is not a valid name")
    return value


def _port(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
        raise SpecError(f"{where}: {value!r} is not a port (1-65535)")
    return value


def _path(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.startswith("/"):
        raise SpecError(f"{where}: {value!r} is not a path (it must start with /)")
    if any(c in value for c in "?#% \t") or "//" in value:
        raise SpecError(f"{where}: {value!r} must be an exact, normalised path without a query")
    return value


def _labels(value: Any, where: str) -> tuple[tuple[str, str], ...]:
    doc = _mapping(value, where)
    if not doc:
        raise SpecError(f"{where}: needs at least one label")
    out = []
    for k, v in sorted(doc.items()):
        if not isinstance(k, str) or not isinstance(v, str) or not LABEL_VALUE.match(v):
            raise SpecError(f"{where}.{k}: {v!r} is not a label value")
        out.append((k, v))
    return tuple(out)


def _hosts(value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        raise SpecError(
            f"{where}: missing: the Host names clients send to the gateway, e.g. "
            "[llm.example.com]; ['*'] takes every host, shared with any other '*' "
            "VirtualService on the gateway (docs/deploy-istio.md#hosts)"
        )
    if not isinstance(value, list) or not value:
        raise SpecError(f"{where}: expected a non-empty list of host names")
    for i, h in enumerate(value):
        if not isinstance(h, str) or not (h == ANY_HOST or HOST.match(h)):
            raise SpecError(f"{where}[{i}]: {h!r} is not a host name (or '*')")
    if len(set(value)) != len(value):
        raise SpecError(f"{where}: a host appears twice")
    if ANY_HOST in value and len(value) > 1:
        raise SpecError(f"{where}: '*' takes every host: give it alone")
    return tuple(value)


_PolicyFacts = tuple[set[str], set[str], set[str], Callable[[str, str | None], IdentitySpec]]


def _policy_facts(path: Path | None) -> _PolicyFacts:
    """The policy's route and profile names, the routes whose pool has several endpoints
    (``path`` None: the built-in default policy), and a route's identity (by route and the
    spec's profile, as ``ext_proc.admit.routing.Router`` resolves it)."""
    from ext_proc.policy.load import PolicyError, load_policy

    try:
        policy = load_policy(path)
    except (PolicyError, OSError) as e:
        raise SpecError(f"policy: {e}") from None
    several = set()
    for name, binding in policy.routes.items():
        pool = policy.pools.get(binding.pool or policy.default_pool)
        if pool is not None and (
            len(pool.metrics_urls) > 1 or pool.dns_name or pool.prometheus_url
        ):
            several.add(name)

    def identity(route: str, profile: str | None) -> IdentitySpec:
        binding = policy.routes[route]
        if binding.identity is not None:
            return binding.identity
        return policy.profiles[profile or binding.profile or policy.default_profile].identity

    return set(policy.routes), set(policy.profiles), several, identity


def parse_spec(doc: Any, base: Path | None = None) -> MeshSpec:
    """Check a spec document; relative ``policy`` paths are read from ``base``."""
    doc = _mapping(doc, "spec")
    _only(doc, "", {"policy", "ice", "backend", "gateway", "routes", "read_only", "tls"})
    policy: Path | None = None
    if doc.get("policy") is not None:
        if not isinstance(doc["policy"], str):
            raise SpecError("policy: expected a file path")
        policy = (base or Path.cwd()) / doc["policy"]
    routes_known, profiles_known, several, identity = _policy_facts(policy)

    ice_doc = _mapping(doc.get("ice"), "ice")
    _only(ice_doc, "ice.", {"service", "namespace", "port"})
    ice = Ice(
        service=_name(ice_doc.get("service", Ice().service), "ice.service"),
        namespace=_name(ice_doc.get("namespace", Ice().namespace), "ice.namespace"),
        port=_port(ice_doc.get("port", Ice().port), "ice.port"),
    )
    be_doc = _mapping(doc.get("backend"), "backend")
    _only(be_doc, "backend.", {"service", "namespace", "port", "selector", "target_port"})
    backend = Backend(
        service=_name(be_doc.get("service", Backend().service), "backend.service"),
        namespace=_name(be_doc.get("namespace", Backend().namespace), "backend.namespace"),
        port=_port(be_doc.get("port", Backend().port), "backend.port"),
        selector=_labels(be_doc["selector"], "backend.selector")
        if "selector" in be_doc
        else Backend().selector,
        target_port=_port(be_doc["target_port"], "backend.target_port")
        if be_doc.get("target_port") is not None
        else None,
    )
    gw_doc = _mapping(doc.get("gateway"), "gateway")
    _only(
        gw_doc,
        "gateway.",
        {"name", "namespace", "istio_selector", "istio_namespace", "port", "target_port", "hosts"},
    )
    gateway = Gateway(
        name=_name(gw_doc.get("name", Gateway().name), "gateway.name"),
        namespace=_name(gw_doc.get("namespace", backend.namespace), "gateway.namespace"),
        istio_selector=_labels(gw_doc["istio_selector"], "gateway.istio_selector")
        if "istio_selector" in gw_doc
        else Gateway().istio_selector,
        istio_namespace=_name(
            gw_doc.get("istio_namespace", Gateway().istio_namespace), "gateway.istio_namespace"
        ),
        port=_port(gw_doc.get("port", Gateway().port), "gateway.port"),
        target_port=_port(gw_doc.get("target_port", Gateway().target_port), "gateway.target_port"),
        hosts=_hosts(gw_doc.get("hosts"), "gateway.hosts"),
    )

    raw_routes = doc.get("routes")
    if not isinstance(raw_routes, list) or not raw_routes:
        raise SpecError("routes: expected a non-empty list of {name, path[, profile]}")
    routes: list[RouteSpec] = []
    names: set[str] = set()
    paths: set[str] = set()
    for i, raw in enumerate(raw_routes):
        where = f"routes[{i}]"
        r = _mapping(raw, where)
        _only(r, f"{where}.", {"name", "path", "profile"})
        if "path" not in r:
            raise SpecError(f"{where}.path: missing")
        name = _name(r.get("name"), f"{where}.name", ROUTE_NAME)
        if name not in routes_known:
            raise SpecError(f"{where}.name: {name!r} is not a route of the policy")
        path = _path(r["path"], f"{where}.path")
        profile = r.get("profile")
        if profile is not None and profile not in profiles_known:
            raise SpecError(f"{where}.profile: unknown profile {profile!r}")
        if name in names:
            raise SpecError(f"{where}.name: {name!r} appears twice")
        if path in paths:
            raise SpecError(f"{where}.path: {path!r} appears twice")
        names.add(name)
        paths.add(path)
        routes.append(
            RouteSpec(
                name=name,
                path=path,
                profile=profile,
                several_endpoints=name in several,
                identity=identity(name, profile),
            )
        )

    read_only = doc.get("read_only", list(MeshSpec(routes=()).read_only))
    if not isinstance(read_only, list):
        raise SpecError("read_only: expected a list of paths")
    checked = tuple(_path(p, f"read_only[{i}]") for i, p in enumerate(read_only))
    for i, p in enumerate(checked):
        if p in paths:
            raise SpecError(f"read_only[{i}]: {p!r} is also a judged route's path")
    tls = _tls(doc.get("tls"), base)
    if tls is None and any(r.identity.source == "mtls" for r in routes):
        raise SpecError(
            "tls: missing: a route's identity is source: mtls, so the listener needs TLS with "
            "client certificates (tls: {cert, key, client_ca}; docs/identity.md)"
        )
    return MeshSpec(
        routes=tuple(routes),
        read_only=checked,
        ice=ice,
        backend=backend,
        gateway=gateway,
        policy=policy,
        tls=tls,
    )


def _tls(value: Any, base: Path | None) -> ListenerTls | None:
    """``tls: {cert, key, client_ca}``: file paths (relative ones from ``base``)."""
    if value is None:
        return None
    doc = _mapping(value, "tls")
    _only(doc, "tls.", {"cert", "key", "client_ca"})
    paths = []
    for name in ("cert", "key", "client_ca"):
        text = doc.get(name)
        if not isinstance(text, str) or not text:
            raise SpecError(f"tls.{name}: missing (a file path)")
        paths.append(str((base or Path.cwd()) / text))
    return ListenerTls(*paths)


def load_spec(path: Path) -> MeshSpec:
    """Read and check the spec at ``path``."""
    try:
        doc = yaml.safe_load(path.read_text())
    except OSError as e:
        raise SpecError(f"{path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise SpecError(f"{path}: not YAML ({str(e).splitlines()[0]})") from None
    return parse_spec(doc, path.parent)
