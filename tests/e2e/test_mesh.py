"""ICE's decisions through real Envoy configured as each mesh configures its proxy, with what
ICE adds taken from the generated manifests (tests/e2e/meshes.py builds the bootstraps, and
applies Istio's patches with istiod's semantics: tests/e2e/istio_apply.py).

Per flavour (Istio ingress gateway, Istio sidecar, Envoy Gateway): the bootstrap passes
``envoy --mode validate``; a pass carries the verdict on the request and the response; a
downgrade rewrites only the limit; a sheddable request gets a 429 with ``retry-after``; the
route's name reaches ICE (completions default to sheddable); an oversized input gets a 400 in
the API's format; a backend's valve 503 is answered as ICE's; spoofed verdict headers never
reach the backend; a read-only route and an unknown path never meet ICE; with ICE down,
requests fail open; a 4 MiB body is judged (not Envoy's 413: the listener's 1 MiB default is
raised); ICE's cluster and the listener, read back from Envoy's ``/config_dump``, hold what
the docs promise. On Istio's shared gateway another tenant's route keeps its headers, its
paths and ICE's absence, and a tenant's '*' VirtualService, created before or after ICE's
(which names its host), keeps its paths while ICE's host keeps ICE's 404.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ext_proc.lab.stack import envoy_binary, free_port
from ext_proc.tools.envoygen import pieces
from ext_proc.tools.envoygen.emit import as_dict

from . import meshes
from .harness import (
    CHAT,
    COMPLETIONS,
    E2E,
    HIGH,
    HIGH_SCORE,
    LONG_INPUT,
    LOW,
    LOW_SCORE,
    MESSAGES,
    MSGS,
    RETRY_AFTER_S,
    assert_verdict,
    chat_raw,
    request,
    running_stack,
    upload,
)

# (bootstrap for (listener port, backend port), listener, ICE's cluster, backend clusters)
Flavour = tuple[Callable[[int, int], dict[str, Any]], str, str, str | tuple[str, ...]]
UNUSED = "no-static-backend"  # the sidecar reaches the backend by ORIGINAL_DST, not by name


def _flavours() -> dict[str, Flavour]:
    flavours: dict[str, Flavour] = {
        "istio-gateway": (
            lambda _listener, _backend: meshes.istio_gateway(),
            meshes.GATEWAY_LISTENER,
            meshes.ISTIO_ICE,
            (meshes.ISTIO_BACKEND, meshes.TENANT_CLUSTER),
        ),
        "istio-sidecar": (
            lambda listener, backend: meshes.istio_sidecar(
                redirect_port=listener, app_port=backend
            ),
            meshes.SIDECAR_LISTENER,
            meshes.ISTIO_ICE,
            UNUSED,
        ),
    }
    for name, (build, listener, ice, backends) in meshes.envoy_gateway_flavours().items():
        flavours[name] = (_ports_unused(build), listener, ice, backends)
    return flavours


def _ports_unused(build: Callable[[], dict[str, Any]]) -> Callable[[int, int], dict[str, Any]]:
    def with_ports(_listener: int, _backend: int) -> dict[str, Any]:
        return build()

    return with_ports


FLAVOURS = _flavours()
FLAVOUR_OF: dict[int, str] = {}  # id(E2E) → its flavour's name


def _template(tmp: Path, name: str, listener_port: int = 18001, backend_port: int = 18002) -> Path:
    path = tmp / f"{name}.json"
    path.write_text(json.dumps(FLAVOURS[name][0](listener_port, backend_port)))
    return path


@contextlib.contextmanager
def _stack(tmp: Path, name: str, **kwargs: Any) -> Iterator[E2E]:
    _, listener, ice, backend = FLAVOURS[name]
    envoy_port, backend_port = free_port(), free_port()
    with running_stack(
        tmp,
        envoy_template=_template(tmp, name, envoy_port, backend_port),
        listener=listener,
        ice_cluster=ice,
        backend_cluster=backend,
        envoy_port=envoy_port,
        backend_port=backend_port,
        host=meshes.GATEWAY_HOST if name == "istio-gateway" else None,
        **kwargs,
    ) as e2e:
        FLAVOUR_OF[id(e2e)] = name
        yield e2e


@pytest.fixture(scope="module", params=sorted(FLAVOURS))
def mesh(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2E]:
    name: str = request.param
    with _stack(tmp_path_factory.mktemp(name), name) as e2e:
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
    with _stack(tmp_path, name, start_ice=False) as e2e:
        body = {"model": "dev-model", "messages": MSGS, "max_tokens": 64}
        reply = e2e.post(CHAT, body, SPOOFED)
        assert reply.status == 200, reply
        assert reply.header("x-ice-decision") is None
        rec = e2e.only_received()
        assert rec.json() == body
        # ICE is not there to drop them: the proxy's own filter did.
        assert [k for k, _ in rec.header_list if k in SPOOFED] == []


FOUR_MIB = 4 * 1024 * 1024


def test_a_4_mib_body_is_judged_not_refused_by_the_proxy(mesh: E2E) -> None:
    """Envoy's listener buffer limit defaults to 1 MiB (Istio leaves it there): a larger
    body would get Envoy's 413 before ICE sees it. The patches raise it to 8 MiB."""
    mesh.set_state(LOW, level="low", score=LOW_SCORE)
    body = {"model": "dev-model", "messages": MSGS, "max_tokens": 8, "user": "u" * FOUR_MIB}
    reply = mesh.post(CHAT, body)
    assert reply.status == 200, (reply.status, reply.body[:300])
    assert reply.header("x-ice-decision") == "pass"
    assert len(mesh.only_received().body) > FOUR_MIB


