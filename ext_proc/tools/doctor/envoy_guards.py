"""Checks of what an inference HCM does to a request before ICE sees it: the spoofed
verdict headers stripped, the path normalised, the body limit.

Job: ``strip_check`` (a ``header_mutation`` filter ahead of ext_proc, or the HCM's
``early_header_mutation_extensions`` as Envoy Gateway builds it, must remove every header
prefix and name in ``pieces.SPOOF_PREFIXES`` / ``SPOOF_NAMES``; a filter disabled in the HCM
counts when each judged route turns it on, as on Istio's shared gateway), ``normalise_check``
(``normalize_path``, ``merge_slashes``, unescaped ``%2F``; a WARN, not a FAIL, on a shared
proxy, ext_proc off by default, where every route to a backend in the judged paths' virtual
host is an exact path: a path in another form gets the catch-all, never the backend) and
``buffer_check`` (the body buffer of every judged route, ``body_limit``, at least ICE's
``--max-body-bytes``).

Invariants: pure; a removal counts when its matcher is a prefix of the header (``prefix``),
the header itself (``exact`` / ``remove``, names only) or a regex matching it.
"""

from __future__ import annotations

import re
from typing import Any

from ext_proc.tools.doctor import expect as X
from ext_proc.tools.doctor.checks import Check, fail
from ext_proc.tools.doctor.dump import EXT_PROC_TYPE, FilterView, HcmView, as_dict, as_list, unwrap
from ext_proc.tools.doctor.routing import filter_on, route_to, select_vhost

__all__ = ["body_limit", "buffer_check", "normalise_check", "strip_check"]

HEADER_MUTATION_TYPE = "envoy.extensions.filters.http.header_mutation.v3.HeaderMutation"
GOOD_ESCAPED_SLASHES = ("UNESCAPE_AND_FORWARD", "UNESCAPE_AND_REDIRECT", "REJECT_REQUEST")


def _mutation_removals(items: list[Any]) -> list[dict[str, Any]]:
    out = []
    for item in items:
        m = as_dict(item)
        if "remove" in m:
            out.append({"exact": str(m["remove"])})
        elif "remove_on_match" in m:
            out.append(as_dict(as_dict(m["remove_on_match"]).get("key_matcher")))
    return out


def _covers(matcher: dict[str, Any], header: str, prefix: bool) -> bool:
    """Whether a removal matcher removes ``header`` (every header starting with it when
    ``prefix``)."""
    h = header.lower()
    if "prefix" in matcher:
        return h.startswith(str(matcher["prefix"]).lower())
    if "exact" in matcher:
        return not prefix and h == str(matcher["exact"]).lower()
    if "safe_regex" in matcher:
        regex = str(as_dict(matcher["safe_regex"]).get("regex", ""))
        probe = h + "doctor-probe" if prefix else h
        return re.fullmatch(regex, probe) is not None
    return False


def _missing(removals: list[dict[str, Any]]) -> list[str]:
    wanted = [(p, True) for p in X.SPOOF_PREFIXES] + [(n, False) for n in X.SPOOF_NAMES]
    return [
        f"{h}*" if prefix else h
        for h, prefix in wanted
        if not any(_covers(m, h, prefix) for m in removals)
    ]


def _judged_routes(
    hcm: HcmView, judged: tuple[str, ...], host: str | None
) -> list[tuple[Any, ...]]:
    """(route, vhost, table) of each judged path that reaches a backend, for ``host`` (None:
    the ``*`` virtual host)."""
    table = hcm.route_config or {}
    vhost = select_vhost(table, host) if table else None
    hits = [route_to(vhost, "POST", p) for p in judged]
    return [(h.route, vhost, table) for h in hits if h.upstream and h.route is not None]


def _on_every_judged_route(
    hcm: HcmView, f: FilterView, judged: tuple[str, ...], host: str | None
) -> list[dict[str, Any]] | None:
    """A disabled stripping filter that every judged route turns on: the removals in force
    on all of them (filter's and route's), or None when some route leaves it off."""
    routes = _judged_routes(hcm, judged, host)
    if not routes:
        return None
    own = _mutation_removals(as_list(as_dict(f.config.get("mutations")).get("request_mutations")))
    common: list[dict[str, Any]] | None = None
    for route, vhost, table in routes:
        on, fields = filter_on(f, route, vhost, table)
        if not on:
            return None
        mine = own + _mutation_removals(
            as_list(as_dict(fields.get("mutations")).get("request_mutations"))
        )
        if common is None or len(_missing(mine)) > len(_missing(common)):
            common = mine
    return common


