"""Checks of one inference HCM's filter chain (what holds on every route of it).

Job: given an ``HcmView`` (a listener's HTTP connection manager that serves judged paths)
and ``Expected``, say whether ext_proc is there and before the router, how it fails
(``failure_mode_allow`` against the profiles' ``fail_mode``), its processing mode, its
``message_timeout`` / ``max_message_timeout``; then the request guards ahead of ICE
(``envoy_guards``: stripping, normalisation, body limit) and what the routes' identities need
(``envoy_identity``).

Invariants: pure; one ``Check`` per item per ext_proc filter (or HCM), its detail prefixed
with the listener's name; the expected values come from ``expect``
(``ext_proc.tools.envoygen.pieces``), never typed here.
"""

from __future__ import annotations

import re
from typing import Any

from ext_proc.tools.doctor import expect as X
from ext_proc.tools.doctor.checks import Check, fail
from ext_proc.tools.doctor.dump import EXT_PROC_TYPE, FilterView, HcmView, as_dict
from ext_proc.tools.doctor.envoy_guards import buffer_check, normalise_check, strip_check
from ext_proc.tools.doctor.envoy_identity import identity_checks

__all__ = ["duration_s", "ext_proc_filters", "filter_checks"]

ROUTER_TYPE = "envoy.extensions.filters.http.router.v3.Router"
REGEN = "regenerate the config with `ice envoy-config` (ext_proc/tools/envoygen/pieces.py)"


def duration_s(value: Any, default: float) -> float:
    """A protobuf Duration as JSON (``"1.5s"``) or YAML (``{seconds, nanos}``), in seconds."""
    if value is None:
        return default
    if isinstance(value, str):
        m = re.fullmatch(r"\s*(-?\d+(?:\.\d+)?)s\s*", value)
        return float(m.group(1)) if m else default
    d = as_dict(value)
    if d:
        return float(d.get("seconds", 0)) + float(d.get("nanos", 0)) / 1e9
    return float(value) if isinstance(value, int | float) else default


def _ms(s: float) -> str:
    return f"{s * 1000:g} ms"


def ext_proc_filters(hcm: HcmView) -> list[tuple[int, FilterView]]:
    """ICE's ext_proc filters (by type, or by name when the type is unknown), with their
    positions in the chain."""
    return [
        (i, f)
        for i, f in enumerate(hcm.filters)
        if f.type == EXT_PROC_TYPE or (not f.type and f.name.startswith(X.EXT_PROC))
    ]


def _is_router(f: FilterView) -> bool:
    return f.type == ROUTER_TYPE or (not f.type and f.name == X.ROUTER)


def _mode_check(config: dict[str, Any], where: str) -> Check:
    want = X.ice_mode()
    got = X.normal_mode(as_dict(config.get("processing_mode")))
    wrong = {k: got[k] for k in want if got[k] != want[k]}
    spelled = ", ".join(f"{k} {v} (ICE needs {want[k]})" for k, v in wrong.items())
    severe = [k for k in wrong if k.startswith("request_") or k == "response_body_mode"]
    severe = [k for k in severe if k != "request_trailer_mode"]
    fix = "processing_mode as pieces.ext_proc_config: " + ", ".join(
        f"{k} {v}" for k, v in want.items()
    )
    if severe:
        return fail("envoy.processing_mode", f"{where}: {spelled}", fix)
    if wrong:
        return Check(
            "WARN",
            "envoy.processing_mode",
            f"{where}: {spelled}: a round trip to ICE that only continues",
            fix,
        )
    if config.get("allow_mode_override") is not True:
        return Check(
            "WARN",
            "envoy.processing_mode",
            f"{where}: allow_mode_override is off: ICE cannot skip the body of requests it "
            "lets through at the headers phase (read-only, passthrough)",
            "allow_mode_override: true",
        )
    modes = ", ".join(f"{k.replace('_mode', '')} {v}" for k, v in want.items())
    return Check("PASS", "envoy.processing_mode", f"{where}: {modes}, allow_mode_override")


def _failure_mode_check(config: dict[str, Any], ex: X.Expected, where: str) -> Check:
    closed = ex.fail_closed_profiles()
    if config.get("failure_mode_allow") is True:
        if closed:
            return Check(
                "WARN",
                "envoy.failure_mode_allow",
                f"{where}: Envoy fails open while ICE is down, but profiles {', '.join(closed)} "
                "say fail_mode: closed",
                "failure_mode_allow: false if those routes must never pass unjudged (then "
                "ICE down = 500s), or fail_mode: open",
            )
        return Check("PASS", "envoy.failure_mode_allow", f"{where}: fails open while ICE is down")
    if closed and len(closed) == len(ex.policy.profiles):
        return Check(
            "PASS",
            "envoy.failure_mode_allow",
            f"{where}: fails closed while ICE is down, as every profile (fail_mode: closed)",
        )
    return fail(
        "envoy.failure_mode_allow",
        f"{where}: failure_mode_allow is false: while ICE is down every judged request fails",
        "failure_mode_allow: true (the policy's profiles fail open)",
    )


