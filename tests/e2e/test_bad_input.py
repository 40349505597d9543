"""Bad and unusual input through real Envoy: a precise 4xx in the API's format, or untouched.

After every case ICE must still judge the next request, and its own counters must say what
it did (``ice_bad_requests_total``, ``ice_passthrough_total``).
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from ext_proc.schemas.openai import OPENAI_CHAT

from .harness import (
    CHAT,
    E2E,
    MAX_MODEL_LEN,
    MESSAGES,
    OUTPUT_BUFFER,
    PROBE,
    PROBE_HEADERS,
    Reply,
    upload,
)

MSGS = '[{"role": "user", "content": "hello"}]'
ROUTES = {CHAT: "chat", MESSAGES: "messages"}
LIMIT = 8 * 1024 * 1024  # ICE's --max-body-bytes and the virtual host's request_body_buffer_limit


def chat(max_tokens: str) -> bytes:
    return f'{{"model": "dev-model", "messages": {MSGS}, "max_tokens": {max_tokens}}}'.encode()


@dataclass(frozen=True)
class Bad:
    """A request ICE must answer itself with ``status`` and error ``code``."""

    path: str
    body: bytes | None
    status: int
    code: str
    param: str | None = None


BAD = {
    "malformed_json": Bad(CHAT, b'{"model": "dev-model", "messages": [', 400, "invalid_json"),
    "malformed_json_anthropic": Bad(MESSAGES, b'{"max_tokens": 5,, }', 400, "invalid_json"),
    "json_array": Bad(CHAT, b'[{"model": "dev-model", "messages": []}]', 400, "invalid_json"),
    "json_string": Bad(CHAT, b'"hello"', 400, "invalid_json"),
    "trailing_data": Bad(CHAT, chat("5") + b" {}", 400, "invalid_json"),
    "empty_body": Bad(CHAT, None, 400, "empty_body"),
    "empty_body_anthropic": Bad(MESSAGES, None, 400, "empty_body"),
    "max_tokens_string": Bad(CHAT, chat('"lots"'), 400, "invalid_type", "max_tokens"),
    "max_tokens_negative": Bad(CHAT, chat("-5"), 400, "invalid_value", "max_tokens"),
    "max_tokens_float_1e30": Bad(CHAT, chat("1e30"), 400, "invalid_type", "max_tokens"),
    "max_tokens_true": Bad(CHAT, chat("true"), 400, "invalid_type", "max_tokens"),
    "max_tokens_anthropic_string": Bad(MESSAGES, chat('"lots"'), 400, "invalid_type", "max_tokens"),
    "max_tokens_anthropic_missing": Bad(
        MESSAGES, b'{"model": "m", "messages": []}', 400, "missing_field", "max_tokens"
    ),
    "messages_not_array": Bad(
        CHAT, b'{"model": "m", "messages": "hi", "max_tokens": 5}', 400, "invalid_type", "messages"
    ),
    "non_utf8": Bad(
        CHAT,
        b'{"model": "dev-model", "messages": [{"role": "user", "content": "\xff\xfe\xc3("}]}',
        400,
        "invalid_json",
    ),
}


def assert_error_format(reply: Reply, path: str, code: str, param: str | None = None) -> None:
    """The error object of the path's API, with ICE's machine-readable code."""
    assert reply.header("content-type") == "application/json"
    doc = reply.json()
    if path == MESSAGES:
        assert doc["type"] == "error"
        assert set(doc["error"]) >= {"type", "message"}
    else:
        assert set(doc["error"]) == {"message", "type", "param", "code"}
    assert doc["error"]["code"] == code
    if param is not None:
        assert doc["error"]["param"] == param
    assert doc["error"]["message"]


def assert_still_judging(stack: E2E) -> None:
    reply = stack.post(CHAT, PROBE, PROBE_HEADERS)
    assert reply.status == 200, reply
    assert reply.header("x-ice-decision") == "pass"
    assert reply.header("x-mem-pressure") == "low"


# Deep nesting makes json.loads raise RecursionError (not JSONDecodeError): ICE must still
# answer a precise 400, not fail open and let the request through unjudged.
DEEPLY_NESTED = Bad(
    CHAT,
    b'{"model": "m", "max_tokens": 5, "messages": [], "x": '
    + b"[" * 100_000
    + b"]" * 100_000
    + b"}",
    400,
    "invalid_json",
)
CASES = [
    *(pytest.param(case, id=name) for name, case in BAD.items()),
    pytest.param(DEEPLY_NESTED, id="deeply_nested"),
]


@pytest.mark.parametrize("case", CASES)
def test_bad_request_gets_a_precise_4xx_in_the_api_format(stack: E2E, case: Bad) -> None:
    route = ROUTES[case.path]
    before = stack.ice_metric("ice_bad_requests_total", route=route, reason=case.code)
    reply = stack.post(case.path, case.body)
    assert reply.status == case.status, reply
    assert_error_format(reply, case.path, case.code, case.param)
    assert reply.header("x-ice-decision") == "reject"
    assert reply.header("x-ice-reason") == case.code
    assert reply.header("x-mem-pressure") == "low"
    assert stack.received() == []
    after = stack.ice_metric("ice_bad_requests_total", route=route, reason=case.code)
    assert after == before + 1
    assert_still_judging(stack)


def test_huge_integer_max_tokens_is_downgraded_not_rejected(stack: E2E) -> None:
    body = chat(str(10**30))
    expected = MAX_MODEL_LEN - OUTPUT_BUFFER - OPENAI_CHAT.features(json.loads(body)).input_tokens
    reply = stack.post(CHAT, body)
    assert reply.status == 200, reply
    assert reply.header("x-ice-decision") == "downgrade"
    assert reply.header("x-ice-reason") == "context_budget"
    assert int(reply.header("x-ice-original-max-tokens") or 0) >= 2**53
    rec = stack.only_received()
    assert rec.body == chat(str(expected))
    assert_still_judging(stack)


def test_non_json_content_type_on_a_judged_path_is_a_415_and_never_reaches_the_backend(
    stack: E2E,
) -> None:
    body = chat("100000")  # ICE would downgrade this, had it judged it
    reason = "unsupported_media_type"
    before = stack.ice_metric("ice_bad_requests_total", route="chat", reason=reason)
    spoof = {"x-ice-decision": "pass", "x-mem-pressure": "low"}
    reply = stack.post(CHAT, body, spoof, content_type="text/plain")
    assert reply.status == 415, reply
    err = reply.json()["error"]
    assert (err["code"], err["type"]) == ("unsupported_media_type", "invalid_request_error")
    assert "text/plain" in err["message"]
    assert reply.header("x-ice-decision") == "reject"
    assert stack.received() == []
    after = stack.ice_metric("ice_bad_requests_total", route="chat", reason=reason)
    assert after == before + 1
    assert_still_judging(stack)


@pytest.mark.parametrize(
    ("content_type", "judged"),
    [
        ("application/json; charset=utf-8", True),
        ("Application/JSON", True),
        ("application/vnd.api+json", True),
        (None, True),  # many clients send none; JSON backends parse the body regardless
        ("text/plain; charset=utf-8", False),
        ("application/x-www-form-urlencoded", False),
        ("multipart/form-data; boundary=x", False),
    ],
)
def test_json_content_types_are_judged_and_others_refused(
    stack: E2E, content_type: str | None, judged: bool
) -> None:
    body = chat("100000")
    reply = stack.post(CHAT, body, content_type=content_type)
    if judged:
        assert reply.status == 200, reply
        rec = stack.only_received()
        assert reply.header("x-ice-decision") == "downgrade"
        assert rec.header("x-ice-decision") == "downgrade"
        assert rec.json()["max_tokens"] < 100000
    else:
        assert reply.status == 415, reply
        assert reply.json()["error"]["code"] == "unsupported_media_type"
        assert stack.received() == []


def test_unknown_path_is_refused_by_envoy_without_consulting_ice(stack: E2E) -> None:
    """Closed by default (tests/e2e/test_paths.py has the path rules in full)."""
    before = stack.ice_metric("ice_passthrough_total") + stack.ice_metric("ice_decisions_total")
    reply = stack.post("/v1/audio/transcriptions", chat("100000"))
    assert reply.status == 404  # Envoy's own answer: the backend never sees it
    assert reply.json()["error"]["code"] == "unknown_endpoint"
    assert reply.ice_headers() == {}
    assert stack.received() == []
    models = stack.get("/v1/models")  # read-only: straight to the backend
    assert models.status == 200
    assert models.json()["data"][0]["id"] == "dev-model"
    assert models.ice_headers() == {}
    after = stack.ice_metric("ice_passthrough_total") + stack.ice_metric("ice_decisions_total")
    assert after == before
    assert_still_judging(stack)


ENCODED_CHAT_PATHS = [
    "/v1/chat/%63ompletions",
    "/v1/chat%2Fcompletions",
    "/v1//chat/completions",
    "/v1/./chat/completions",
    "/v1/x/../chat/completions",
    "/v1/chat/completions?api-version=1",
]


@pytest.mark.parametrize("path", ENCODED_CHAT_PATHS)
def test_a_differently_spelled_chat_path_cannot_skip_ice(stack: E2E, path: str) -> None:
    """Envoy routes on the normalised path, the one a backend such as uvicorn acts on."""
    reply = stack.post(path, chat("100000"))
    assert reply.status == 200, reply
    assert reply.header("x-ice-decision") == "downgrade"
    rec = stack.only_received()
    assert rec.path == CHAT
    assert rec.header("x-ice-decision") == "downgrade"
    assert rec.json()["max_tokens"] < 100000


# --- body size limits ---------------------------------------------------------------------


def big_chat(size: int, path: str = CHAT) -> bytes:
    """A valid request body of exactly ``size`` bytes: one very long user message."""
    head = b'{"model": "dev-model", "max_tokens": 16, "messages": [{"role": "user", "content": "'
    tail = b'"}]}'
    return head + b"a" * (size - len(head) - len(tail)) + tail


@pytest.mark.parametrize("chunked", [False, True], ids=["content_length", "chunked"])
@pytest.mark.parametrize("path", [CHAT, MESSAGES], ids=["openai", "anthropic"])
def test_body_over_the_limit_is_413_in_the_api_format(stack: E2E, path: str, chunked: bool) -> None:
    # With a content-length either ICE (from the declared length, at the headers phase) or
    # Envoy (its buffer limit hit while the body streams in) answers first; a chunked upload
    # is Envoy's to refuse. Both answer 413 in the API's format.
    body = big_chat(9 * 1024 * 1024)
    reply = upload(stack.envoy_port, path, chunks(body), length=None if chunked else len(body))
    assert reply.status == 413, reply
    assert_error_format(reply, path, "request_too_large")
    assert stack.received() == []
    assert_still_judging(stack)


def test_ice_answers_413_from_the_declared_length_before_the_body_arrives(stack: E2E) -> None:
    before = stack.ice_metric("ice_bad_requests_total", route="chat", reason="request_too_large")
    head = (
        f"POST {CHAT} HTTP/1.1\r\nhost: e2e\r\ncontent-type: application/json\r\n"
        f"content-length: {9 * 1024 * 1024}\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", stack.envoy_port), timeout=10) as sock:
        sock.sendall(head + b'{"model": "dev-model"')  # the rest of the body never comes
        raw = b""
        while b"\r\n\r\n" not in raw or not raw.endswith(b"}\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            raw += chunk
    status_line, _, rest = raw.partition(b"\r\n")
    assert status_line.startswith(b"HTTP/1.1 413"), raw
    headers = {
        k.strip().lower(): v.strip()
        for k, _, v in (line.partition(b":") for line in rest.split(b"\r\n\r\n")[0].split(b"\r\n"))
    }
    assert headers[b"x-ice-decision"] == b"reject"
    assert headers[b"x-ice-reason"] == b"request_too_large"
    after = stack.ice_metric("ice_bad_requests_total", route="chat", reason="request_too_large")
    assert after == before + 1
    assert stack.received() == []
    assert_still_judging(stack)


def chunks(body: bytes, size: int = 256 * 1024) -> Iterator[bytes]:
    for i in range(0, len(body), size):
        yield body[i : i + size]


@pytest.mark.parametrize("chunked", [False, True], ids=["content_length", "chunked"])
def test_body_just_under_the_limit_reaches_ice_whole(stack: E2E, chunked: bool) -> None:
    """ICE parses all of it: the long message is over max_model_len, so ICE answers 400."""
    body = big_chat(LIMIT - 64 * 1024)
    reply = upload(stack.envoy_port, CHAT, chunks(body), length=None if chunked else len(body))
    assert reply.status == 400, reply
    assert_error_format(reply, CHAT, "context_length_exceeded", "messages")
    assert reply.header("x-ice-decision") == "reject"
    estimate = OPENAI_CHAT.features(json.loads(body)).input_tokens
    assert f"about {estimate} tokens" in reply.json()["error"]["message"]
    assert stack.received() == []
    assert_still_judging(stack)


def test_ice_counts_each_kind_of_bad_request(stack: E2E) -> None:
    kinds = ("invalid_json", "empty_body", "invalid_type", "invalid_value")
    before = {k: stack.ice_metric("ice_bad_requests_total", route="chat", reason=k) for k in kinds}
    for body in (b"{", None, chat('"x"'), chat("true"), chat("0")):
        assert stack.post(CHAT, body).status == 400
    after = {k: stack.ice_metric("ice_bad_requests_total", route="chat", reason=k) for k in kinds}
    assert {k: after[k] - before[k] for k in kinds} == {
        "invalid_json": 1,
        "empty_body": 1,
        "invalid_type": 2,
        "invalid_value": 1,
    }
