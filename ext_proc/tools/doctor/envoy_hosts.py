"""``envoy.ice_hosts``: ICE's hosts as Envoy sees them, and what Envoy does with a request
when they are flagged.

Read from Envoy's admin ``/clusters?format=json`` (each host's health flags) and
``/stats?format=json`` (the cluster's health-check counters: network failures are checks that
could not reach ICE; the others, ICE answering NOT_SERVING), with ICE's cluster settings from
the config dump (its panic threshold, Envoy's 50 % by default).

- Every host healthy: PASS. Some flagged: WARN, with each one's reason.
- Every host not yet checked (Envoy has just started): WARN, not a FAIL (checked every
  0.5 s by the generated clusters).
- Every host flagged, panic threshold 0 (every cluster ``ice envoy-config`` writes since
  issue 44's late guard): FAIL; Envoy sends no stream to ICE, so every request passes
  unjudged (fail-open).
- Every host flagged, panic threshold above 0 (an older or hand-written cluster): Envoy's
  panic routing still sends every
  stream to them. When the checks cannot reach ICE (only network failures) that is a FAIL:
  the streams fail too, and the requests pass unjudged. When ICE answers the checks (it says
  NOT_SERVING, or answered before), a WARN: requests are still judged where ICE answers,
  but failover between replicas is off until a check passes.

Invariants: pure over the JSON documents passed in; a missing counter or flag reads as
absent, never as an error.
"""

from __future__ import annotations

from typing import Any

from ext_proc.tools.doctor.checks import Check, fail
from ext_proc.tools.doctor.dump import as_dict, as_list

__all__ = ["address_of", "healthy", "hosts_check", "panic_threshold"]

# Envoy's host health flags (``/clusters?format=json``), as reasons
REASONS = {
    "failed_active_health_check": "fails its gRPC health check",
    "failed_outlier_check": "ejected by outlier detection (refused or reset connections)",
    "pending_active_hc": "not checked yet",
    "failed_eds_health": "unhealthy in EDS (not ready)",
    "pending_dynamic_removal": "being removed",
}
DEFAULT_PANIC_PERCENT = 50.0


def healthy(host: dict[str, Any]) -> bool:
    status = as_dict(host.get("health_status"))
    if any(k.startswith(("failed_", "pending_active")) and v is True for k, v in status.items()):
        return False
    return str(status.get("eds_health_status", "HEALTHY")) in ("HEALTHY", "DEGRADED")


def _reasons(host: dict[str, Any]) -> list[str]:
    status = as_dict(host.get("health_status"))
    out = [REASONS.get(k, k) for k, v in status.items() if v is True and k in REASONS]
    eds = str(status.get("eds_health_status", "HEALTHY"))
    if eds not in ("HEALTHY", "DEGRADED"):
        out.append(f"EDS says {eds}")
    return out or ["flagged"]


def _only_pending(host: dict[str, Any]) -> bool:
    status = as_dict(host.get("health_status"))
    flags = {k for k, v in status.items() if v is True}
    return flags in ({"pending_active_hc"}, {"pending_active_hc", "failed_active_health_check"})


def address_of(host: dict[str, Any]) -> str:
    sock = as_dict(as_dict(host.get("address")).get("socket_address"))
    if sock:
        return f"{sock.get('address')}:{sock.get('port_value')}"
    pipe = as_dict(as_dict(host.get("address")).get("pipe"))
    return f"unix:{pipe.get('path')}" if pipe else "?"


def panic_threshold(cluster: dict[str, Any]) -> float:
    """The cluster's healthy panic threshold in percent (Envoy's default 50)."""
    common = as_dict(cluster.get("common_lb_config"))
    if "healthy_panic_threshold" not in common:
        return DEFAULT_PANIC_PERCENT
    return float(as_dict(common["healthy_panic_threshold"]).get("value", 0.0))


def _counters(stats: dict[str, Any], name: str) -> dict[str, float]:
    """``cluster.<name>.health_check.*`` counters from ``/stats?format=json``."""
    prefix = f"cluster.{name}.health_check."
    out: dict[str, float] = {}
    for stat in as_list(stats.get("stats")):
        s = as_dict(stat)
        key = str(s.get("name", ""))
        if key.startswith(prefix) and isinstance(s.get("value"), int | float):
            out[key.removeprefix(prefix)] = float(s["value"])
    return out


def _why(down: list[dict[str, Any]], counters: dict[str, float]) -> str:
    hosts = "; ".join(f"{address_of(h)} {', '.join(_reasons(h))}" for h in down)
    failed, network = counters.get("failure", 0.0), counters.get("network_failure", 0.0)
    if failed:
        hosts += (
            f" (health checks: {network:.0f} of {failed:.0f} failures could not reach ICE, "
            f"{failed - network:.0f} were ICE answering NOT_SERVING)"
        )
    return hosts


def hosts_check(
    name: str, hosts: list[dict[str, Any]], cluster: dict[str, Any], stats: dict[str, Any]
) -> Check:
    """The ``envoy.ice_hosts`` verdict for cluster ``name`` (see the module docstring)."""
    up = [address_of(h) for h in hosts if healthy(h)]
    down = [h for h in hosts if not healthy(h)]
    if not hosts:
        return fail(
            "envoy.ice_hosts",
            f"cluster {name} has no endpoints: every request passes unjudged",
            "give ICE's cluster its workers' addresses (one per --workers port)",
        )
    if not down:
        return Check("PASS", "envoy.ice_hosts", f"{name}: healthy {', '.join(up)}")
    counters = _counters(stats, name)
    why = _why(down, counters)
    if up:
        return Check(
            "WARN",
            "envoy.ice_hosts",
            f"{name}: healthy {', '.join(up)}; out: {why}",
            "restart the replicas that are out (Envoy takes them back within about a second)",
        )
    if all(_only_pending(h) for h in down):
        return Check(
            "WARN",
            "envoy.ice_hosts",
            f"{name}: not checked yet ({why}); Envoy has just started or just learnt them",
            "run the doctor again in a few seconds",
        )
    panic = panic_threshold(cluster)
    unreachable = counters.get("failure", 0.0) > 0 and counters.get("failure", 0.0) == counters.get(
        "network_failure", 0.0
    )
    if panic <= 0 or unreachable:
        how = "Envoy sends no stream to ICE" if panic <= 0 else "its streams fail too"
        return fail(
            "envoy.ice_hosts",
            f"Envoy sees every ICE host of {name} unhealthy ({why}): {how}, so requests pass "
            "unjudged (fail-open)",
            "start ICE, or fix the cluster's addresses",
        )
    return Check(
        "WARN",
        "envoy.ice_hosts",
        f"Envoy sees every ICE host of {name} unhealthy ({why}) and routes in panic mode "
        f"(threshold {panic:g} %): it still sends every stream to them, so requests are "
        "judged where ICE answers; failover between replicas is off until a check passes",
        "make ICE's gRPC health answer SERVING (a standby or draining replica says "
        "NOT_SERVING), or check the health-check settings (ice envoy-config)",
    )
