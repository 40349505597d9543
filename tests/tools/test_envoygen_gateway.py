"""Envoy Gateway's objects (ext_proc/tools/envoygen/gateway.py): deterministic; closed by default;
one EnvoyExtensionPolicy per profile; every judged route's name (and profile) reaches ICE
through the patch; the verdict headers on the judged routes' responses; spoofed headers
removed before ext_proc; and the bootstrap EG would build from them passes
``envoy --mode validate`` with ICE's own pieces where the local bootstrap has them."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from envoy_data_plane.google.protobuf import Any as PbAny

from ext_proc.lab.stack import envoy_binary
from ext_proc.tools.envoygen import gateway, gateway_names, pieces
from ext_proc.tools.envoygen.emit import as_dict, to_yaml
from ext_proc.tools.envoygen.local import local_bootstrap
from ext_proc.tools.envoygen.spec import MeshSpec, load_spec, parse_spec
from tests.e2e import eg_xds  # the EG-shaped bootstrap (tests/e2e/eg_xds.py)

REPO = Path(__file__).resolve().parents[2]
SPEC = load_spec(REPO / "envoy" / "mesh.yaml")
Docs = dict[tuple[str, str], dict[str, Any]]


def _by_name(spec: MeshSpec) -> Docs:
    return {(d["kind"], d["metadata"]["name"]): d for d in gateway.objects(spec)}


def _policy_with(tmp_path: Path, **extra: Any) -> Path:
    """The default policy plus a profile ``batch`` (and ``extra`` routes)."""
    policy = yaml.safe_load((REPO / "ext_proc" / "default_policy.yaml").read_text())
    batch = dict(policy["profiles"]["default"])
    batch["shed"] = {"sheddable": "medium", "standard": "high"}
    policy["profiles"]["batch"] = batch
    policy["routes"].update(extra)
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(policy))
    return path


@pytest.fixture
def profiled(tmp_path: Path) -> MeshSpec:
    """Routes with the policy's binding, with ``batch``, and naming ``default`` itself."""
    _policy_with(tmp_path)
    doc = {
        "policy": "policy.yaml",
        "gateway": {"hosts": ["llm.example.com"]},
        "routes": [
            {"name": "chat", "path": "/v1/chat/completions"},
            {"name": "completions", "path": "/v1/completions", "profile": "batch"},
            {"name": "messages", "path": "/v1/messages", "profile": "default"},
            {"name": "chat_batch", "path": "/v1/chat/completions/batch", "profile": "batch"},
        ],
    }
    return parse_spec(doc, tmp_path)


def _bootstrap(spec: MeshSpec) -> dict[str, Any]:
    return eg_xds.xds_like_bootstrap(
        gateway.objects(spec), "127.0.0.1:50051", "127.0.0.1:8000", 10080, 19901
    )


def _hcm(bootstrap: dict[str, Any]) -> dict[str, Any]:
    (listener,) = bootstrap["static_resources"]["listeners"]
    (hcm,) = listener["default_filter_chain"]["filters"]
    config: dict[str, Any] = hcm["typed_config"]
    return config


def _xds_routes(bootstrap: dict[str, Any]) -> list[dict[str, Any]]:
    (vhost,) = _hcm(bootstrap)["route_config"]["virtual_hosts"]
    routes: list[dict[str, Any]] = vhost["routes"]
    return routes


def _judged_rules(spec: MeshSpec) -> list[tuple[str, int, dict[str, Any]]]:
    """(HTTPRoute, rule index, rule) of every judged route, in the objects' order."""
    return [
        (d["metadata"]["name"], i, rule)
        for d in gateway.objects(spec)
        if d["kind"] == "HTTPRoute" and d["metadata"]["name"] != gateway_names.CLOSED
        for i, rule in enumerate(d["spec"]["rules"])
    ]


# --- the objects ------------------------------------------------------------------------


def test_two_calls_give_the_same_objects_and_the_same_bytes(profiled: MeshSpec) -> None:
    for spec in (SPEC, profiled):
        assert gateway.objects(spec) == gateway.objects(spec)
        assert to_yaml(gateway.objects(spec), gateway.HEADER) == to_yaml(
            gateway.objects(spec), gateway.HEADER
        )
    assert "&id" not in to_yaml(gateway.objects(SPEC))  # no YAML aliases: objects not shared


