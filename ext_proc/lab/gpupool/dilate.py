"""``dilate``: the bench's time settings at dilation k, and ICE's policy for the GPU pool.

The fake executor makes every modelled step last k × its modelled time (``PoolSpec.dilation``),
so a pool that would serve R requests per second serves R / k here. Everything else that is a
time is scaled by the same k, so the run is the GPU run slowed down uniformly:

- arrivals: wall gap = k × modelled gap (``wall_plan``); the TTFT SLO: k × the modelled one;
- ICE's policy (``gpu_policy``): every pool's ``scrape_interval_s``, ``scrape_timeout_s`` and
  ``max_age_s``; every profile's ``ttft_target_s``, ``retry_after_s`` (and its min / max,
  rounded up: they are whole seconds), ``forecast.start_within_s`` / ``recovery_s`` and,
  under ``admission: slo``, ``slo.ttft_ms`` (the bench's modelled TTFT target × k);
  the queue's ``max_queue_wait_ms`` is the bench's ``--queue-wait-ms`` × k
  (``overload_setup(queue_wait_ms=...)``).

What is not scaled: the host's own costs (ICE's verdict, Envoy, tokenizing, vLLM's scheduler),
which a real GPU host pays at 1×; at k ≫ 1 they shrink relative to the modelled time, which
is the point of k (the executor also absorbs up to k × the modelled step overhead of host time
per step: ``executor``). Figures in modelled time are wall figures / k (tokens per second × k).

``gpu_policy`` starts from the tiny pool's policy (``overload.POLICY``) and sets every
profile's ``max_model_len`` to the pool's, the ``admission`` ("reserve", "forecast" or
"slo"; slo with the bench's target, ``ttft_slo_s``, where the profile has none), and the
scaled times; everything else (pressure weights, shedding ladder) is left as it is: this is
the instrument, not a tuning of ICE for it. Invariant: pure except for the file it writes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from ext_proc.lab.overload.burst import POLICY, Planned

__all__ = ["gpu_policy", "wall_plan"]

_POOL_TIMES = ("scrape_interval_s", "scrape_timeout_s", "max_age_s")
_PROFILE_TIMES = ("ttft_target_s",)
_PROFILE_SECONDS = ("retry_after_s", "retry_after_min_s", "retry_after_max_s")
_FORECAST_TIMES = ("start_within_s", "recovery_s")


def wall_plan(plan: Sequence[Planned], k: float) -> list[Planned]:
    """``plan`` with every start time multiplied by ``k`` (modelled → wall seconds)."""
    return [replace(p, at_s=round(p.at_s * k, 6)) for p in plan]


def gpu_policy(
    out: Path,
    *,
    max_model_len: int,
    k: float,
    admission: str = "reserve",
    read_floors: bool = True,
    template: Path = POLICY,
    ttft_slo_s: float = 2.0,
) -> Path:
    """ICE's policy for the GPU pool at dilation ``k`` (module docstring), written to ``out``."""
    policy: dict[str, Any] = yaml.safe_load(template.read_text())
    for pool in (policy.get("pools") or {}).values():
        for key in _POOL_TIMES:
            if key in pool:
                pool[key] = round(float(pool[key]) * k, 6)
    for profile in (policy.get("profiles") or {}).values():
        profile["max_model_len"] = max_model_len
        profile["admission"] = admission
        for key in _PROFILE_TIMES:
            profile[key] = round(float(profile.get(key, 2.0)) * k, 6)
        defaults = {"retry_after_s": 2, "retry_after_min_s": 1, "retry_after_max_s": 60}
        for key in _PROFILE_SECONDS:
            profile[key] = math.ceil(float(profile.get(key, defaults[key])) * k)
        if admission == "slo" and not profile.get("slo"):
            profile["slo"] = {"ttft_ms": round(ttft_slo_s * k * 1000, 3)}
        if admission in ("forecast", "slo"):
            forecast = dict(profile.get("forecast") or {})
            forecast["read_floors"] = read_floors
            for key, default in zip(_FORECAST_TIMES, (0.0, 10.0), strict=True):
                forecast[key] = round(float(forecast.get(key, default)) * k, 6)
            profile["forecast"] = forecast
    out.write_text(yaml.safe_dump(policy, sort_keys=False))
    return out
