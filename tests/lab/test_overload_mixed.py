"""The overload benchmark's mixed workload, without vLLM: its shares, sizes, fit in the
context, determinism from the seed, and what the report says of a plan."""

from __future__ import annotations

import random
import statistics

import pytest

from ext_proc.lab.overload import (
    MIX,
    LogNormal,
    MixedSpec,
    describe,
    interleave,
    parse_mix,
    plan_burst,
    plan_mixed,
    plan_text,
    request_body,
)
from ext_proc.lab.vllm_local import ServeConfig

SPEC = MixedSpec()


@pytest.mark.parametrize(("requests", "long"), [(24, 7), (10, 3), (100, 30), (1, 0), (0, 0)])
def test_the_long_share_is_exact(requests: int, long: int) -> None:
    plan = plan_mixed(requests, 0, MIX, seed=1)
    assert len(plan) == requests
    assert sum(1 for p in plan if p.kind == "long") == long  # round(0.3 × requests)
    assert sum(1 for p in plan if p.kind == "short") == requests - long


@pytest.mark.parametrize("seed", range(1, 21))
def test_sizes_stay_in_their_ranges_and_fit_the_context(seed: int) -> None:
    for p in plan_mixed(50, 0, MIX, seed=seed):
        if p.kind == "short":
            assert 80 <= p.prompt_tokens <= 120, p
            assert p.max_tokens >= 8, p
        else:
            assert 1000 <= p.prompt_tokens <= 1200, p
            assert p.max_tokens >= 32, p
        # prompt words + output + template margin + ICE's output buffer ≤ max_model_len: vLLM
        # takes it, and ICE does not cut max_tokens for the context
        assert p.prompt_tokens + p.max_tokens + 32 + 128 <= 2048, p


def test_the_spec_matches_the_tiny_server() -> None:
    assert SPEC.max_model_len == ServeConfig().max_model_len
    assert SPEC.fit(1200) == 688
    assert SPEC.fit(100) == 1788


def test_outputs_are_heavy_tailed_and_long_answers_are_longer() -> None:
    plan = plan_mixed(2000, 0, MIX, seed=7)
    short = [p.max_tokens for p in plan if p.kind == "short"]
    long = [p.max_tokens for p in plan if p.kind == "long"]
    # medians near the spec's (32, 160); the mean well above the median (a right tail)
    assert 26 <= statistics.median(short) <= 38
    assert 130 <= statistics.median(long) <= 190
    assert statistics.mean(short) > 1.3 * statistics.median(short)
    assert max(short) > 8 * statistics.median(short)
    # the clip bites only on the long tail
    assert max(long) <= SPEC.fit(1000)
    assert any(p.max_tokens == SPEC.fit(p.prompt_tokens) for p in plan if p.kind == "long")


def test_the_same_seed_gives_the_same_plan_and_another_seed_another() -> None:
    a = plan_mixed(24, 100, MIX, "heavy=4,light=1", seed=3)
    assert a == plan_mixed(24, 100, MIX, "heavy=4,light=1", seed=3)
    assert a != plan_mixed(24, 100, MIX, "heavy=4,light=1", seed=4)
    # the global random state plays no part
    random.seed(123)
    b = plan_mixed(24, 100, MIX, "heavy=4,light=1", seed=3)
    random.seed(456)
    assert b == plan_mixed(24, 100, MIX, "heavy=4,light=1", seed=3) == a


def test_schedule_priorities_and_tenants_are_the_bursts() -> None:
    plan = plan_mixed(10, 250, MIX, "heavy=4,light=1", seed=1)
    burst = plan_burst(10, 870, 200, 250, MIX, "heavy=4,light=1")
    assert [(p.index, p.at_s, p.priority, p.tenant) for p in plan] == [
        (p.index, p.at_s, p.priority, p.tenant) for p in burst
    ]
    assert [p.priority for p in plan] == interleave(parse_mix(MIX), 10)
    assert all(p.tenant is None for p in plan_mixed(10, 0, MIX, seed=1))


def test_a_mixed_request_asks_for_its_planned_output() -> None:
    p = next(p for p in plan_mixed(24, 0, MIX, seed=1) if p.kind == "long")
    body = request_body(p, "tiny", seed=5)
    assert body["max_tokens"] == p.max_tokens and body["ignore_eos"] is True
    assert len(body["messages"][0]["content"].split()) == p.prompt_tokens


def test_bad_specs_are_refused() -> None:
    with pytest.raises(ValueError, match="long_share"):
        plan_mixed(10, 0, MIX, spec=MixedSpec(long_share=1.5))
    with pytest.raises(ValueError, match="no room"):
        plan_mixed(10, 0, MIX, spec=MixedSpec(long_prompt=(1000, 1900)))
    with pytest.raises(ValueError, match="--mix"):
        plan_mixed(10, 0, "urgent=1")


def test_lognormal_draws_from_its_generator_only() -> None:
    dist = LogNormal(32, 1.0, 8)
    a = [dist.draw(random.Random(9)) for _ in range(3)]
    assert a == [dist.draw(random.Random(9))] * 3
    assert LogNormal(1, 0.0, 8).draw(random.Random(1)) == 8  # the floor
    assert dist.text() == "lognormal(median 32, σ 1), ≥ 8"


def test_describe_and_plan_text_state_the_plan() -> None:
    plan = plan_mixed(24, 0, MIX, seed=1)
    d = describe(plan)
    assert list(d) == ["short", "long"]
    assert (d["short"]["requests"], d["long"]["requests"]) == (17, 7)
    longs = [p.max_tokens for p in plan if p.kind == "long"]
    assert d["long"]["output_tokens"]["sum"] == sum(longs)
    assert d["long"]["output_tokens"]["max"] == max(longs)
    assert d["long"]["prompt_words"]["min"] >= 1000
    text = plan_text(plan)
    assert text.startswith("short 17: prompt ") and "; long 7: prompt " in text
    assert describe(plan_burst(4, 870, 200, 0, MIX)) == {
        "all": {
            "requests": 4,
            "prompt_words": {"min": 870, "p50": 870, "max": 870},
            "output_tokens": {"min": 200, "p50": 200, "p95": 200, "max": 200, "sum": 800},
        }
    }
    spec = SPEC.text()
    for part in ("70% short", "80–120 words", "median 32", "30% long", "1000–1200", "≤ 2048"):
        assert part in spec
