"""``mode: shadow``: every request is judged as enforce would judge it, the would-be verdict
travels with it (``x-ice-shadow-decision``, ``x-ice-shadow-reason``) and is counted
(``ice_decisions_total{mode="shadow"}``), and the request reaches the backend unchanged."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from .harness import CHAT, E2E, HIGH, HIGH_SCORE, request, running_stack

MSGS = [{"role": "user", "content": "Explain KV caches in two sentences."}]


@pytest.fixture(scope="module")
def shadow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2E]:
    with running_stack(
        tmp_path_factory.mktemp("shadow"), profile_extra="    mode: shadow\n"
    ) as e2e:
        e2e.set_state(HIGH, level="high", score=HIGH_SCORE)
        yield e2e


def _shadow(headers: object) -> tuple[str | None, str | None]:
    get = headers.header  # type: ignore[attr-defined]
    return get("x-ice-shadow-decision"), get("x-ice-shadow-reason")


def test_a_request_enforce_would_shed_goes_on_unchanged_saying_so(shadow: E2E) -> None:
    shadow.clear_received()
    body = json.dumps({"model": "dev-model", "messages": MSGS, "max_tokens": 64}).encode()
    reply = shadow.post(CHAT, body, {"x-priority": "sheddable"})
    assert reply.status == 200, reply
    assert reply.header("x-ice-decision") == "pass"
    assert _shadow(reply) == ("reject", "memory_pressure")
    rec = shadow.only_received()
    assert rec.body == body
    assert _shadow(rec) == ("reject", "memory_pressure")


def test_a_request_enforce_would_downgrade_keeps_its_limit(shadow: E2E) -> None:
    shadow.clear_received()
    body = json.dumps({"model": "dev-model", "messages": MSGS, "max_tokens": 5000}).encode()
    reply = shadow.post(CHAT, body)
    assert reply.status == 200
    assert reply.header("x-downgraded") is None
    assert _shadow(reply) == ("downgrade", "pressure_cap")
    assert shadow.only_received().body == body


@pytest.mark.parametrize(
    ("body", "headers", "reason"),
    [
        (b'{"model": "dev-model", "messages": [', {}, "invalid_json"),
        (b"hello", {"content-type": "text/plain"}, "unsupported_media_type"),
    ],
    ids=["broken-json", "text-plain"],
)
def test_a_request_enforce_would_refuse_reaches_the_backend(
    shadow: E2E, body: bytes, headers: dict[str, str], reason: str
) -> None:
    shadow.clear_received()
    reply = request(
        shadow.envoy_port, "POST", CHAT, body, {"content-type": "application/json", **headers}
    )
    assert _shadow(reply) == ("reject", reason)
    rec = shadow.only_received()
    assert rec.body == body
    assert _shadow(rec) == ("reject", reason)


def test_shadow_verdicts_are_counted_apart(shadow: E2E) -> None:
    before = shadow.ice_metric("ice_decisions_total", mode="shadow", decision="reject")
    shadow.post(CHAT, {"model": "dev-model", "messages": MSGS}, {"x-priority": "sheddable"})
    after = shadow.ice_metric("ice_decisions_total", mode="shadow", decision="reject")
    assert after == before + 1
    assert shadow.ice_metric("ice_decisions_total", mode="enforce", decision="reject") == 0
