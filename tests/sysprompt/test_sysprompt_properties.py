"""Property tests (hypothesis) of ext_proc.sysprompt.complexity's compaction: lossless, byte-exact
outside the edited values, idempotent, and its tokens saved are the estimate's drop."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ext_proc.schemas.anthropic_messages import ANTHROPIC_MESSAGES
from ext_proc.schemas.openai import OPENAI_CHAT
from ext_proc.sysprompt.compact import compact_system_json
from ext_proc.sysprompt.scan import compact_text, delete_in_literal, embedded_json_spans

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
VALUES = st.recursive(
    SCALARS,
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=6), c, max_size=4),
    max_leaves=16,
)
CONTAINERS = st.lists(VALUES, max_size=4) | st.dictionaries(st.text(max_size=6), VALUES, max_size=4)
PROSE = st.text(st.characters(exclude_characters="{[", codec="utf-8"), max_size=20)
STYLES = st.sampled_from(["indent2", "tab", "spaced", "compact"])


def _dump(value: Any, style: str, ascii_: bool) -> str:
    if style == "indent2":
        return json.dumps(value, indent=2, ensure_ascii=ascii_)
    if style == "tab":
        return json.dumps(value, indent="\t", ensure_ascii=ascii_)
    if style == "spaced":
        return json.dumps(value, ensure_ascii=ascii_)
    return json.dumps(value, separators=(",", ":"), ensure_ascii=ascii_)


def _tight(value: Any, ascii_: bool) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=ascii_)


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(["openai", "anthropic"]),
    CONTAINERS,
    CONTAINERS,
    VALUES,
    PROSE,
    PROSE,
    STYLES,
    STYLES,
    st.sampled_from(["compact", "spaced", "indented"]),
    st.booleans(),
)
def test_compaction_is_lossless_byte_exact_and_idempotent(
    kind: str,
    embedded: Any,
    user_json: Any,
    params: Any,
    before: str,
    after: str,
    sys_style: str,
    param_style: str,
    body_style: str,
    ascii_: bool,
) -> None:
    user = _dump(user_json, "indent2", ascii_)  # pretty JSON outside the system prompt
    content = before + _dump(embedded, sys_style, ascii_) + after
    compacted = before + _tight(embedded, ascii_) + after
    if kind == "openai":
        doc: dict[str, Any] = {
            "model": "m",
            "messages": [
                {"role": "system", "content": "@@SYS@@"},
                {"role": "user", "content": user},
            ],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": "@@P@@"}}],
        }
    else:
        doc = {
            "model": "m",
            "max_tokens": 8,
            "system": [{"type": "text", "text": "@@SYS@@"}],
            "messages": [{"role": "user", "content": user}],
            "tools": [{"name": "f", "input_schema": "@@P@@"}],
        }
    if body_style == "compact":
        template = json.dumps(doc, separators=(",", ":"), ensure_ascii=ascii_)
    elif body_style == "spaced":
        template = json.dumps(doc, ensure_ascii=ascii_)
    else:
        template = json.dumps(doc, indent=3, ensure_ascii=ascii_)

    def fill(sys_text: str, params_text: str) -> bytes:
        sys_literal = json.dumps(sys_text, ensure_ascii=ascii_)
        out = template.replace('"@@SYS@@"', sys_literal).replace('"@@P@@"', params_text)
        return out.encode()

    body = fill(content, _dump(params, param_style, ascii_))
    expected = fill(compacted, _tight(params, ascii_))
    result = compact_system_json(body, kind + (".chat" if kind == "openai" else ".messages"))
    if expected == body:
        assert result is None
        return
    assert result is not None
    new_body, saved = result
    # byte for byte: only the system text's JSON whitespace and the schema's whitespace went
    assert new_body == expected
    assert json.loads(new_body) == json.loads(expected)
    adapter = OPENAI_CHAT if kind == "openai" else ANTHROPIC_MESSAGES
    drop = adapter.features(json.loads(body)).input_tokens
    drop -= adapter.features(json.loads(new_body)).input_tokens
    assert saved == drop >= 0
    assert compact_system_json(new_body, adapter) is None  # idempotent


TEXTS = st.text(
    st.sampled_from([*'{}[]",: \n\t01.-eEtrufalsn\\x', "\u00e9", "\U0001f600"]),
    max_size=60,
)


@settings(max_examples=500, deadline=None)
@given(st.one_of(TEXTS, st.text(max_size=40)), st.booleans())
def test_compact_text_only_drops_json_whitespace(text: str, ascii_: bool) -> None:
    new, removed = compact_text(text)
    assert all(text[a:b].strip(" \t\n\r") == "" for a, b in removed)
    assert len(new) == len(text) - sum(b - a for a, b in removed)
    # each span found before parses, after, to the same value (spans shift by what went)
    old_spans = embedded_json_spans(text)
    new_spans = embedded_json_spans(new)
    if removed:
        assert [v for _, _, v in old_spans] == [v for _, _, v in new_spans]
    assert compact_text(new) == (new, ())  # idempotent
    literal = json.dumps(text, ensure_ascii=ascii_)
    edited = delete_in_literal(literal, removed)
    assert edited is not None and json.loads(edited) == new
