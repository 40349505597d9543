"""Issue 44, item 2, through real Envoy: a verdict without the body is never more permissive
than one with it.

The issue's set-up: the shipped Envoy config and ICE's defaults (a 16 MiB window); one slow
upload holds a place for 8,000,000 bytes (its headers and one byte sent), so any body over
~6.7 MB is judged from its size (``x-ice-judged: headers``). On the calm page, a chat with
``n: 500, max_tokens: 1000000`` (alone: a 400 ``too_many_sequences``) and an
``/invocations`` body of 1.6 M prompts × ``n: 4`` reached the backend as coarse passes, with
``n`` and ``max_tokens`` intact. A body names ``n`` and its limit in a few bytes whatever its
size, so no size bounds them: the coarse verdict is now a 429 ``ice_busy`` with Retry-After.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from .harness import CHAT, E2E, RETRY_AFTER_S, Reply, running_stack, slow_upload, upload

INVOCATIONS = "/invocations"
SLOW_LENGTH = 8_000_000  # the slow upload
BIG_BYTES = 7_000_000  # over 7/8 × 16 MiB − 8,000,000 = 6,680,064: judged from its size


@pytest.fixture(scope="module")
def default_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2E]:
    with running_stack(tmp_path_factory.mktemp("round3-coarse")) as e2e:
        yield e2e


@pytest.fixture(autouse=True)
def _fresh(default_stack: E2E) -> None:
    default_stack.reset()  # calm: usage 0, nothing running


def padded(body: dict[str, Any], nbytes: int) -> bytes:
    """``body`` with a ``metadata`` string that brings it to ``nbytes`` bytes."""
    bare = json.dumps({**body, "metadata": {"pad": ""}}).encode()
    out = json.dumps({**body, "metadata": {"pad": "x" * (nbytes - len(bare))}}).encode()
    assert len(out) == nbytes
    return out


def beside_a_slow_upload(e2e: E2E, path: str, body: bytes) -> Reply:
    with slow_upload(e2e, SLOW_LENGTH):
        return upload(e2e.envoy_port, path, [body], length=len(body))


def assert_refused_unread(e2e: E2E, reply: Reply) -> None:
    assert reply.status == 429, reply
    assert reply.header("x-ice-judged") == "headers"
    assert reply.header("x-ice-decision") == "reject"
    assert reply.header("x-ice-reason") == "ice_busy"
    assert reply.header("retry-after") == str(RETRY_AFTER_S)
    assert reply.json()["error"]["code"] == "ice_busy"
    assert [r.path for r in e2e.received()] == []


N_500 = {"model": "dev-model", "messages": [{"role": "user", "content": "hi"}], "n": 500}


def test_a_chat_with_n_500_is_refused_alone(default_stack: E2E) -> None:
    """The full verdict on the same request, read: 400 ``too_many_sequences``."""
    reply = default_stack.post(CHAT, {**N_500, "max_tokens": 1_000_000})
    assert reply.status == 400, reply
    assert reply.header("x-ice-reason") == "too_many_sequences"


def test_a_chat_with_n_500_beside_a_slow_upload_does_not_pass_from_its_size(
    default_stack: E2E,
) -> None:
    body = padded({**N_500, "max_tokens": 1_000_000}, BIG_BYTES)
    assert_refused_unread(default_stack, beside_a_slow_upload(default_stack, CHAT, body))


def test_an_invocations_body_of_many_prompts_beside_a_slow_upload_does_not_pass(
    default_stack: E2E,
) -> None:
    ask = {"model": "dev-model", "prompt": ["hi"] * 1_600_000, "n": 4}
    body = json.dumps(ask, separators=(",", ":")).encode()
    assert 6_680_064 < len(body) < 8 * 1024 * 1024  # under Envoy's and ICE's body limit
    assert_refused_unread(default_stack, beside_a_slow_upload(default_stack, INVOCATIONS, body))


def test_a_chat_the_full_verdict_passes_is_judged_in_full_once_the_upload_is_gone(
    default_stack: E2E,
) -> None:
    """The 429 is ICE being busy, not the request: the same size alone is read and judged
    (the retry the Retry-After asks for)."""
    body = padded({**N_500, "n": 1, "max_tokens": 100}, BIG_BYTES)
    reply = upload(default_stack.envoy_port, CHAT, [body], length=len(body))
    assert reply.status == 200, reply
    assert reply.header("x-ice-judged") is None
    assert reply.header("x-ice-decision") == "pass"
