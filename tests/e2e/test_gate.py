"""No way around the gate, through real Envoy and ICE with the e2e policy: each bypass a new
user found with today's clients is closed (every one of these passed unjudged before).

Context budget in this policy: safe output = MAX_MODEL_LEN − input − OUTPUT_BUFFER; the dev
backend reports enable_prefix_caching="True", so n samples share their prompt's full blocks.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import openai
import pytest

from ext_proc.schemas import ADAPTERS, SCHEMAS, rawjson

from .harness import (
    CAP_HIGH,
    CHAT,
    COMPLETIONS,
    E2E,
    HIGH,
    HIGH_SCORE,
    KV_TIGHT,
    MAX_MODEL_LEN,
    MESSAGES,
    OUTPUT_BUFFER,
)

RESPONSES = "/v1/responses"
EMBEDDINGS = "/v1/embeddings"


def safe_output(adapter_path: str, body: dict[str, Any], schema: str = "") -> int:
    """MAX_MODEL_LEN − ICE's input estimate − OUTPUT_BUFFER, with ICE's own adapter."""
    adapter = SCHEMAS[schema] if schema else ADAPTERS[adapter_path]
    f = adapter.features(rawjson.decode_object(json.dumps(body).encode()))
    return MAX_MODEL_LEN - f.input_tokens - OUTPUT_BUFFER


def openai_client(stack: E2E) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key="x", max_retries=0)


def assert_refused(reply: Any, status: int, code: str, stack: E2E) -> dict[str, Any]:
    assert reply.status == status, reply
    assert reply.header("x-ice-decision") == "reject"
    assert reply.header("x-ice-reason") == code
    err: dict[str, Any] = reply.json()["error"]
    assert err["code"] == code
    assert stack.received() == []
    return err


# -- /v1/responses is judged like chat


def test_responses_with_a_huge_output_limit_is_downgraded_with_the_sdk(stack: E2E) -> None:
    with openai_client(stack) as client:
        raw = client.responses.with_raw_response.create(
            model="dev-model", input="Say hi.", max_output_tokens=100_000_000
        )
    assert raw.headers["x-ice-decision"] == "downgrade"
    assert raw.headers["x-ice-reason"] == "context_budget"
    assert raw.headers["x-mem-pressure"] == "low"
    assert raw.parse().status == "completed"
    rec = stack.only_received()
    expected = safe_output(RESPONSES, {"input": "Say hi."})
    assert rec.json()["max_output_tokens"] == expected
    assert rec.header("x-ice-original-max-tokens") == "100000000"


def test_responses_is_capped_at_high_pressure(stack: E2E) -> None:
    stack.set_state(HIGH, level="high", score=HIGH_SCORE)
    body = {"model": "dev-model", "input": [{"role": "user", "content": "hi"}]}
    reply = stack.post(RESPONSES, body)
    assert reply.status == 200, reply
    assert (reply.header("x-ice-decision"), reply.header("x-ice-reason")) == (
        "downgrade",
        "pressure_cap",
    )
    assert stack.only_received().json()["max_output_tokens"] == CAP_HIGH  # injected


def test_responses_with_stored_context_fills_the_window_in_the_kv_check(stack: E2E) -> None:
    # 1,000 blocks of 16, 60 % used: floor(999 × 0.4) = 399 free; a previous_response_id
    # request is judged to fill the 8,192-token window: 512 blocks → 429 kv_exhausted
    # (score 100 × 0.40 × 0.6 / 0.65 = 37: low)
    state = {"kv_cache_usage_perc": 0.6, "num_gpu_blocks": 1000, "num_requests_waiting": 0}
    stack.set_state(state, level="low")
    body = {"input": "and then?", "previous_response_id": "resp_1", "max_output_tokens": 10}
    reply = stack.post(RESPONSES, body)
    err = assert_refused(reply, 429, "kv_exhausted", stack)
    assert "512 KV-cache blocks" in err["message"]


# -- embeddings


def test_embeddings_with_5000_inputs_is_a_400_with_the_sdk(stack: E2E) -> None:
    with openai_client(stack) as client, pytest.raises(openai.BadRequestError) as caught:
        client.embeddings.create(model="dev-model", input=["a"] * 5000)
    assert caught.value.code == "too_many_inputs"
    assert caught.value.response.headers["x-ice-decision"] == "reject"
    assert stack.received() == []


def test_embeddings_pass_with_verdict_headers_and_are_shed_at_critical(stack: E2E) -> None:
    with openai_client(stack) as client:
        raw = client.embeddings.with_raw_response.create(model="dev-model", input=["a", "b"])
    assert raw.headers["x-ice-decision"] == "pass"
    assert len(raw.parse().data) == 2
    assert "max_tokens" not in stack.only_received().json()  # no output limit written
    stack.clear_received()
    stack.set_state(HIGH, level="high", score=HIGH_SCORE)
    reply = stack.post(EMBEDDINGS, {"input": "a"}, {"x-priority": "sheddable"})
    assert_refused(reply, 429, "memory_pressure", stack)


# -- fan-out


@pytest.mark.parametrize(
    "body",
    [
        {"prompt": "hi", "max_tokens": 7000, "n": 3000},
        {"prompt": ["hi"] * 3000, "max_tokens": 7},
        {"prompt": "hi", "max_tokens": 7, "best_of": 3000},
    ],
    ids=["n-3000", "prompt-list-3000", "best_of-3000"],
)
def test_fan_out_beyond_the_cap_is_a_400(stack: E2E, body: dict[str, Any]) -> None:
    reply = stack.post(COMPLETIONS, body)
    err = assert_refused(reply, 400, "too_many_sequences", stack)
    assert "3000" in err["message"]


def test_n_samples_are_counted_in_the_free_block_fit(stack: E2E) -> None:
    # 90 free blocks of 16. "hi" is 1 token. n=4 with shared prompt blocks:
    # 4 × ceil((1 + O) / 16) ≤ 90 → ceil(...) ≤ 22 → 1 + O ≤ 352 → O = 351
    stack.set_state(KV_TIGHT, level="low")
    reply = stack.post(COMPLETIONS, {"prompt": "hi", "max_tokens": 1000, "n": 4})
    assert reply.status == 200, reply
    assert (reply.header("x-ice-decision"), reply.header("x-ice-reason")) == (
        "downgrade",
        "kv_free_blocks",
    )
    assert reply.header("x-ice-sequences") == "4"
    rec = stack.only_received()
    assert rec.json()["max_tokens"] == 351
    assert rec.header("x-ice-sequences") == "4"  # the backend sees it too
    assert stack.ice_metric("ice_sequences_judged_total", route="completions") >= 4


def test_a_batch_of_prompts_is_counted_prompt_by_prompt(stack: E2E) -> None:
    # four prompts of 1 token: 4 × ceil((1 + O) / 16) ≤ 90 → O = 351, as for n=4
    stack.set_state(KV_TIGHT, level="low")
    reply = stack.post(COMPLETIONS, {"prompt": ["a", "b", "c", "d"], "max_tokens": 1000})
    assert reply.header("x-ice-reason") == "kv_free_blocks", reply
    assert stack.only_received().json()["max_tokens"] == 351


# -- the limit the backend uses, and repeated keys


def test_max_completion_tokens_binds_even_with_a_smaller_max_tokens(stack: E2E) -> None:
    stack.set_state(HIGH, level="high", score=HIGH_SCORE)
    body = {
        "model": "dev-model",
        "messages": [{"role": "user", "content": "hi"}],
        "max_completion_tokens": 4000,
        "max_tokens": 16,
    }
    reply = stack.post(CHAT, body)
    assert reply.header("x-downgraded") == "true", reply
    assert reply.header("x-ice-original-max-tokens") == "4000"
    sent = stack.only_received().json()
    assert (sent["max_completion_tokens"], sent["max_tokens"]) == (CAP_HIGH, 16)


@pytest.mark.parametrize(
    ("path", "raw", "param"),
    [
        (
            CHAT,
            b'{"messages":[{"role":"user","content":"hi"}],"max_tokens":16,'
            b'"stream":false,"max_tokens":100000000}',
            "max_tokens",
        ),
        (COMPLETIONS, b'{"prompt":"hi","n":1,"max_tokens":5,"n":500}', "n"),
        (
            CHAT,
            b'{"messages":[{"role":"user","content":"short","content":"long"}]}',
            "messages[0].content",
        ),
    ],
    ids=["max_tokens-twice", "n-twice", "content-twice"],
)
def test_a_repeated_key_ice_reads_is_a_400_naming_it(
    stack: E2E, path: str, raw: bytes, param: str
) -> None:
    err = assert_refused(stack.post(path, raw), 400, "duplicate_key", stack)
    assert err["param"] == param


def test_a_repeated_key_ice_does_not_read_passes_byte_for_byte(stack: E2E) -> None:
    raw = b'{"messages":[{"role":"user","content":"hi"}],"max_tokens":5,"top_p":1,"top_p":0.5}'
    reply = stack.post(CHAT, raw)
    assert reply.header("x-ice-decision") == "pass", reply
    assert stack.only_received().body == raw


# -- images


def image_chat(images: int) -> dict[str, Any]:
    part = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
    content = [{"type": "text", "text": "What is in these pictures?"}] + [part] * images
    return {"model": "dev-model", "messages": [{"role": "user", "content": content}]}


def test_images_cost_tokens_in_the_output_limit(stack: E2E) -> None:
    plain = {**image_chat(0), "max_tokens": 6000}
    assert stack.post(CHAT, plain).header("x-ice-decision") == "pass"
    stack.clear_received()
    body = {**image_chat(8), "max_tokens": 6000}
    reply = stack.post(CHAT, body)
    assert reply.header("x-ice-decision") == "downgrade", reply
    # 8 images × 576 tokens leave 8192 − 512 − (input + 4608) for output
    expected = safe_output(CHAT, image_chat(8))
    assert expected < 6000
    assert stack.only_received().json()["max_tokens"] == expected


def test_more_media_parts_than_the_cap_is_a_400(stack: E2E) -> None:
    assert_refused(
        stack.post(CHAT, {**image_chat(17), "max_tokens": 5}), 400, "too_many_media_parts", stack
    )


def test_anthropic_image_blocks_cost_tokens(stack: E2E) -> None:
    source = {"type": "url", "url": "https://example.com/cat.png"}
    content: Any = [{"type": "image", "source": source}] * 8 + [{"type": "text", "text": "?"}]
    with anthropic.Anthropic(base_url=stack.base_url, api_key="x", max_retries=0) as client:
        raw = client.messages.with_raw_response.create(
            model="dev-model", max_tokens=6000, messages=[{"role": "user", "content": content}]
        )
    assert raw.headers["x-ice-decision"] == "downgrade"
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 6000}
    assert stack.only_received().json()["max_tokens"] == safe_output(MESSAGES, body)


# -- vLLM's other generating paths and SGLang's native one


@pytest.mark.parametrize(
    ("path", "body", "schema", "field"),
    [
        (
            "/v1/chat/completions/batch",
            {
                "messages": [
                    [{"role": "user", "content": "a"}],
                    [{"role": "user", "content": "b"}],
                ],
                "max_tokens": 100000,
            },
            "",
            ("max_tokens",),
        ),
        (
            "/invocations",
            {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 100000},
            "",
            ("max_tokens",),
        ),
        (
            "/inference/v1/generate",
            {"token_ids": [1, 2, 3], "sampling_params": {"max_tokens": 100000}},
            "",
            ("sampling_params", "max_tokens"),
        ),
        (
            "/generate",
            {"text": "hi", "sampling_params": {"max_new_tokens": 100000}},
            "sglang_generate",
            ("sampling_params", "max_new_tokens"),
        ),
    ],
    ids=["chat-batch", "invocations", "vllm-generate", "sglang-generate"],
)
def test_other_generating_paths_are_judged(
    stack: E2E, path: str, body: dict[str, Any], schema: str, field: tuple[str, ...]
) -> None:
    reply = stack.post(path, body)
    assert reply.status == 200, reply
    assert (reply.header("x-ice-decision"), reply.header("x-ice-reason")) == (
        "downgrade",
        "context_budget",
    )
    sent: Any = stack.only_received().json()
    for key in field:
        sent = sent[key]
    assert sent == safe_output(path, body, schema)


def test_a_null_limit_is_replaced_in_place_at_high_pressure(stack: E2E) -> None:
    stack.set_state(HIGH, level="high", score=HIGH_SCORE)
    raw = b'{"model":"dev-model","messages":[{"role":"user","content":"hi"}],"max_tokens":null}'
    reply = stack.post(CHAT, raw)
    assert reply.header("x-ice-decision") == "downgrade", reply
    sent = stack.only_received().body
    assert sent.count(b'"max_tokens"') == 1  # not a null first copy and a second one
    assert json.loads(sent)["max_tokens"] == CAP_HIGH


def test_an_invocation_the_backend_could_read_two_ways_is_a_400(stack: E2E) -> None:
    # vLLM would fail chat validation (no role) and serve the 4 prompts × n=4 with 8000 tokens
    body = {
        "messages": [{"content": "hi"}],
        "prompt": ["a", "b", "c", "d"],
        "n": 4,
        "max_completion_tokens": 16,
        "max_tokens": 8000,
    }
    assert_refused(stack.post("/invocations", body), 400, "ambiguous_invocation", stack)


def test_an_invocation_of_an_unknown_shape_never_reaches_the_backend(stack: E2E) -> None:
    reply = stack.post("/invocations", {"queries": "a", "documents": ["b"]})
    assert_refused(reply, 400, "unsupported_invocation", stack)


MINIMAL_BODIES = {
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8},
    "/v1/completions": {"prompt": "hi", "max_tokens": 8},
    "/v1/messages": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8},
    "/v1/responses": {"input": "hi", "max_output_tokens": 8},
    "/v1/embeddings": {"input": "hi"},
    "/v1/chat/completions/batch": {"messages": [[{"role": "user", "content": "hi"}]]},
    "/invocations": {"prompt": "hi", "max_tokens": 8},
    "/inference/v1/generate": {"token_ids": [1, 2], "sampling_params": {"max_tokens": 8}},
    "/generate": {"text": "hi", "sampling_params": {"max_new_tokens": 8}},
}


@pytest.mark.parametrize("path", list(MINIMAL_BODIES), ids=list(MINIMAL_BODIES))
def test_every_judged_endpoint_passes_and_sheds_with_verdict_headers(stack: E2E, path: str) -> None:
    body = MINIMAL_BODIES[path]
    passed = stack.post(path, body)
    assert passed.status == 200, passed
    assert passed.header("x-ice-decision") == "pass"
    assert passed.header("x-mem-pressure") == "low"
    assert stack.only_received().header("x-ice-decision") == "pass"
    stack.clear_received()
    stack.set_state(HIGH, level="high", score=HIGH_SCORE)
    shed = stack.post(path, body, {"x-priority": "sheddable"})
    assert shed.status == 429, shed
    assert shed.header("retry-after") is not None
    assert shed.header("x-ice-reason") == "memory_pressure"
    error = shed.json()
    code = error["error"]["code"]
    assert code == "memory_pressure"
    if path == MESSAGES:
        assert error["type"] == "error"  # Anthropic's format
    assert stack.received() == []
