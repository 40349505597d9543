"""rawjson: spans of top-level members, minimal edits, precise errors."""

from __future__ import annotations

import json

import pytest

from ext_proc.schemas.rawjson import (
    InvalidJSON,
    add_member,
    decode_object,
    parse_object,
    replace_value,
)

ODD = '{ "z": 1,\n  "model" :"m",  "max_tokens":   4096 , "x": {"max_tokens": 7}, "u": "é€😀" }'


def test_replace_value_changes_only_that_value() -> None:
    doc = parse_object(ODD.encode())
    out = replace_value(doc, "max_tokens", 100)
    assert out == ODD.replace("4096", "100").encode()
    assert json.loads(out)["x"] == {"max_tokens": 7}


def test_add_member_appends_and_keeps_the_rest() -> None:
    doc = parse_object(ODD.encode())
    out = add_member(doc, "max_tokens_new", 5)
    assert out.startswith(ODD[: ODD.rindex("}")].rstrip().encode())
    assert json.loads(out)["max_tokens_new"] == 5
    assert list(json.loads(out))[-1] == "max_tokens_new"


def test_add_member_to_empty_object() -> None:
    assert json.loads(add_member(parse_object(b"{}"), "k", 1)) == {"k": 1}


def test_duplicate_keys_last_wins_like_json_loads() -> None:
    doc = parse_object(b'{"a": 1, "a": 2}')
    assert doc.values == json.loads(b'{"a": 1, "a": 2}')
    assert json.loads(replace_value(doc, "a", 9)) == {"a": 9}


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b"", "must be a JSON object"),
        (b"[1, 2]", "must be a JSON object"),
        (b'"text"', "must be a JSON object"),
        (b'{"a":}', "Expecting value at char 5"),
        (b'{"a": 1} trailing', "unexpected data after the object at char 9"),
        (b'\xff{"a": 1}', "not valid UTF-8 (byte 0)"),
        (b'{"a": 1,}', "expected a member name at char 8"),
        (b'{"a" 1}', "expected ':' at char 5"),
        (b'{"a": 1 "b": 2}', "expected ',' or '}' at char 8"),
        (b'{"a": 1', "expected ',' or '}' at char 7"),
    ],
    ids=[
        "empty",
        "array",
        "string",
        "missing-value",
        "trailing",
        "non-utf8",
        "trailing-comma",
        "missing-colon",
        "missing-comma",
        "unterminated",
    ],
)
def test_invalid_bodies_raise_with_position(body: bytes, fragment: str) -> None:
    with pytest.raises(InvalidJSON) as info:
        parse_object(body)
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"[1, 2]",
        b'{"a":}',
        b'{"a": 1} trailing',
        b'\xff{"a": 1}',
        b'{"a": 1,}',
        b'{"a" 1}',
        b'{"a": 1',
        b'{"a": [1, {"b": null}], "c": "\\u00e9"}',
        b" { } ",
        b'{"a": NaN}',
    ],
)
def test_fast_decode_accepts_exactly_what_span_parsing_accepts(body: bytes) -> None:
    try:
        slow: object = parse_object(body).values
    except InvalidJSON:
        slow = InvalidJSON
    try:
        fast: object = decode_object(body)
    except InvalidJSON:
        fast = InvalidJSON
    assert fast == slow
