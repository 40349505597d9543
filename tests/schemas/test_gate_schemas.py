"""No way around the gate, in the adapters: every generating endpoint, every sequence, the
limit the backend uses, repeated keys, media parts and stored context (pure, hand-computed).

Estimates used below (ext_proc/schemas/estimate.py): ASCII text costs ceil(chars / 4) tokens, each
message adds PER_MESSAGE_TOKENS = 4, a prompt adds REPLY_PRIMER_TOKENS = 3, an image of
unknown size costs the default tokens_per_image = 576.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from ext_proc.media import media_cost
from ext_proc.media.spec import MediaSpec
from ext_proc.schemas import ADAPTERS, SCHEMAS, BadRequest, RequestFeatures, rawjson

CHAT = ADAPTERS["/v1/chat/completions"]
COMPLETIONS = ADAPTERS["/v1/completions"]
RESPONSES = ADAPTERS["/v1/responses"]
EMBEDDINGS = ADAPTERS["/v1/embeddings"]
BATCH = ADAPTERS["/v1/chat/completions/batch"]
INVOCATIONS = ADAPTERS["/invocations"]
VLLM_GENERATE = ADAPTERS["/inference/v1/generate"]
SGLANG = SCHEMAS["sglang_generate"]
MESSAGES = ADAPTERS["/v1/messages"]


def features(adapter: Any, raw: str | dict[str, Any]) -> RequestFeatures:
    text = raw if isinstance(raw, str) else json.dumps(raw)
    result: RequestFeatures = adapter.features(rawjson.decode_object(text.encode()))
    return result


def user(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


# -- fan-out: the sequences one request starts


@pytest.mark.parametrize(
    ("adapter", "body", "prompts", "samples"),
    [
        (COMPLETIONS, {"prompt": "hi", "max_tokens": 7000, "n": 3000}, 1, 3000),
        (COMPLETIONS, {"prompt": ["a"] * 3000, "max_tokens": 7}, 3000, 1),
        (COMPLETIONS, {"prompt": "hi", "best_of": 3000}, 1, 3000),
        (COMPLETIONS, {"prompt": "hi", "n": 2, "best_of": 5}, 1, 5),
        (COMPLETIONS, {"prompt": [[1, 2], [3], [4, 5, 6]], "n": 2}, 3, 2),
        (COMPLETIONS, {"prompt": [1, 2, 3], "n": None}, 1, 1),
        (CHAT, {"messages": [user("hi")], "n": 4}, 1, 4),
        (BATCH, {"messages": [[user("a")], [user("b")]], "n": 1}, 2, 1),
        (EMBEDDINGS, {"input": ["a", "b", "c"]}, 3, 1),
        (VLLM_GENERATE, {"token_ids": [1, 2], "sampling_params": {"n": 3}}, 1, 3),
        (SGLANG, {"text": ["a", "b"], "sampling_params": {"n": 4}}, 2, 4),
        (SGLANG, {"input_ids": [[1], [2], [3]]}, 3, 1),
        (INVOCATIONS, {"prompt": ["a", "b"], "n": 2}, 2, 2),
    ],
    ids=[
        "completions-n",
        "completions-prompt-list",
        "completions-best_of",
        "completions-best_of-over-n",
        "completions-token-id-lists",
        "completions-n-null",
        "chat-n",
        "batch-chat",
        "embeddings-inputs",
        "vllm-generate-n",
        "sglang-text-list-n",
        "sglang-input-ids-batch",
        "invocations-completions",
    ],
)
def test_every_prompt_and_sample_is_a_sequence(
    adapter: Any, body: dict[str, Any], prompts: int, samples: int
) -> None:
    f = features(adapter, body)
    assert (len(f.prompts), f.samples, f.sequences) == (prompts, samples, prompts * samples)


def test_a_batch_keeps_each_prompts_tokens_and_judges_the_longest() -> None:
    # "abcd" → 1 token, "abcdefgh" → 2, 12 chars → 3
    f = features(COMPLETIONS, {"prompt": ["abcd", "abcdefgh", "abcdefghijkl"]})
    assert (f.prompt_tokens, f.input_tokens) == ((1, 2, 3), 3)
    assert f.prompt_groups() == ((1, 1), (2, 1), (3, 1))


@pytest.mark.parametrize(
    "body",
    [{"prompt": "hi", "n": 0}, {"prompt": "hi", "n": "3"}, {"prompt": "hi", "best_of": 2.5}],
    ids=["n-zero", "n-string", "best_of-float"],
)
def test_a_bad_sample_count_is_a_400_naming_it(body: dict[str, Any]) -> None:
    with pytest.raises(BadRequest) as e:
        features(COMPLETIONS, body)
    assert e.value.param in ("n", "best_of")


# -- the limit the backend uses


@pytest.mark.parametrize(
    ("adapter", "body", "limit", "field"),
    [
        (CHAT, {"messages": [], "max_completion_tokens": 4000, "max_tokens": 16}, 4000, "mct"),
        (CHAT, {"messages": [], "max_completion_tokens": None, "max_tokens": 16}, 16, "mt"),
        (RESPONSES, {"input": "hi", "max_output_tokens": 100000000}, 100000000, "mot"),
        # absent and null: the rules of ext_proc/schemas/limits.py
        # (tests/policy/test_unset_limits.py)
        (VLLM_GENERATE, {"token_ids": [1], "sampling_params": {}}, None, None),
        (VLLM_GENERATE, {"token_ids": [1], "sampling_params": {"max_tokens": None}}, None, None),
        (SGLANG, {"text": "a"}, None, None),
        (SGLANG, {"text": "a", "sampling_params": {"max_new_tokens": 900}}, 900, "mnt"),
        (
            SGLANG,
            {"text": ["a", "b"], "sampling_params": [{"max_new_tokens": 9}, {}]},
            128,
            "mnt",
        ),
        (
            BATCH,
            {"messages": [[user("a")]], "max_completion_tokens": 70, "max_tokens": 5},
            70,
            "mct",
        ),
    ],
    ids=[
        "chat-mct-wins-over-smaller-mt",
        "chat-null-mct-falls-back",
        "responses-max_output_tokens",
        "vllm-generate-absent",
        "vllm-generate-null-unbounded",
        "sglang-absent",
        "sglang-max_new_tokens",
        "sglang-list-largest",
        "batch-chat-mct",
    ],
)
def test_the_judged_limit_is_the_one_the_backend_uses(
    adapter: Any, body: dict[str, Any], limit: int | None, field: str | None
) -> None:
    names = {
        "mct": "max_completion_tokens",
        "mt": "max_tokens",
        "mot": "max_output_tokens",
        "mnt": "max_new_tokens",
    }
    f = features(adapter, body)
    assert (f.max_tokens, f.max_tokens_field) == (limit, names.get(field or ""))


# -- repeated keys


@pytest.mark.parametrize(
    ("adapter", "raw", "param"),
    [
        (CHAT, '{"messages":[],"max_tokens":16,"max_tokens":100000000}', "max_tokens"),
        (CHAT, '{"messages":[{"role":"user","content":"a","content":"b"}]}', "messages[0].content"),
        (
            CHAT,
            '{"messages":[{"role":"user","content":[{"type":"text","type":"image_url"}]}]}',
            "messages[0].content[0].type",
        ),
        (COMPLETIONS, '{"prompt":"a","n":1,"n":500}', "n"),
        (
            RESPONSES,
            '{"input":"a","max_output_tokens":5,"max_output_tokens":9}',
            "max_output_tokens",
        ),
        (VLLM_GENERATE, '{"token_ids":[1],"sampling_params":{"n":1,"n":9}}', "sampling_params.n"),
        (SGLANG, '{"text":"a","sampling_params":{"max_new_tokens":1,"max_new_tokens":9}}', None),
        (MESSAGES, '{"messages":[],"max_tokens":1,"system":"a","system":"b"}', "system"),
        (EMBEDDINGS, '{"input":"a","input":["b","c"]}', "input"),
    ],
    ids=[
        "top-level-limit",
        "message-content",
        "content-part-type",
        "completions-n",
        "responses-limit",
        "vllm-sampling-n",
        "sglang-sampling-limit",
        "anthropic-system",
        "embeddings-input",
    ],
)
def test_a_repeated_key_ice_reads_is_a_400_naming_it(
    adapter: Any, raw: str, param: str | None
) -> None:
    with pytest.raises(BadRequest) as e:
        features(adapter, raw)
    assert e.value.code == "duplicate_key"
    assert e.value.param == (param or "sampling_params.max_new_tokens")


def test_a_repeated_key_ice_does_not_read_is_left_alone() -> None:
    raw = '{"messages":[],"temperature":0.1,"temperature":0.9,"max_tokens":5}'
    assert features(CHAT, raw).max_tokens == 5


# -- media parts


def png_url(width: int, height: int) -> str:
    import base64
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (width, height)).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def test_images_cost_their_default_tokens_not_nothing() -> None:
    parts = [{"type": "image_url", "image_url": {"url": "https://x/cat.png"}}] * 8
    with_images = features(CHAT, {"messages": [user(parts)], "max_tokens": 6000})
    without = features(CHAT, {"messages": [user([])], "max_tokens": 6000})
    # 8 × 576 = 4608 more tokens
    assert with_images.input_tokens - without.input_tokens == 4608
    assert (with_images.media_parts, with_images.media_tokens) == (8, 4608)


def test_a_qwen2_vl_profile_prices_a_data_url_image_by_its_pixels(tmp_path: Any) -> None:
    (tmp_path / "preprocessor_config.json").write_text(
        json.dumps(
            {
                "image_processor_type": "Qwen2VLImageProcessor",
                "patch_size": 14,
                "merge_size": 2,
                "min_pixels": 3136,
                "max_pixels": 12845056,
            }
        )
    )
    cost = media_cost(MediaSpec(model_dir=str(tmp_path)))
    body = {"messages": [user([{"type": "image_url", "image_url": {"url": png_url(224, 224)}}])]}
    f = CHAT.features(rawjson.decode_object(json.dumps(body).encode()), cost)
    # 224×224 → 8×8 merged patches of 28 px = 64 tokens, + vision start/end = 66
    assert f.media_tokens == 66


@pytest.mark.parametrize(
    ("adapter", "body"),
    [
        (
            MESSAGES,
            {
                "max_tokens": 10,
                "messages": [
                    user([{"type": "image", "source": {"type": "url", "url": "https://x/a.png"}}])
                ],
            },
        ),
        (
            RESPONSES,
            {
                "input": [
                    {
                        "role": "user",
                        "content": [{"type": "input_image", "image_url": "https://x/a.png"}],
                    }
                ]
            },
        ),
        (SGLANG, {"text": "a", "image_data": "https://x/a.png"}),
        (
            VLLM_GENERATE,
            {
                "token_ids": [1],
                "sampling_params": {},
                "content_parts": [{"type": "image_url", "image_url": {"url": "https://x/a.png"}}],
            },
        ),
    ],
    ids=["anthropic-image", "responses-input_image", "sglang-image_data", "vllm-content_parts"],
)
def test_every_api_counts_its_image_parts(adapter: Any, body: dict[str, Any]) -> None:
    f = features(adapter, body)
    assert (f.media_parts, f.media_tokens) == (1, 576)
    assert f.input_tokens >= 576


def test_an_unknown_part_type_costs_its_json_not_nothing() -> None:
    part = {"type": "input_file", "file_data": "x" * 4000}
    f = features(RESPONSES, {"input": [{"role": "user", "content": [part]}]})
    assert f.input_tokens >= 1000  # 4,000 characters of JSON ≈ 1,000 tokens


# -- the Responses API


def test_responses_counts_instructions_input_items_and_tools() -> None:
    body = {
        "instructions": "abcdefgh",  # 4 + 2
        "input": [
            {"role": "user", "content": "abcd"},  # 4 + 1
            {"type": "function_call", "name": "abcd", "arguments": "abcdefgh"},  # 4 + 1 + 2
            {"type": "function_call_output", "call_id": "c", "output": "abcd"},  # 4 + 1
        ],
        "tools": [{"type": "function", "name": "f"}],
    }
    tools = -(-len(json.dumps(body["tools"], separators=(",", ":"))) // 4)
    f = features(RESPONSES, body)
    assert f.input_tokens == 3 + 6 + 5 + 7 + 5 + tools
    assert not f.stored_context


@pytest.mark.parametrize(
    "body",
    [
        {"input": "hi", "previous_response_id": "resp_1"},
        {"input": "hi", "conversation": "conv_1"},
        {"prompt": {"id": "pmpt_1"}},
        {"input": [{"type": "item_reference", "id": "msg_1"}]},
    ],
    ids=["previous_response_id", "conversation", "stored-prompt", "item_reference"],
)
def test_responses_with_stored_context_say_so(body: dict[str, Any]) -> None:
    assert features(RESPONSES, body).stored_context


# -- embeddings and invocations


def test_embeddings_have_no_output_and_count_inputs() -> None:
    f = features(EMBEDDINGS, {"input": ["abcd", "abcdefgh"], "model": "e"})
    assert (f.generates, f.max_tokens, f.inputs, f.prompt_tokens) == (False, None, 2, (1, 2))


@pytest.mark.parametrize(
    ("body", "schema"),
    [
        ({"messages": [user("hi")]}, "openai.chat"),
        ({"prompt": "hi"}, "openai.completions"),
        ({"input": "hi"}, "openai.embeddings"),
    ],
    ids=["messages", "prompt", "input"],
)
def test_invocations_are_judged_by_shape_in_vllms_order(body: dict[str, Any], schema: str) -> None:
    assert features(INVOCATIONS, body).schema == schema


@pytest.mark.parametrize(
    ("adapter", "body", "code"),
    [
        # vLLM would serve this as completions: its role-less message fails chat validation
        (
            INVOCATIONS,
            {"messages": [{"content": "hi"}], "prompt": ["a", "b", "c", "d"], "n": 4},
            "ambiguous_invocation",
        ),
        (INVOCATIONS, {"messages": [user("hi")], "input": ["a", "b"]}, "ambiguous_invocation"),
        # vLLM's request union serves the messages and ignores the input
        (EMBEDDINGS, {"input": "x", "messages": [user("y")]}, "ambiguous_input"),
        (SGLANG, {"text": "a", "input_ids": [1, 2]}, "ambiguous_input"),
        # each tensor is one more prompt of a length only the tensor knows
        (COMPLETIONS, {"prompt": "x", "prompt_embeds": ["AAAA", "BBBB"]}, "unsupported_field"),
        (
            CHAT,
            {"messages": [user([{"type": "prompt_embeds", "data": "AAAA"}])]},
            "unsupported_field",
        ),
    ],
    ids=[
        "invocations-messages-and-prompt",
        "invocations-messages-and-input",
        "embeddings-input-and-messages",
        "sglang-text-and-ids",
        "completions-prompt_embeds",
        "chat-prompt_embeds-part",
    ],
)
def test_a_body_the_backend_could_read_two_ways_is_a_400(
    adapter: Any, body: dict[str, Any], code: str
) -> None:
    with pytest.raises(BadRequest) as e:
        features(adapter, body)
    assert e.value.code == code


def test_untyped_and_uuid_media_parts_count_as_vllm_reads_them() -> None:
    parts = [
        {"image_url": "https://x/a.png"},  # no type: vLLM reads it by its key
        {"type": "text", "text": "x", "uuid": "u", "image_url": "https://x/b.png"},
        {"type": "audio_embeds", "audio_embeds": "AAAA"},
    ]
    f = features(CHAT, {"messages": [user(parts)]})
    assert f.media_parts == 3
    assert f.media_tokens == 576 + 576 + 750


def test_an_invocation_of_no_known_shape_is_a_400() -> None:
    with pytest.raises(BadRequest) as e:
        features(INVOCATIONS, {"queries": "a", "documents": ["b"]})
    assert e.value.code == "unsupported_invocation"


def test_media_cost_defaults_are_never_free() -> None:
    cost = media_cost(MediaSpec())
    from ext_proc.media import MediaPart

    assert [cost.tokens(MediaPart(k)) for k in ("image", "audio", "video")] == [576, 750, 4096]
