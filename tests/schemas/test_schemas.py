"""Schema adapters: features from each API's body, and precise BadRequests."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ext_proc.schemas import (
    OPENAI_CHAT,
    OPENAI_COMPLETIONS,
    BadRequest,
    schema_for_path,
)
from ext_proc.schemas.anthropic_messages import ANTHROPIC_MESSAGES as ANTHROPIC_MESSAGES_FOR_TESTS


@pytest.mark.parametrize(
    ("path", "name"),
    [
        ("/v1/chat/completions", "openai.chat"),
        ("/v1/chat/completions?x=1", "openai.chat"),
        ("/v1/chat/completions/", "openai.chat"),
        ("/v1/completions", "openai.completions"),
        ("/v1/messages", "anthropic.messages"),
        ("/v1/embeddings", "openai.embeddings"),
        ("/v1/responses", "openai.responses"),
        ("/v1/chat/completions/batch", "openai.chat_batch"),
        ("/invocations", "sagemaker.invocations"),
        ("/inference/v1/generate", "vllm.generate"),
        ("/generate", None),  # SGLang's: chosen per route (schema: sglang_generate)
        ("/v1/load_lora_adapter", None),
        ("/health", None),
    ],
)
def test_schema_for_path(path: str, name: str | None) -> None:
    adapter = schema_for_path(path)
    assert (adapter.name if adapter else None) == name


def test_chat_features_count_string_and_array_content() -> None:
    body = {
        "model": "m",
        "messages": [
            {"role": "system", "content": "abcdefgh"},  # 2 tokens + 4 framing
            {"role": "user", "content": [{"type": "text", "text": "abcd"}, {"type": "image_url"}]},
        ],
        "max_tokens": 100,
        "stream": True,
    }
    f = OPENAI_CHAT.features(body)
    # 3 (reply primer) + (4 + 2) + (4 + 1 + 576: an image of unknown size at the default
    # tokens_per_image) = 590
    assert (f.input_tokens, f.max_tokens, f.max_tokens_field, f.stream, f.model) == (
        590,
        100,
        "max_tokens",
        True,
        "m",
    )


@pytest.mark.parametrize(
    ("limits", "expected"),
    [
        ({"max_tokens": 50}, (50, "max_tokens")),
        ({"max_completion_tokens": 40}, (40, "max_completion_tokens")),
        ({"max_tokens": 50, "max_completion_tokens": 40}, (40, "max_completion_tokens")),
        # the backend uses max_completion_tokens whenever it is set (vLLM, SGLang, OpenAI)
        ({"max_tokens": 30, "max_completion_tokens": 40}, (40, "max_completion_tokens")),
        ({"max_tokens": None}, (None, None)),
        ({}, (None, None)),
        ({"max_tokens": 10**30}, (2**53, "max_tokens")),
    ],
    ids=[
        "max_tokens",
        "max_completion_tokens",
        "both-mct-smaller",
        "both-mt-smaller",
        "null",
        "absent",
        "huge-clamped",
    ],
)
def test_chat_output_limit(limits: dict[str, Any], expected: tuple[Any, Any]) -> None:
    f = OPENAI_CHAT.features({"messages": [], **limits})
    assert (f.max_tokens, f.max_tokens_field) == expected


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"messages": "hi"}, "messages", "invalid_type"),
        ({}, "messages", "invalid_type"),
        ({"messages": ["hi"]}, "messages", "invalid_type"),
        ({"messages": [{"content": 5}]}, "messages[0].content", "invalid_type"),
        ({"messages": [], "max_tokens": "lots"}, "max_tokens", "invalid_type"),
        ({"messages": [], "max_tokens": -5}, "max_tokens", "invalid_value"),
        ({"messages": [], "max_tokens": 0}, "max_tokens", "invalid_value"),
        ({"messages": [], "max_tokens": 1e30}, "max_tokens", "invalid_type"),
        ({"messages": [], "max_tokens": True}, "max_tokens", "invalid_type"),
        ({"messages": [], "max_completion_tokens": 2.5}, "max_completion_tokens", "invalid_type"),
    ],
    ids=[
        "messages-string",
        "messages-missing",
        "message-not-object",
        "content-number",
        "max-tokens-string",
        "negative",
        "zero",
        "float",
        "bool",
        "mct-float",
    ],
)
def test_chat_bad_requests_name_the_parameter(body: dict[str, Any], param: str, code: str) -> None:
    with pytest.raises(BadRequest) as info:
        OPENAI_CHAT.features(body)
    assert (info.value.param, info.value.code) == (param, code)


@pytest.mark.parametrize(
    ("prompt", "tokens", "count"),
    [
        ("abcdefgh", 2, 1),
        (["abcd", "abcdefghijkl"], 3, 2),
        ([1, 2, 3, 4, 5], 5, 1),
        ([[1, 2], [1, 2, 3]], 3, 2),
    ],
    ids=["string", "strings", "token-ids", "batches-of-ids"],
)
def test_completions_prompt_forms(prompt: Any, tokens: int, count: int) -> None:
    f = OPENAI_COMPLETIONS.features({"prompt": prompt, "max_tokens": 7})
    assert (f.input_tokens, f.message_count, f.max_tokens) == (tokens, count, 7)


def test_completions_rejects_other_prompt_types() -> None:
    with pytest.raises(BadRequest) as info:
        OPENAI_COMPLETIONS.features({"prompt": {"a": 1}})
    assert info.value.param == "prompt"


def test_anthropic_counts_system_and_blocks_and_requires_max_tokens() -> None:
    a = ANTHROPIC_MESSAGES_FOR_TESTS
    body = {
        "system": [{"type": "text", "text": "abcd"}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "abcdefgh"}]}],
        "max_tokens": 64,
    }
    f = a.features(body)
    assert (f.input_tokens, f.max_tokens, f.max_tokens_field) == (3 + 5 + 6, 64, "max_tokens")
    with pytest.raises(BadRequest) as info:
        a.features({"messages": []})
    assert (info.value.param, info.value.code) == ("max_tokens", "missing_field")


def test_error_bodies_follow_each_api_format() -> None:
    openai_err = json.loads(OPENAI_CHAT.error_body(429, "memory_pressure", "busy", None))
    assert openai_err == {
        "error": {
            "message": "busy",
            "type": "rate_limit_error",
            "param": None,
            "code": "memory_pressure",
        }
    }
    anth = json.loads(ANTHROPIC_MESSAGES_FOR_TESTS.error_body(400, "invalid_json", "bad", "x"))
    assert anth == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "bad",
            "code": "invalid_json",
            "param": "x",
        },
    }
