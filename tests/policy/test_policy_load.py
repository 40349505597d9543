"""Policy files: the default loads, bad files name the field, generated code is current."""

from __future__ import annotations

from pathlib import Path

import pytest

from ext_proc.policy.load import PolicyError, load_policy, parse_policy
from ext_proc.policy.settings import Level
from ext_proc.tools.protogen import ROOT, generate


def test_builtin_default_policy_loads_with_documented_defaults() -> None:
    policy = load_policy(None)
    profile = policy.profiles[policy.default_profile]
    assert profile.max_model_len == 8192
    assert profile.pressure.weight_kv_cache == 0.40 and profile.pressure.weight_queue == 0.25
    assert dict(profile.max_tokens_cap) == {Level.HIGH: 1024, Level.CRITICAL: 256}
    assert dict(profile.shed_at) == {"sheddable": Level.HIGH, "standard": Level.CRITICAL}
    assert policy.pools["default"].scrape_interval_s == 0.2
    assert policy.routes["completions"].priority == "sheddable"


def test_empty_file_gives_a_default_profile_and_pool() -> None:
    policy = parse_policy("")
    assert set(policy.profiles) == {"default"} and set(policy.pools) == {"default"}
    assert policy.profiles["default"].max_model_len is None


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("profiles: {a: {max_model_length: 3}}", 'no field named "max_model_length"'),
        ("profiles: {a: {max_model_len: lots}}", "max_model_len"),
        ("profiles: {a: {max_model_len: 0}}", "profiles.a.max_model_len: must be > 0"),
        (
            "profiles: {a: {pressure: {thresholds: {medium: 70}}}}",
            "profiles.a.pressure.thresholds.high: must be greater than the level below (70.0)",
        ),
        (
            "profiles: {a: {pressure: {thresholds: {critical: 150}}}}",
            "profiles.a.pressure.thresholds.critical: must be in (0, 100]",
        ),
        (
            "profiles: {a: {pressure: {weight_kv_cache: -1}}}",
            "profiles.a.pressure.weight_kv_cache: must be a finite number",
        ),
        (
            "profiles: {a: {pressure: {weight_kv_cache: 0, weight_queue: 0, weight_pcie: 0}}}",
            "at least one weight must be > 0",
        ),
        ("profiles: {a: {shed: {standard: huge}}}", "profiles.a.shed.standard: unknown level"),
        ("profiles: {a: {default_priority: vip}}", "profiles.a.default_priority: unknown priority"),
        ("profiles: {a: {fail_mode: maybe}}", "profiles.a.fail_mode: must be 'open' or 'closed'"),
        ("profiles: {a: {retry_after_s: 0}}", "profiles.a.retry_after_s: must be ≥ 1"),
        (
            "profiles: {a: {backend_overload_status: 500}}",
            "profiles.a.backend_overload_status: must be 503, 429 or 0 (off), got 500",
        ),
        ("profiles: {a: {backend_overload_status: -1}}", "backend_overload_status"),
        ("pools: {a: {metrics_urls: [foo]}}", "pools.a.metrics_urls[0]: not an http(s) URL"),
        ("pools: {a: {scrape_interval_s: 0}}", "pools.a.scrape_interval_s: must be a number > 0"),
        ("default_profile: nope", "default_profile: no profile named 'nope'"),
        ("routes: {chat: {profile: nope}}", "routes.chat.profile: no profile named 'nope'"),
        ("routes: {chat: {pool: nope}}", "routes.chat.pool: no pool named 'nope'"),
        ("routes: {chat: {priority: vip}}", "routes.chat.priority: unknown priority"),
        ("priority_header: x-ice-priority", "priority_header: 'x-ice-priority' is reserved"),
        ("- a\n- b", "the top level must be a mapping"),
        ("a: [", "not valid YAML"),
    ],
    ids=lambda v: v if len(v) < 30 else v[:30],
)
def test_bad_policy_names_field_and_problem(text: str, fragment: str) -> None:
    with pytest.raises(PolicyError) as info:
        parse_policy(text, source="p.yaml")
    assert fragment in str(info.value)
    assert str(info.value).startswith("p.yaml: ")


