"""The ICE half of ``ice doctor``: is each worker serving, and are its pools' views fresh?

Job: ``health_checks`` asks each ICE address's ``grpc.health.v1`` service for ``""`` and
``envoy.service.ext_proc.v3.ExternalProcessor`` (what ``ice serve`` registers, and what
Envoy's gRPC health check asks); ``metrics_checks`` reads ICE's Prometheus page
(``--metrics-address``) with ``prometheus_client.parser`` and says, per pool, when ICE last
built a view (``ice_pool_snapshot_timestamp_seconds``), whether it holds stale sources
(``ice_pool_stale``), whether scrapes fail (``ice_scrape_errors_total``, read twice when it
is not zero), which policy is in force (``ice_policy_info{sha256}`` when ICE exports it,
else "unknown") and ICE's own faults (``ice_internal_errors_total``).

Invariants: an address or page that cannot be read is a FAIL naming the reason; ages
compare ICE's wall clock with this host's (a skew shows as age).
"""

from __future__ import annotations

import hashlib
import time
from collections import defaultdict
from collections.abc import Callable, Sequence

from prometheus_client.parser import text_string_to_metric_families

from ext_proc.tools.doctor import expect as X
from ext_proc.tools.doctor.checks import Check, fail
from ext_proc.tools.doctor.fetch import Fetch, FetchError

__all__ = ["HEALTH_SERVICES", "Samples", "health_checks", "metrics_checks", "parse_samples"]

EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
HEALTH_SERVICES = ("", EXT_PROC_SERVICE)
# ICE's metric names (ext_proc/telemetry.py; a unit test keeps them equal).
SNAPSHOT_TS = "ice_pool_snapshot_timestamp_seconds"
POOL_STALE = "ice_pool_stale"
SCRAPE_ERRORS = "ice_scrape_errors_total"
POLICY_INFO = "ice_policy_info"
POLICY_RELOADS = "ice_policy_reloads_total"
INTERNAL_ERRORS = "ice_internal_errors_total"
LEDGER_BACKEND = "ice_ledger_backend"
DEFAULT_MAX_AGE_S = 5.0

Samples = dict[str, list[tuple[dict[str, str], float]]]


