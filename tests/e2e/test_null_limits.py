"""Issue 44, item 1, through real Envoy: a ``null`` output limit is judged as the backend runs
it (the rest of the context, docs/endpoints.md "A request without a limit"), not as 16 tokens.

On a "hot" page (KV 0.80 of 8,101 blocks of 16: 1,620 free, pressure medium), ``n: 16`` with
a null limit is 16 sequences of up to max_model_len − prompt tokens: 16 × 512 blocks, far
more than are free. Before, ICE read the null as 16 tokens a sequence (16 × 2 blocks) and
passed it untouched (``x-ice-decision: pass``) on ``/inference/v1/generate`` and SGLang's
``/generate``. Now it injects the limit that fits the free blocks, in place of the null.
Completions are the exception the table records: vLLM runs their null as 16 tokens."""

from __future__ import annotations

import json
from typing import Any

import pytest

from .harness import E2E

HOT = {
    "kv_cache_usage_perc": 0.80,
    "num_requests_running": 8,
    "num_requests_waiting": 0,
    "num_gpu_blocks": 8101,
}
HOT_SCORE = "49"  # 100 × 0.40 × 0.80 / 0.65 = 49.2: medium, no level cap
FREE_BLOCKS = 1620  # (8,101 − 1) × (1 − 0.80)
BLOCK = 16
MESSAGES = [{"role": "user", "content": "hi"}]

# path, body with n = 16 and a null limit, where the limit sits
NULL_BODIES: list[tuple[str, dict[str, Any], tuple[str, ...]]] = [
    (
        "/inference/v1/generate",
        {"token_ids": [1, 2, 3], "sampling_params": {"n": 16, "max_tokens": None}},
        ("sampling_params", "max_tokens"),
    ),
    (
        "/generate",
        {"text": "hi", "sampling_params": {"n": 16, "max_new_tokens": None}},
        ("sampling_params", "max_new_tokens"),
    ),
    # chat read a null as no limit before too (the rest of the context): it holds
    ("/invocations", {"messages": MESSAGES, "n": 16, "max_tokens": None}, ("max_tokens",)),
]
IDS = ["vllm-generate", "sglang-generate", "invocations-chat"]
# vLLM 0.32's completions read a null limit as their default, 16 tokens
# (``normalize_null_max_tokens``; tests/e2e/test_vllm_unset_limits.py ran it): 16 sequences
# of 16 tokens fit on hot, and the body goes on untouched.
SIXTEEN = [
    ("/v1/completions", {"prompt": "hi", "n": 16, "max_tokens": None}),
    ("/invocations", {"prompt": "hi", "n": 16, "max_tokens": None}),
]


def _at(doc: Any, where: tuple[str, ...]) -> Any:
    for key in where:
        doc = doc[key]
    return doc


@pytest.mark.parametrize(("path", "body", "where"), NULL_BODIES, ids=IDS)
def test_n16_with_a_null_limit_is_sixteen_sequences_of_the_context_on_hot(
    stack: E2E, path: str, body: dict[str, Any], where: tuple[str, ...]
) -> None:
    stack.set_state(HOT, level="medium", score=HOT_SCORE)
    reply = stack.post(path, {"model": "dev-model", **body})
    assert reply.status == 200, reply
    assert (reply.header("x-ice-decision"), reply.header("x-ice-reason")) == (
        "downgrade",
        "kv_free_blocks",
    ), reply.ice_headers()
    sent = stack.only_received()
    granted = _at(json.loads(sent.body), where)
    # the injected limit fits 16 unshared sequences (a prompt under one block) in the free
    # blocks, and is far above the 16 tokens the null used to be read as
    assert isinstance(granted, int) and granted > 16
    assert 16 * -(-(granted + 1) // BLOCK) <= FREE_BLOCKS
    assert sent.body.count(where[-1].encode()) == 1  # the null replaced, not shadowed


@pytest.mark.parametrize(("path", "body", "where"), NULL_BODIES, ids=IDS)
def test_the_same_request_passes_untouched_where_the_whole_context_fits(
    stack: E2E, path: str, body: dict[str, Any], where: tuple[str, ...]
) -> None:
    """Calm and a large pool (65,536 blocks): 16 × 512 blocks fit, so the body goes on
    byte for byte with its null."""
    raw = json.dumps({"model": "dev-model", **body}).encode()
    reply = stack.post(path, raw)
    assert reply.status == 200, reply
    assert reply.header("x-ice-decision") == "pass", reply.ice_headers()
    assert stack.only_received().body == raw


@pytest.mark.parametrize(("path", "body"), SIXTEEN, ids=["completions", "invocations-prompt"])
def test_a_null_completions_limit_is_sixteen_tokens_as_vllm_runs_it(
    stack: E2E, path: str, body: dict[str, Any]
) -> None:
    stack.set_state(HOT, level="medium", score=HOT_SCORE)
    raw = json.dumps({"model": "dev-model", **body}).encode()
    reply = stack.post(path, raw)
    assert reply.status == 200, reply
    assert reply.header("x-ice-decision") == "pass", reply.ice_headers()
    assert stack.only_received().body == raw
