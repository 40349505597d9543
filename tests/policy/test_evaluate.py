"""The evaluator's degradation ladder, table-driven (pure: no I/O)."""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType

import pytest

from ext_proc.policy.decision import Decision, Downgrade, Pass, Reject, verdict_headers
from ext_proc.policy.evaluate import KvFit, Shape, evaluate, safe_output_tokens
from ext_proc.policy.pressure import Pressure
from ext_proc.policy.settings import Level, Priority, Profile
from ext_proc.schemas import RequestFeatures

PROFILE = Profile(name="p", max_model_len=8192, output_buffer_tokens=512, min_output_tokens=16)
LOW = Pressure(10.0, Level.LOW)
MEDIUM = Pressure(50.0, Level.MEDIUM)
HIGH = Pressure(70.0, Level.HIGH)
CRITICAL = Pressure(95.0, Level.CRITICAL)


def feats(input_tokens: int = 100, max_tokens: int | None = 256) -> RequestFeatures:
    return RequestFeatures(
        schema="openai.chat",
        model="m",
        input_tokens=input_tokens,
        max_tokens=max_tokens,
        max_tokens_field="max_tokens" if max_tokens is not None else None,
        stream=False,
        message_count=1,
    )


CASES: list[tuple[str, RequestFeatures, Pressure | None, Priority, Decision]] = [
    ("pass-low", feats(), LOW, "standard", Pass(LOW)),
    ("pass-unknown-pressure", feats(), None, "standard", Pass(None)),
    ("pass-medium-no-cap", feats(max_tokens=4000), MEDIUM, "standard", Pass(MEDIUM)),
    # safe = 8192 - 100 - 512 = 7580
    (
        "downgrade-context-budget",
        feats(max_tokens=100000),
        LOW,
        "standard",
        Downgrade(LOW, 7580, 100000, "context_budget"),
    ),
    ("exactly-safe-passes", feats(max_tokens=7580), LOW, "standard", Pass(LOW)),
    (
        "downgrade-context-unknown-pressure",
        feats(max_tokens=9000),
        None,
        "standard",
        Downgrade(None, 7580, 9000, "context_budget"),
    ),
    (
        "downgrade-high-cap",
        feats(max_tokens=4096),
        HIGH,
        "standard",
        Downgrade(HIGH, 1024, 4096, "pressure_cap"),
    ),
    (
        "inject-high-cap",
        feats(max_tokens=None),
        HIGH,
        "standard",
        Downgrade(HIGH, 1024, None, "pressure_cap"),
    ),
    ("no-inject-when-no-cap", feats(max_tokens=None), LOW, "standard", Pass(LOW)),
    (
        "shed-sheddable-at-high",
        feats(),
        HIGH,
        "sheddable",
        Reject(HIGH, 429, "memory_pressure", "", retry_after_s=2),
    ),
    ("standard-not-shed-at-high", feats(max_tokens=100), HIGH, "standard", Pass(HIGH)),
    (
        "shed-standard-at-critical",
        feats(),
        CRITICAL,
        "standard",
        Reject(CRITICAL, 429, "memory_pressure", "", retry_after_s=2),
    ),
    (
        "critical-never-shed",
        feats(max_tokens=2048),
        CRITICAL,
        "critical",
        Downgrade(CRITICAL, 256, 2048, "pressure_cap"),
    ),
    (
        "input-fills-context-400",
        feats(input_tokens=8192),
        LOW,
        "standard",
        Reject(LOW, 400, "context_length_exceeded", "", param="messages"),
    ),
    (
        "input-over-context-400-before-shedding",
        feats(input_tokens=9000),
        CRITICAL,
        "sheddable",
        Reject(CRITICAL, 400, "context_length_exceeded", "", param="messages"),
    ),
    # room = 8192 - 8000 = 192 < buffer: safe = max(min(16, 192), 192 - 512) = 16
    (
        "tight-context-floor",
        feats(input_tokens=8000, max_tokens=1000),
        LOW,
        "standard",
        Downgrade(LOW, 16, 1000, "context_budget"),
    ),
    # room = 8 < min_output_tokens: safe = 8 (never more than the context has)
    (
        "floor-never-exceeds-room",
        feats(input_tokens=8184, max_tokens=100),
        LOW,
        "standard",
        Downgrade(LOW, 8, 100, "context_budget"),
    ),
    # cap and budget both bind: the smaller wins (cap 256 < safe 7580)
    (
        "smaller-limit-wins",
        feats(max_tokens=100000),
        CRITICAL,
        "critical",
        Downgrade(CRITICAL, 256, 100000, "pressure_cap"),
    ),
]