def health_checks(addresses: Sequence[str], timeout_s: float) -> list[Check]:
    """One check per ICE address: SERVING for both services, or why not."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    out = []
    for address in addresses:
        problems: list[str] = []
        good: list[str] = []
        with grpc.insecure_channel(address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            for service in HEALTH_SERVICES:
                label = service or '""'
                try:
                    reply = stub.Check(
                        health_pb2.HealthCheckRequest(service=service), timeout=timeout_s
                    )
                except grpc.RpcError as e:
                    code = e.code().name if hasattr(e, "code") else "error"
                    details = e.details() if hasattr(e, "details") else ""
                    problems.append(f"{label}: {code} {details}".strip())
                    continue
                status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
                (good if status == "SERVING" else problems).append(f"{label}: {status}")
        if problems:
            out.append(
                fail(
                    "ice.health",
                    f"{address}: {'; '.join(problems)}",
                    "start ICE (ice serve --address ...) or pass the address it listens on; "
                    "with --workers N every worker's port PORT..PORT+N-1",
                )
            )
        else:
            out.append(Check("PASS", "ice.health", f"{address}: {', '.join(good)}"))
    return out


def parse_samples(text: str) -> Samples:
    """A Prometheus page → sample name → [(labels, value)]; ValueError when not one."""
    out: Samples = defaultdict(list)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[s.name].append((dict(s.labels), float(s.value)))
    return dict(out)


def _by_pool(samples: Samples, name: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for labels, value in samples.get(name, []):
        pool = labels.get("pool", "")
        out[pool] = max(out.get(pool, value), value)
    return out


def _read(fetch: Fetch, url: str, timeout_s: float) -> Samples:
    text = fetch(url, timeout_s)
    try:
        return parse_samples(text)
    except ValueError as e:
        raise FetchError(f"{url}: not a Prometheus page ({e})") from None


def _policy_check(samples: Samples, ex: X.Expected) -> Check:
    in_force = [lab.get("sha256", "") for lab, v in samples.get(POLICY_INFO, []) if v == 1]
    refused = sum(v for lab, v in samples.get(POLICY_RELOADS, []) if lab.get("result") == "refused")
    if not in_force:
        return Check(
            "MANUAL",
            "ice.policy_in_force",
            f"unknown: ICE's metrics do not say which policy it runs (compared with "
            f"{ex.policy_source})",
            "check that ice serve --policy names the file given to the doctor",
        )
    ours = hashlib.sha256(ex.policy_bytes).hexdigest()
    if ours not in in_force:
        return Check(
            "WARN",
            "ice.policy_in_force",
            f"ICE runs policy sha256 {', '.join(s[:12] for s in in_force)}, not "
            f"{ex.policy_source} ({ours[:12]}): the checks used another policy than ICE's",
            "pass --policy with ICE's policy file, or deploy this one",
        )
    if refused:
        return Check(
            "WARN",
            "ice.policy_in_force",
            f"{ex.policy_source} ({ours[:12]}) in force; {refused:g} reloads refused since start",
            "read ICE's log for the refused file's error",
        )
    return Check("PASS", "ice.policy_in_force", f"{ex.policy_source} (sha256 {ours[:12]})")


def _ledger_checks(samples: Samples) -> list[Check]:
    """With ``--ledger``: whether this ICE judges with the shared ledger now (none without)."""
    up = {labels.get("backend"): value for labels, value in samples.get(LEDGER_BACKEND, [])}
    if not up:
        return []
    if up.get("redis", 0) >= 1:
        return [Check("PASS", "ice.ledger", "judging with the replicas' shared ledger (Redis)")]
    return [
        Check(
            "WARN",
            "ice.ledger",
            "started with --ledger but judging with its local ledger: Redis is unreachable, "
            "failing or slower than --ledger-deadline-ms",
            "check Redis and ice_ledger_errors_total{op}; ICE returns to it by itself",
        )
    ]


def metrics_checks(
    url: str | None,
    ex: X.Expected,
    fetch: Fetch,
    timeout_s: float,
    *,
    now: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
    error_window_s: float = 1.0,
) -> list[Check]:
    if url is None:
        return [
            Check(
                "MANUAL",
                "ice.metrics",
                "no --ice-metrics: pool freshness, scrape errors and the policy in force not read",
                "pass --ice-metrics http://HOST:PORT/metrics (ice serve --metrics-address)",
            )
        ]
    try:
        first = _read(fetch, url, timeout_s)
    except FetchError as e:
        return [
            fail(
                "ice.metrics",
                f"cannot read ICE's metrics: {e}",
                "ice serve --metrics-address HOST:PORT, and pass that URL",
            )
        ]
    out = [Check("PASS", "ice.metrics", f"{url}: {sum(len(v) for v in first.values())} samples")]
    at = now()
    stamps, stale = _by_pool(first, SNAPSHOT_TS), _by_pool(first, POOL_STALE)
    errors_before = _by_pool(first, SCRAPE_ERRORS)
    scraped = {
        name
        for name, p in ex.policy.pools.items()
        if p.metrics_urls or p.dns_name or p.prometheus_url or p.gpu_metrics_urls or p.local_gpus
    }
    for pool in sorted(scraped | set(stamps) | set(stale)):
        spec = ex.policy.pools.get(pool)
        max_age = spec.max_age_s if spec else DEFAULT_MAX_AGE_S
        ts = stamps.get(pool, 0.0)
        name = "ice.pool_freshness"
        if ts <= 0:
            out.append(
                fail(
                    name,
                    f"pool {pool}: no view built yet: ICE judges its requests with pressure "
                    "unknown",
                    "check the pool's metrics_urls (backend.* checks below) and ICE's log",
                )
            )
            continue
        age = at - ts
        if age > max_age:
            out.append(
                fail(
                    name,
                    f"pool {pool}: last view {age:.1f} s ago (> max_age_s {max_age:g}): "
                    "pressure unknown, KV checks off",
                    "make the backends' /metrics answer within scrape_timeout_s",
                )
            )
        elif stale.get(pool, 0.0) >= 1:
            out.append(
                Check(
                    "WARN",
                    name,
                    f"pool {pool}: view {age:.1f} s old holds stale sources (x-ice-stale)",
                    "a backend's /metrics is slow or failing: see backend.metrics",
                )
            )
        else:
            out.append(Check("PASS", name, f"pool {pool}: view {max(age, 0):.1f} s old, fresh"))
    if any(v > 0 for v in errors_before.values()):
        sleep(error_window_s)
        try:
            errors_after = _by_pool(_read(fetch, url, timeout_s), SCRAPE_ERRORS)
        except FetchError:
            errors_after = errors_before
    else:
        errors_after = errors_before
    for pool in sorted(set(errors_before) | scraped):
        total, grew = (
            errors_after.get(pool, 0.0),
            errors_after.get(pool, 0.0) - errors_before.get(pool, 0.0),
        )
        if grew > 0:
            out.append(
                Check(
                    "WARN",
                    "ice.scrape_errors",
                    f"pool {pool}: {grew:g} failed scrapes in {error_window_s:g} s ({total:g} "
                    "since start)",
                    "see backend.metrics and ICE's log",
                )
            )
        else:
            out.append(
                Check("PASS", "ice.scrape_errors", f"pool {pool}: none now ({total:g} since start)")
            )
    out.append(_policy_check(first, ex))
    out += _ledger_checks(first)
    faults = sum(v for _, v in first.get(INTERNAL_ERRORS, []))
    if faults:
        out.append(
            Check(
                "WARN",
                "ice.internal_errors",
                f"{faults:g} faults inside ICE since start (requests failed open or closed)",
                "read ICE's log; report the traceback",
            )
        )
    else:
        out.append(Check("PASS", "ice.internal_errors", "none since start"))
    return out
