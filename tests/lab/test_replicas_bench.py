"""bench/replicas.py and ``ext_proc.lab.replicas``: the arithmetic, the summaries, one real run.

Checks: a request's blocks are ICE's ceil((prompt + output) / block_size); the peak of held
blocks over hand-computed intervals (three overlapping requests; an end and a start at the
same instant do not overlap; a zero-length interval holds nothing) and the over-admission
against the usable blocks; an answer's blocks use its usage's prompt tokens, else the plan's,
and a downgraded one its completion tokens; only served answers hold blocks; the quantiles,
added latency and median [min–max] summaries; the victim of the crash scenario and its
probe's size; a round's counts; the table's rows (a skipped setting says why); the command
line's --dry-run. And one short real run (dev backend, shape local, 2 replicas, one round):
it produces a row whose admitted + 429 is the burst's size (nothing is asserted about
over-admission).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from ext_proc.lab.replicas import (
    Answer,
    BurstPlan,
    FailoverResult,
    Held,
    RoundResult,
    SettingResult,
    added_ms,
    blocks_for,
    failover_table,
    held,
    nearest_rank,
    over_admission,
    peak_blocks,
    settings,
    stats,
    table,
)
from ext_proc.lab.replicas.faults import probe_max_tokens, victim_of
from ext_proc.lab.replicas.setup import Backend

ROOT = Path(__file__).resolve().parents[2]
PLAN = BurstPlan(requests=3, prompt_words=89, max_tokens=60, stream_delay_ms=0, prompt_tokens=93)


def bench() -> ModuleType:
    name = "ice_bench_replicas"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / "replicas.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def test_blocks_are_ices_formula() -> None:
    assert blocks_for(93, 60, 16) == 10  # 153 tokens
    assert blocks_for(100, 60, 16) == 10  # 160: exactly 10
    assert blocks_for(101, 60, 16) == 11
    assert blocks_for(317, 100, 128) == 4
    with pytest.raises(ValueError):
        blocks_for(1, 1, 0)


def test_peak_of_three_overlapping_requests() -> None:
    # a: [0, 3) 10 blocks, b: [1, 4) 20, c: [2, 5) 40 → 10, 30, 70 (in [2, 3)), 60, 40
    intervals = [Held(0, 3, 10), Held(1, 4, 20), Held(2, 5, 40)]
    assert peak_blocks(intervals) == 70
    assert over_admission(intervals, 63) == 7
    assert over_admission(intervals, 70) == 0  # never negative
    assert over_admission(intervals, 100) == 0


def test_an_end_frees_its_blocks_before_a_start_at_the_same_instant() -> None:
    assert peak_blocks([Held(0, 2, 30), Held(2, 4, 40)]) == 40
    assert peak_blocks([Held(0, 2.001, 30), Held(2, 4, 40)]) == 70
    assert peak_blocks([Held(1, 1, 99), Held(0, 5, 5)]) == 5  # zero length: holds nothing
    assert peak_blocks([]) == 0
    assert over_admission([], 63) == 0


def test_six_of_ten_blocks_fit_sixty_three_and_twelve_overshoot_by_57() -> None:
    six = [Held(0.01 * i, 2.5, 10) for i in range(6)]
    assert over_admission(six, 63) == 0
    twelve = six + [Held(0.01 * i, 2.5, 10) for i in range(6)]
    assert peak_blocks(twelve) == 120
    assert over_admission(twelve, 63) == 57


def test_an_answers_blocks() -> None:
    counted = Answer(0, 60, status=200, prompt_tokens=101)
    assert counted.blocks(PLAN, 16) == 11  # usage's prompt tokens: 161 tokens
    unknown = Answer(1, 60, status=200)
    assert unknown.blocks(PLAN, 16) == 10  # the plan's 93 + 60
    cut = Answer(2, 60, status=200, prompt_tokens=93, downgraded=True, completion_tokens=3)
    assert cut.blocks(PLAN, 16) == 6  # 96 tokens: the output it was given, not 60


def test_only_served_answers_hold_blocks() -> None:
    answers = [
        Answer(0, 60, start_s=0.0, end_s=2.0, status=200, prompt_tokens=93),
        Answer(1, 60, start_s=0.0, end_s=0.05, status=429),
        Answer(2, 60, start_s=0.0, end_s=0.1, status=0, error="ClientError"),
        Answer(3, 60, start_s=0.5, end_s=2.5, status=200, prompt_tokens=93),
    ]
    assert held(answers, PLAN, 16) == [Held(0.0, 2.0, 10), Held(0.5, 2.5, 10)]


def test_quantiles_and_added_latency() -> None:
    through = [0.010, 0.012, 0.011, 0.013]
    direct = [0.005, 0.005, 0.006, 0.005]
    assert nearest_rank(through, 0.5) == 0.011  # rank ceil(0.5 × 4) = 2
    assert nearest_rank(through, 0.99) == 0.013
    assert nearest_rank([], 0.5) is None
    assert added_ms(through, direct, 0.5) == 6.0  # 11 ms − 5 ms
    assert added_ms(through, direct, 0.99) == 7.0  # 13 ms − 6 ms
    assert added_ms([], direct, 0.5) is None


def test_median_min_max_over_rounds() -> None:
    s = stats([3, 1, 2])
    assert (s.median, s.min, s.max, s.n, s.text) == (2, 1, 3, 3, "2 [1–3]")
    assert stats([4, 4]).text == "4"
    partial = stats([None, 4, 6])
    assert (partial.median, partial.n, partial.text) == (5.0, 2, "5 [4–6] (n=2)")
    none = stats([None, None])
    assert (none.median, none.n, none.text) == (None, 0, "-")


def test_the_crash_kills_the_replica_that_passed_most() -> None:
    assert victim_of([1, 5]) == 1
    assert victim_of([3, 3]) == 0  # the first of equals
    assert victim_of([None, 2]) == 1
    assert victim_of([None, None]) == 0


def test_the_crash_probe_fits_only_once_the_victims_blocks_are_gone() -> None:
    dev = Backend("dev", "http://127.0.0.1:1", "dev-model", Path("p.yaml"), 16, 64)
    # 63 usable − 40 of the victim's + 1 = 24 blocks: 93 + 283 = 376 tokens (ICE reads 3
    # more prompt tokens: 379, still 24 blocks)
    assert probe_max_tokens(dev, PLAN, 40) == (283, 24)
    assert blocks_for(96, 283, 16) == 24
    assert probe_max_tokens(dev, PLAN, 60) == (60, 10)  # never less than a burst request
    vllm = Backend("vllm", "http://127.0.0.1:1", "tiny", Path("p.yaml"), 128, 24, 2048)
    plan = BurstPlan(24, 300, 100, 0, 317)
    # 20 blocks would be 2,235 output tokens: capped by the context, 2048 − 317 − 128
    assert probe_max_tokens(vllm, plan, 4) == (1603, 15)


def _round(statuses: list[int], judged: bool = True) -> RoundResult:
    answers = [
        Answer(i, 60, start_s=0.0, end_s=2.0, status=st, judged=judged, prompt_tokens=93)
        for i, st in enumerate(statuses)
    ]
    intervals = held(answers, PLAN, 16)
    return RoundResult(1, answers, peak_blocks(intervals), over_admission(intervals, 63), None)


def test_a_rounds_counts() -> None:
    s = _round([200] * 7 + [429] * 2 + [503]).summary()
    assert (s["requests"], s["admitted"], s["shed_429"], s["other"]) == (10, 8, 2, 1)
    assert (s["peak_blocks"], s["over_blocks"], s["unjudged"]) == (70, 7, 0)
    assert s["added_p50_ms"] is None  # no probe ran
    assert _round([200], judged=False).summary()["unjudged"] == 1


def test_the_table_has_a_row_per_setting_skipped_ones_too() -> None:
    ran = SettingResult("local", 2, rounds=[_round([200] * 7 + [429] * 3) for _ in range(2)])
    skipped = SettingResult("standby", 2, skipped="no standby_clusters yet")
    text = table([ran, skipped]).splitlines()
    assert text[0].startswith("| setting | rounds | admitted | 429 |")
    assert text[2].startswith("| local ×2 | 2 | 7 | 3 | 0 | 0 | 70 | 7 |")
    assert "| standby ×2 | 0 | skipped: no standby_clusters yet |" in text[3]


def test_settings_run_n_outer_and_refuse_unknown_shapes() -> None:
    assert settings([1, 2], ["local", "redis"]) == [
        ("local", 1),
        ("redis", 1),
        ("local", 2),
        ("redis", 2),
    ]
    with pytest.raises(ValueError, match="unknown shape"):
        settings([1], ["active"])
    with pytest.raises(ValueError):
        settings([0], ["local"])


def test_dry_run_prints_the_plan_and_starts_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench().main(["--dry-run", "--replicas", "1,2", "--shapes", "local"]) == 0
    out = capsys.readouterr().out
    assert "pool 64 blocks of 16 tokens (63 usable)" in out
    assert "10 blocks each, 6 fit the pool at once" in out
    assert "settings: local ×1, local ×2" in out


def test_a_short_real_run_gives_a_row_per_setting(tmp_path: Path) -> None:
    out = tmp_path / "replicas.json"
    argv = ["--replicas", "2", "--shapes", "local", "--rounds", "1", "--probe-requests", "20"]
    argv += ["--workdir", str(tmp_path / "work"), "--out", str(out)]
    assert bench().main(argv) == 0
    doc = json.loads(out.read_text())
    (setting,) = doc["settings"]
    assert (setting["shape"], setting["replicas"], setting["skipped"]) == ("local", 2, None)
    (row,) = setting["rounds"]
    assert row["admitted"] + row["shed_429"] == 24
    assert "| local ×2 | 1 |" in doc["table"]


def _faulted(unjudged: int, end_s: float, back: float | None) -> FailoverResult:
    """A failover run: ``unjudged`` answers without a verdict, the last ending ``end_s`` after
    the fault (at 2.0 s); the replica back at 4.0 s, judging ``back`` s later."""
    answers = [Answer(i, 1, start_s=1.0, end_s=1.5, status=200, judged=True) for i in range(3)]
    answers += [
        Answer(10 + i, 1, start_s=2.0, end_s=2.0 + end_s, status=200, judged=False)
        for i in range(unjudged)
    ]
    took = None if back is None else 4.0 + back
    return FailoverResult(answers, 2.0, 8.0, shape="local", replicas=2, fault="stop",
                          back_s=4.0, took_traffic_s=took)  # fmt: skip


def test_the_failover_table_gives_median_and_spread_per_scenario() -> None:
    runs = [_faulted(4, 1.1, 0.02), _faulted(2, 1.3, 0.04), _faulted(6, 1.2, None)]
    table = failover_table(runs)
    (row,) = [line for line in table.splitlines() if line.startswith("| local")]
    # unjudged 2, 4, 6 → 4 [2–6]; last unjudged 1.1, 1.3, 1.2 s → 1.2 [1.1–1.3]; judging again
    # 0.02 and 0.04 s (one run never saw it) → 0.03 [0.02–0.04]
    assert row == (
        "| local | 2 | stop | 3 | 7 [5–9] | 4 [2–6] | 1.2 [1.1–1.3] | 0 | 0.03 [0.02–0.04] |"
    )


def test_the_failover_matrix_runs_standby_with_two_replicas_only() -> None:
    args = (
        bench()
        .build_parser()
        .parse_args(
            ["--failover", "--failover-shapes", "standby,local", "--failover-replicas", "2,4"]
        )
    )
    assert bench().failover_matrix(args) == [
        ("standby", 2, "kill"),
        ("standby", 2, "stop"),
        ("local", 2, "kill"),
        ("local", 2, "stop"),
        ("local", 4, "kill"),
        ("local", 4, "stop"),
    ]