def _timeout_checks(config: dict[str, Any], ex: X.Expected, where: str) -> list[Check]:
    out = []
    mt = duration_s(config.get("message_timeout"), 0.2)  # Envoy's default: 200 ms
    budget_s = ex.policy.exact_count_budget_ms / 1000
    if mt <= budget_s:
        out.append(
            fail(
                "envoy.message_timeout",
                f"{where}: message_timeout {_ms(mt)} is not above the policy's "
                f"exact_count_budget_ms ({_ms(budget_s)}): verdicts arrive after Envoy gave up",
                f"message_timeout: {X.MESSAGE_TIMEOUT_S:g}s (= ice serve --message-timeout-ms)",
            )
        )
    elif mt != X.MESSAGE_TIMEOUT_S:
        out.append(
            Check(
                "WARN",
                "envoy.message_timeout",
                f"{where}: message_timeout {_ms(mt)}, ICE's default --message-timeout-ms is "
                f"{_ms(X.MESSAGE_TIMEOUT_S)}",
                f"run ice serve --message-timeout-ms {mt * 1000:g} (they must be equal)",
            )
        )
    else:
        out.append(Check("PASS", "envoy.message_timeout", f"{where}: {_ms(mt)}"))
    mmt = duration_s(config.get("max_message_timeout"), 0.0)
    deadline_ms = ex.extension_ms()
    if deadline_ms is None:
        out.append(
            Check(
                "PASS",
                "envoy.max_message_timeout",
                f"{where}: {_ms(mmt)}; no profile truncates or queues, so ICE never extends a "
                "timeout",
            )
        )
    elif mmt < deadline_ms / 1000 + 1:
        out.append(
            fail(
                "envoy.max_message_timeout",
                f"{where}: max_message_timeout {_ms(mmt)} is below the longest truncation "
                f"deadline_ms or max_queue_wait_ms + 1 s ({deadline_ms + 1000} ms): truncated "
                "or queued requests time out",
                f"max_message_timeout: at least {deadline_ms / 1000 + 1:g}s (the shipped "
                f"configs: {X.MAX_MESSAGE_TIMEOUT_S:g}s)",
            )
        )
    else:
        out.append(
            Check(
                "PASS",
                "envoy.max_message_timeout",
                f"{where}: {_ms(mmt)} ≥ the longest truncation deadline_ms or "
                f"max_queue_wait_ms ({deadline_ms}) + 1 s",
            )
        )
    return out


def filter_checks(hcm: HcmView, ex: X.Expected) -> list[Check]:
    """Every filter-chain check of one inference HCM."""
    where = hcm.listener
    found = ext_proc_filters(hcm)
    out: list[Check] = []
    if not found:
        out.append(
            fail(
                "envoy.ext_proc",
                f"{where}: no ext_proc filter: judged paths reach the backend unjudged",
                f"add pieces.ext_proc_filter() before the router; {REGEN}",
            )
        )
    routers = [i for i, f in enumerate(hcm.filters) if _is_router(f)]
    for i, f in found:
        config = f.config
        grpc = as_dict(config.get("grpc_service"))
        target = as_dict(grpc.get("envoy_grpc")).get("cluster_name") or (
            "google_grpc " + str(as_dict(grpc.get("google_grpc")).get("target_uri", ""))
        )
        rules = as_dict(config.get("mutation_rules"))
        if rules.get("disallow_all") is True:
            out.append(
                fail(
                    "envoy.ext_proc",
                    f"{where}: {f.name}: mutation_rules.disallow_all: ICE cannot set its headers",
                    "remove mutation_rules",
                )
            )
        elif rules:
            out.append(
                Check(
                    "WARN",
                    "envoy.ext_proc",
                    f"{where}: {f.name} → {target}; mutation_rules set: check they let ICE set "
                    "x-ice-*, x-mem-pressure*, x-downgraded, content-length and the body",
                    "remove mutation_rules",
                )
            )
        else:
            out.append(Check("PASS", "envoy.ext_proc", f"{where}: {f.name} → {target}"))
        if not routers or i > routers[-1]:
            out.append(
                fail(
                    "envoy.filter_order",
                    f"{where}: {f.name} is after the router (position {i + 1} of "
                    f"{len(hcm.filters)}): it never runs",
                    "move ext_proc before envoy.filters.http.router (the router is last)",
                )
            )
        else:
            out.append(
                Check(
                    "PASS",
                    "envoy.filter_order",
                    f"{where}: {f.name} at position {i + 1}, router at {routers[-1] + 1}",
                )
            )
        out.append(_failure_mode_check(config, ex, where))
        out.append(_mode_check(config, where))
        out += _timeout_checks(config, ex, where)
    out.append(buffer_check(hcm, where, tuple(ex.judged), ex.host))
    out.append(
        strip_check(
            hcm, found[0][0] if found else len(hcm.filters), where, tuple(ex.judged), ex.host
        )
    )
    out.append(normalise_check(hcm, where, tuple(ex.judged), ex.host))
    out += identity_checks(hcm, ex, found)
    return out
