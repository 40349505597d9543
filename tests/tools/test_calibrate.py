"""ice calibrate: labelling, the model (planted ground truth), thresholds, the pages source."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest

from ext_proc.policy.load import parse_policy
from ext_proc.policy.settings import PressureModel
from ext_proc.tools.calibrate.cli import fragment, main, parse_duration
from ext_proc.tools.calibrate.fit import auc, fit_pressure, thresholds_for
from ext_proc.tools.calibrate.history import (
    History,
    Track,
    build_history,
    counter_increase,
    hurt_labels,
    outcome_events,
    over_target,
)

DATA = Path(__file__).parents[1] / "data" / "vllm_cpu"


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


# -- labelling, by hand ---------------------------------------------------------------------


def test_hurt_labels_by_hand() -> None:
    t = np.array([0.0, 10, 20, 30, 40, 50])
    event = np.array([False, False, False, True, False, False])
    hurt, known = hurt_labels(t, event, 15.0)
    # step 20: the event at 30 is in (20, 35]; step 30: its own event is not "after" it
    assert hurt.tolist() == [0, 0, 1, 0, 0, 0]
    assert known.tolist() == [True, True, True, True, False, False]  # 40 + 15 > 50
    hurt, _ = hurt_labels(t, event, 30.0)
    assert hurt.tolist() == [1, 1, 1, 0, 0, 0]  # step 0: 30 ≤ 0 + 30
    hurt, _ = hurt_labels(t, np.zeros(6, dtype=bool), 30.0)
    assert hurt.tolist() == [0] * 6


def test_counter_increase_and_over_target_by_hand() -> None:
    inc = counter_increase(np.array([1.0, 3.0, 2.0, np.nan, 5.0, 6.0]))
    assert inc.tolist() == [0.0, 2.0, 2.0, 0.0, 0.0, 1.0]  # 3→2 is a reset: +2
    # F(1.5) = 4 + 0.5 × (8 − 4) = 6 → 10 − 6 above
    assert over_target((1.0, 2.0, math.inf), (4.0, 8.0, 10.0), 1.5) == 4.0
    assert over_target((1.0, 2.0, math.inf), (4.0, 8.0, 10.0), 0.5) == 8.0  # F = 2
    assert over_target((1.0, 2.0, math.inf), (4.0, 8.0, 10.0), 5.0) == 2.0  # past the last


def test_events_by_hand() -> None:
    n = 4
    nan = np.full(n, np.nan)
    a = Track(
        kv=np.array([0.1, 0.5, 0.9, 0.9]),
        waiting=np.array([0.0, 2.0, 20.0, 1.0]),
        preemptions=np.array([5.0, 5.0, 5.0, 7.0]),
        ttft_count=np.array([0.0, 10.0, 20.0, 30.0]),
        ttft_over=np.array([0.0, 5.0, 5.0, 5.0]),
    )
    b = Track(kv=np.array([0.3, 0.5, np.nan, 0.5]), waiting=np.zeros(n), preemptions=nan,
              ttft_count=nan, ttft_over=nan)  # fmt: skip
    h = build_history(np.array([0.0, 30, 60, 90]), {"a": a, "b": b})
    assert h.kv.tolist() == [0.2, 0.5, 0.9, 0.7]
    assert h.waiting.tolist() == [0.0, 1.0, 10.0, 0.5]
    ev = outcome_events(h, queue_limit=8, ttft_share=0.1)
    assert ev.preemption.tolist() == [False, False, False, True]
    assert ev.queue.tolist() == [False, False, True, False]
    assert ev.ttft.tolist() == [False, True, False, False]  # 5 of 10 over target
    assert ev.any.tolist() == [False, True, True, True]


# -- the model --------------------------------------------------------------------------------


@pytest.mark.parametrize("planted", [(0.7, 0.3), (0.2, 0.8)])
def test_fit_recovers_planted_weights(planted: tuple[float, float]) -> None:
    rng = np.random.default_rng(7)
    n = 20000
    x = rng.uniform(0.0, 1.0, (n, 2))
    y = (rng.uniform(size=n) < _sigmoid(-6.0 + 10.0 * x @ np.array(planted))).astype(np.int8)
    fit = fit_pressure(x, y, np.array([0.40, 0.25]), (40, 65, 85), features=("kv", "queue"))
    assert fit is not None
    assert fit.weights["kv"] == pytest.approx(planted[0], abs=0.04)
    assert fit.weights["queue"] == pytest.approx(planted[1], abs=0.04)
    assert sum(fit.weights.values()) == pytest.approx(1.0)
    assert fit.fitted.log_loss < fit.default.log_loss
    assert fit.fitted.auc is not None and fit.default.auc is not None
    assert fit.fitted.auc >= fit.default.auc
    # the planted logit −6 + 10 s crosses 0.2 / 0.5 / 0.8 at s = 0.461 / 0.6 / 0.739
    assert fit.thresholds == pytest.approx((46.1, 60.0, 73.9), abs=2.5)
    assert fit.test_steps == 4000 and fit.train_steps == 16000


def test_fit_through_history_and_labels() -> None:
    """Signals → preemption counter whose increase at step i+1 follows the planted logistic
    of step i's features → events → labels (horizon one step) → the planted weights."""
    rng = np.random.default_rng(11)
    n, step = 15000, 30.0
    kv = rng.uniform(0.0, 1.0, n)
    waiting = rng.uniform(0.0, 8.0, n)  # saturation 8: x_queue uniform 0-1
    p = _sigmoid(-5.0 + 9.0 * (0.3 * kv + 0.7 * waiting / 8.0))
    bumps = np.zeros(n)
    bumps[1:] = rng.uniform(size=n - 1) < p[:-1]
    nan = np.full(n, np.nan)
    track = Track(kv=kv, waiting=waiting, preemptions=np.cumsum(bumps), ttft_count=nan,
                  ttft_over=nan)  # fmt: skip
    h = build_history(step * np.arange(n, dtype=np.float64), {"b0": track})
    ev = outcome_events(h, queue_limit=100, ttft_share=0.1)
    hurt, known = hurt_labels(h.t, ev.any, step)
    assert bool(np.all(hurt[:-1] == bumps[1:])) and not known[-1]
    x = np.column_stack([kv, waiting / 8.0])[known]
    fit = fit_pressure(x, hurt[known], np.array([0.40, 0.25]), (40, 65, 85),
                       features=("kv", "queue"))  # fmt: skip
    assert fit is not None
    assert fit.weights["kv"] == pytest.approx(0.3, abs=0.05)
    assert fit.fitted.log_loss < fit.default.log_loss


