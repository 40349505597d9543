"""Every Envoy config in envoy/ is one Envoy accepts, as written and as the stack renders it,
and every one forwards only what docs/endpoints.md lists (closed by default).

The Kubernetes manifests are not bootstraps: the Istio EnvoyFilter's patches are applied to a
stand-in of a sidecar's inbound config (as Istio applies them) and that is validated; the
Envoy Gateway manifest's routes are compared with the same lists.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from ext_proc.lab.stack import CLOSED_ROUTE, ENVOY_DIR, envoy_binary, render_envoy_config
from ext_proc.tools.envoygen import pieces

from . import meshes
from .harness import CLOSED, ENVOY_TEMPLATE, JUDGED_ROUTES, READ_ONLY_ROUTES

# The bootstraps (everything else under envoy/ is a spec or a Kubernetes manifest).
CONFIGS = [ENVOY_DIR / "bench.yaml", ENVOY_DIR / "envoy.yaml"]


def _validate(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [envoy_binary(), "--mode", "validate", "-c", str(path), "-l", "error"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_envoy_dir_holds_the_stack_config() -> None:
    assert ENVOY_TEMPLATE in CONFIGS


@pytest.mark.parametrize("path", CONFIGS, ids=[str(p.relative_to(ENVOY_DIR)) for p in CONFIGS])
def test_envoy_config_passes_envoy_validate(path: Path) -> None:
    result = _validate(path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_rendered_config_with_two_ice_workers_passes_envoy_validate(tmp_path: Path) -> None:
    config: dict[str, Any] = render_envoy_config(
        ENVOY_TEMPLATE,
        admin_port=19901,
        listeners={"ingress": 18080},
        clusters={"ice": ["127.0.0.1:15051", "127.0.0.1:15052"], "backend": ["127.0.0.1:18000"]},
    )
    endpoints = config["static_resources"]["clusters"]
    ice = next(c for c in endpoints if c["name"] == "ice")
    assert len(ice["load_assignment"]["endpoints"][0]["lb_endpoints"]) == 2
    path = tmp_path / "rendered.json"
    path.write_text(json.dumps(config))
    result = _validate(path)
    assert result.returncode == 0, result.stdout + result.stderr


# --- closed by default -----------------------------------------------------------------------

TYPE = "type.googleapis.com/"
EXT_PROC = "envoy.filters.http.ext_proc"
BUFFER = "envoy.filters.http.buffer"
BENCH_YAML = ENVOY_DIR / "bench.yaml"
GATEWAY = ENVOY_DIR / "k8s" / "overlays" / "envoy-gateway" / "generated" / "envoy-gateway.yaml"
READ_METHODS = [{"name": ":method", "string_match": {"safe_regex": {"regex": "GET|HEAD"}}}]


def _hcm(config: dict[str, Any], listener: str = "ingress") -> dict[str, Any]:
    found = next(x for x in config["static_resources"]["listeners"] if x["name"] == listener)
    typed: dict[str, Any] = found["filter_chains"][0]["filters"][0]["typed_config"]
    return typed


def _routes(hcm: dict[str, Any]) -> list[dict[str, Any]]:
    (vhost,) = hcm["route_config"]["virtual_hosts"]
    routes: list[dict[str, Any]] = vhost["routes"]
    return routes


def _ext_proc(route: dict[str, Any]) -> dict[str, Any]:
    config: dict[str, Any] = route.get("typed_per_filter_config", {}).get(EXT_PROC, {})
    return config


def check_closed_by_default(
    hcm: dict[str, Any],
    cluster: str,
    *,
    closed: str = CLOSED,
    read_only: dict[str, str] = READ_ONLY_ROUTES,
    extra: tuple[str, ...] = (),
) -> None:
    """The judged routes, then the read-only ones, then the 404 (``extra``: more names)."""
    assert hcm["normalize_path"] is True
    assert hcm["merge_slashes"] is True
    assert hcm["path_with_escaped_slashes_action"] == "UNESCAPE_AND_FORWARD"
    buffer = next(f for f in hcm["http_filters"] if f["name"] == BUFFER)
    assert buffer["disabled"] is True
    routes = [r for r in _routes(hcm) if r["name"] not in extra]
    judged, rest = routes[: len(JUDGED_ROUTES)], routes[len(JUDGED_ROUTES) :]
    assert {r["match"].get("path"): r["name"] for r in judged} == JUDGED_ROUTES
    for r in judged:
        assert set(r["match"]) == {"path"}, r["name"]
        assert r["route"]["cluster"] == cluster
        assert _ext_proc(r)["overrides"]["grpc_initial_metadata"] == [
            {"key": "x-ice-route", "value": r["name"]}
        ]
    reads, last = rest[:-1], rest[-1]
    assert {r["match"].get("path"): r["name"] for r in reads} == read_only
    for r in reads:
        assert r["match"].get("headers") == READ_METHODS, r["name"]
        assert r["route"]["cluster"] == cluster
        assert _ext_proc(r).get("disabled") is True
    assert last["name"] == closed
    assert last["match"] == {"prefix": "/"}
    assert "route" not in last
    assert last["direct_response"]["status"] == 404
    body = last["direct_response"]["body_format"]
    assert body["content_type"] == "application/json"
    error = body["json_format"]["error"]
    assert (error["type"], error["param"], error["code"]) == (
        "invalid_request_error",
        None,
        "unknown_endpoint",
    )
    assert "%PATH(NQ)%" in error["message"]
    assert _ext_proc(last).get("disabled") is True
    assert BUFFER in last["typed_per_filter_config"]


def test_the_stack_config_is_closed_by_default() -> None:
    config = yaml.safe_load(ENVOY_TEMPLATE.read_text())
    check_closed_by_default(_hcm(config), "backend")


def test_the_bench_config_is_closed_by_default_beside_its_baseline() -> None:
    config = yaml.safe_load(BENCH_YAML.read_text())
    hcm = _hcm(config)
    check_closed_by_default(hcm, "fast_upstream", extra=("chat_direct",))
    (direct,) = [r for r in _routes(hcm) if r["name"].endswith("_direct")]
    assert direct["match"]["headers"] == [
        {"name": "x-bench-route", "string_match": {"exact": "direct"}}
    ]
    assert _ext_proc(direct)["disabled"] is True
    assert _routes(hcm)[0] is direct  # before `chat`, which takes the same path


def test_closed_route_name_is_the_one_the_stack_opens_before() -> None:
    assert CLOSED_ROUTE == CLOSED


# --- render_envoy_config(passthrough_paths=...) ----------------------------------------------


def _render(template: Path, listeners: dict[str, int], **kw: Any) -> dict[str, Any]:
    clusters = {"ice": ["127.0.0.1:15051"], "backend": ["127.0.0.1:18000"]}
    clusters["fast_upstream"] = ["127.0.0.1:18001"]
    return render_envoy_config(
        template, admin_port=19901, listeners=listeners, clusters=clusters, **kw
    )


def test_passthrough_paths_become_routes_just_before_the_404(tmp_path: Path) -> None:
    config = _render(
        ENVOY_TEMPLATE, {"ingress": 18080}, passthrough_paths=["/tokenize", "/detokenize"]
    )
    routes = _routes(_hcm(config))
    names = [r["name"] for r in routes]
    assert names[-3:] == ["passthrough:/detokenize", "passthrough:/tokenize", CLOSED]
    opened = routes[-2]
    assert opened["match"] == {"path": "/tokenize"}  # any method
    assert opened["route"] == {"cluster": "backend", "timeout": "600s"}
    assert _ext_proc(opened) == {
        "@type": f"{TYPE}envoy.extensions.filters.http.ext_proc.v3.ExtProcPerRoute",
        "disabled": True,
    }
    path = tmp_path / "opened.json"
    path.write_text(json.dumps(config))
    result = _validate(path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_passthrough_paths_in_the_bench_config_go_to_its_upstream() -> None:
    listeners = {"ingress": 18080, "fast_upstream": 18001}
    config = _render(BENCH_YAML, listeners, passthrough_paths=["/tokenize"])
    routes = _routes(_hcm(config))
    assert [r["name"] for r in routes[-2:]] == ["passthrough:/tokenize", CLOSED]
    assert routes[-2]["route"]["cluster"] == "fast_upstream"
    upstream = [r.get("name") for r in _routes(_hcm(config, "fast_upstream"))]
    assert "passthrough:/tokenize" not in upstream


def test_no_passthrough_paths_leaves_the_routes_as_written() -> None:
    config = _render(ENVOY_TEMPLATE, {"ingress": 18080})
    written = yaml.safe_load(ENVOY_TEMPLATE.read_text())
    assert _routes(_hcm(config)) == _routes(_hcm(written))


def test_a_passthrough_path_that_already_has_a_route_is_refused() -> None:
    with pytest.raises(ValueError, match="already a route"):
        _render(ENVOY_TEMPLATE, {"ingress": 18080}, passthrough_paths=["/v1/embeddings"])


def test_passthrough_paths_need_a_closed_route(tmp_path: Path) -> None:
    config = yaml.safe_load(ENVOY_TEMPLATE.read_text())
    hcm = _hcm(config)
    hcm["route_config"]["virtual_hosts"][0]["routes"] = _routes(hcm)[:-1]
    template = tmp_path / "open.yaml"
    template.write_text(yaml.safe_dump(config))
    with pytest.raises(ValueError, match="no 'closed' route"):
        _render(template, {"ingress": 18080}, passthrough_paths=["/tokenize"])


# --- Istio: the EnvoyFilter's patches on a stand-in inbound sidecar config -------------------

# --- Istio: the generated EnvoyFilters in stand-ins of the gateway and the sidecar ------------


def test_istio_gateway_is_closed_by_default_and_ice_is_off_elsewhere() -> None:
    bootstrap = meshes.istio_gateway()
    hcm = _hcm(bootstrap, meshes.GATEWAY_LISTENER)
    ext_proc = next(f for f in hcm["http_filters"] if f["name"] == EXT_PROC)
    # The gateway carries other services' routes: ICE is off unless a route turns it on.
    assert ext_proc["disabled"] is True
    tenant, vhost = hcm["route_config"]["virtual_hosts"]
    assert tenant == meshes.tenant_vhost(meshes.SPEC.gateway.port)
    routes = vhost["routes"]
    judged = [r for r in routes if _ext_proc(r).get("overrides")]
    assert {r["match"]["path"]: r["name"] for r in judged} == {
        p: f"ice.{n}" for p, n in JUDGED_ROUTES.items()
    }
    for r in judged:
        assert r["route"]["cluster"] == meshes.ISTIO_BACKEND
        echoed = {h["header"]["key"] for h in r["response_headers_to_add"]}
        assert echoed == set(pieces.ECHOED_HEADERS)
    closed = routes[-1]
    assert (closed["name"], closed["match"]) == ("ice.closed", {"prefix": "/"})
    assert closed["direct_response"]["status"] == 404
    assert BUFFER in closed["typed_per_filter_config"]
    names = [f["name"] for f in hcm["http_filters"]]
    assert names.index("envoy.filters.http.header_mutation") < names.index(EXT_PROC)
    assert names[-1] == "envoy.filters.http.router"


def test_istio_sidecar_closes_the_inbound_routes_by_default() -> None:
    hcm = meshes.hcms_of(meshes.istio_sidecar())[0]
    ext_proc = next(f for f in hcm["http_filters"] if f["name"] == EXT_PROC)
    assert ext_proc["typed_config"]["grpc_service"]["envoy_grpc"]["cluster_name"] == (
        meshes.ISTIO_ICE
    )
    # ICE's scraper reaches vLLM's /metrics through the same sidecar: read-only there too.
    read_only = {**READ_ONLY_ROUTES, "/metrics": "readonly_metrics"}
    check_closed_by_default(hcm, meshes.ISTIO_INBOUND, closed="default", read_only=read_only)


@pytest.mark.parametrize("flavour", ["gateway", "sidecar"])
def test_istio_and_the_stack_config_run_ice_the_same_way(flavour: str) -> None:
    """The ext_proc filter in Istio is envoy.yaml's, but for its cluster (and, at the
    gateway, off by default)."""
    stack = next(
        f
        for f in _hcm(yaml.safe_load(ENVOY_TEMPLATE.read_text()))["http_filters"]
        if f["name"] == EXT_PROC
    )
    bootstrap = meshes.istio_gateway() if flavour == "gateway" else meshes.istio_sidecar()
    istio = meshes.ext_proc_of(bootstrap)
    # the same service (its stream retry too), on Istio's cluster to ICE
    grpc = {
        **stack["typed_config"]["grpc_service"],
        "envoy_grpc": {"cluster_name": meshes.ISTIO_ICE},
    }
    assert istio["typed_config"] == {**stack["typed_config"], "grpc_service": grpc}
    ice = next(
        c for c in bootstrap["static_resources"]["clusters"] if c["name"] == meshes.ISTIO_ICE
    )
    local = next(
        c
        for c in yaml.safe_load(ENVOY_TEMPLATE.read_text())["static_resources"]["clusters"]
        if c["name"] == "ice"
    )
    # the local cluster's stream limit and connect timeout, by DestinationRule, beside what
    # istiod sets itself (its idle timeout stays)
    options = ice["typed_extension_protocol_options"][meshes.H2_OPTIONS]
    local_options = local["typed_extension_protocol_options"][meshes.H2_OPTIONS]
    assert options["explicit_http_config"] == local_options["explicit_http_config"]
    assert "idle_timeout" in options["common_http_protocol_options"]
    assert ice["connect_timeout"] == local["connect_timeout"]


# --- Envoy Gateway: the same paths with Gateway API routes -----------------------------------


def _gateway() -> dict[tuple[str, str], dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all(GATEWAY.read_text()) if d]
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def test_envoy_gateway_routes_are_closed_by_default() -> None:
    docs = _gateway()
    judged = docs["HTTPRoute", "llm-inference"]["spec"]["rules"]
    # One rule per judged route, so that each has its own xDS route name for the patch.
    assert [r["matches"][0]["path"]["value"] for r in judged] == list(JUDGED_ROUTES)
    assert {m["path"]["type"] for r in judged for m in r["matches"]} == {"Exact"}
    assert all(len(r["matches"]) == 1 for r in judged)
    reads, rest = docs["HTTPRoute", "llm-inference-closed"]["spec"]["rules"]
    assert [(m["path"]["value"], m["method"]) for m in reads["matches"]] == [
        (path, method) for path in READ_ONLY_ROUTES for method in ("GET", "HEAD")
    ]
    assert rest["matches"] == [{"path": {"type": "PathPrefix", "value": "/"}}]
    assert "backendRefs" not in rest
    (ref,) = rest["filters"]
    name = ref["extensionRef"]["name"]
    response = docs["HTTPRouteFilter", name]["spec"]["directResponse"]
    assert (response["statusCode"], response["contentType"]) == (404, "application/json")
    error = json.loads(response["body"]["inline"])["error"]
    assert (error["type"], error["param"], error["code"]) == (
        "invalid_request_error",
        None,
        "unknown_endpoint",
    )
    # ICE on the judged route only.
    policy = docs["EnvoyExtensionPolicy", "ice"]["spec"]
    assert [t["name"] for t in policy["targetRefs"]] == ["llm-inference"]
