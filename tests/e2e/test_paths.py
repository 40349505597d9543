"""Which paths real Envoy forwards: closed by default (docs/endpoints.md).

Only the judged endpoints (through ICE), the read-only paths (GET/HEAD, ICE off) and a
policy's ``passthrough_paths`` reach the backend. Anything else is Envoy's own 404 in the
OpenAI error format; the dev backend records every request it gets (any method, any path),
so ``received() == []`` proves a request never reached it. Verdicts on the new endpoints are
tested elsewhere: here only the path rules.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .harness import CHAT, E2E, Reply, running_stack, upload

# vLLM operator endpoints, other APIs, and made-up paths: none is served.
UNLISTED = [
    "/v1/load_lora_adapter",
    "/collective_rpc",
    "/pause",
    "/sleep",
    "/update_weights",
    "/reset_prefix_cache",
    "/v1/audio/transcriptions",
    "/tokenize",
    "/some/thing",
]
SMALL_CHAT = {
    "model": "dev-model",
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": 4,
}


def assert_gateway_404(reply: Reply, method: str, path: str) -> None:
    """Envoy's 404 (route ``closed``): the OpenAI error object naming method and path."""
    assert reply.status == 404, reply
    assert reply.header("content-type") == "application/json"
    assert reply.json() == {
        "error": {
            "message": f"{method} {path} is not served by this gateway.",
            "type": "invalid_request_error",
            "param": None,
            "code": "unknown_endpoint",
        }
    }
    assert reply.ice_headers() == {}


def ice_activity(stack: E2E) -> float:
    """Everything ICE counts per request it sees: unchanged means ICE was not consulted."""
    return stack.ice_metric("ice_passthrough_total") + stack.ice_metric("ice_decisions_total")


@pytest.mark.parametrize("path", UNLISTED)
def test_a_post_to_an_unlisted_path_is_envoys_404(stack: E2E, path: str) -> None:
    before = ice_activity(stack)
    reply = stack.post(path, {"lora_name": "x", "lora_path": "/tmp/evil"})
    assert_gateway_404(reply, "POST", path)
    assert stack.received() == []
    assert ice_activity(stack) == before


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE"])
def test_other_methods_on_an_unlisted_path_are_404_too(stack: E2E, method: str) -> None:
    reply = stack.call(method, "/sleep?level=2", b"{}" if method == "PUT" else None)
    assert_gateway_404(reply, method, "/sleep")
    assert stack.received() == []


def test_a_big_body_to_the_404_route_gets_the_404_cleanly(stack: E2E) -> None:
    """Envoy reads the body before its 404, so a client that sends all first still reads it."""
    body = b'{"x": "' + b"a" * (5 * 1024 * 1024) + b'"}'
    for _ in range(2):
        assert_gateway_404(
            stack.post("/v1/audio/transcriptions", body), "POST", "/v1/audio/transcriptions"
        )
    assert stack.received() == []


def test_a_body_over_the_limit_to_the_404_route_is_413_in_the_api_format(stack: E2E) -> None:
    body = b"a" * (9 * 1024 * 1024)
    parts = (body[i : i + 256 * 1024] for i in range(0, len(body), 256 * 1024))
    reply = upload(stack.envoy_port, "/v1/audio/transcriptions", parts, length=len(body))
    assert reply.status == 413, reply
    assert reply.json()["error"]["code"] == "request_too_large"
    assert stack.received() == []


# Spelled otherwise: after Envoy's normalisation (escaped slashes decoded, slashes merged)
# the path is matched exactly and case-sensitively, without its query string.
NOT_CHAT = {
    "trailing_slash": "/v1/chat/completions/",
    "other_case": "/V1/Chat/Completions",
    "params": "/v1/chat/completions;x=1",
}
AS_CHAT = {
    "escaped_slash": "/v1/chat%2Fcompletions",
    "double_slashes": "//v1//chat/completions",
    "query_string": "/v1/chat/completions?x=1",
}


@pytest.mark.parametrize("path", NOT_CHAT.values(), ids=NOT_CHAT.keys())
def test_a_near_miss_of_a_judged_path_is_404_not_the_backend(stack: E2E, path: str) -> None:
    before = ice_activity(stack)
    reply = stack.post(path, SMALL_CHAT)
    assert_gateway_404(reply, "POST", path)
    assert stack.received() == []
    assert ice_activity(stack) == before


@pytest.mark.parametrize("path", AS_CHAT.values(), ids=AS_CHAT.keys())
def test_a_normalised_judged_path_is_judged_by_ice(stack: E2E, path: str) -> None:
    reply = stack.post(path, SMALL_CHAT)
    assert reply.status == 200, reply
    assert reply.header("x-ice-decision") == "pass"
    rec = stack.only_received()
    assert rec.path == CHAT
    assert rec.header("x-ice-decision") == "pass"


# --- read-only paths -----------------------------------------------------------------------


@pytest.mark.parametrize("method", ["GET", "HEAD"])
def test_models_and_health_reach_the_backend_without_ice(stack: E2E, method: str) -> None:
    before = ice_activity(stack)
    models = stack.call(method, "/v1/models")
    health = stack.call(method, "/health")
    assert (models.status, health.status) == (200, 200)
    if method == "GET":
        assert models.json()["data"][0]["id"] == "dev-model"
        assert health.body == b""
    assert models.ice_headers() == {}
    assert health.ice_headers() == {}
    assert stack.received() == []  # the backend answers these two without recording them
    assert ice_activity(stack) == before


@pytest.mark.parametrize("path", ["/version", "/ping"])
def test_version_and_ping_reach_the_backend(stack: E2E, path: str) -> None:
    reply = stack.get(path)
    assert reply.status == 200, reply
    assert reply.ice_headers() == {}
    rec = stack.only_received()  # the dev backend's catch-all: recorded
    assert (rec.method, rec.path) == ("GET", path)
    assert rec.ice_headers() == {}


@pytest.mark.parametrize(
    ("method", "path"),
    [("POST", "/v1/models"), ("DELETE", "/v1/models"), ("POST", "/health"), ("PUT", "/ping")],
)
def test_another_method_on_a_read_only_path_is_404(stack: E2E, method: str, path: str) -> None:
    reply = stack.call(method, path, b"{}", {"content-type": "application/json"})
    assert_gateway_404(reply, method, path)
    assert stack.received() == []


# --- a policy's passthrough_paths ----------------------------------------------------------


@pytest.fixture(scope="module")
def opened(tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2E]:
    """A stack whose policy opens ``/tokenize`` (passthrough_paths)."""
    with running_stack(tmp_path_factory.mktemp("opened"), passthrough_paths=["/tokenize"]) as e2e:
        yield e2e


@pytest.mark.parametrize("method", ["POST", "GET"])
def test_a_passthrough_path_reaches_the_backend_unjudged(opened: E2E, method: str) -> None:
    opened.clear_received()
    body = b'{"model": "dev-model", "prompt": "hello"}'
    reply = opened.call(method, "/tokenize", body, {"content-type": "application/json"})
    assert reply.status == 200, reply
    assert reply.ice_headers() == {}
    rec = opened.only_received()
    assert (rec.method, rec.path, rec.body) == (method, "/tokenize", body)
    assert rec.ice_headers() == {}


def test_a_path_the_policy_does_not_open_stays_closed(opened: E2E) -> None:
    opened.clear_received()
    reply = opened.post("/detokenize", {"tokens": [1, 2]})
    assert_gateway_404(reply, "POST", "/detokenize")
    assert opened.received() == []
    judged = opened.post(CHAT, SMALL_CHAT)
    assert judged.header("x-ice-decision") == "pass"
