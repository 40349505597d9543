"""``compact_system_json`` through the pipeline: the compacted body is what ICE judges and what
goes on (a pass too), marked ``x-ice-compacted``; off by default, and never in shadow mode."""

from __future__ import annotations

import json
import time

from ext_proc.admit.outcome import Continue
from ext_proc.admit.pipeline import Pipeline, RequestFacts
from ext_proc.policy.load import default_policy_text, parse_policy
from ext_proc.schemas import OPENAI_CHAT
from ext_proc.signals.snapshot import BackendSignals, PoolSnapshot

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
SYSTEM = "Answer with this config:\n" + json.dumps({"units": "metric", "lang": ["en"]}, indent=4)
BODY = json.dumps(
    {
        "model": "m",
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi"}],
        "max_tokens": 32,
    },
    indent=2,
).encode()


def _pipeline(extra: str) -> Pipeline:
    text = default_policy_text().replace("    fail_mode: open", "    fail_mode: open\n" + extra)
    backend = BackendSignals(url="u", kv_cache_usage=0.1, num_requests_waiting=0)
    calm = PoolSnapshot(pool="default", backends=(backend,), taken_at_s=time.monotonic())
    return Pipeline(parse_policy(text), lambda _pool: calm)


def _judge(pipeline: Pipeline) -> Continue:
    route = pipeline.router.resolve([])
    verdict = pipeline.on_body(route, RequestFacts(adapter=OPENAI_CHAT), BODY)
    assert verdict is not None and isinstance(verdict.outcome, Continue)
    return verdict.outcome


def test_a_pass_forwards_the_compacted_body_with_its_saving() -> None:
    outcome = _judge(_pipeline("    compact_system_json: true"))
    assert outcome.body is not None
    sent = json.loads(outcome.body)
    system = sent["messages"][0]["content"]
    assert system == 'Answer with this config:\n{"units":"metric","lang":["en"]}'
    assert json.loads(system.split("\n", 1)[1]) == {"units": "metric", "lang": ["en"]}
    assert sent["messages"][1] == {"role": "user", "content": "hi"}
    saved = dict(outcome.headers)["x-ice-compacted"]
    assert saved.startswith("tokens=") and int(saved.split("=")[1]) > 0


def test_off_by_default_and_in_shadow_mode_the_body_is_untouched() -> None:
    for extra in ("", "    compact_system_json: true\n    mode: shadow"):
        outcome = _judge(_pipeline(extra))
        assert outcome.body is None, extra
        assert "x-ice-compacted" not in dict(outcome.headers)


def test_a_shadow_profile_judges_the_body_enforce_would_judge_and_forwards_the_original() -> None:
    """Shadow is applied last: the would-be verdict is made on the compacted decode, as
    enforce makes it, and the request still goes on as the client sent it."""
    route_input: dict[str, int] = {}
    for mode in ("enforce", "shadow"):
        pipeline = _pipeline(f"    compact_system_json: true\n    mode: {mode}")
        verdict = pipeline.on_body(
            pipeline.router.resolve([]), RequestFacts(adapter=OPENAI_CHAT), BODY
        )
        assert verdict is not None and verdict.features is not None
        route_input[mode] = verdict.features.input_tokens
        if mode == "shadow":
            assert isinstance(verdict.outcome, Continue) and verdict.outcome.body is None
            assert dict(verdict.outcome.headers)["x-ice-shadow-decision"] == "pass"
    plain = _pipeline("").on_body(
        _pipeline("").router.resolve([]), RequestFacts(adapter=OPENAI_CHAT), BODY
    )
    assert plain is not None and plain.features is not None
    assert route_input["shadow"] == route_input["enforce"] < plain.features.input_tokens
