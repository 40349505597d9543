"""The ``ice`` command as an operator runs it (subprocess)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"


def ice(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "ext_proc.cli", *args],
        input=stdin,
        capture_output=True,
        timeout=60,
        check=False,
    )


def test_evaluate_prints_decision_scores_and_exact_mutation(tmp_path: Path) -> None:
    req = tmp_path / "req.json"
    req.write_bytes(
        b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 100000}'
    )
    out = ice("evaluate", "--metrics", str(DATA / "vllm_v1_metrics.txt"), str(req))
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    # usage 0.8742, 3 waiting: 100 × (0.40 × 0.8742 + 0.25 × 3/8) / 0.65 = 68.22 → high
    assert report["mem_pressure_score"] == 68.22 and report["mem_pressure"] == "high"
    assert report["decision"] == "downgrade" and report["reason"] == "pressure_cap"
    assert report["mutation"]["body"]["max_tokens"] == 1024
    assert report["mutation"]["request_headers"]["x-ice-original-max-tokens"] == "100000"


def test_evaluate_sheddable_route_gets_the_429_it_would_send(tmp_path: Path) -> None:
    req = tmp_path / "req.json"
    req.write_text('{"prompt": "hello", "max_tokens": 5}')
    out = ice(
        "evaluate",
        "--metrics",
        str(DATA / "vllm_v1_metrics.txt"),
        "--route",
        "completions",
        "--path",
        "/v1/completions",
        str(req),
    )
    report = json.loads(out.stdout)
    assert report["priority"] == "sheddable" and report["decision"] == "reject"
    resp = report["mutation"]["immediate_response"]
    assert resp["status"] == 429 and resp["headers"]["retry-after"] == "2"
    assert resp["body"]["error"]["type"] == "rate_limit_error"


def test_evaluate_says_a_shed_request_would_wait_in_the_profiles_queue(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "profiles:\n  default:\n    queue: {enabled: true, max_queue_wait_ms: 5000}\n"
    )
    req = tmp_path / "req.json"
    req.write_text('{"prompt": "hello", "max_tokens": 5}')
    args = ["evaluate", "--policy", str(policy), "--metrics", str(DATA / "vllm_v1_metrics.txt")]
    # high pressure (68.22): a sheddable request is shed for memory, so it would be queued
    out = ice(*args, "--path", "/v1/completions", "--priority", "sheddable", str(req))
    report = json.loads(out.stdout)
    assert report["reason"] == "memory_pressure"
    assert report["queue"] == {"would_queue": True, "max_queue_wait_ms": 5000, "tenant": "default"}
    out = ice(*args, "--path", "/v1/completions", "--priority", "standard", str(req))
    assert json.loads(out.stdout)["queue"]["would_queue"] is False  # standard passes at high


def test_evaluate_without_metrics_reports_unknown_pressure() -> None:
    out = ice("evaluate", "-", stdin=b'{"messages": [], "max_tokens": 10}')
    report = json.loads(out.stdout)
    assert report["mem_pressure"] == "unknown" and report["decision"] == "pass"


def test_bad_policy_stops_start_up_naming_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "p.yaml"
    bad.write_text("profiles:\n  chat:\n    pressure:\n      thresholds: {high: 30}\n")
    out = ice("serve", "--policy", str(bad), "--address", "127.0.0.1:1")
    assert out.returncode == 2
    assert b"profiles.chat.pressure.thresholds.high" in out.stderr


def test_lab_commands_say_they_need_a_checkout_where_the_lab_is_absent(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from ext_proc import cli

    monkeypatch.setattr(cli, "_lab_installed", lambda: False)
    assert cli.main(["demo", "--no-wait"]) == 2
    assert "demo is a lab command: it needs a source checkout" in capsys.readouterr().err
    assert cli.main(["dev-backend"]) == 2