def test_the_judged_paths_in_spec_order_one_exact_rule_each_to_the_backend() -> None:
    rules = _judged_rules(SPEC)
    assert [r["matches"] for _, _, r in rules] == [
        [{"path": {"type": "Exact", "value": route.path}}] for route in SPEC.routes
    ]
    for _, _, rule in rules:
        assert rule["backendRefs"] == [{"name": "vllm", "port": 8000}]
        assert rule["timeouts"] == {"request": "600s"}


def test_the_routes_attach_only_to_their_own_gateways_listener() -> None:
    docs = _by_name(SPEC)
    gw = docs["Gateway", SPEC.gateway.name]
    (listener,) = gw["spec"]["listeners"]
    assert (listener["name"], listener["port"]) == (gateway_names.LISTENER, SPEC.gateway.port)
    assert listener["allowedRoutes"] == {"namespaces": {"from": "Same"}}
    for (kind, _), doc in docs.items():
        if kind == "HTTPRoute":
            assert doc["metadata"]["namespace"] == SPEC.gateway.namespace
            assert doc["spec"]["parentRefs"] == [
                {"name": SPEC.gateway.name, "sectionName": gateway_names.LISTENER}
            ]


def test_read_only_paths_pass_for_get_and_head_only() -> None:
    reads, _ = _by_name(SPEC)["HTTPRoute", gateway_names.CLOSED]["spec"]["rules"]
    assert [(m["path"]["value"], m["method"]) for m in reads["matches"]] == [
        (path, method) for path in SPEC.read_only for method in ("GET", "HEAD")
    ]
    assert {m["path"]["type"] for m in reads["matches"]} == {"Exact"}
    assert "filters" not in reads


def test_everything_else_is_a_404_in_the_openai_error_format() -> None:
    docs = _by_name(SPEC)
    _, rest = docs["HTTPRoute", gateway_names.CLOSED]["spec"]["rules"]
    assert rest["matches"] == [{"path": {"type": "PathPrefix", "value": "/"}}]
    assert "backendRefs" not in rest
    (ref,) = rest["filters"]
    assert ref["type"] == "ExtensionRef"
    response = docs["HTTPRouteFilter", ref["extensionRef"]["name"]]["spec"]["directResponse"]
    assert (response["statusCode"], response["contentType"]) == (404, "application/json")
    body = json.loads(response["body"]["inline"])
    assert body == {
        "error": {
            "message": gateway.CLOSED_MESSAGE,
            "type": "invalid_request_error",
            "param": None,
            "code": "unknown_endpoint",
        }
    }
    assert "%" not in response["body"]["inline"]  # EG's body is a format string


def test_one_extension_policy_per_distinct_profile(profiled: MeshSpec) -> None:
    docs = gateway.objects(profiled)
    policies = [d for d in docs if d["kind"] == "EnvoyExtensionPolicy"]
    assert [p["metadata"]["name"] for p in policies] == ["ice", "ice-batch", "ice-default"]
    routes = {d["metadata"]["name"]: d for d in docs if d["kind"] == "HTTPRoute"}
    by_policy = {
        p["metadata"]["name"]: [
            rule["matches"][0]["path"]["value"]
            for t in p["spec"]["targetRefs"]
            for rule in routes[t["name"]]["spec"]["rules"]
        ]
        for p in policies
    }
    assert by_policy == {
        "ice": ["/v1/chat/completions"],
        "ice-batch": ["/v1/completions", "/v1/chat/completions/batch"],
        "ice-default": ["/v1/messages"],
    }
    # The closed route never meets ICE.
    targets = {t["name"] for p in policies for t in p["spec"]["targetRefs"]}
    assert gateway_names.CLOSED not in targets


