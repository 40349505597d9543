"""The policies an overload comparison runs ICE with, rewritten from a template: the pools
pointed at the vLLM it started (``render_policy``), the admission mode and forecast settings
in every profile (``admission_policy``), the admission queue on in every profile
(``queue_policy``; ``check_queue_policy`` loads it before anything starts), each tenant's
share of every pool (``shares_policy``).

Invariant: each writes a new file and returns its path; the template is never changed.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from ext_proc.lab.overload.burst import TENANT_HEADER

__all__ = [
    "MAX_TENANTS",
    "QUEUE_LENGTH",
    "QUEUE_WAIT_MS",
    "QueuePolicyError",
    "admission_policy",
    "check_queue_policy",
    "queue_policy",
    "render_policy",
    "shares_policy",
]

# The queue mode's defaults (the bench's --queue-wait-ms / --queue-length): long enough that a
# burst of the tiny model drains through the queue rather than time out (ICE's own default
# wait is 3000 ms).
QUEUE_WAIT_MS = 30_000
QUEUE_LENGTH = 64
MAX_TENANTS = 16


class QueuePolicyError(RuntimeError):
    """The queue mode's policy does not load (an ICE without the profile key ``queue``?)."""


def render_policy(template: Path, out: Path, vllm_port: int, model_dir: Path) -> Path:
    """``template`` with its pools scraping ``vllm_port`` and its tokenizers at ``model_dir``."""
    policy: dict[str, Any] = yaml.safe_load(template.read_text())
    for pool in policy.get("pools", {}).values():
        pool["metrics_urls"] = [f"http://127.0.0.1:{vllm_port}/metrics"]
    for spec in (policy.get("tokenizers") or {}).values():
        if "model_dir" in spec:
            spec["model_dir"] = str(model_dir)
    out.write_text(yaml.safe_dump(policy, sort_keys=False))
    return out


def admission_policy(
    template: Path,
    out: Path,
    admission: str,
    read_floors: bool = True,
    forecast: Mapping[str, float] | None = None,
    ttft_ms: float | None = None,
) -> Path:
    """``template`` with ``admission`` (reserve, forecast or slo) in every profile and, for
    the forecast (and slo, which holds blocks as it does), ``read_floors`` (off for
    client-like limits: their ``min_tokens`` is the bench's way to make vLLM generate the
    drawn length, not something a client says); for slo, ``slo: {ttft_ms}`` (the bench's
    TTFT target) unless the profile has a target; written to ``out``. The tokenizers'
    relative paths are ``render_policy``'s to fix."""
    policy: dict[str, Any] = yaml.safe_load(template.read_text())
    for profile in (policy.get("profiles") or {}).values():
        profile["admission"] = admission
        if admission == "slo" and ttft_ms is not None and not profile.get("slo"):
            profile["slo"] = {"ttft_ms": ttft_ms}
        if admission in ("forecast", "slo"):
            profile["forecast"] = {
                **(profile.get("forecast") or {}),
                **(forecast or {}),
                "read_floors": read_floors,
            }
    out.write_text(yaml.safe_dump(policy, sort_keys=False))
    return out


def shares_policy(template: Path, out: Path, shares: Mapping[str, Any]) -> Path:
    """``template`` with ``tenant_shares: shares`` in every pool (``cap``, ``caps``,
    ``guaranteed``: docs/tenant-shares.md), written to ``out``."""
    policy: dict[str, Any] = yaml.safe_load(template.read_text())
    for pool in (policy.get("pools") or {}).values():
        pool["tenant_shares"] = dict(shares)
    out.write_text(yaml.safe_dump(policy, sort_keys=False))
    return out


def queue_policy(
    template: Path,
    out: Path,
    wait_ms: int = QUEUE_WAIT_MS,
    length: int = QUEUE_LENGTH,
    tenant_header: str = TENANT_HEADER,
    *,
    max_tenants: int = MAX_TENANTS,
    critical: str = "pass",
) -> Path:
    """``template`` with ``queue:`` (on; ``wait_ms``, ``length``, ``tenant_header``,
    ``max_tenants``, ``critical``: pass or wait) in every profile, replacing any it had;
    written to ``out``. Relative
    paths stay relative to the policy's folder: give it a rendered policy (absolute paths) or
    an ``out`` beside ``template``."""
    policy: dict[str, Any] = yaml.safe_load(template.read_text())
    for profile in (policy.get("profiles") or {}).values():
        profile["queue"] = {
            "enabled": True,
            "max_queue_wait_ms": wait_ms,
            "max_queue_length": length,
            "tenant_header": tenant_header,
            "max_tenants": max_tenants,
            "critical": critical,
        }
    out.write_text(yaml.safe_dump(policy, sort_keys=False))
    return out


def check_queue_policy(path: Path) -> None:
    from ext_proc.policy.errors import PolicyError
    from ext_proc.policy.load import load_policy

    try:
        policy = load_policy(path)
    except PolicyError as e:
        raise QueuePolicyError(
            f"queue mode: ICE cannot load {path} (does this ICE know the profile key `queue`?): {e}"
        ) from e
    off = [n for n, p in policy.profiles.items() if getattr(p, "queue", None) is None]
    if off:
        raise QueuePolicyError(f"queue mode: {path} loads with the queue off in {off}")
