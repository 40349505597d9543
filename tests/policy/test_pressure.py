"""mem_pressure_score against hand-computed values (see ext_proc/policy/pressure.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ext_proc.policy.pressure import level_for, pressure_of, queue_term
from ext_proc.policy.settings import Level, PressureModel
from ext_proc.signals.scrapes import Derived
from ext_proc.signals.snapshot import BackendSignals, PoolSnapshot

DEFAULT = PressureModel()


def pool(*backends: BackendSignals) -> PoolSnapshot:
    return PoolSnapshot(pool="p", backends=backends, taken_at_s=0.0)


def b(
    usage: float | None, waiting: float | None = None, blocks: int | None = None
) -> BackendSignals:
    return BackendSignals(
        url="u",
        kv_cache_usage=usage,
        num_requests_waiting=waiting,
        num_gpu_blocks=blocks,
        block_size=16 if blocks else None,
    )


@pytest.mark.parametrize(
    ("snapshot", "score", "level"),
    [
        # 100 × (0.40 × 0.95 + 0.25 × 2/8) / 0.65 = 68.08
        (pool(b(0.95, 2)), 68.08, Level.HIGH),
        # 100 × (0.40 × 0.20 + 0) / 0.65 = 12.31
        (pool(b(0.20, 0)), 12.31, Level.LOW),
        # full cache and a saturated queue
        (pool(b(1.0, 8)), 100.0, Level.CRITICAL),
        (pool(b(1.0, 50)), 100.0, Level.CRITICAL),
        # 100 × (0.40 × 1.0 + 0.25 × 4/8) / 0.65 = 80.77
        (pool(b(1.0, 4)), 80.77, Level.HIGH),
        # queue signal missing: the KV term alone, renormalised → 100 × 0.5
        (pool(b(0.5)), 50.0, Level.MEDIUM),
        # KV missing: the queue alone → 100 × 4/8
        (pool(b(None, 4)), 50.0, Level.MEDIUM),
        # block-weighted usage: (0.9 × 3000 + 0.1 × 1000) / 4000 = 0.7; waiting mean 1
        # → 100 × (0.40 × 0.7 + 0.25 × 1/8) / 0.65 = 47.88
        (pool(b(0.9, 2, 3000), b(0.1, 0, 1000)), 47.88, Level.MEDIUM),
        # one backend lacks block counts: plain mean 0.5
        # → 100 × (0.40 × 0.5 + 0.25 × 1/8) / 0.65 = 35.58
        (pool(b(0.9, 2, 3000), b(0.1, 0)), 35.58, Level.LOW),
    ],
    ids=[
        "worked-example",
        "light",
        "saturated",
        "over-saturated",
        "full-cache-half-queue",
        "kv-only",
        "queue-only",
        "block-weighted",
        "unweighted-mean",
    ],
)
def test_score_matches_hand_computation(snapshot: PoolSnapshot, score: float, level: Level) -> None:
    p = pressure_of(snapshot, DEFAULT)
    assert p is not None
    assert p.score == pytest.approx(score, abs=0.01)
    assert p.level is level


def test_score_rises_with_used_memory_not_free_memory() -> None:
    scores = [pressure_of(pool(b(u, 0)), DEFAULT) for u in (0.1, 0.5, 0.9)]
    values = [s.score for s in scores if s is not None]
    assert values == sorted(values) and values[0] < values[-1]


def test_no_signal_means_no_score() -> None:
    assert pressure_of(pool(b(None)), DEFAULT) is None
    assert pressure_of(pool(), DEFAULT) is None


def test_custom_weights_and_thresholds() -> None:
    model = PressureModel(
        weight_kv_cache=1.0, weight_queue=0.0, medium_at=10, high_at=20, critical_at=30
    )
    p = pressure_of(pool(b(0.25, 100)), model)
    assert p is not None and p.score == 25.0 and p.level is Level.HIGH


@pytest.mark.parametrize(
    ("score", "level"),
    [
        (0, Level.LOW),
        (39.99, Level.LOW),
        (40, Level.MEDIUM),
        (65, Level.HIGH),
        (84.99, Level.HIGH),
        (85, Level.CRITICAL),
        (100, Level.CRITICAL),
    ],
)
def test_level_boundaries_are_inclusive_lower_bounds(score: float, level: Level) -> None:
    assert level_for(score, DEFAULT) is level


def test_pcie_term_joins_when_the_pool_has_gpus() -> None:
    from ext_proc.signals.scrapes import GpuScrape

    gpus = (
        GpuScrape(source="d", at_s=0, gpu="0", pcie_tx_bytes_s=16e9, pcie_rx_bytes_s=8e9),
        GpuScrape(source="d", at_s=0, gpu="1", pcie_tx_bytes_s=0.0, pcie_rx_bytes_s=8e9),
    )
    snap = PoolSnapshot(
        pool="p", backends=(b(0.5, 2),), taken_at_s=0.0, gpus=gpus, pcie_bandwidth_bytes_s=32e9
    )
    # s_pcie = mean(16/32, 8/32) = 0.375; s_kv = 0.5; s_queue = 2/8 = 0.25
    # 100 × (0.40 × 0.5 + 0.35 × 0.375 + 0.25 × 0.25) / 1.00 = 39.375
    assert snap.pcie_utilization == pytest.approx(0.375)
    p = pressure_of(snap, DEFAULT)
    assert p is not None and p.score == pytest.approx(39.38, abs=0.01)


# -- vLLM's own valve and sleep mode --------------------------------------------------------


def v(
    usage: float | None,
    waiting: float | None = None,
    *,
    rejected: bool | None = None,
    sleep: str | None = None,
    blocks: int | None = None,
) -> BackendSignals:
    """A backend whose valve rejected a request since its previous scrape (``rejected``)
    and whose engine is in ``sleep``."""
    derived = None
    if rejected is not None:
        derived = Derived(window_s=1.0, admission_rejected_recently=rejected)
    return replace(b(usage, waiting, blocks), derived=derived, sleep_state=sleep)


@pytest.mark.parametrize(
    ("snapshot", "s_queue", "score", "level"),
    [
        # one backend, 2 waiting, its valve refused a request: q = max(2, 8) → s_queue 1
        # 100 × (0.40 × 0.5 + 0.25 × 1) / 0.65 = 69.23
        (pool(v(0.5, 2, rejected=True)), 1.0, 69.23, Level.HIGH),
        # the same without a rejection: 100 × (0.40 × 0.5 + 0.25 × 2/8) / 0.65 = 40.38
        (pool(v(0.5, 2, rejected=False)), 0.25, 40.38, Level.MEDIUM),
        # more waiting than the saturation: q = max(12, 8) = 12, s_queue = min(1, 12/8) = 1
        (pool(v(0.5, 12, rejected=True)), 1.0, 69.23, Level.HIGH),
        # the module's worked example: q = (max(2, 8), 0) → 4/8; s_kv 0.5
        # 100 × (0.40 × 0.5 + 0.25 × 0.5) / 0.65 = 50.0; without the rejection 35.58
        (pool(v(0.5, 2, rejected=True), v(0.5, 0, rejected=False)), 0.5, 50.0, Level.MEDIUM),
        (pool(v(0.5, 2, rejected=False), v(0.5, 0, rejected=False)), 0.125, 35.58, Level.LOW),
        # a rejecting backend that does not report its queue counts as saturated:
        # q = (8, 0) → 0.5 → 50.0
        (pool(v(0.5, None, rejected=True), v(0.5, 0)), 0.5, 50.0, Level.MEDIUM),
        # no queue gauge and no rejection: it drops out of the mean, (4) → 0.5
        (pool(v(0.5, None, rejected=False), v(0.5, 4)), 0.5, 50.0, Level.MEDIUM),
        # the flag unknown (fewer than two scrapes) counts as no rejection
        (pool(v(0.5, 2)), 0.25, 40.38, Level.MEDIUM),
    ],
    ids=[
        "rejected",
        "not-rejected",
        "rejected-over-saturation",
        "worked-example",
        "worked-example-without",
        "rejected-no-gauge",
        "no-gauge-no-rejection",
        "flag-unknown",
    ],
)
def test_valve_rejections_saturate_the_backends_queue(
    snapshot: PoolSnapshot, s_queue: float, score: float, level: Level
) -> None:
    assert queue_term(snapshot, DEFAULT.queue_saturation_requests) == pytest.approx(s_queue)
    p = pressure_of(snapshot, DEFAULT)
    assert p is not None
    assert p.score == pytest.approx(score, abs=0.01) and p.level is level


def test_sleeping_backends_take_no_part() -> None:
    # awake: usage 0.9 with 4 waiting; asleep (level 1): usage 0, nothing waiting.
    # Only the awake one counts: 100 × (0.40 × 0.9 + 0.25 × 4/8) / 0.65 = 74.62; counting
    # both would be 100 × (0.40 × 0.45 + 0.25 × 2/8) / 0.65 = 37.31
    snap = pool(v(0.9, 4, blocks=101), v(0.0, 0, sleep="weights_offloaded", blocks=101))
    p = pressure_of(snap, DEFAULT)
    assert p is not None and p.score == pytest.approx(74.62, abs=0.01)
    assert snap.serving.backends == snap.backends[:1] and not snap.asleep


def test_a_pool_whose_every_backend_sleeps_is_scored_over_all() -> None:
    snap = pool(v(0.2, 0, sleep="discard_all"), v(0.4, 0, sleep="paused"))
    assert snap.asleep and snap.serving is snap
    p = pressure_of(snap, DEFAULT)
    # plain mean 0.3: 100 × 0.40 × 0.3 / 0.65 = 18.46
    assert p is not None and p.score == pytest.approx(18.46, abs=0.01)


@pytest.mark.parametrize(
    ("state", "asleep"),
    [(None, False), ("awake", False), ("paused", True), ("weights_offloaded", True)],
)
def test_asleep_is_any_state_but_awake(state: str | None, asleep: bool) -> None:
    assert v(0.1, sleep=state).asleep is asleep
