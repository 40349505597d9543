"""Envoy's access log carries ICE's verdict: one JSON line per request with the decision, the
reason, the pressure, the profile, the input tokens, the output limit asked for and granted,
what truncation dropped, and the ext_proc filter's own status (a fail-open is visible)."""

from __future__ import annotations

from pathlib import Path

from .harness import CHAT, HIGH, HIGH_SCORE, MAX_MODEL_LEN, running_stack
from .harness import access_log_entry as _entry

MSGS = [{"role": "user", "content": "Explain KV caches in two sentences."}]


def test_each_judged_request_logs_its_verdict(tmp_path: Path) -> None:
    with running_stack(tmp_path) as e2e:
        e2e.set_state(HIGH, level="high", score=HIGH_SCORE)
        body = {"model": "dev-model", "messages": MSGS}
        assert e2e.post(f"{CHAT}?t=pass", {**body, "max_tokens": 64}).status == 200
        assert e2e.post(f"{CHAT}?t=down", {**body, "max_tokens": 5000}).status == 200
        shed = e2e.post(f"{CHAT}?t=shed", body, {"x-priority": "sheddable"})
        assert shed.status == 429
        passed, downgraded, rejected = (
            _entry(e2e, f"{CHAT}?t={t}") for t in ("pass", "down", "shed")
        )
        for entry in (passed, downgraded, rejected):
            assert entry["route"] == "chat"
            assert entry["profile"] == "default"
            assert entry["pressure"] == "high" and entry["score"] == HIGH_SCORE
            assert int(entry["input_tokens"]) > 0
            assert entry["ext_proc_headers_status"] == "0"  # gRPC OK: ICE answered
        assert (passed["decision"], passed["status"]) == ("pass", 200)
        assert (passed["max_tokens_requested"], passed["max_tokens_granted"]) == ("64", "64")
        assert (downgraded["decision"], downgraded["reason"]) == ("downgrade", "pressure_cap")
        assert downgraded["max_tokens_requested"] == "5000"
        assert downgraded["max_tokens_granted"] == "1024"
        assert (rejected["decision"], rejected["status"]) == ("reject", 429)
        assert rejected["max_tokens_granted"] is None
        assert int(passed["input_tokens"]) < MAX_MODEL_LEN


def test_a_fail_open_request_is_visible_in_the_log(tmp_path: Path) -> None:
    with running_stack(tmp_path, start_ice=False) as e2e:
        reply = e2e.post(
            f"{CHAT}?t=open", {"model": "dev-model", "messages": MSGS, "max_tokens": 8}
        )
        assert reply.status == 200
        entry = _entry(e2e, f"{CHAT}?t=open")
        assert entry["decision"] is None  # ICE never judged it
        assert entry["ext_proc_failed_open"] == "1", entry  # the filter gave up on ICE
        # the failed call (14), or none at all: no healthy ICE host, and no panic mode
        assert entry["ext_proc_headers_status"] in (None, "14"), entry
