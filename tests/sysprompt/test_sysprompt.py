"""ext_proc.sysprompt: the complexity score (hand-computed) and lossless JSON compaction."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from ext_proc.schemas import rawjson
from ext_proc.schemas.anthropic_messages import ANTHROPIC_MESSAGES
from ext_proc.schemas.openai import OPENAI_CHAT
from ext_proc.sysprompt.compact import compact_system_json, maybe_compact
from ext_proc.sysprompt.complexity import system_prompt_complexity
from ext_proc.sysprompt.scan import compact_text, embedded_json_spans


def _chat(system: Any, user: str = "hi", tools: Any = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "m",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
    }
    if tools is not None:
        body["tools"] = tools
    return body


# --- the score, computed by hand ----------------------------------------------------------


def test_score_without_structured_data() -> None:
    # system "abcd"*10: 40 ASCII chars = 10 tokens (+4 framing); user 10 tokens (+4);
    # reply primer 3: input 31. system 14, structured 0: score = 14/31 × 0.5
    body = _chat("abcd" * 10, "x" * 40)
    f = OPENAI_CHAT.features(body)
    assert f.input_tokens == 31
    s = system_prompt_complexity(body, OPENAI_CHAT, f)
    assert (s.system_tokens, s.structured_tokens, s.tool_tokens) == (14, 0, 0)
    assert s.system_share == pytest.approx(14 / 31)
    assert s.structured_share == 0.0
    assert s.score == pytest.approx(14 / 31 * 0.5)


def test_score_with_embedded_json() -> None:
    # 'cfg: {"a":[1,2]}' is 16 chars = 4 tokens; its span '{"a":[1,2]}' 11 chars = 3 tokens
    # system = 4 + 4 = 8, structured 3; input = 3 + 8 + (4 + 10) = 25
    # score = 8/25 × (0.5 + 0.5 × 3/8) = 0.32 × 0.6875 = 0.22
    body = _chat('cfg: {"a":[1,2]}', "x" * 40)
    s = system_prompt_complexity(body, "openai.chat", OPENAI_CHAT.features(body))
    assert s.input_tokens == 25
    assert (s.system_tokens, s.structured_tokens) == (8, 3)
    assert s.structured_share == pytest.approx(3 / 8)
    assert s.score == pytest.approx(0.22)
    assert s.compactable_tokens == 0  # already compact


def test_score_anthropic_blocks_and_tools() -> None:
    # system block "a"*8 = 2 tokens (+4); tools' compact JSON is 47 chars = 12 tokens;
    # system 18, structured 12 (the tools); user "b"*20 = 5 (+4); primer 3: input 30
    # score = 0.6 × (0.5 + 0.5 × 2/3) = 0.5
    body = {
        "model": "m",
        "max_tokens": 10,
        "system": [{"type": "text", "text": "a" * 8}],
        "messages": [{"role": "user", "content": "b" * 20}],
        "tools": [{"name": "t", "input_schema": {"type": "object"}}],
    }
    f = ANTHROPIC_MESSAGES.features(body)
    assert f.input_tokens == 30
    s = system_prompt_complexity(body, "anthropic_messages", f.input_tokens)
    assert (s.system_tokens, s.structured_tokens, s.tool_tokens) == (18, 12, 12)
    assert s.system_share == pytest.approx(0.6)
    assert s.score == pytest.approx(0.5)


def test_score_edges() -> None:
    no_system = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}
    s = system_prompt_complexity(no_system, OPENAI_CHAT, OPENAI_CHAT.features(no_system))
    assert (s.system_tokens, s.score) == (0, 0.0)
    assert system_prompt_complexity(no_system, OPENAI_CHAT, 0).score == 0.0
    assert system_prompt_complexity(no_system, "openai.completions", 10).score == 0.0
    # developer messages count as system prompt, and a share never exceeds 1
    dev = {"messages": [{"role": "developer", "content": "x" * 400}]}
    s = system_prompt_complexity(dev, OPENAI_CHAT, 5)
    assert s.system_tokens == 104 and s.system_share == 1.0 and s.score == 0.5


# --- the embedded-JSON scan ----------------------------------------------------------------


def test_scan_finds_outermost_spans_only() -> None:
    text = 'a {"x": [1, 2]} b [3] {no} [NaN] {"y": {"z": 1}}'
    spans = [(text[a:b], v) for a, b, v in embedded_json_spans(text)]
    assert spans == [
        ('{"x": [1, 2]}', {"x": [1, 2]}),
        ("[3]", [3]),
        ('{"y": {"z": 1}}', {"y": {"z": 1}}),
    ]


def test_scan_is_bounded_on_pathological_text() -> None:
    for text in ("[" * 200_000, '{"a":' * 50_000, "[1," * 100_000):
        t0 = time.perf_counter()
        embedded_json_spans(text)
        assert time.perf_counter() - t0 < 2.0


def test_compact_text_keeps_tokens_and_prose() -> None:
    text = 'Use:\n{\n  "n": 1.0,\n  "e": 1E+2,\n  "s": "a  b",\n  "d": 1, "d": 2\n}\n  end  '
    new, removed = compact_text(text)
    assert new == 'Use:\n{"n":1.0,"e":1E+2,"s":"a  b","d":1,"d":2}\n  end  '
    assert all(text[a:b].strip(" \t\n\r") == "" for a, b in removed)


# --- compaction of the body ---------------------------------------------------------------


PRETTY = json.dumps({"a": [1.0, -0.0, 1e-7], "é": "x\u00e9"}, indent=2)


def test_openai_compaction_exact_bytes_and_tokens() -> None:
    params = '{\n    "type": "object",\n    "properties": {"q": {"default": 1.50}}\n  }'
    body = (
        '{"model": "m", "messages": [\n'
        '  {"role": "system", "content": "caf\\u00e9 \\/ rules:\\n'
        + PRETTY.replace('"', '\\"').replace("\n", "\\n")
        + '"},\n'
        '  {"role": "user", "content": "{\\n  \\"keep\\": 1\\n}"}\n'
        '], "tools": [{"type": "function", "function": {"name": "f", "parameters": '
        + params
        + "}}]}"
    ).encode()
    result = compact_system_json(body, "openai.chat")
    assert result is not None
    new, saved = result
    sys_json = json.dumps(json.loads(PRETTY), separators=(",", ":")).replace('"', '\\"')
    expected = (
        '{"model": "m", "messages": [\n'
        '  {"role": "system", "content": "caf\\u00e9 \\/ rules:\\n' + sys_json + '"},\n'
        '  {"role": "user", "content": "{\\n  \\"keep\\": 1\\n}"}\n'
        '], "tools": [{"type": "function", "function": {"name": "f", "parameters": '
        '{"type":"object","properties":{"q":{"default":1.50}}}}}]}'
    ).encode()
    assert new == expected
    before = OPENAI_CHAT.features(json.loads(body)).input_tokens
    after = OPENAI_CHAT.features(json.loads(new)).input_tokens
    assert saved == before - after > 0
    assert compact_system_json(new, "openai.chat") is None  # idempotent


def test_anthropic_string_blocks_descriptions_and_schema() -> None:
    desc = 'Input like {\n  "q": [1, 2]\n}'
    doc: dict[str, Any] = {
        "model": "m",
        "max_tokens": 5,
        "system": [
            {"type": "text", "text": "Ctx " + PRETTY, "cache_control": {"type": "ephemeral"}}
        ],
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [
            {"name": "t", "description": desc, "input_schema": {"type": "object", "required": []}}
        ],
    }
    body = json.dumps(doc, indent=2).encode()
    new, saved = compact_system_json(body, ANTHROPIC_MESSAGES) or (b"", -1)
    got = json.loads(new)
    assert got["system"][0]["text"] == "Ctx " + json.dumps(
        json.loads(PRETTY), separators=(",", ":")
    )
    assert got["tools"][0]["description"] == 'Input like {"q":[1,2]}'
    assert got["tools"][0]["input_schema"] == doc["tools"][0]["input_schema"]
    assert '"input_schema": {"type":"object","required":[]}' in new.decode()
    before = ANTHROPIC_MESSAGES.features(doc).input_tokens
    assert saved == before - ANTHROPIC_MESSAGES.features(got).input_tokens > 0
    # a plain string system prompt
    doc2 = {**doc, "system": "S " + PRETTY}
    del doc2["tools"]
    new2, _ = compact_system_json(json.dumps(doc2).encode(), "anthropic.messages") or (b"", 0)
    assert json.loads(new2)["system"] == "S " + json.dumps(
        json.loads(PRETTY), separators=(",", ":")
    )


def test_nothing_to_do_or_not_json_is_left_alone() -> None:
    compact = json.dumps(_chat('cfg {"a":1} {not json} [unclosed', '{\n "u": 1\n}'))
    assert compact_system_json(compact.encode(), "openai.chat") is None
    assert compact_system_json(b'{"messages": [', "openai.chat") is None
    assert compact_system_json(b"\xff{}", "openai.chat") is None
    assert compact_system_json(b"[1, 2]", "openai.chat") is None
    pretty = json.dumps(_chat(PRETTY)).encode()
    assert compact_system_json(pretty, "openai.completions") is None
    assert compact_system_json(pretty, "openai.responses") is None
    doc = rawjson.parse_object(pretty)
    assert maybe_compact(doc, "openai.chat", enabled=False) is None
    out = maybe_compact(doc, "openai_chat", enabled=True)
    direct = compact_system_json(pretty, "openai.chat")
    assert out is not None and direct is not None and direct[1] > 0
    assert out[0].text.encode() == direct[0]
    assert out[1] == (("x-ice-compacted", f"tokens={direct[1]}"),)
    # the compacted decode is what a parse of the compacted bytes gives, with no parse
    again = rawjson.parse_object(direct[0])
    assert (out[0].values, out[0].spans, out[0].close_index) == (
        again.values,
        again.spans,
        again.close_index,
    )


def test_repeated_keys_are_left_alone() -> None:
    text = json.dumps(PRETTY)
    body = (
        '{"messages": [{"role": "system", "content": ' + text + ', "content": ' + text + "}]}"
    ).encode()
    assert compact_system_json(body, "openai.chat") is None
    body = ('{"system": ' + text + ', "system": ' + text + ', "messages": []}').encode()
    assert compact_system_json(body, "anthropic.messages") is None


def test_non_system_messages_untouched() -> None:
    doc = {
        "messages": [{"role": "user", "content": PRETTY}, {"role": "assistant", "content": PRETTY}]
    }
    assert compact_system_json(json.dumps(doc).encode(), "openai.chat") is None
