"""``ext_proc.lab.gpupool.workloads`` and ``dilate``: plans, the sustainable rate, the k scaling."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ext_proc.lab.gpupool import H100_SXM, Chunk, PoolSpec, step_time
from ext_proc.lab.gpupool.dilate import gpu_policy, wall_plan
from ext_proc.lab.gpupool.workloads import KINDS, MARGIN_TOKENS, plan_gpu, sustainable_rate
from ext_proc.lab.overload.burst import Planned
from ext_proc.policy.load import load_policy


@pytest.mark.parametrize("kind", KINDS)
def test_plans_are_seeded_and_fit_the_context(kind: str) -> None:
    plan = plan_gpu(kind, 200, 4.0, seed=3, max_model_len=32_768)
    assert plan == plan_gpu(kind, 200, 4.0, seed=3, max_model_len=32_768)
    assert plan != plan_gpu(kind, 200, 4.0, seed=4, max_model_len=32_768)
    assert all(p.prompt_tokens + p.max_tokens + MARGIN_TOKENS <= 32_768 for p in plan)
    assert [p.at_s for p in plan] == sorted(p.at_s for p in plan) and plan[0].at_s == 0.0
    assert {p.kind for p in plan} <= {"chat", "retrieval", "reasoning"}


def test_kind_ranges() -> None:
    ret = plan_gpu("retrieval", 300, 1.0)
    assert all(4000 <= p.prompt_tokens <= 16000 and p.max_tokens >= 16 for p in ret)
    rea = plan_gpu("reasoning", 300, 1.0)
    assert all(2000 <= p.max_tokens <= 8000 for p in rea)
    mix = plan_gpu("mix", 600, 1.0)
    shares = {k: sum(p.kind == k for p in mix) / 600 for k in ("chat", "retrieval", "reasoning")}
    assert shares["chat"] == pytest.approx(0.6, abs=0.06)


def test_poisson_mean_gap() -> None:
    plan = plan_gpu("chat", 4001, 8.0, seed=5)
    assert plan[-1].at_s / 4000 == pytest.approx(1 / 8.0, rel=0.05)


def test_client_limits() -> None:
    plan = plan_gpu("chat", 100, 1.0, limits="client")
    assert all(p.client_like for p in plan)
    assert {p.sent_limit for p in plan} == {1024, None}


def test_unknown_kind() -> None:
    with pytest.raises(ValueError, match="unknown workload"):
        plan_gpu("video", 10, 1.0)


def test_sustainable_rate_hand_computed() -> None:
    # Two requests: prompts 83 + 17 = 100 and 183 + 17 = 200 tokens → P = 150; outputs 100
    # and 300 → O = 200; held = 250. 256 blocks of 16: 255 × 16 = 4,080 slots → N = 16;
    # prefill 16 × 150 / 200 = 12 tokens at context 75.
    spec = PoolSpec(kv_memory_bytes=512 * 2**20, max_model_len=2048)
    plan = [Planned(0, 0.0, "standard", 83, 100), Planned(1, 1.0, "standard", 183, 300)]
    chunks = [Chunk(1, 250)] * 16 + [Chunk(12, 75)]
    step_s = step_time(spec.cost, H100_SXM, chunks, 16).seconds
    assert sustainable_rate(spec, plan) == pytest.approx(16 / 200 / step_s)


def test_wall_plan_scales_arrivals() -> None:
    plan = plan_gpu("chat", 5, 2.0)
    assert [p.at_s for p in wall_plan(plan, 10.0)] == pytest.approx([p.at_s * 10 for p in plan])


@pytest.mark.parametrize("admission", ["reserve", "forecast", "slo"])
def test_gpu_policy_loads_with_scaled_times(tmp_path: Path, admission: str) -> None:
    out = gpu_policy(tmp_path / "p.yaml", max_model_len=32_768, k=10.0, admission=admission)
    data = yaml.safe_load(out.read_text())
    data.pop("tokenizers")  # a relative path that overload_setup's render_policy fixes
    out.write_text(yaml.safe_dump(data))
    policy = load_policy(out)
    profile = policy.profiles["tiny"]
    assert profile.max_model_len == 32_768 and profile.admission == admission
    assert profile.ttft_target_s == pytest.approx(20.0)
    assert profile.retry_after_s == 20
    pool = policy.pools["vllm"]
    assert pool.scrape_interval_s == pytest.approx(1.0)
    assert pool.max_age_s == pytest.approx(10.0)
    if admission in ("forecast", "slo"):
        assert profile.forecast is not None and profile.forecast.recovery_s == pytest.approx(100.0)
    # slo: the bench's 2 s modelled target × k; the others hold no target
    assert profile.slo.ttft_ms == (20_000 if admission == "slo" else None)
