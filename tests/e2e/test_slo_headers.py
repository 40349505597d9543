"""Through real Envoy: a profile's ``slo`` targets, tightened by the client's llm-d headers,
reach the backend as ``x-ice-slo-ttft-ms`` / ``x-ice-slo-tpot-ms`` (docs/slo.md); the
client's own headers go on as sent, a client's ``x-ice-slo-*`` does not, and the verdict is
the one a request without targets gets."""

from __future__ import annotations

from pathlib import Path

from .harness import CHAT, LOW, LOW_SCORE, running_stack

BODY = {"model": "dev-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


def test_the_target_used_reaches_the_backend(tmp_path: Path) -> None:
    extra = "    slo: {ttft_ms: 2000, tpot_ms: 50}\n"
    with running_stack(tmp_path, profile_extra=extra) as e2e:
        e2e.set_state(LOW, level="low", score=LOW_SCORE)
        sent = {
            "x-llm-d-slo-ttft-ms": "700",  # tighter: taken
            "x-llm-d-slo-tpot-ms": "80",  # looser: the profile's 50
            "x-ice-slo-ttft-ms": "1",  # ICE's own header: never the client's
        }
        reply = e2e.post(CHAT, BODY, sent)
        assert reply.status == 200, reply
        assert reply.header("x-ice-decision") == "pass"
        rec = e2e.only_received()
        assert rec.header("x-ice-slo-ttft-ms") == "700"
        assert rec.header("x-ice-slo-tpot-ms") == "50"
        assert [v for k, v in rec.header_list if k == "x-ice-slo-ttft-ms"] == ["700"]
        assert rec.header("x-llm-d-slo-ttft-ms") == "700"
        assert rec.header("x-llm-d-slo-tpot-ms") == "80"
        assert rec.header("x-ice-decision") == "pass"