def test_fit_with_pcie() -> None:
    rng = np.random.default_rng(3)
    n = 30000
    x = rng.uniform(0.0, 1.0, (n, 3))
    y = (rng.uniform(size=n) < _sigmoid(-6.0 + 12.0 * x @ np.array([0.5, 0.3, 0.2]))).astype(
        np.int8
    )
    fit = fit_pressure(x, y, np.array([0.40, 0.25, 0.35]), (40, 65, 85),
                       features=("kv", "queue", "pcie"))  # fmt: skip
    assert fit is not None
    for k, v in {"kv": 0.5, "queue": 0.3, "pcie": 0.2}.items():
        assert fit.weights[k] == pytest.approx(v, abs=0.05)


def test_fit_one_class_is_none() -> None:
    x = np.random.default_rng(0).uniform(size=(100, 2))
    assert fit_pressure(x, np.zeros(100, dtype=np.int8), np.array([0.4, 0.25]),
                        (40, 65, 85), features=("kv", "queue")) is None  # fmt: skip


def test_thresholds_by_hand() -> None:
    lg = math.log(4.0)  # logit(0.8) = −logit(0.2) = ln 4
    # b = −3, c = 6: 100 (±ln 4 + 3) / 6 and 100 × 3 / 6
    assert thresholds_for(-3.0, 6.0) == (
        round(100 * (3 - lg) / 6, 1),
        50.0,
        round(100 * (3 + lg) / 6, 1),
    )
    assert thresholds_for(-3.0, 6.0) == (26.9, 50.0, 73.1)
    # b = 0, c = 1: all raw values are outside [1, 100]: clipped, 1 point apart, ascending
    assert thresholds_for(0.0, 1.0) == (1.0, 2.0, 100.0)
    assert thresholds_for(-50.0, 10.0) == (98.0, 99.0, 100.0)  # all past 100
    assert thresholds_for(0.0, 0.0) is None and thresholds_for(0.0, -1.0) is None


