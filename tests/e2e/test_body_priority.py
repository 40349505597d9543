"""Issue 44, item 6, through real Envoy: the body's own ``priority`` (vLLM's scheduling
priority under ``--scheduling-policy priority``, lower first) follows the route's
``client_priority``. Before, every one went to the backend as sent: ``priority: -100`` put a
client ahead of every request at vLLM's default 0."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from .harness import CHAT, E2E, running_stack

MESSAGES = [{"role": "user", "content": "hi"}]


def _raw(body: dict[str, Any], priority: Any) -> tuple[bytes, bytes]:
    """The body with ``priority`` as its second member, and the same body without it."""
    without = {"model": "dev-model", **body}
    with_it = {"model": "dev-model", "priority": priority, **body}
    return json.dumps(with_it).encode(), json.dumps(without).encode()


CASES = [
    (CHAT, {"messages": MESSAGES, "max_tokens": 8}),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 8}),
    ("/inference/v1/generate", {"token_ids": [1, 2], "sampling_params": {"max_tokens": 8}}),
    ("/invocations", {"messages": MESSAGES, "max_tokens": 8}),
]
IDS = ["chat", "completions", "vllm-generate", "invocations"]


def _forwarded(e2e: E2E, path: str, raw: bytes) -> bytes:
    e2e.clear_received()
    reply = e2e.post(path, raw, {"x-priority": "critical"})  # the header does not matter here
    assert reply.status == 200, reply
    return e2e.only_received().body


def test_cap_removes_a_priority_ahead_of_the_default_and_keeps_one_behind(
    tmp_path: Path,
) -> None:
    with running_stack(tmp_path, client_priority="cap") as e2e:
        for path, body in CASES:
            ahead, without = _raw(body, -100)
            assert _forwarded(e2e, path, ahead) == without, path
            behind, _ = _raw(body, 5)
            assert _forwarded(e2e, path, behind) == behind, path  # byte for byte
            coerced, _ = _raw(body, "-7")  # vLLM's pydantic reads -7 from the string
            assert _forwarded(e2e, path, coerced) == without, path


def test_ignore_removes_any_priority(tmp_path: Path) -> None:
    with running_stack(tmp_path, client_priority="ignore") as e2e:
        for path, body in CASES:
            behind, without = _raw(body, 5)
            assert _forwarded(e2e, path, behind) == without, path


@pytest.mark.parametrize(("path", "body"), CASES, ids=IDS)
def test_trust_forwards_it_as_sent(stack: E2E, path: str, body: dict[str, Any]) -> None:
    ahead, _ = _raw(body, -100)  # the shared stack trusts its clients (the mesh's part)
    assert _forwarded(stack, path, ahead) == ahead
