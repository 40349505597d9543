"""The bench's client-like limits (``ext_proc.lab.overload.workload``, ``burst.request_body``)
and its admission rewrite (``setup.admission_policy``): the same sizes as the exact plan,
limits as clients send them, and vLLM still told to generate the drawn length."""

from __future__ import annotations

from pathlib import Path

import yaml

from ext_proc.lab.overload.burst import TINY_EOS_ID, request_body
from ext_proc.lab.overload.setup import admission_policy
from ext_proc.lab.overload.workload import CLIENT_LIMIT, plan_mixed
from ext_proc.policy.load import load_policy

POLICY = Path(__file__).resolve().parents[2] / "ext_proc" / "lab" / "vllm_tiny_policy.yaml"


def test_client_limits_keep_the_sizes_of_the_exact_plan() -> None:
    exact = plan_mixed(40, 100, "standard=1", seed=5)
    client = plan_mixed(40, 100, "standard=1", seed=5, limits="client")
    assert [(p.prompt_tokens, p.max_tokens, p.kind) for p in exact] == [
        (p.prompt_tokens, p.max_tokens, p.kind) for p in client
    ]
    assert all(p.client_like for p in client) and not any(p.client_like for p in exact)
    sent = [p.sent_limit for p in client]
    assert set(sent) == {CLIENT_LIMIT, None}
    assert 10 <= sent.count(None) <= 30  # half each, drawn
    assert sent == [
        p.sent_limit for p in plan_mixed(40, 100, "standard=1", seed=5, limits="client")
    ]


def test_a_client_like_body_sends_the_clients_limit_and_still_stops_at_the_drawn_length() -> None:
    plan = plan_mixed(40, 100, "standard=1", seed=5, limits="client")
    with_limit = next(p for p in plan if p.sent_limit is not None)
    without = next(p for p in plan if p.sent_limit is None)
    body = request_body(with_limit, "m", 1)
    assert body["max_tokens"] == CLIENT_LIMIT and "ignore_eos" not in body
    # vLLM stops at min_tokens + 1 with the end-of-sequence token favoured
    assert body["min_tokens"] == with_limit.max_tokens - 1
    assert body["logit_bias"] == {str(TINY_EOS_ID): 100}
    assert "max_tokens" not in request_body(without, "m", 1)
    exact = request_body(plan_mixed(1, 100, "standard=1", seed=5)[0], "m", 1)
    assert exact["ignore_eos"] is True and "min_tokens" not in exact


def test_the_admission_rewrite_sets_every_profile(tmp_path: Path) -> None:
    out = admission_policy(POLICY, tmp_path / "p.yaml", "forecast", read_floors=False)
    doc = yaml.safe_load(out.read_text())
    for profile in doc["profiles"].values():
        assert profile["admission"] == "forecast"
        assert profile["forecast"]["read_floors"] is False
    for spec in doc.get("tokenizers", {}).values():  # the loader needs a real model dir
        spec.pop("model_dir", None)
    doc.pop("tokenizers", None)
    (tmp_path / "q.yaml").write_text(yaml.safe_dump(doc))
    policy = load_policy(tmp_path / "q.yaml")
    assert all(
        p.admission == "forecast" and not p.forecast.read_floors for p in policy.profiles.values()
    )


def test_the_slo_arm_gives_every_profile_the_benchs_ttft_target(tmp_path: Path) -> None:
    out = admission_policy(POLICY, tmp_path / "p.yaml", "slo", ttft_ms=2000.0)
    doc = yaml.safe_load(out.read_text())
    doc.pop("tokenizers", None)
    (tmp_path / "q.yaml").write_text(yaml.safe_dump(doc))
    policy = load_policy(tmp_path / "q.yaml")
    assert policy.profiles
    for p in policy.profiles.values():
        assert p.admission == "slo" and p.forecasts and p.forecast.read_floors
        assert p.slo.ttft_ms == 2000.0
