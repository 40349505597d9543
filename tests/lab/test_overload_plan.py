"""The overload benchmark's plans and wiring, without vLLM: tenants interleaved by weight, the
tenant-alone control, the queue policy, the order of the modes per round, the command line's
argument checks."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import pytest
import yaml

from ext_proc._pb import policy_pb2
from ext_proc.lab.overload import (
    POLICY,
    Planned,
    QueuePolicyError,
    RunResult,
    Setup,
    alone,
    compare,
    interleave,
    parse_tenants,
    plan_burst,
    queue_policy,
)
from ext_proc.lab.overload import policies as policies_mod
from ext_proc.lab.overload import setup as setup_mod

REPO = Path(__file__).resolve().parents[2]


def test_tenants_are_interleaved_by_weight_beside_the_priorities() -> None:
    plan = plan_burst(10, 870, 200, 250, "standard=3,sheddable=2", "heavy=4,light=1")
    # smooth weighted round robin, 4:1: h h l h h, then again
    assert [p.tenant for p in plan] == ["heavy"] * 2 + ["light"] + ["heavy"] * 4 + ["light"] + [
        "heavy"
    ] * 2
    # the priorities are the plan's without tenants
    plain = plan_burst(10, 870, 200, 250, "standard=3,sheddable=2")
    assert [p.priority for p in plan] == [p.priority for p in plain]
    assert all(p.tenant is None for p in plain)
    assert plan == plan_burst(10, 870, 200, 250, "standard=3,sheddable=2", "heavy=4,light=1")


def test_interleave_keeps_the_weights_over_each_cycle() -> None:
    names = interleave({"a": 2, "b": 1, "c": 1}, 8)
    assert names == ["a", "b", "c", "a", "a", "b", "c", "a"]


def test_tenant_alone_keeps_index_time_and_size() -> None:
    plan = plan_burst(10, 870, 200, 250, "standard=1", "heavy=4,light=1")
    control = alone(plan, "light")
    assert control == [
        Planned(2, 0.5, "standard", 870, 200, "light"),
        Planned(7, 1.75, "standard", 870, 200, "light"),
    ]
    with pytest.raises(ValueError, match="no request"):
        alone(plan, "nobody")


@pytest.mark.parametrize("spec", ["heavy", "heavy=0", "heavy=x", "a b=1", "a=1,a=2", "=1", ""])
def test_bad_tenant_specs_are_refused(spec: str) -> None:
    with pytest.raises(ValueError, match="--tenants"):
        parse_tenants(spec)


def test_tenant_specs() -> None:
    assert parse_tenants("heavy=4, light=1") == {"heavy": 4, "light": 1}


def _minimal_template(tmp_path: Path) -> Path:
    """The tiny policy without what needs the tiny model on disk (tokenizer, truncation)."""
    policy: dict[str, Any] = yaml.safe_load(POLICY.read_text())
    policy.pop("tokenizers", None)
    for profile in policy["profiles"].values():
        profile.pop("truncation", None)
    path = tmp_path / "template.yaml"
    path.write_text(yaml.safe_dump(policy, sort_keys=False))
    return path


def test_queue_policy_turns_the_queue_on_in_every_profile(tmp_path: Path) -> None:
    policy: dict[str, Any] = yaml.safe_load(POLICY.read_text())
    policy["profiles"]["second"] = {**policy["profiles"]["tiny"], "queue": {"enabled": False}}
    template = tmp_path / "two.yaml"
    template.write_text(yaml.safe_dump(policy, sort_keys=False))
    out = queue_policy(template, tmp_path / "q.yaml", 1234, 7, "x-tenant", critical="wait")
    written = yaml.safe_load(out.read_text())
    want = {
        "enabled": True,
        "max_queue_wait_ms": 1234,
        "max_queue_length": 7,
        "tenant_header": "x-tenant",
        "max_tenants": 16,
        "critical": "wait",
    }
    assert {name: p["queue"] for name, p in written["profiles"].items()} == {
        "tiny": want,
        "second": want,
    }
    # everything else as it was
    for p in written["profiles"].values():
        p.pop("queue")
    policy["profiles"]["second"].pop("queue")
    assert written == policy


def test_a_queue_policy_that_does_not_load_fails_before_anything_starts(tmp_path: Path) -> None:
    # 0 ms is out of range once ICE knows `queue`; an unknown key before: either way refused
    bad = queue_policy(_minimal_template(tmp_path), tmp_path / "bad.yaml", 0, 7, "x-tenant")
    with pytest.raises(QueuePolicyError, match="queue mode"):
        policies_mod.check_queue_policy(bad)


@pytest.mark.skipif(
    "queue" not in policy_pb2.Profile.DESCRIPTOR.fields_by_name,
    reason="this ICE has no profile key `queue` yet",
)
def test_the_queue_policy_loads_with_the_queue_on(tmp_path: Path) -> None:
    from ext_proc.policy.load import load_policy

    path = queue_policy(_minimal_template(tmp_path), tmp_path / "q.yaml", 30000, 64, "x-tenant")
    policies_mod.check_queue_policy(path)
    spec = load_policy(path).profiles["tiny"].queue
    assert spec is not None
    assert (spec.max_queue_wait_ms, spec.max_queue_length, spec.tenant_header) == (
        30000,
        64,
        "x-tenant",
    )


def _setup(queue: bool) -> Setup:
    return Setup(
        vllm_url="http://vllm",
        envoy_url="http://envoy",
        admin_port=1,
        model="tiny",
        stack=cast(Any, None),
        vllm=cast(Any, None),
        ice_metrics_url="http://ice/metrics",
        queue_url="http://envoy-queue" if queue else None,
        queue_admin_port=2 if queue else None,
        queue_ice_metrics_url="http://ice-queue/metrics" if queue else None,
    )


def test_each_mode_goes_to_its_own_target() -> None:
    s = _setup(queue=True)
    assert s.target("direct") == ("http://vllm", None, None)
    assert s.target("ice") == ("http://envoy", 1, "http://ice/metrics")
    assert s.target("queue") == ("http://envoy-queue", 2, "http://ice-queue/metrics")
    with pytest.raises(ValueError, match="queue=True"):
        _setup(queue=False).target("queue")
    with pytest.raises(ValueError, match="unknown mode"):
        s.target("both")


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """``compare`` with its runs recorded instead of sent."""
    seen: list[dict[str, Any]] = []

    async def fake_run(**kw: Any) -> RunResult:
        seen.append(kw)
        return RunResult(
            mode=kw["mode"],
            round=kw["round_no"],
            wall_s=1.0,
            preemptions=0,
            queue_time_mean_s=None,
            vllm_requests=0,
            waiting_max=0,
            running_max=0,
            kv_usage_max=0.0,
            ext_proc={},
            shots=[],
            ttft_slo_s=kw["ttft_slo_s"],
            variant=kw["variant"],
        )

    monkeypatch.setattr(setup_mod, "run_burst", fake_run)
    monkeypatch.setattr(setup_mod, "wait_idle", lambda url: None)
    return seen


def _order(seen: Sequence[dict[str, Any]]) -> list[tuple[int, str]]:
    return [(c["round_no"], c["mode"] + (f" {c['variant']}" if c["variant"] else "")) for c in seen]


def test_two_modes_alternate_per_round(calls: list[dict[str, Any]]) -> None:
    burst = plan_burst(2, 10, 10, 250, "standard=1")
    results = compare(_setup(queue=False), burst, rounds=3, progress=None)
    assert _order(calls) == [
        (1, "direct"),
        (1, "ice"),
        (2, "ice"),
        (2, "direct"),
        (3, "direct"),
        (3, "ice"),
    ]
    assert [r.mode for r in results] == [c["mode"] for c in calls]
    # direct: straight to vLLM, no Envoy; ice: Envoy's admin and ICE's metrics
    assert calls[0]["target"] == "http://vllm" and calls[0]["admin_port"] is None
    assert calls[1]["target"] == "http://envoy" and calls[1]["admin_port"] == 1


def test_three_modes_and_a_control_rotate_per_round(calls: list[dict[str, Any]]) -> None:
    burst = plan_burst(5, 10, 10, 250, "standard=1", "heavy=4,light=1")
    controls = {"light alone": alone(burst, "light")}
    compare(
        _setup(queue=True),
        burst,
        rounds=2,
        modes=["direct", "ice", "queue"],
        progress=None,
        ttft_slo_s=1.5,
        controls=controls,
    )
    first = ["direct", "ice", "queue", "direct light alone", "ice light alone", "queue light alone"]
    assert _order(calls) == [(1, m) for m in first] + [(2, m) for m in first[1:] + first[:1]]
    assert all(c["ttft_slo_s"] == 1.5 for c in calls)
    assert [len(c["burst"]) for c in calls[:6]] == [5, 5, 5, 1, 1, 1]
    assert calls[2]["target"] == "http://envoy-queue" and calls[2]["admin_port"] == 2
    # fresh prompt text: no two runs share a seed
    assert len({c["seed"] for c in calls}) == len(calls)


def test_the_queue_mode_without_its_ice_fails_before_any_run(calls: list[dict[str, Any]]) -> None:
    burst = plan_burst(2, 10, 10, 250, "standard=1")
    with pytest.raises(ValueError, match="queue=True"):
        compare(_setup(queue=False), burst, rounds=1, modes=["direct", "queue"], progress=None)
    assert calls == []


def _bench() -> Any:
    spec = importlib.util.spec_from_file_location("bench_overload", REPO / "bench" / "overload.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_modes() -> None:
    bench = _bench()
    assert bench.parse_modes("queue,direct") == ["queue", "direct"]
    for bad in ("direct,both", "ice,ice", ""):
        with pytest.raises(ValueError, match="--modes"):
            bench.parse_modes(bad)


@pytest.mark.parametrize(
    "argv",
    [
        ["--modes", "direct,nope"],
        ["--tenants", "heavy=0"],
        ["--tenant-alone", "light"],  # without --tenants
        ["--tenants", "heavy=4,light=1", "--tenant-alone", "medium"],
        ["--ice-workers", "0"],
    ],
)
def test_bench_refuses_bad_arguments_before_starting_anything(
    argv: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    bench = _bench()

    def no_setup(*a: object, **k: object) -> None:
        raise AssertionError("overload_setup called")

    monkeypatch.setattr(bench, "overload_setup", no_setup)
    with pytest.raises(SystemExit) as exc:
        bench.main(argv)
    assert exc.value.code == 2
