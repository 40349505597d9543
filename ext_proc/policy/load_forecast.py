"""Policy loading for admission by forecast: a profile's ``admission``, ``forecast``,
``default_output_tokens`` and ``slo`` targets (see load.py for the file as a whole). Every
problem raises ``PolicyError`` naming the field."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ext_proc._pb import policy_pb2
from ext_proc.policy.errors import PolicyError
from ext_proc.policy.settings import Admission, ForecastSpec, SloTarget

__all__ = ["AdmissionSettings", "admission_settings"]


@dataclass(frozen=True, slots=True)
class AdmissionSettings:
    admission: Admission
    forecast: ForecastSpec
    default_output_tokens: int | None
    slo: SloTarget


def _bounded(msg: Any, name: str, default: float, lo: float, hi: float, where: str) -> float:
    if not msg.HasField(name):
        return default
    value = float(getattr(msg, name))
    if not lo <= value <= hi:
        raise PolicyError(f"{where}.forecast.{name}: must be in {lo}..{hi}, got {value}")
    return value


def admission_settings(msg: policy_pb2.Profile, where: str) -> AdmissionSettings:
    """The profile's admission mode, forecast settings and no-limit output default."""
    mode = msg.admission or "reserve"
    if mode not in ("reserve", "forecast", "slo"):
        raise PolicyError(f"{where}.admission: must be reserve, forecast or slo, got {mode!r}")
    d, f = ForecastSpec(), msg.forecast
    spec = ForecastSpec(
        quantile=_bounded(f, "quantile", d.quantile, 0.1, 1.0, where),
        margin=_bounded(f, "margin", d.margin, 0.0, 0.5, where),
        recovery_s=_bounded(f, "recovery_s", d.recovery_s, 0.1, 3600.0, where),
        min_observations=int(
            _bounded(f, "min_observations", d.min_observations, 1, 1_000_000, where)
        ),
        read_floors=f.read_floors if f.HasField("read_floors") else d.read_floors,
        start_within_s=_bounded(f, "start_within_s", d.start_within_s, 0.0, 60.0, where),
        refine=f.refine if f.HasField("refine") else d.refine,
    )
    default = None
    if msg.HasField("default_output_tokens"):
        default = int(msg.default_output_tokens)
        if default < 1:
            raise PolicyError(f"{where}.default_output_tokens: must be ≥ 1, got {default}")
    admission: Admission = (
        "slo" if mode == "slo" else "forecast" if mode == "forecast" else "reserve"
    )
    return AdmissionSettings(admission, spec, default, slo_target(msg, where))


# a target above an hour is a typo (seconds written as milliseconds × 1000), not a target
_MAX_TARGET_MS = 3_600_000.0


def slo_target(msg: policy_pb2.Profile, where: str) -> SloTarget:
    """The profile's ``slo``: each of ``ttft_ms`` / ``tpot_ms`` unset (None) or in
    (0, 3 600 000] milliseconds."""
    found: dict[str, float | None] = {}
    for name in ("ttft_ms", "tpot_ms"):
        if not msg.slo.HasField(name):
            found[name] = None
            continue
        value = float(getattr(msg.slo, name))
        if not 0.0 < value <= _MAX_TARGET_MS:  # also refuses NaN
            raise PolicyError(
                f"{where}.slo.{name}: must be in (0, {_MAX_TARGET_MS:.0f}] ms, got {value}"
            )
        found[name] = value
    return SloTarget(ttft_ms=found["ttft_ms"], tpot_ms=found["tpot_ms"])
