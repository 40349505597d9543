"""The memory-pressure score of a backend pool, and its level.

Formula (``mem_pressure_score``, 0-100; it rises as memory fills up, never with free memory):

    s_kv    = pool KV-cache usage, the used fraction 0-1
              (Σ usage_i × blocks_i / Σ blocks_i over backends when every backend reports
               ``num_gpu_blocks``; otherwise the plain mean of usage_i)
    s_pcie  = mean over the pool's GPUs of max(PCIe tx, rx bytes/s) / pcie_bandwidth_bytes_s
              (DCGM_FI_PROF_PCIE_TX_BYTES / _RX_BYTES; only when the pool names DCGM exporters)
    s_queue = min(1, mean over backends of q_i / queue_saturation_requests)
              q_i = waiting requests of backend i (``vllm:num_requests_waiting``), or
                    max(waiting_i, queue_saturation_requests) when backend i's own admission
                    valve (vLLM ``--max-num-queued-reqs`` / ``--max-num-queued-tokens``)
                    answered a request 503 between its two newest scrapes
                    (``vllm:admission_rejections_total`` rose): the valve refuses exactly
                    when its queue is at its cap, so that queue counts as saturated
                    (a backend that reports no waiting count but rejected counts as
                    saturated too; one that reports neither drops out of the mean);
                    under ``admission: forecast`` with a wait (``start_within_s`` > 0)
                    waiting_i is first less W_i, the requests ICE admitted to start within
                    the wait and planned to be waiting when the view was taken:
                    max(0, waiting_i − W_i) (``PoolViews.unplanned``; they wait by plan)
    score   = 100 × (w_kv × s_kv + w_pcie × s_pcie + w_queue × s_queue) / (w_kv + w_pcie + w_queue)

Only signals the pool actually reports take part: a missing signal drops out of both the
numerator and the denominator. With no signal at all there is no score (level unknown).
Backends whose engine sleeps (vLLM sleep mode, ``BackendSignals.asleep``) take no part in
s_kv and s_queue: they serve nothing, and a sleeping engine's released cache would read as
idle; when every backend sleeps they all count (the pool answers 503 ``backend_asleep``
anyway, see ``ext_proc.placement.placer``).
Defaults: w_kv = 0.40, w_pcie = 0.35, w_queue = 0.25 (the design's weights; the PCIe term
joins only when the pool has GPU sources), queue_saturation_requests = 8, PCIe Gen4 x16
bandwidth 32e9 bytes/s per direction. GPU framebuffer use is not a pressure term: vLLM
preallocates ~90% of the GPU for its KV pool whatever the load, so KV usage is the memory
signal (``ice signals`` shows framebuffer use for the operator).
Levels: low < 40 ≤ medium < 65 ≤ high < 85 ≤ critical (``PressureModel`` thresholds).

Worked example: usage 0.95, 2 waiting per backend →
    100 × (0.40 × 0.95 + 0.25 × 0.25) / 0.65 = 68.08 → high.
With the valve: two backends of equal blocks at usage 0.5, waiting 2 and 0; the first
rejected a request since its previous scrape → q = (max(2, 8), 0), s_queue = 4 / 8 = 0.5 →
    100 × (0.40 × 0.5 + 0.25 × 0.5) / 0.65 = 50.0 → medium (35.58, low, without it).
"""

from __future__ import annotations

from dataclasses import dataclass

from ext_proc.policy.settings import Level, PressureModel
from ext_proc.signals.snapshot import PoolSnapshot

__all__ = ["Pressure", "level_for", "pressure_of", "queue_term"]


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


def queue_term(snapshot: PoolSnapshot, saturation_requests: float) -> float | None:
    """s_queue (module docstring): min(1, mean q_i / saturation_requests), a backend whose
    valve rejected since its previous scrape counting at least ``saturation_requests``;
    None when no backend reports a queue or a rejection."""
    total = 0.0
    count = 0
    for b in snapshot.backends:
        waiting = b.num_requests_waiting
        if b.admission_rejected:
            waiting = max(waiting or 0.0, saturation_requests)
        if waiting is None:
            continue
        total += max(0.0, waiting)
        count += 1
    if count == 0:
        return None
    return min(1.0, total / count / saturation_requests)


def pressure_of(snapshot: PoolSnapshot, model: PressureModel) -> Pressure | None:
    """Score a pool snapshot; None when it reports no usable signal."""
    stale = snapshot.stale
    snapshot = snapshot.serving  # sleeping backends take no part
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
    s_queue = queue_term(snapshot, model.queue_saturation_requests)
    if s_queue is not None and model.weight_queue > 0:
        num += model.weight_queue * s_queue
        den += model.weight_queue
    if den == 0.0:
        return None
    score = round(100.0 * num / den, 2)
    return Pressure(score=score, level=level_for(score, model), stale=stale)