def _config_dump(e2e: E2E) -> dict[str, Any]:
    reply = request(e2e.admin_port, "GET", "/config_dump")
    assert reply.status == 200, reply
    doc: dict[str, Any] = reply.json()
    return doc


def _dumped(dump: dict[str, Any], kind: str, key: str) -> list[dict[str, Any]]:
    section = next(c for c in dump["configs"] if c["@type"].endswith(kind))
    return [entry[key] for entry in section.get(f"static_{key}s", [])]


def test_ices_cluster_and_the_listener_hold_what_the_docs_promise(mesh: E2E) -> None:
    """docs/deploy-istio.md and docs/endpoints.md, read back from Envoy itself: ICE's cluster
    connects within 1 s with up to 1,024 streams per HTTP/2 connection and ejects a refusing
    replica; the listener takes bodies up to 8 MiB."""
    name = FLAVOUR_OF[id(mesh)]
    _, listener_name, ice_name, _ = FLAVOURS[name]
    dump = _config_dump(mesh)
    (ice,) = [c for c in _dumped(dump, "ClustersConfigDump", "cluster") if c["name"] == ice_name]
    local = as_dict(pieces.ice_cluster("ice", ["127.0.0.1:1"]))
    assert ice["connect_timeout"] == local["connect_timeout"] == "1s"
    options = ice["typed_extension_protocol_options"][meshes.H2_OPTIONS]
    h2 = options["explicit_http_config"]["http2_protocol_options"]
    assert h2["max_concurrent_streams"] == 1024
    od = ice["outlier_detection"]
    assert od["consecutive_local_origin_failure"] == 1
    assert od["split_external_local_origin_errors"] is True
    (listener,) = [
        x for x in _dumped(dump, "ListenersConfigDump", "listener") if x["name"] == listener_name
    ]
    assert listener["per_connection_buffer_limit_bytes"] >= pieces.MAX_BODY_BYTES