@pytest.mark.parametrize(
    ("features", "pressure", "priority", "expected"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_ladder(
    features: RequestFeatures, pressure: Pressure | None, priority: Priority, expected: Decision
) -> None:
    got = evaluate(features, pressure, PROFILE, priority)
    if isinstance(expected, Reject):
        assert isinstance(got, Reject)
        assert (got.status, got.reason, got.retry_after_s, got.param, got.pressure) == (
            expected.status,
            expected.reason,
            expected.retry_after_s,
            expected.param,
            expected.pressure,
        )
        assert got.message
    else:
        assert got == expected


def test_no_max_model_len_means_no_context_checks() -> None:
    profile = replace(PROFILE, max_model_len=None)
    assert safe_output_tokens(profile, 10**6) is None
    assert evaluate(feats(input_tokens=10**6, max_tokens=10**6), LOW, profile, "standard") == Pass(
        LOW
    )


def test_shedding_table_is_per_profile() -> None:
    profile = replace(PROFILE, shed_at=MappingProxyType({"sheddable": Level.MEDIUM}))
    assert isinstance(evaluate(feats(), MEDIUM, profile, "sheddable"), Reject)
    assert not isinstance(evaluate(feats(), CRITICAL, profile, "standard"), Reject)


@pytest.mark.parametrize(
    ("decision", "headers"),
    [
        (
            Pass(LOW),
            [("x-mem-pressure", "low"), ("x-mem-pressure-score", "10"), ("x-ice-decision", "pass")],
        ),
        (Pass(None), [("x-mem-pressure", "unknown"), ("x-ice-decision", "pass")]),
        (
            Downgrade(HIGH, 1024, 4096, "pressure_cap"),
            [
                ("x-mem-pressure", "high"),
                ("x-mem-pressure-score", "70"),
                ("x-ice-decision", "downgrade"),
                ("x-downgraded", "true"),
                ("x-ice-original-max-tokens", "4096"),
                ("x-ice-reason", "pressure_cap"),
            ],
        ),
        (
            Downgrade(HIGH, 1024, None, "pressure_cap"),
            [
                ("x-mem-pressure", "high"),
                ("x-mem-pressure-score", "70"),
                ("x-ice-decision", "downgrade"),
                ("x-downgraded", "true"),
                ("x-ice-reason", "pressure_cap"),
            ],
        ),
        (
            Reject(CRITICAL, 429, "memory_pressure", "m", retry_after_s=2),
            [
                ("x-mem-pressure", "critical"),
                ("x-mem-pressure-score", "95"),
                ("x-ice-decision", "reject"),
                ("x-ice-reason", "memory_pressure"),
            ],
        ),
    ],
    ids=["pass", "pass-unknown", "downgrade", "inject", "reject"],
)
def test_verdict_headers(decision: Decision, headers: list[tuple[str, str]]) -> None:
    assert verdict_headers(decision) == headers


# --- KV blocks: block size 16, full attention (blocks = ceil((in + out) / 16)) ---------------
def kv(free: int, usable: int = 1000) -> KvFit:
    return KvFit(
        free_blocks=free, usable_blocks=usable, block_size=16, blocks=lambda i, o: -(-(i + o) // 16)
    )


KV_CASES: list[tuple[str, RequestFeatures, Priority, KvFit, Decision]] = [
    # 100 + 256 = 356 tokens = 23 blocks ≤ 50 free
    ("fits", feats(100, 256), "standard", kv(50), Pass(LOW)),
    # 20 free blocks = 320 tokens: output ≤ 320 − 100 = 220
    (
        "downgrade-to-free-blocks",
        feats(100, 4096),
        "standard",
        kv(20),
        Downgrade(LOW, 220, 4096, "kv_free_blocks"),
    ),
    # free blocks bind before the context budget (7,580)
    (
        "kv-binds-before-budget",
        feats(100, 100000),
        "standard",
        kv(20),
        Downgrade(LOW, 220, 100000, "kv_free_blocks"),
    ),
    # input 300 + min_output 16 = 316 tokens = 20 blocks > 19 free → shed
    (
        "shed-when-min-output-does-not-fit",
        feats(300, 64),
        "standard",
        kv(19),
        Reject(LOW, 429, "kv_exhausted", "", retry_after_s=2),
    ),
    # critical is never shed: nothing fits, so the limit stays (the backend will queue it)
    ("critical-not-shed", feats(300, 64), "critical", kv(0), Pass(LOW)),
    # input + 1 token needs 1,001 blocks > 1,000 usable: even an idle backend cannot hold it
    (
        "beyond-idle-capacity-400",
        feats(16000, 16),
        "standard",
        kv(1000, usable=1000),
        Reject(LOW, 400, "kv_capacity_exceeded", "", param="messages"),
    ),
]


@pytest.mark.parametrize(
    ("features", "priority", "fit", "expected"),
    [c[1:] for c in KV_CASES],
    ids=[c[0] for c in KV_CASES],
)
def test_kv_rules(
    features: RequestFeatures, priority: Priority, fit: KvFit, expected: Decision
) -> None:
    profile = replace(PROFILE, max_model_len=None if features.input_tokens > 8000 else 8192)
    got = evaluate(features, LOW, profile, priority, fit)
    if isinstance(expected, Reject):
        assert isinstance(got, Reject)
        assert (got.status, got.reason, got.retry_after_s) == (
            expected.status,
            expected.reason,
            expected.retry_after_s,
        )
    else:
        assert got == expected


def test_kv_shed_mode_sheds_when_the_requested_output_does_not_fit() -> None:
    profile = replace(PROFILE, on_kv_shortfall="shed")
    got = evaluate(feats(100, 4096), LOW, profile, "standard", kv(20))
    assert isinstance(got, Reject) and got.reason == "kv_exhausted"


def test_kv_ignore_mode_skips_free_block_rules() -> None:
    profile = replace(PROFILE, on_kv_shortfall="ignore")
    assert evaluate(feats(300, 64), LOW, profile, "standard", kv(0)) == Pass(LOW)


@pytest.mark.parametrize(
    ("free", "wanted", "expected"), [(20, 4096, 220), (20, 100, 100), (6, 4096, 0), (7, 4096, 12)]
)
def test_output_fit_is_the_largest_output_in_whole_free_blocks(
    free: int, wanted: int, expected: int
) -> None:
    # input 100 tokens: 7 blocks hold 112 tokens → 12 output tokens; 6 blocks hold none
    assert kv(free).output_fit(Shape.single(100), wanted) == expected


def test_kv_shed_mode_judges_the_output_the_context_allows_not_the_raw_request() -> None:
    # max_tokens 100000 cannot be served anyway: the context budget (8192 − 100 − 512 = 7580)
    # bounds what it can get; 7,680 tokens = 480 blocks fit 500 free → downgrade, not 429
    profile = replace(PROFILE, on_kv_shortfall="shed")
    got = evaluate(feats(100, 100000), LOW, profile, "standard", kv(500))
    assert got == Downgrade(LOW, 7580, 100000, "context_budget")
