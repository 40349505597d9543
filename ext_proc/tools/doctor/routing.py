"""Which route of a route table a request takes, and whether ext_proc runs on it.

Job: the part of Envoy's routing the doctor needs to say what happens to ``POST
/v1/chat/completions`` or ``GET /health`` on a listener: the virtual host (``select_vhost``),
the first matching route (``match_route``: ``path``, ``prefix``, ``path_separated_prefix``,
``safe_regex``, ``case_sensitive``, header matchers), and for an HTTP filter the per-route
config in force (route, then virtual host, then route table: the most specific wins) and so
whether the filter runs there (``filter_on``).

Invariants: pure. The request has no query string, no body-dependent headers, and only
``:method``, ``:path``, ``:authority`` and ``content-type: application/json``; a matcher the
doctor cannot evaluate (``path_match_policy``, ``grpc``, ``dynamic_metadata``, query
parameters, filter state) does not match, so a route guarded by one is passed over as such
a request would pass it. Regexes are RE2 in Envoy and Python's ``re`` here (the same for
the patterns in routes' method and path matchers).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ext_proc.tools.doctor.dump import FilterView, as_dict, as_list, unwrap

__all__ = ["Hit", "filter_on", "match_route", "per_filter_config", "route_to", "select_vhost"]

FILTER_CONFIG_TYPE = "envoy.config.route.v3.FilterConfig"
UNEVALUATED = ("grpc", "dynamic_metadata", "filter_state", "tls_context", "cel_expression")


def _domain_matches(pattern: str, host: str) -> bool:
    p, h = pattern.lower(), host.lower()
    if p in ("*", h):
        return True
    if p.startswith("*"):
        return h.endswith(p[1:]) and len(h) > len(p) - 1
    if p.endswith("*"):
        return h.startswith(p[:-1]) and len(h) > len(p) - 1
    return False


def select_vhost(table: dict[str, Any], host: str | None) -> dict[str, Any] | None:
    """The virtual host serving ``host`` (Envoy's order: exact, suffix, prefix, ``*``); with
    no host, the ``*`` one, else the only one, else the first."""
    vhosts = [as_dict(v) for v in as_list(table.get("virtual_hosts"))]
    if not vhosts:
        return None
    if host is None:
        star = [v for v in vhosts if "*" in as_list(v.get("domains"))]
        return star[0] if star else vhosts[0]
    for kind in ("exact", "suffix", "prefix", "any"):
        for v in vhosts:
            for raw in as_list(v.get("domains")):
                d = str(raw)
                is_kind = {
                    "exact": "*" not in d,
                    "suffix": d.startswith("*") and d != "*",
                    "prefix": d.endswith("*") and d != "*",
                    "any": d == "*",
                }[kind]
                if is_kind and _domain_matches(d, host):
                    return v
    return None


def _string_match(m: dict[str, Any], value: str) -> bool | None:
    """A ``StringMatcher`` on ``value``; None when it has no known field."""
    ignore = m.get("ignore_case") is True
    v = value.lower() if ignore else value

    def norm(x: Any) -> str:
        return str(x).lower() if ignore else str(x)

    if "exact" in m:
        return v == norm(m["exact"])
    if "prefix" in m:
        return v.startswith(norm(m["prefix"]))
    if "suffix" in m:
        return v.endswith(norm(m["suffix"]))
    if "contains" in m:
        return norm(m["contains"]) in v
    if "safe_regex" in m:
        return re.fullmatch(str(as_dict(m["safe_regex"]).get("regex", "")), value) is not None
    return None


def _header_matches(matcher: dict[str, Any], headers: dict[str, str]) -> bool:
    value = headers.get(str(matcher.get("name", "")).lower())
    if value is None and matcher.get("treat_missing_header_as_empty") is True:
        value = ""
    result: bool | None
    if "present_match" in matcher:
        result = (value is not None) == (matcher["present_match"] is True)
    elif value is None:
        result = False
    elif "string_match" in matcher:
        result = _string_match(as_dict(matcher["string_match"]), value)
    elif "exact_match" in matcher:
        result = value == str(matcher["exact_match"])
    elif "prefix_match" in matcher:
        result = value.startswith(str(matcher["prefix_match"]))
    elif "suffix_match" in matcher:
        result = value.endswith(str(matcher["suffix_match"]))
    elif "safe_regex_match" in matcher:
        regex = str(as_dict(matcher["safe_regex_match"]).get("regex", ""))
        result = re.fullmatch(regex, value) is not None
    else:  # no value matcher: the header must be present
        result = True
    if result is None:
        return False
    return result != (matcher.get("invert_match") is True)


def _path_matches(match: dict[str, Any], path: str) -> bool:
    sensitive = match.get("case_sensitive", True) is not False
    p = path if sensitive else path.lower()

    def norm(x: Any) -> str:
        return str(x) if sensitive else str(x).lower()

    if "path" in match:
        return p == norm(match["path"])
    if "prefix" in match:
        return p.startswith(norm(match["prefix"]))
    if "path_separated_prefix" in match:
        pre = norm(match["path_separated_prefix"])
        return p == pre or p.startswith(pre + "/")
    if "safe_regex" in match:
        regex = str(as_dict(match["safe_regex"]).get("regex", ""))
        return re.fullmatch(regex, path) is not None
    return False  # path_match_policy (URI templates) and the like: not evaluated


def match_route(
    vhost: dict[str, Any], method: str, path: str, host: str = "ice-doctor"
) -> dict[str, Any] | None:
    """The first route of ``vhost`` that ``method path`` takes, or None (Envoy's 404)."""
    headers = {":method": method, ":path": path, ":authority": host}
    headers["content-type"] = "application/json"
    for raw in as_list(vhost.get("routes")):
        route = as_dict(raw)
        match = as_dict(route.get("match"))
        if any(k in match for k in UNEVALUATED) or as_list(match.get("query_parameters")):
            continue
        if not _path_matches(match, path):
            continue
        if all(_header_matches(as_dict(h), headers) for h in as_list(match.get("headers"))):
            return route
    return None


def per_filter_config(
    filter_name: str, route: dict[str, Any], vhost: dict[str, Any], table: dict[str, Any]
) -> tuple[str, dict[str, Any]] | None:
    """The per-route config of ``filter_name`` in force on ``route``: (type, fields), with a
    ``FilterConfig`` wrapper kept (its ``disabled`` matters) — or None when none is set."""
    for level in (route, vhost, table):
        found = as_dict(level.get("typed_per_filter_config")).get(filter_name)
        if found is not None:
            return unwrap(found)
    return None


def filter_on(
    f: FilterView, route: dict[str, Any], vhost: dict[str, Any], table: dict[str, Any]
) -> tuple[bool, dict[str, Any]]:
    """Whether ``f`` runs on ``route``, and its per-route config there (fields, ``{}`` when
    none): a per-route config that says ``disabled`` turns it off; any other turns a
    disabled-by-default filter on; without one the HCM's ``disabled`` holds."""
    found = per_filter_config(f.name, route, vhost, table)
    if found is None:
        return not f.disabled, {}
    kind, fields = found
    if kind == FILTER_CONFIG_TYPE:
        if fields.get("disabled") is True:
            return False, {}
        inner_kind, inner = unwrap(fields.get("config"))
        fields = inner if inner_kind else {}
    if fields.get("disabled") is True:
        return False, {}
    return True, fields


@dataclass(frozen=True, slots=True)
class Hit:
    """Where a request goes: ``route`` (None: no route matched), and what it does."""

    route: dict[str, Any] | None
    action: str  # "route" (to a cluster), "direct_response", "redirect", "none"
    name: str  # the route's name, or "" when it has none

    @property
    def upstream(self) -> bool:
        return self.action == "route"


def route_to(vhost: dict[str, Any] | None, method: str, path: str) -> Hit:
    route = match_route(vhost, method, path) if vhost is not None else None
    if route is None:
        return Hit(None, "none", "")
    action = next((a for a in ("route", "direct_response", "redirect") if a in route), "none")
    return Hit(route, action, str(route.get("name", "")))