def test_one_profile_gives_one_policy_on_the_judged_route_only() -> None:
    docs = _by_name(SPEC)
    policies = [d for (k, _), d in docs.items() if k == "EnvoyExtensionPolicy"]
    assert [p["metadata"]["name"] for p in policies] == ["ice"]
    assert policies[0]["spec"]["targetRefs"] == [
        {"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "name": gateway_names.JUDGED}
    ]


def test_more_judged_routes_than_an_httproute_holds_are_split(tmp_path: Path) -> None:
    names = [f"r{i}" for i in range(gateway_names.MAX_RULES + 1)]
    _policy_with(tmp_path, **{n: {"profile": "default", "pool": "default"} for n in names})
    doc = {
        "policy": "policy.yaml",
        "gateway": {"hosts": ["llm.example.com"]},
        "routes": [{"name": n, "path": f"/{n}"} for n in names],
    }
    spec = parse_spec(doc, tmp_path)
    rules = _judged_rules(spec)
    assert [name for name, _, _ in rules] == [gateway_names.JUDGED] * gateway_names.MAX_RULES + [
        f"{gateway_names.JUDGED}-2"
    ]
    (policy,) = [d for d in gateway.objects(spec) if d["kind"] == "EnvoyExtensionPolicy"]
    assert [t["name"] for t in policy["spec"]["targetRefs"]] == [
        gateway_names.JUDGED,
        f"{gateway_names.JUDGED}-2",
    ]
    assert _xds_patched_routes(spec) == {f"/{n}": (n, None) for n in names}


def test_a_backend_in_another_namespace_gets_a_reference_grant() -> None:
    assert not [d for d in gateway.objects(SPEC) if d["kind"] == "ReferenceGrant"]
    doc = {"routes": [{"name": "chat", "path": "/v1/chat/completions"}]}
    spec = parse_spec(
        {
            **doc,
            "backend": {"namespace": "models"},
            "gateway": {"namespace": "gw", "hosts": ["llm.example.com"]},
        }
    )
    (grant,) = [d for d in gateway.objects(spec) if d["kind"] == "ReferenceGrant"]
    assert grant["metadata"]["namespace"] == "models"
    assert grant["spec"]["from"] == [
        {"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "namespace": "gw"}
    ]
    assert grant["spec"]["to"] == [{"group": "", "kind": "Service", "name": "vllm"}]
    ((_, _, rule),) = _judged_rules(spec)
    assert rule["backendRefs"] == [{"name": "vllm", "namespace": "models", "port": 8000}]


def test_every_echoed_header_is_set_on_the_judged_routes_responses(profiled: MeshSpec) -> None:
    for spec in (SPEC, profiled):
        for _, _, rule in _judged_rules(spec):
            (modifier,) = rule["filters"]
            assert modifier["type"] == "ResponseHeaderModifier"
            assert set(modifier["responseHeaderModifier"]) == {"set"}  # overwrite, as pieces
            assert modifier["responseHeaderModifier"]["set"] == [
                {"name": h, "value": f"%DYNAMIC_METADATA(ice:{h})%"} for h in pieces.ECHOED_HEADERS
            ]
    # and in the bootstrap: exactly pieces' headers, on the judged routes only
    verdict = [as_dict(h) for h in pieces.verdict_response_headers()]
    for route in _xds_routes(_bootstrap(SPEC)):
        judged = gateway_names.JUDGED + "/" in route["name"]
        assert (route.get("response_headers_to_add") == verdict) == judged


def _xds_patched_routes(spec: MeshSpec) -> dict[str, tuple[str, str | None]]:
    """xDS route's path → (x-ice-route, x-ice-profile) ICE gets there, after the patch."""
    out = {}
    for route in _xds_routes(_bootstrap(spec)):
        for config in route.get("typed_per_filter_config", {}).values():
            assert config["@type"] == gateway_names.FILTER_CONFIG_TYPE
            inner = config["config"]
            assert inner["@type"].endswith("ExtProcPerRoute")
            meta = {m["key"]: m["value"] for m in inner["overrides"]["grpc_initial_metadata"]}
            out[route["match"]["path"]] = (meta["x-ice-route"], meta.get("x-ice-profile"))
    return out


def test_the_patch_policy_carries_every_judged_routes_name_and_profile(
    profiled: MeshSpec,
) -> None:
    for spec in (SPEC, profiled):
        (epp,) = [d for d in gateway.objects(spec) if d["kind"] == "EnvoyPatchPolicy"]
        assert epp["spec"]["type"] == "JSONPatch"
        assert epp["spec"]["targetRef"] == {
            "group": "gateway.networking.k8s.io",
            "kind": "Gateway",
            "name": spec.gateway.name,
        }
        values = [
            p["operation"]["value"]
            for p in epp["spec"]["jsonPatches"]
            if p["type"] != gateway_names.CLUSTER_TYPE
            and not p["operation"]["path"].endswith("/retry_policy")
        ]
        expected = [as_dict(_pack(r.name, r.profile)) for r in spec.routes]
        assert sorted(map(json.dumps, (v for v in values if isinstance(v, dict)))) == sorted(
            map(json.dumps, expected)
        )
        for p in epp["spec"]["jsonPatches"]:
            op = p["operation"]
            if p["type"] == gateway_names.CLUSTER_TYPE:  # a whole field of ICE's cluster
                assert "jsonPath" not in op and op["path"] in (
                    "/health_checks",
                    "/outlier_detection",
                )
            else:
                assert "jsonPath" in op  # by name, never by array index
        assert _xds_patched_routes(spec) == {r.path: (r.name, r.profile) for r in spec.routes}


def _pack(route: str, profile: str | None) -> PbAny:
    return PbAny.pack(pieces.judged_route_config(route, profile))


def test_spoofed_headers_are_removed_before_ext_proc() -> None:
    docs = _by_name(SPEC)
    early = docs["ClientTrafficPolicy", "ice"]["spec"]["headers"]["earlyRequestHeaders"]
    assert set(early["remove"]) == set(pieces.SPOOF_NAMES)
    assert {(m["type"], m["value"]) for m in early["removeOnMatch"]} == {
        ("Prefix", p) for p in pieces.SPOOF_PREFIXES
    }
    assert docs["ClientTrafficPolicy", "ice"]["spec"]["targetRefs"] == [
        {
            "group": "gateway.networking.k8s.io",
            "kind": "Gateway",
            "name": SPEC.gateway.name,
            "sectionName": gateway_names.LISTENER,
        }
    ]
    # In the HCM: an early header mutation (before routing and every HTTP filter) doing what
    # pieces' header_mutation filter does; no route strips request headers (after ext_proc).
    hcm = _hcm(_bootstrap(SPEC))
    (mutation,) = hcm["early_header_mutation_extensions"]
    assert mutation["name"] == "envoy.http.early_header_mutation.header_mutation"
    strip = as_dict(pieces.strip_spoofed_headers())["typed_config"]["mutations"]
    key = json.dumps
    assert sorted(map(key, mutation["typed_config"]["mutations"])) == sorted(
        map(key, strip["request_mutations"])
    )
    for route in _xds_routes(_bootstrap(SPEC)):
        assert "request_headers_to_remove" not in route


# --- the bootstrap EG would build -------------------------------------------------------


def test_the_bootstrap_has_egs_names_and_order() -> None:
    bootstrap = _bootstrap(SPEC)
    (listener,) = bootstrap["static_resources"]["listeners"]
    assert listener["name"] == gateway_names.listener_name(SPEC) == "llm/llm-gateway/http"
    hcm = _hcm(bootstrap)
    assert hcm["route_config"]["name"] == gateway_names.route_config_name(SPEC)
    names = [f["name"] for f in hcm["http_filters"]]
    flt = gateway_names.ext_proc_filter_name("llm", "ice")
    assert names == [flt, pieces.ROUTER]
    assert hcm["http_filters"][0]["disabled"] is True
    routes = _xds_routes(bootstrap)
    assert routes[-1]["match"] == {"prefix": "/"}  # the 404 last: Exact beats PathPrefix
    assert routes[-1]["direct_response"]["status"] == 404
    enabled = {
        r["match"].get("path") for r in routes if flt in r.get("typed_per_filter_config", {})
    }
    assert enabled == {r.path for r in SPEC.routes}  # ICE on the judged routes only
    assert all(r["name"].endswith("/*") and r["name"].startswith("httproute/llm/") for r in routes)
    clusters = [c["name"] for c in bootstrap["static_resources"]["clusters"]]
    assert clusters == eg_xds.ice_clusters(gateway.objects(SPEC)) + eg_xds.backend_clusters(
        gateway.objects(SPEC)
    )


def test_the_ext_proc_filter_is_pieces_config_as_eg_builds_it() -> None:
    (ext_proc, _) = _hcm(_bootstrap(SPEC))["http_filters"]
    config = dict(ext_proc["typed_config"])
    grpc = config.pop("grpc_service")
    assert grpc["envoy_grpc"]["cluster_name"] == "envoyextensionpolicy/llm/ice/extproc/0"
    expected = as_dict(pieces.ext_proc_filter("x"))["typed_config"]
    del expected["grpc_service"]
    # max_message_timeout and response_attributes by the patch, the rest by EG's API
    assert config == expected


def test_the_ice_cluster_settings_are_pieces(profiled: MeshSpec) -> None:
    (policy,) = [d for d in gateway.objects(SPEC) if d["kind"] == "EnvoyExtensionPolicy"]
    settings = policy["spec"]["extProc"][0]["backendSettings"]
    cluster = as_dict(pieces.ice_cluster("x", ["127.0.0.1:1"]))
    (check,) = cluster["health_checks"]
    assert settings["timeout"]["tcp"]["connectTimeout"] == cluster["connect_timeout"]
    assert settings["http2"]["maxConcurrentStreams"] == pieces.ICE_STREAMS_PER_CONNECTION == 1024
    active = settings["healthCheck"]["active"]
    assert (active["type"], active["timeout"], active["interval"]) == ("GRPC", "1s", "500ms")
    assert (check["timeout"], check["interval"]) == ("1s", "0.500s")  # the same, in Go's words


def test_the_bootstrap_normalises_and_buffers_as_the_local_bootstrap() -> None:
    (local_listener,) = local_bootstrap(SPEC)["static_resources"]["listeners"]
    local_hcm = local_listener["filter_chains"][0]["filters"][0]["typed_config"]
    (listener,) = _bootstrap(SPEC)["static_resources"]["listeners"]
    hcm = _hcm(_bootstrap(SPEC))
    # both buffer bodies up to 8 MiB: Envoy Gateway's listener whole, the local bootstrap on
    # its virtual host, reading 256 KiB per event from a client (docs/flood.md)
    assert listener["per_connection_buffer_limit_bytes"] == pieces.MAX_BODY_BYTES
    (vhost,) = local_hcm["route_config"]["virtual_hosts"]
    assert vhost["request_body_buffer_limit"] == pieces.MAX_BODY_BYTES
    assert local_listener["per_connection_buffer_limit_bytes"] == pieces.LISTENER_READ_BYTES
    for key in ("normalize_path", "merge_slashes", "path_with_escaped_slashes_action"):
        assert hcm[key] == local_hcm[key], key


def test_every_patch_finds_exactly_one_place(profiled: MeshSpec) -> None:
    for spec in (SPEC, profiled):
        docs = gateway.objects(spec)
        bootstrap = eg_xds.xds_like_bootstrap(docs, "127.0.0.1:1", "127.0.0.1:2", 1, 2)
        hcm = _hcm(bootstrap)
        targets = {gateway_names.ROUTE_CONFIG_TYPE: hcm["route_config"]}
        (epp,) = [d for d in docs if d["kind"] == "EnvoyPatchPolicy"]
        for patch in epp["spec"]["jsonPatches"]:
            if patch["type"] == gateway_names.CLUSTER_TYPE:  # on EG's ICE cluster, by name
                clusters = [
                    c["name"] for c in bootstrap["static_resources"]["clusters"]
                ]  # fmt: skip
                assert clusters.count(patch["name"]) == 1, patch
                continue
            target = targets.get(patch["type"], bootstrap["static_resources"]["listeners"][0])
            assert len(eg_xds.resolve_json_path(target, patch["operation"]["jsonPath"])) == 1, patch


@pytest.mark.parametrize("which", ["mesh.yaml", "profiled"])
def test_the_bootstrap_passes_envoy_validate(
    which: str, profiled: MeshSpec, tmp_path: Path
) -> None:
    spec = SPEC if which == "mesh.yaml" else profiled
    path = tmp_path / "envoy-gateway-bootstrap.yaml"
    path.write_text(to_yaml([_bootstrap(spec)]))
    done = subprocess.run(
        [envoy_binary(), "--mode", "validate", "-c", str(path), "-l", "error"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_eg_carries_ices_fast_checks_outlier_detection_and_stream_retry(
    profiled: MeshSpec,
) -> None:
    """What EG's ClusterSettings cannot say is patched: the checks without traffic, outlier
    detection on local-origin failures, the ext_proc stream's retry on another replica."""
    docs = gateway.objects(profiled)
    settings = [
        p["spec"]["extProc"][0]["backendSettings"]["healthCheck"]["active"]
        for p in docs
        if p["kind"] == "EnvoyExtensionPolicy"
    ]
    assert {(s["interval"], s["timeout"]) for s in settings} == {("500ms", "1s")}
    bootstrap = eg_xds.xds_like_bootstrap(docs, "127.0.0.1:1", "127.0.0.1:2", 1, 2)
    local = as_dict(pieces.ice_cluster("ice", ["127.0.0.1:1"]))
    ice = [
        c
        for c in bootstrap["static_resources"]["clusters"]
        if c["name"] in eg_xds.ice_clusters(docs)
    ]
    assert ice
    for cluster in ice:
        assert cluster["health_checks"] == local["health_checks"]
        assert cluster["outlier_detection"] == local["outlier_detection"]
    retry = as_dict(pieces.ext_proc_config("ice"))["grpc_service"]["retry_policy"]
    for f in _hcm(bootstrap)["http_filters"]:
        if f["name"].startswith(pieces.EXT_PROC):
            assert f["typed_config"]["grpc_service"]["retry_policy"] == retry, f["name"]