def test_missing_file_is_a_policy_error(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="cannot read"):
        load_policy(tmp_path / "absent.yaml")


def test_explicit_caps_replace_the_defaults() -> None:
    policy = parse_policy("profiles: {default: {max_tokens_cap: {medium: 2048}}}")
    assert dict(policy.profiles["default"].max_tokens_cap) == {Level.MEDIUM: 2048}


def test_shed_never_disables_shedding_for_a_priority() -> None:
    policy = parse_policy("profiles: {default: {shed: {standard: never, sheddable: medium}}}")
    assert dict(policy.profiles["default"].shed_at) == {"sheddable": Level.MEDIUM}


def test_generated_protobuf_code_is_current(tmp_path: Path) -> None:
    generate(tmp_path)
    committed = ROOT / "ext_proc" / "_pb"
    for name in ("policy_pb2.py", "policy_pb2.pyi"):
        assert (tmp_path / name).read_text() == (committed / name).read_text(), (
            f"{name} is stale: run `make protos`"
        )


KV_DATA = Path(__file__).parents[1] / "data" / "kv"


def test_kv_model_loads_the_config_and_checks_it(tmp_path: Path) -> None:
    config = next(p for p in sorted(KV_DATA.glob("*.json")) if "llama" in p.name.lower())
    policy = parse_policy(f"profiles: {{default: {{kv_model: {{config: '{config}', tp: 1}}}}}}")
    spec = policy.profiles["default"].kv_model
    assert spec is not None and spec.shape.num_layers > 0


@pytest.mark.parametrize(
    ("kv_model", "fragment"),
    [
        ("{}", "kv_model.config: the path of the model's config.json is required"),
        ("{config: /nonexistent/config.json}", "kv_model.config: cannot read"),
    ],
    ids=["missing", "unreadable"],
)
def test_bad_kv_model_names_the_field(kv_model: str, fragment: str) -> None:
    with pytest.raises(PolicyError) as info:
        parse_policy(f"profiles: {{default: {{kv_model: {kv_model}}}}}")
    assert fragment in str(info.value)


def test_hybrid_model_config_is_refused_as_not_modelled(tmp_path: Path) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(
        '{"model_type": "jamba", "num_hidden_layers": 32, "hidden_size": 4096,'
        ' "num_attention_heads": 32, "num_key_value_heads": 8}'
    )
    with pytest.raises(PolicyError) as info:
        parse_policy(f"profiles: {{default: {{kv_model: {{config: '{cfg}'}}}}}}")
    assert "profiles.default.kv_model" in str(info.value)
    assert "jamba" in str(info.value).lower() or "not modelled" in str(info.value).lower()


def test_on_kv_shortfall_values() -> None:
    assert (
        parse_policy("profiles: {default: {on_kv_shortfall: shed}}")
        .profiles["default"]
        .on_kv_shortfall
        == "shed"
    )
    with pytest.raises(PolicyError, match="on_kv_shortfall"):
        parse_policy("profiles: {default: {on_kv_shortfall: panic}}")


def test_kv_hold_defaults_to_done_and_takes_only_done_or_seen() -> None:
    pool = "pools: {p: {metrics_urls: ['http://127.0.0.1:1/metrics']%s}}"
    assert parse_policy(pool % "").pools["p"].kv_hold == "done"
    assert parse_policy(pool % ", kv_hold: seen").pools["p"].kv_hold == "seen"
    with pytest.raises(PolicyError, match="kv_hold: must be done or seen"):
        parse_policy(pool % ", kv_hold: forever")


@pytest.mark.parametrize(
    ("text", "expected"),
    [("", 503), ("backend_overload_status: 429", 429), ("backend_overload_status: 0", 0)],
    ids=["default", "429", "off"],
)
def test_backend_overload_status(text: str, expected: int) -> None:
    policy = parse_policy(f"profiles: {{default: {{{text}}}}}")
    assert policy.profiles["default"].backend_overload_status == expected