def test_auc_by_hand() -> None:
    y = np.array([0, 0, 1, 1], dtype=np.int8)
    assert auc(y, np.array([0.1, 0.4, 0.35, 0.8])) == 0.75
    assert auc(y, np.array([0.5, 0.5, 0.5, 0.5])) == 0.5  # ties count half
    assert auc(np.array([1, 1], dtype=np.int8), np.array([0.1, 0.2])) is None


def test_fragment_is_a_valid_policy() -> None:
    text = fragment("default", PressureModel(), {"kv": 0.7, "queue": 0.3}, (30.5, 55, 80.2), "x")
    policy = parse_policy(text)
    pm = policy.profiles["default"].pressure
    assert (pm.weight_kv_cache, pm.weight_queue, pm.queue_saturation_requests) == (0.7, 0.3, 8)
    assert (pm.medium_at, pm.high_at, pm.critical_at) == (30.5, 55, 80.2)


def test_parse_duration() -> None:
    assert parse_duration("7d") == 604800 and parse_duration("30s") == 30
    assert parse_duration("1.5h") == 5400 and parse_duration("250ms") == 0.25


# -- the pages source and the CLI ---------------------------------------------------------


def _pages(tmp: Path, texts: list[str], start: float = 1_700_000_000.0) -> Path:
    root = tmp / "pages"
    (root / "b0").mkdir(parents=True)
    for i, text in enumerate(texts):
        (root / "b0" / f"metrics-{start + 30 * i:.0f}.txt").write_text(text)
    return root


def test_no_events_prints_the_defaults(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    page = (DATA / "metrics_idle.txt").read_text()
    root = _pages(tmp_path, [page] * 6)
    out = tmp_path / "frag.yaml"
    assert main(["--pages", str(root), "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert "no outcome events" in said and "6 steps, 1 backends" in said
    pm = parse_policy(out.read_text()).profiles["default"].pressure
    d = PressureModel()
    assert (pm.weight_kv_cache, pm.weight_queue, pm.queue_saturation_requests) == (
        d.weight_kv_cache, d.weight_queue, d.queue_saturation_requests)  # fmt: skip
    assert (pm.medium_at, pm.high_at, pm.critical_at) == (d.medium_at, d.high_at, d.critical_at)


def test_pages_history_reads_the_recorded_pages(tmp_path: Path) -> None:
    from ext_proc.signals.parse import parse_engine
    from ext_proc.tools.calibrate.pages import history_from_pages

    texts = [(DATA / f"metrics_{k}.txt").read_text() for k in ("idle", "loaded", "preempting")]
    root = _pages(tmp_path, texts)
    h: History = history_from_pages(root, kind=None, ttft_target_s=2.0)
    scr = [parse_engine("vllm", "b0", t, 0.0) for t in texts]
    assert h.t.tolist() == [1_700_000_000.0, 1_700_000_030.0, 1_700_000_060.0]
    assert h.kv.tolist() == [s.kv_cache_usage for s in scr]
    assert h.waiting.tolist() == [s.num_requests_waiting for s in scr]
    want = [0.0] + [
        max(0.0, (b.preemptions or 0) - (a.preemptions or 0)) for a, b in itertools.pairwise(scr)
    ]
    assert h.preempted.tolist() == want


def test_sidecar_times(tmp_path: Path) -> None:
    from ext_proc.tools.calibrate.pages import page_times

    (tmp_path / "a.txt").write_text("x")
    (tmp_path / "b.txt").write_text("x")
    (tmp_path / "timestamps.json").write_text('{"a.txt": 200, "b.txt": 100}')
    assert [(b, t, p.name) for b, t, p in page_times(tmp_path)] == [
        ("pages", 100.0, "b.txt"), ("pages", 200.0, "a.txt")]  # fmt: skip


@pytest.mark.parametrize(
    "argv",
    [
        ["--pages", "/nonexistent/ice-calibrate"],
        [],
        ["--pages", "x", "--prometheus", "http://127.0.0.1:1"],
        ["--pages", "x", "--step", "soon"],
        ["--pages", "x", "--probabilities", "0.5,0.2,0.8"],
    ],
)
def test_bad_input_exits_2_with_one_line(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("ice calibrate: error: ") and err.count("\n") == 1