def strip_check(
    hcm: HcmView,
    first_ext_proc: int,
    where: str,
    judged: tuple[str, ...] = (),
    host: str | None = None,
) -> Check:
    removals: list[dict[str, Any]] = []
    used: list[str] = []
    ignored: list[str] = []
    for ext in as_list(hcm.hcm.get("early_header_mutation_extensions")):
        _, config = unwrap(as_dict(ext).get("typed_config"))
        removals += _mutation_removals(as_list(config.get("mutations")))
        used.append("early_header_mutation_extensions")
    for i, f in enumerate(hcm.filters):
        if f.type != HEADER_MUTATION_TYPE and not (not f.type and f.name == X.HEADER_MUTATION):
            continue
        per_route = _on_every_judged_route(hcm, f, judged, host) if f.disabled else None
        if i <= first_ext_proc and per_route is not None:
            removals += per_route
            used.append(f"filter {f.name} (on for each judged route)")
            continue
        if i > first_ext_proc or f.disabled:
            ignored.append(f"{f.name} {'disabled' if f.disabled else 'after ext_proc'}")
            continue
        requests = as_dict(f.config.get("mutations")).get("request_mutations")
        removals += _mutation_removals(as_list(requests))
        used.append(f"filter {f.name}")
    missing = _missing(removals)
    if missing:
        seen = ", ".join(used) or "no header_mutation filter before ext_proc"
        if ignored:
            seen += f"; {', '.join(ignored)} does not count"
        return fail(
            "envoy.strip_spoofed_headers",
            f"{where}: a client's {', '.join(missing)} reach ICE and the backend ({seen})",
            "put pieces.strip_spoofed_headers() (header_mutation removing "
            f"{', '.join(f'{p}*' for p in X.SPOOF_PREFIXES)}, {', '.join(X.SPOOF_NAMES)}) "
            "before ext_proc",
        )
    return Check("PASS", "envoy.strip_spoofed_headers", f"{where}: removed by {', '.join(used)}")


def body_limit(listener_limit: int, route: Any, vhost: Any) -> tuple[int, str]:
    """The request body a route buffers, and which setting says so. Envoy's precedence: the
    route's own ``request_body_buffer_limit``, else its ``per_request_buffer_limit_bytes``
    (capped by the listener's), then the same two on its virtual host, else the listener's
    ``per_connection_buffer_limit_bytes``."""
    for part, label in ((as_dict(route), "route"), (as_dict(vhost), "virtual host")):
        if part.get("request_body_buffer_limit") is not None:
            return int(part["request_body_buffer_limit"]), f"{label} request_body_buffer_limit"
        if part.get("per_request_buffer_limit_bytes") is not None:
            per = int(part["per_request_buffer_limit_bytes"])
            return min(per, listener_limit), f"{label} per_request_buffer_limit_bytes"
    return listener_limit, "per_connection_buffer_limit_bytes"


def buffer_check(
    hcm: HcmView, where: str, judged: tuple[str, ...] = (), host: str | None = None
) -> Check:
    """The smallest body buffer of the judged routes (``body_limit``; the listener's when no
    judged route is found) against ICE's ``--max-body-bytes``."""
    listener, want = hcm.buffer_limit_bytes, X.MAX_BODY_BYTES
    said = "" if hcm.buffer_limit_set else " (not set: Envoy's default)"
    found = [
        (*body_limit(listener, route, vhost), str(as_dict(route).get("name", "?")))
        for route, vhost, _ in _judged_routes(hcm, judged, host)
    ]
    limit, which, name = min(found, default=(listener, "per_connection_buffer_limit_bytes", ""))
    setting = f"{which} {limit}" + (said if which.startswith("per_connection") else "")
    if name:
        setting = f"route {name}: {setting}"
    if limit < want:
        return fail(
            "envoy.buffer_limit",
            f"{where}: {setting} < ICE's --max-body-bytes {want}: larger bodies get Envoy's "
            "413 before ICE sees them",
            f"request_body_buffer_limit: {want} on the judged routes' virtual host (or "
            f"per_connection_buffer_limit_bytes: {want} on the listener)",
        )
    return Check("PASS", "envoy.buffer_limit", f"{where}: {setting} ≥ {want}")


def _exact_only(hcm: HcmView, judged: tuple[str, ...], host: str | None) -> bool:
    """A shared proxy (ext_proc off by default: the HCM serves others' routes too) where every
    route to a backend in the judged paths' virtual host matches an exact path."""
    shared = any(f.disabled for f in hcm.filters if f.type == EXT_PROC_TYPE)
    routes = _judged_routes(hcm, judged, host)
    if not routes or not shared:
        return False
    vhost = as_dict(routes[0][1])
    upstream = [as_dict(r) for r in as_list(vhost.get("routes")) if "route" in as_dict(r)]
    return all(set(as_dict(r.get("match"))) & {"path"} for r in upstream)


def normalise_check(
    hcm: HcmView, where: str, judged: tuple[str, ...] = (), host: str | None = None
) -> Check:
    h = hcm.hcm
    problems = []
    if h.get("normalize_path") is not True:
        problems.append("normalize_path off")
    if h.get("merge_slashes") is not True:
        problems.append("merge_slashes off")
    action = str(h.get("path_with_escaped_slashes_action", "KEEP_UNCHANGED"))
    if action not in GOOD_ESCAPED_SLASHES:
        problems.append(f"path_with_escaped_slashes_action {action}")
    if problems and _exact_only(hcm, judged, host):
        return Check(
            "WARN",
            "envoy.path_normalisation",
            f"{where}: {', '.join(problems)}; every route to a backend is an exact path, so "
            "//v1/chat/completions or /v1/chat%2Fcompletions get the catch-all (404), never "
            "the backend unjudged",
            "normalize the paths (merge_slashes, UNESCAPE_AND_FORWARD) to judge them instead; "
            "on a shared Istio gateway that is the mesh's pathNormalization",
        )
    if problems:
        return fail(
            "envoy.path_normalisation",
            f"{where}: {', '.join(problems)}: /v1/chat/%63ompletions, //v1/chat/completions or "
            "/v1/chat%2Fcompletions are routed as written, not as the backend reads them",
            "normalize_path: true, merge_slashes: true, path_with_escaped_slashes_action: "
            "UNESCAPE_AND_FORWARD",
        )
    return Check(
        "PASS", "envoy.path_normalisation", f"{where}: normalize_path, merge_slashes, {action}"
    )