def test_a_second_tenants_route_on_the_shared_gateway_is_unchanged(mesh: E2E) -> None:
    """On Istio's shared ingress gateway another team's route (its own host) keeps what it
    had: ICE never judges it, its requests keep their headers (no stripping) and their paths
    (no slash merging), while ICE's own routes still strip, judge and answer a too-large body
    in the API's format."""
    if FLAVOUR_OF[id(mesh)] != "istio-gateway":
        pytest.skip("a shared gateway: Istio's ingress gateway only")
    tenant = {"host": meshes.TENANT_HOST, **SPOOFED}
    body = {"model": "dev-model", "messages": MSGS, "max_tokens": 8}
    reply = mesh.post("/v1//chat/completions", body, tenant)
    rec = mesh.only_received()
    assert rec.path == "/v1//chat/completions"  # Istio's BASE normalisation, untouched
    for header, value in SPOOFED.items():
        assert rec.headers_named(header) == [value], header
    assert reply.header("x-mem-pressure") is None  # no verdict: ICE never saw it
    # ICE's own route on the same listener: stripped and judged.
    mesh.clear_received()
    mine = mesh.post(CHAT, body, SPOOFED)
    assert mine.status == 200 and mine.header("x-mem-pressure") is not None, mine
    assert mesh.only_received().headers_named("x-ice-anything") == []
    # sent while the reply is read (the proxy answers 413 before the upload ends, and resets a
    # client that only reads after sending: CI saw that reset once)
    big = json.dumps({**body, "user": "u" * (pieces.MAX_BODY_BYTES + 1)}).encode()
    parts = [big[i : i + 65536] for i in range(0, len(big), 65536)]
    too_large = upload(
        mesh.envoy_port, CHAT, parts, length=len(big), headers={"host": meshes.GATEWAY_HOST}
    )
    assert too_large.status == 413, too_large
    assert too_large.json()["error"]["code"] == "request_too_large"


def test_a_service_port_apart_from_the_containers_is_judged_in_the_sidecar(tmp_path: Path) -> None:
    """Service port 80, container port 8000: istiod keys the inbound chain, route table and
    cluster by 8000, the vhost by 80; the patches (by ``backend.target_port``) still apply
    (the stand-in refuses any that matches nothing) and ICE judges."""
    backend = dataclasses.replace(meshes.SPEC.backend, port=80, target_port=8000)
    spec = dataclasses.replace(meshes.SPEC, backend=backend)
    envoy_port, backend_port = free_port(), free_port()
    template = tmp_path / "sidecar.json"
    bootstrap = meshes.istio_sidecar(spec, redirect_port=envoy_port, app_port=backend_port)
    template.write_text(json.dumps(bootstrap))
    with running_stack(
        tmp_path,
        envoy_template=template,
        listener=meshes.SIDECAR_LISTENER,
        ice_cluster=meshes.ISTIO_ICE,
        backend_cluster=UNUSED,
        envoy_port=envoy_port,
        backend_port=backend_port,
    ) as e2e:
        body = {"model": "dev-model", "messages": MSGS, "max_tokens": 8}
        reply = e2e.post(CHAT, body)
        assert reply.status == 200 and reply.header("x-ice-decision") == "pass", reply
        assert e2e.post("/v1/unknown", body).status == 404


@pytest.mark.parametrize("tenant_first", [True, False], ids=["tenant-first", "ice-first"])
def test_a_star_tenant_on_the_shared_gateway_keeps_its_paths_and_ice_its_404(
    tmp_path: Path, tenant_first: bool
) -> None:
    """Another tenant's '*' VirtualService on Istio's shared gateway, created before or after
    ICE's (which names its host, ``gateway.hosts``): through real Envoy, the tenant's GET /
    reaches the tenant, not ICE's 404; on ICE's host an unknown path gets ICE's 404, not the
    tenant, and a chat is judged. (With ICE's VirtualService on '*', istiod merges both into
    one virtual host in creation order and one of these breaks:
    tests/tools/test_istio_standin.py.)"""
    template = tmp_path / "gateway.json"
    bootstrap = meshes.istio_gateway(tenant_hosts=("*",), tenant_first=tenant_first)
    template.write_text(json.dumps(bootstrap))
    with running_stack(
        tmp_path,
        envoy_template=template,
        listener=meshes.GATEWAY_LISTENER,
        ice_cluster=meshes.ISTIO_ICE,
        backend_cluster=(meshes.ISTIO_BACKEND, meshes.TENANT_CLUSTER),
        host=meshes.GATEWAY_HOST,
    ) as e2e:
        tenant = e2e.get("/", {"host": "shop.example.com"})
        assert tenant.status == 200 and tenant.header("x-mem-pressure") is None, tenant
        assert e2e.only_received().path == "/"
        e2e.clear_received()
        unknown = e2e.get("/v1/nope")
        assert unknown.status == 404 and unknown.json()["error"]["code"] == "unknown_endpoint"
        assert e2e.received() == []
        body = {"model": "dev-model", "messages": MSGS, "max_tokens": 8}
        chat = e2e.post(CHAT, body)
        assert chat.status == 200 and chat.header("x-ice-decision") == "pass", chat
