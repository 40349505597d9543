"""The memory-pressure score of a backend pool, and its level.

Formula (``mem_pressure_score``, 0-100; it rises as memory fills up, never with free memory):

    s_kv    = pool KV-cache usage, the used fraction 0-1
              (Σ usage_i × blocks_i / Σ blocks_i over backends when every backend reports
               ``num_gpu_blocks``; otherwise the plain mean of usage_i)
    s_pcie  = mean over the pool's GPUs of max(PCIe tx, rx bytes/s) / pcie_bandwidth_bytes_s
              (DCGM_FI_PROF_PCIE_TX_BYTES / _RX_BYTES; only when the pool names DCGM exporters)
    s_queue = min(1, mean waiting requests per backend / queue_saturation_requests)
    score   = 100 × (w_kv × s_kv + w_pcie × s_pcie + w_queue × s_queue) / (w_kv + w_pcie + w_queue)

Only signals the pool actually reports take part: a missing signal drops out of both the
numerator and the denominator. With no signal at all there is no score (level unknown).
Defaults: w_kv = 0.40, w_pcie = 0.35, w_queue = 0.25 (the design's weights; the PCIe term
joins only when the pool has GPU sources), queue_saturation_requests = 8, PCIe Gen4 x16
bandwidth 32e9 bytes/s per direction. GPU framebuffer use is not a pressure term: vLLM
preallocates ~90% of the GPU for its KV pool whatever the load, so KV usage is the memory
signal (``ice signals`` shows framebuffer use for the operator).
Levels: low < 40 ≤ medium < 65 ≤ high < 85 ≤ critical (``PressureModel`` thresholds).

Worked example: usage 0.95, 2 waiting per backend →
    100 × (0.40 × 0.95 + 0.25 × 0.25) / 0.65 = 68.08 → high.
"""

from __future__ import annotations

from dataclasses import dataclass

from ext_proc.policy.model import Level, PressureModel
from ext_proc.signals.snapshot import PoolSnapshot

__all__ = ["Pressure", "level_for", "pressure_of"]


@dataclass(frozen=True, slots=True)
class Pressure:
    """A pool's pressure: score 0-100 and its level."""

    score: float
    level: Level
    stale: bool = False  # the pool's view holds or lacks stale sources


def level_for(score: float, model: PressureModel) -> Level:
    """The level a score falls in."""
    if score >= model.critical_at:
        return Level.CRITICAL
    if score >= model.high_at:
        return Level.HIGH
    if score >= model.medium_at:
        return Level.MEDIUM
    return Level.LOW


def pressure_of(snapshot: PoolSnapshot, model: PressureModel) -> Pressure | None:
    """Score a pool snapshot; None when it reports no usable signal."""
    num = 0.0
    den = 0.0
    kv = snapshot.kv_cache_usage
    if kv is not None and model.weight_kv_cache > 0:
        num += model.weight_kv_cache * min(1.0, max(0.0, kv))
        den += model.weight_kv_cache
    pcie = snapshot.pcie_utilization
    if pcie is not None and model.weight_pcie > 0:
        num += model.weight_pcie * pcie
        den += model.weight_pcie
    waiting = snapshot.waiting_per_backend
    if waiting is not None and model.weight_queue > 0:
        s_queue = min(1.0, max(0.0, waiting) / model.queue_saturation_requests)
        num += model.weight_queue * s_queue
        den += model.weight_queue
    if den == 0.0:
        return None
    score = round(100.0 * num / den, 2)
    return Pressure(score=score, level=level_for(score, model), stale=snapshot.stale)
