"""ICE's decisions through real Envoy configured as each mesh configures its proxy, with what
ICE adds taken from the generated manifests (tests/e2e/meshes.py builds the bootstraps).

Per flavour (Istio ingress gateway, Istio sidecar, Envoy Gateway): the bootstrap passes
``envoy --mode validate``; a pass carries the verdict on the request and the response; a
downgrade rewrites only the limit; a sheddable request gets a 429 with ``retry-after``; the
route's name reaches ICE (completions default to sheddable); an oversized input gets a 400 in
the API's format; a backend's valve 503 is answered as ICE's; spoofed verdict headers never
reach the backend; a read-only route and an unknown path never meet ICE; with ICE down,
requests fail open.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ext_proc.lab.stack import envoy_binary

from . import meshes
from .harness import (
    CHAT,
    COMPLETIONS,
    E2E,
    HIGH,
    HIGH_SCORE,
    LOW,
    LOW_SCORE,
    MESSAGES,
    RETRY_AFTER_S,
    running_stack,
)
from .test_decisions import LONG_INPUT, MSGS, assert_verdict, chat_raw

Flavour = tuple[Callable[[], dict[str, Any]], str, str, str | tuple[str, ...]]


def _flavours() -> dict[str, Flavour]:
    flavours: dict[str, Flavour] = {
        "istio-gateway": (
            meshes.istio_gateway,
            meshes.GATEWAY_LISTENER,
            meshes.ISTIO_ICE,
            meshes.ISTIO_BACKEND,
        ),
        "istio-sidecar": (
            meshes.istio_sidecar,
            meshes.SIDECAR_LISTENER,
            meshes.ISTIO_ICE,
            meshes.ISTIO_INBOUND,
        ),
    }
    flavours.update(meshes.envoy_gateway_flavours())
    return flavours


FLAVOURS = _flavours()


def _template(tmp: Path, name: str) -> Path:
    path = tmp / f"{name}.json"
    path.write_text(json.dumps(FLAVOURS[name][0]()))
    return path


@pytest.fixture(scope="module", params=sorted(FLAVOURS))
def mesh(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2E]:
    name: str = request.param
    tmp = tmp_path_factory.mktemp(name)
    _, listener, ice, backend = FLAVOURS[name]
    with running_stack(
        tmp,
        envoy_template=_template(tmp, name),
        listener=listener,
        ice_cluster=ice,
        backend_cluster=backend,
    ) as e2e:
        yield e2e


@pytest.fixture(autouse=True)
def _idle(request: pytest.FixtureRequest) -> None:
    if "mesh" in request.fixturenames:
        e2e: E2E = request.getfixturevalue("mesh")
        e2e.reset()


@pytest.mark.parametrize("name", sorted(FLAVOURS))
def test_the_mesh_shaped_bootstrap_passes_envoy_validate(name: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [envoy_binary(), "--mode", "validate", "-c", str(_template(tmp_path, name)), "-l", "error"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_pass_carries_the_verdict_on_request_and_response(mesh: E2E) -> None:
    mesh.set_state(LOW, level="low", score=LOW_SCORE)
    body = chat_raw("256")
    reply = mesh.post(CHAT, body)
    assert reply.status == 200, reply
    assert_verdict(reply, decision="pass", level="low", score=LOW_SCORE)
    rec = mesh.only_received()
    assert rec.body == body
    assert_verdict(rec, decision="pass", level="low", score=LOW_SCORE)


def test_a_downgrade_rewrites_only_the_limit(mesh: E2E) -> None:
    mesh.set_state(HIGH, level="high", score=HIGH_SCORE)
    reply = mesh.post(CHAT, chat_raw("5000"))
    assert reply.status == 200, reply
    common = {"decision": "downgrade", "level": "high", "score": HIGH_SCORE}
    assert_verdict(reply, **common, reason="pressure_cap", original="5000")
    rec = mesh.only_received()
    assert rec.body == chat_raw("1024")


def test_a_sheddable_request_gets_429_with_retry_after(mesh: E2E) -> None:
    mesh.set_state(HIGH, level="high", score=HIGH_SCORE)
    body = {"model": "dev-model", "messages": MSGS, "max_tokens": 64}
    reply = mesh.post(CHAT, body, {"x-priority": "sheddable"})
    assert reply.status == 429, reply
    assert reply.header("retry-after") == str(RETRY_AFTER_S)
    assert reply.json()["error"]["code"] == "memory_pressure"
    assert mesh.received() == []


@pytest.mark.parametrize("path", [CHAT, MESSAGES], ids=["openai", "anthropic"])
def test_a_backends_valve_503_is_answered_as_ices(mesh: E2E, path: str) -> None:
    """The response phase in each mesh's proxy (Envoy Gateway gets response_attributes from
    the patch): vLLM's own 503 reaches the client as ICE's overload answer."""
    mesh.shut_valve()
    body = {"model": "dev-model", "messages": MSGS, "max_tokens": 8}
    reply = mesh.post(path, body, {"x-priority": "critical"})
    assert reply.status == 503, reply
    assert reply.header("retry-after") == str(RETRY_AFTER_S)
    assert reply.header("x-ice-reason") == "backend_overloaded"
    assert reply.json()["error"]["code"] == "backend_overloaded"
    assert len(mesh.received()) == 1


def test_the_route_name_reaches_ice(mesh: E2E) -> None:
    # completions is bound to priority sheddable in the policy: only x-ice-route says so.
    mesh.set_state(HIGH, level="high", score=HIGH_SCORE)
    reply = mesh.post(COMPLETIONS, {"model": "dev-model", "prompt": "hi", "max_tokens": 8})
    assert reply.status == 429, reply
    assert mesh.received() == []


@pytest.mark.parametrize("path", [CHAT, MESSAGES], ids=["openai", "anthropic"])
def test_an_oversized_input_gets_400_in_the_api_format(mesh: E2E, path: str) -> None:
    body = {"model": "dev-model", "messages": [{"role": "user", "content": LONG_INPUT}]}
    reply = mesh.post(path, {**body, "max_tokens": 16})
    assert reply.status == 400, reply
    doc = reply.json()
    assert doc["error"]["code"] == "context_length_exceeded"
    assert (doc.get("type") == "error") == (path == MESSAGES)
    assert mesh.received() == []


SPOOFED = {
    "x-mem-pressure": "low",
    "x-ice-decision": "pass",
    "x-downgraded": "false",
    "x-ice-anything": "1",
    "x-gateway-destination-endpoint": "10.0.0.1:8000",
}


def test_spoofed_verdict_headers_never_reach_the_backend(mesh: E2E) -> None:
    mesh.set_state(HIGH, level="high", score=HIGH_SCORE)
    spoofed = SPOOFED
    body = {"model": "dev-model", "messages": MSGS, "max_tokens": 64}
    assert mesh.post(CHAT, body, spoofed).status == 200
    rec = mesh.only_received()
    assert rec.headers_named("x-mem-pressure") == ["high"]
    assert rec.headers_named("x-ice-decision") == ["pass"]
    for name in ("x-downgraded", "x-ice-anything", "x-gateway-destination-endpoint"):
        assert rec.headers_named(name) == [], name


def test_a_read_only_route_and_an_unknown_path_never_meet_ice(mesh: E2E) -> None:
    models = mesh.get("/v1/models")
    assert models.status == 200, models
    assert models.header("x-ice-decision") is None
    assert models.json()["object"] == "list"  # the backend's answer
    unknown = mesh.post("/v1/unknown", {"model": "dev-model"})
    assert unknown.status == 404, unknown
    assert unknown.json()["error"]["code"] == "unknown_endpoint"
    assert mesh.received() == []


@pytest.mark.parametrize("name", sorted(FLAVOURS))
def test_with_ice_down_requests_fail_open_and_spoofs_are_still_stripped(
    name: str, tmp_path: Path
) -> None:
    _, listener, ice, backend = FLAVOURS[name]
    with running_stack(
        tmp_path,
        start_ice=False,
        envoy_template=_template(tmp_path, name),
        listener=listener,
        ice_cluster=ice,
        backend_cluster=backend,
    ) as e2e:
        body = {"model": "dev-model", "messages": MSGS, "max_tokens": 64}
        reply = e2e.post(CHAT, body, SPOOFED)
        assert reply.status == 200, reply
        assert reply.header("x-ice-decision") is None
        rec = e2e.only_received()
        assert rec.json() == body
        # ICE is not there to drop them: the proxy's own filter did.
        assert [k for k, _ in rec.header_list if k in SPOOFED] == []
