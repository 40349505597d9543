"""Envoy's configuration as the doctor reads it: admin ``/config_dump`` (or a bootstrap file)
→ the HTTP connection managers with their filters and route tables, and the clusters.

Job: ``from_config_dump`` and ``from_bootstrap`` build one ``EnvoyView`` from either source,
so that every check reads the same shapes whatever Envoy was configured by:

- listeners: ``static_listeners`` and ``dynamic_listeners`` (their active state; warming
  ones are noted, not checked), each filter chain and the default filter chain;
- an HCM's route table: inline ``route_config``, or ``rds`` resolved in the dump's
  ``RoutesConfigDump`` (static and dynamic); ``scoped_routes`` are noted as not read;
- HTTP filters: ``typed_config`` (``TypedStruct`` unwrapped), or ``config_discovery``
  resolved in the ``EcdsConfigDump`` (else its ``default_config``);
- clusters: static, dynamic active and dynamic warming.

Invariants: pure (no I/O); never raises on a shape it does not know (a missing or odd field
reads as absent); type names are the part of ``@type`` after the last ``/``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

__all__ = [
    "EXT_PROC_TYPE",
    "HCM_TYPE",
    "EnvoyView",
    "FilterView",
    "HcmView",
    "as_dict",
    "as_list",
    "from_bootstrap",
    "from_config_dump",
    "type_name",
    "unwrap",
]

HCM_TYPE = "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
EXT_PROC_TYPE = "envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor"
TYPED_STRUCTS = ("udpa.type.v1.TypedStruct", "xds.type.v3.TypedStruct")
HCM_NAME = "envoy.filters.network.http_connection_manager"
DEFAULT_BUFFER_LIMIT_BYTES = 1024 * 1024  # Envoy's per_connection_buffer_limit_bytes default


def as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def type_name(config: Any) -> str:
    """``type.googleapis.com/a.b.C`` → ``a.b.C`` ("" when there is none)."""
    url = as_dict(config).get("@type", "")
    return url.rsplit("/", 1)[-1] if isinstance(url, str) else ""


def unwrap(config: Any) -> tuple[str, dict[str, Any]]:
    """A typed config → (its type name, its fields); a ``TypedStruct`` gives its inner type
    and value."""
    d = as_dict(config)
    name = type_name(d)
    if name in TYPED_STRUCTS:
        inner = d.get("type_url", "")
        return (inner.rsplit("/", 1)[-1] if isinstance(inner, str) else ""), as_dict(d.get("value"))
    return name, d


@dataclass(frozen=True, slots=True)
class FilterView:
    """One HTTP filter of an HCM, in chain order."""

    name: str
    type: str  # "" when neither typed_config nor a discovered config gave one
    config: dict[str, Any]
    disabled: bool  # off unless a route turns it on


@dataclass(frozen=True, slots=True)
class HcmView:
    """One HTTP connection manager and where it sits."""

    listener: str
    buffer_limit_bytes: int  # the listener's per_connection_buffer_limit_bytes (or default)
    buffer_limit_set: bool
    hcm: dict[str, Any]
    filters: tuple[FilterView, ...]
    route_config: dict[str, Any] | None  # None: the table could not be found (see route_source)
    route_source: str  # "inline", "rds <name>", "rds <name> (not in the dump)", "scoped"


@dataclass(frozen=True, slots=True)
class EnvoyView:
    hcms: tuple[HcmView, ...]
    clusters: dict[str, dict[str, Any]]
    source: str  # "config_dump" | "bootstrap"
    notes: tuple[str, ...] = ()


def _configs(dump: dict[str, Any], kind: str) -> Iterator[dict[str, Any]]:
    for c in as_list(dump.get("configs")):
        if type_name(c) == f"envoy.admin.v3.{kind}":
            yield as_dict(c)


def _filter(raw: Any, ecds: dict[str, dict[str, Any]]) -> FilterView:
    f = as_dict(raw)
    name = str(f.get("name", ""))
    config: Any = f.get("typed_config")
    if config is None and "config_discovery" in f:
        found = ecds.get(name)
        config = (
            found.get("typed_config")
            if found
            else as_dict(f["config_discovery"]).get("default_config")
        )
    kind, fields = unwrap(config)
    return FilterView(name=name, type=kind, config=fields, disabled=f.get("disabled") is True)


def _hcms(
    listener: dict[str, Any],
    routes: dict[str, dict[str, Any]],
    ecds: dict[str, dict[str, Any]],
) -> Iterator[HcmView]:
    name = str(listener.get("name", "?"))
    limit = listener.get("per_connection_buffer_limit_bytes")
    chains = [*as_list(listener.get("filter_chains"))]
    if "default_filter_chain" in listener:
        chains.append(listener["default_filter_chain"])
    for chain in chains:
        for net in as_list(as_dict(chain).get("filters")):
            kind, hcm = unwrap(as_dict(net).get("typed_config"))
            if kind != HCM_TYPE and not (as_dict(net).get("name") == HCM_NAME and hcm):
                continue
            if "route_config" in hcm:
                table: dict[str, Any] | None = as_dict(hcm["route_config"])
                source = "inline"
            elif "rds" in hcm:
                rds_name = str(as_dict(hcm["rds"]).get("route_config_name", ""))
                table = routes.get(rds_name)
                source = f"rds {rds_name}" + ("" if table else " (not in the dump)")
            else:
                table, source = None, "scoped" if "scoped_routes" in hcm else "none"
            yield HcmView(
                listener=name,
                buffer_limit_bytes=int(limit) if limit is not None else DEFAULT_BUFFER_LIMIT_BYTES,
                buffer_limit_set=limit is not None,
                hcm=hcm,
                filters=tuple(_filter(f, ecds) for f in as_list(hcm.get("http_filters"))),
                route_config=table,
                route_source=source,
            )


def _view(
    listeners: Iterable[dict[str, Any]],
    routes: dict[str, dict[str, Any]],
    clusters: Iterable[dict[str, Any]],
    ecds: dict[str, dict[str, Any]],
    source: str,
    notes: list[str],
) -> EnvoyView:
    hcms = tuple(h for listener in listeners for h in _hcms(listener, routes, ecds))
    by_name = {str(c.get("name", "")): c for c in clusters}
    return EnvoyView(hcms=hcms, clusters=by_name, source=source, notes=tuple(notes))


def from_bootstrap(bootstrap: dict[str, Any]) -> EnvoyView:
    """A bootstrap (``envoy/envoy.yaml`` loaded): its static resources."""
    res = as_dict(bootstrap.get("static_resources"))
    listeners = [as_dict(x) for x in as_list(res.get("listeners"))]
    clusters = [as_dict(x) for x in as_list(res.get("clusters"))]
    notes = ["dynamic resources are not in a bootstrap"] if "dynamic_resources" in bootstrap else []
    return _view(listeners, {}, clusters, {}, "bootstrap", notes)


def from_config_dump(dump: dict[str, Any]) -> EnvoyView:
    """Envoy admin ``/config_dump``: static and dynamic resources, as in force now."""
    notes: list[str] = []
    listeners: list[dict[str, Any]] = []
    for c in _configs(dump, "ListenersConfigDump"):
        listeners += [
            as_dict(as_dict(x).get("listener")) for x in as_list(c.get("static_listeners"))
        ]
        for raw in as_list(c.get("dynamic_listeners")):
            d = as_dict(raw)
            active = as_dict(d.get("active_state")).get("listener")
            if active:
                listeners.append(as_dict(active))
            elif d.get("warming_state"):
                notes.append(f"listener {d.get('name')} is warming (not yet in force): not checked")
            if d.get("error_state"):
                err = as_dict(d["error_state"]).get("details", "")
                notes.append(f"listener {d.get('name')} was rejected: {err}")
    routes: dict[str, dict[str, Any]] = {}
    for c in _configs(dump, "RoutesConfigDump"):
        for key in ("static_route_configs", "dynamic_route_configs"):
            for r in as_list(c.get(key)):
                table = as_dict(as_dict(r).get("route_config"))
                routes[str(table.get("name", ""))] = table
    clusters: list[dict[str, Any]] = []
    for c in _configs(dump, "ClustersConfigDump"):
        for key in ("static_clusters", "dynamic_active_clusters", "dynamic_warming_clusters"):
            clusters += [as_dict(as_dict(x).get("cluster")) for x in as_list(c.get(key))]
    ecds: dict[str, dict[str, Any]] = {}
    for c in _configs(dump, "EcdsConfigDump"):
        for e in as_list(c.get("ecds_filters")):
            _, ext = unwrap(as_dict(e).get("ecds_filter"))
            ecds[str(ext.get("name", ""))] = ext
    if not listeners:  # a dump of only the bootstrap (e.g. ?resource= filters)
        for c in _configs(dump, "BootstrapConfigDump"):
            view = from_bootstrap(as_dict(c.get("bootstrap")))
            return EnvoyView(view.hcms, view.clusters, "config_dump", (*notes, *view.notes))
    return _view(listeners, routes, clusters, ecds, "config_dump", notes)
