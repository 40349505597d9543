"""The Istio stand-in behaves as istiod does (tests/e2e/istio_apply.py, tests/e2e/meshes.py),
one test per EnvoyFilter rule it follows (each refuses or ignores what istiod would), and the
generated Istio objects meet those rules: the right context per patch kind, the listener's
buffer limit raised where istiod's listener is, ports from the container, ICE's cluster
settings by DestinationRule (kept with istiod's own), a shared gateway left alone.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest

from ext_proc.tools.doctor.routing import match_route, select_vhost
from ext_proc.tools.envoygen import istio, pieces
from ext_proc.tools.envoygen.spec import Backend, SpecError, parse_spec
from tests.e2e import istio_apply, meshes

SPEC = meshes.SPEC
OBJECTS = meshes.generated_istio()
GATEWAY_PATCHES: list[dict[str, Any]] = OBJECTS["EnvoyFilter", "ice-gateway"]["spec"][
    "configPatches"
]
SIDECAR_PATCHES: list[dict[str, Any]] = OBJECTS["EnvoyFilter", "ice-sidecar"]["spec"][
    "configPatches"
]
DR = OBJECTS["DestinationRule", "ice"]
PORT = SPEC.backend.container_port
HOSTS = {"gateway": {"hosts": ["llm.example.com"]}}
DOC: dict[str, Any] = {
    "routes": [{"name": "chat", "path": "/v1/chat/completions"}],
    "read_only": ["/v1/models"],
}


def _cluster_patch(context: str) -> dict[str, Any]:
    return {
        "applyTo": "CLUSTER",
        "match": {
            "context": context,
            "cluster": {"service": SPEC.ice.host, "portNumber": SPEC.ice.port},
        },
        "patch": {"operation": "MERGE", "value": {"connect_timeout": "1s"}},
    }


def _sidecar() -> dict[str, Any]:
    return meshes.istio_sidecar()


def _ice_cluster(bootstrap: dict[str, Any]) -> dict[str, Any]:
    return next(
        c for c in bootstrap["static_resources"]["clusters"] if c["name"] == meshes.ISTIO_ICE
    )


def _listener(bootstrap: dict[str, Any]) -> dict[str, Any]:
    listener: dict[str, Any] = bootstrap["static_resources"]["listeners"][0]
    return listener


# --- the applier: istiod's rules ---------------------------------------------------------------


def test_an_outbound_cluster_patch_under_sidecar_inbound_matches_nothing() -> None:
    bootstrap = _sidecar()
    before = copy.deepcopy(_ice_cluster(bootstrap))
    assert istio_apply.apply(bootstrap, [_cluster_patch("SIDECAR_INBOUND")], "sidecar") == [0]
    assert _ice_cluster(bootstrap) == before


def test_an_outbound_cluster_patch_applies_under_sidecar_outbound_gateway_and_any() -> None:
    for proxy, context in (("sidecar", "SIDECAR_OUTBOUND"), ("sidecar", "ANY")):
        bootstrap = _sidecar()
        assert istio_apply.apply(bootstrap, [_cluster_patch(context)], proxy) == []
    gateway = meshes.istio_gateway()
    assert istio_apply.apply(gateway, [_cluster_patch("GATEWAY")], "gateway") == []
    assert istio_apply.apply(gateway, [_cluster_patch("SIDECAR_OUTBOUND")], "gateway") == [0]


@pytest.mark.parametrize("context", ["SIDECAR_OUTBOUND", "GATEWAY"])
def test_a_listener_side_patch_in_another_context_matches_nothing(context: str) -> None:
    patches = copy.deepcopy(SIDECAR_PATCHES)
    for p in patches:
        p["match"]["context"] = context
    assert istio_apply.apply(_sidecar(), patches, "sidecar") == list(range(len(patches)))


def test_a_listener_patch_by_the_container_port_never_meets_virtual_inbound() -> None:
    patch = istio.buffer_limit_patch("SIDECAR_INBOUND", {"portNumber": PORT})
    bootstrap = _sidecar()
    listener = _listener(bootstrap)
    listener.pop("per_connection_buffer_limit_bytes")
    assert istio_apply.apply(bootstrap, [patch], "sidecar") == [0]
    assert "per_connection_buffer_limit_bytes" not in listener
    by_name = istio.buffer_limit_patch("SIDECAR_INBOUND", {"name": "virtualInbound"})
    assert istio_apply.apply(bootstrap, [by_name], "sidecar") == []


def test_filter_patches_on_virtual_inbound_match_the_chains_destination_port() -> None:
    hcm_patch = next(p for p in SIDECAR_PATCHES if p["applyTo"] == "NETWORK_FILTER")
    wrong = copy.deepcopy(hcm_patch)
    wrong["match"]["listener"]["portNumber"] = PORT + 1
    assert istio_apply.apply(_sidecar(), [wrong], "sidecar") == [0]
    # both chains for the port (mTLS-shaped and plaintext), never the blackhole's
    bootstrap = _sidecar()
    chains = _listener(bootstrap)["filter_chains"]
    hcms = [c["filters"][0]["typed_config"] for c in chains if c["name"].startswith("0.0.0.0_")]
    assert len(hcms) == 2 and all(h["merge_slashes"] is True for h in hcms)


def test_a_route_patch_matches_the_route_tables_port_and_vhost() -> None:
    route = next(p for p in SIDECAR_PATCHES if p["applyTo"] == "HTTP_ROUTE")
    for field, value in (("portNumber", SPEC.backend.port + 1), ("name", "inbound|1||")):
        wrong = copy.deepcopy(route)
        wrong["match"]["routeConfiguration"][field] = value
        assert istio_apply.apply(_sidecar(), [wrong], "sidecar") == [0], field
    wrong = copy.deepcopy(route)
    wrong["match"]["routeConfiguration"]["vhost"]["name"] = "inbound|http|1"
    assert istio_apply.apply(_sidecar(), [wrong], "sidecar") == [0]


def test_a_merge_replaces_a_map_entry_whole() -> None:
    cluster = _ice_cluster(meshes.istio_gateway())
    value = {
        "typed_extension_protocol_options": {
            meshes.H2_OPTIONS: {
                "@type": f"type.googleapis.com/{meshes.H2_OPTIONS}",
                "explicit_http_config": {"http2_protocol_options": {"max_concurrent_streams": 7}},
            }
        }
    }
    istio_apply.merge(cluster, value)
    options = cluster["typed_extension_protocol_options"][meshes.H2_OPTIONS]
    assert "common_http_protocol_options" not in options  # istiod's idle timeout: gone


def test_merge_appends_lists_and_clears_the_other_route_actions() -> None:
    route = {"name": "r", "route": {"cluster": "a"}, "response_headers_to_add": [{"k": 1}]}
    istio_apply.merge(
        route, {"direct_response": {"status": 404}, "response_headers_to_add": [{"k": 2}]}
    )
    assert "route" not in route and route["direct_response"] == {"status": 404}
    assert route["response_headers_to_add"] == [{"k": 1}, {"k": 2}]


def test_route_merges_apply_before_inserts_and_inserts_keep_patch_order() -> None:
    vhost: dict[str, Any] = {"name": "v", "routes": [{"name": "default", "match": {"prefix": "/"}}]}

    def insert(name: str) -> dict[str, Any]:
        return {
            "applyTo": "HTTP_ROUTE",
            "match": {"routeConfiguration": {"vhost": {"route": {"name": "default"}}}},
            "patch": {"operation": "INSERT_BEFORE", "value": {"name": name}},
        }

    merge = {
        "applyTo": "HTTP_ROUTE",
        "match": {"routeConfiguration": {"vhost": {"route": {"name": "default"}}}},
        "patch": {"operation": "MERGE", "value": {"direct_response": {"status": 404}}},
    }
    patches = [insert("a"), merge, insert("b")]
    applied = istio_apply._patch_routes(vhost, list(enumerate(patches)))
    assert applied == {0, 1, 2}
    assert [r["name"] for r in vhost["routes"]] == ["a", "b", "default"]
    assert vhost["routes"][2]["direct_response"] == {"status": 404}


def test_an_insert_before_a_missing_route_or_filter_matches_nothing() -> None:
    route = copy.deepcopy(
        next(
            p
            for p in SIDECAR_PATCHES
            if p["applyTo"] == "HTTP_ROUTE" and p["patch"]["operation"] == "INSERT_BEFORE"
        )
    )
    route["match"]["routeConfiguration"]["vhost"]["route"]["name"] = "absent"
    flt = copy.deepcopy(next(p for p in SIDECAR_PATCHES if p["applyTo"] == "HTTP_FILTER"))
    flt["match"]["listener"]["filterChain"]["filter"]["subFilter"]["name"] = "absent"
    assert istio_apply.apply(_sidecar(), [route, flt], "sidecar") == [0, 1]


# --- the generated objects meet them ----------------------------------------------------------


@pytest.mark.parametrize("patches", [GATEWAY_PATCHES, SIDECAR_PATCHES], ids=["gateway", "sidecar"])
def test_no_generated_patch_touches_ices_cluster(patches: list[dict[str, Any]]) -> None:
    """ICE's cluster settings come from the DestinationRule, which istiod merges into its
    own cluster: a CLUSTER MERGE would replace the protocol options entry whole."""
    assert [p for p in patches if p["applyTo"] == "CLUSTER"] == []


def test_the_destination_rule_gives_ices_cluster_the_local_settings_and_keeps_istiods() -> None:
    for bootstrap in (meshes.istio_gateway(), meshes.istio_sidecar()):
        cluster = _ice_cluster(bootstrap)
        assert cluster["connect_timeout"] == "1s"
        options = cluster["typed_extension_protocol_options"][meshes.H2_OPTIONS]
        assert options["explicit_http_config"]["http2_protocol_options"] == {
            "max_concurrent_streams": 1024
        }
        assert options["common_http_protocol_options"] == {"idle_timeout": "3600s"}
        assert cluster["outlier_detection"]["consecutive_local_origin_failure"] == 1


@pytest.mark.parametrize(
    ("build", "context"),
    [(meshes.istio_gateway, "GATEWAY"), (meshes.istio_sidecar, "SIDECAR_INBOUND")],
    ids=["gateway", "sidecar"],
)
def test_every_patch_has_its_context_and_the_listener_takes_8_mib(build: Any, context: str) -> None:
    name = "ice-gateway" if context == "GATEWAY" else "ice-sidecar"
    patches = OBJECTS["EnvoyFilter", name]["spec"]["configPatches"]
    assert {p["match"]["context"] for p in patches} == {context}
    listener = _listener(build())
    assert listener["per_connection_buffer_limit_bytes"] == pieces.MAX_BODY_BYTES


def test_the_gateway_changes_nothing_another_tenant_sees() -> None:
    bootstrap = meshes.istio_gateway()
    hcm = meshes.hcms_of(bootstrap)[0]
    assert hcm["normalize_path"] is True and "merge_slashes" not in hcm  # Istio's own
    assert hcm["path_with_escaped_slashes_action"] == "KEEP_UNCHANGED"
    for f in hcm["http_filters"]:
        if f["name"] in (pieces.HEADER_MUTATION, pieces.EXT_PROC, pieces.BUFFER):
            assert f.get("disabled") is True, f["name"]
    ice_log = hcm["access_log"][-1]
    assert "xds.route_name.startsWith('ice.')" in str(ice_log["filter"])
    for mapper in hcm["local_reply_config"]["mappers"]:
        assert "xds.route_name.startsWith('ice.')" in str(mapper["filter"])
    tenant, mine = hcm["route_config"]["virtual_hosts"]
    assert tenant == meshes.tenant_vhost(SPEC.gateway.port)
    for route in mine["routes"]:
        assert pieces.HEADER_MUTATION in route["typed_per_filter_config"], route["name"]


def test_a_service_port_apart_from_the_containers_patches_the_container_port() -> None:
    spec = dataclasses.replace(
        SPEC, backend=dataclasses.replace(SPEC.backend, port=80, target_port=8000)
    )
    objects = istio.objects(spec)
    (sidecar,) = [o for o in objects if o["metadata"]["name"] == "ice-sidecar"]
    ports = {
        p["match"].get("listener", {}).get("portNumber")
        or p["match"].get("routeConfiguration", {}).get("portNumber")
        for p in sidecar["spec"]["configPatches"]
    }
    assert ports == {8000, None}  # None: the LISTENER patch, by name (virtualInbound)
    bootstrap = meshes.istio_sidecar(spec)  # raises when a patch matches nothing
    hcm = meshes.hcms_of(bootstrap)[0]
    assert hcm["route_config"]["name"] == "inbound|8000||"
    (vhost,) = hcm["route_config"]["virtual_hosts"]
    assert vhost["name"] == "inbound|http|80"
    assert [r["name"] for r in vhost["routes"]][-1] == "default"
    assert len(vhost["routes"]) > 1
    # the Service's port, as before, would match nothing
    by_service = copy.deepcopy(sidecar["spec"]["configPatches"])
    for p in by_service:
        for key in ("listener", "routeConfiguration"):
            if "portNumber" in p["match"].get(key, {}):
                p["match"][key]["portNumber"] = 80
    missed = istio_apply.apply(meshes.istio_sidecar(spec), by_service, "sidecar")
    assert len(missed) == len(by_service) - 1


def test_the_spec_reads_the_container_port_and_defaults_it_to_the_service_port() -> None:
    assert Backend(port=8000).container_port == 8000
    assert Backend(port=80, target_port=8000).container_port == 8000
    assert SPEC.gateway.target_port == 8080
    doc = {"routes": [{"name": "chat", "path": "/v1/chat/completions"}], **HOSTS}
    spec = parse_spec({**doc, "backend": {"port": 80, "target_port": 8000}})
    assert (spec.backend.port, spec.backend.container_port) == (80, 8000)
    with pytest.raises(SpecError, match=r"^backend.target_port: 'x' is not a port"):
        parse_spec({**doc, "backend": {"target_port": "x"}})
    with pytest.raises(SpecError, match=r"^gateway.target_port: 0 is not a port"):
        parse_spec({**doc, "gateway": {"target_port": 0}})


def test_the_minimum_istio_is_in_the_header_and_the_docs() -> None:
    text = (meshes.REPO / "docs" / "deploy-istio.md").read_text()
    istio_min = ".".join(map(str, istio.MIN_ISTIO))
    envoy_min = ".".join(map(str, istio.MIN_ENVOY))
    assert f"Istio {istio_min}" in text and f"Envoy {envoy_min}" in text
    assert any(f"Istio {istio_min}" in line for line in istio.HEADER)


# --- the gateway's hosts: named, '*' only when the spec says so ------------------------------


def _hosts_of(objects: list[dict[str, Any]]) -> dict[str, list[str]]:
    """The Gateway's server hosts and the VirtualService's hosts."""
    (gw,) = [o for o in objects if o["kind"] == "Gateway"]
    (vs,) = [o for o in objects if o["kind"] == "VirtualService"]
    (server,) = gw["spec"]["servers"]
    return {"Gateway": server["hosts"], "VirtualService": vs["spec"]["hosts"]}


def test_the_generated_gateway_and_virtual_service_name_the_specs_hosts() -> None:
    """The shipped spec names its host: no '*' in the checked-in file (a '*' would share one
    virtual host with any other tenant's '*' VirtualService on the gateway)."""
    assert SPEC.gateway.hosts == ("llm.example.com",)
    shipped = list(OBJECTS.values())
    assert _hosts_of(shipped) == {
        "Gateway": ["llm.example.com"],
        "VirtualService": ["llm.example.com"],
    }
    two = parse_spec({**DOC, "gateway": {"hosts": ["llm.example.com", "*.llm.example.org"]}})
    assert set(map(tuple, _hosts_of(istio.objects(two)).values())) == {
        ("llm.example.com", "*.llm.example.org")
    }


def test_a_star_host_only_when_the_spec_asks_for_it() -> None:
    spec = parse_spec({**DOC, "gateway": {"hosts": ["*"]}})
    assert _hosts_of(istio.objects(spec)) == {"Gateway": ["*"], "VirtualService": ["*"]}


@pytest.mark.parametrize(
    ("gateway", "message"),
    [
        ({}, r"^gateway.hosts: missing: .*'\*'.*docs/deploy-istio.md"),
        ({"hosts": []}, r"^gateway.hosts: expected a non-empty list"),
        ({"hosts": "llm.example.com"}, r"^gateway.hosts: expected a non-empty list"),
        ({"hosts": ["LLM_Example"]}, r"^gateway.hosts\[0\]: 'LLM_Example' is not a host name"),
        ({"hosts": ["a.example.com", "*"]}, r"^gateway.hosts: '\*' takes every host"),
        ({"hosts": ["a.example.com", "a.example.com"]}, r"^gateway.hosts: a host appears twice"),
    ],
    ids=["absent", "empty", "not-a-list", "bad-name", "star-with-others", "twice"],
)
def test_a_spec_without_good_hosts_is_refused(gateway: dict[str, Any], message: str) -> None:
    doc = {"routes": DOC["routes"], "gateway": gateway}
    with pytest.raises(SpecError, match=message):
        parse_spec(doc)


def _route_for(bootstrap: dict[str, Any], host: str, method: str, path: str) -> str | None:
    """The name of the route Envoy picks on the gateway for ``method host path`` (None: its
    404 for no virtual host or no route)."""
    table = meshes.hcms_of(bootstrap)[0]["route_config"]
    vhost = select_vhost(table, host)
    route = match_route(vhost, method, path) if vhost is not None else None
    return None if route is None else str(route["name"])


@pytest.mark.parametrize("tenant_first", [True, False], ids=["tenant-first", "ice-first"])
def test_named_hosts_keep_a_star_tenant_and_ice_apart_in_either_creation_order(
    tenant_first: bool,
) -> None:
    """Another tenant's '*' VirtualService on the shared gateway, created before or after
    ICE's: the tenant keeps every host but ICE's (its GET / reaches it), ICE's host keeps
    ICE's routes and its 404 (an unknown path never reaches the tenant)."""
    bootstrap = meshes.istio_gateway(tenant_hosts=("*",), tenant_first=tenant_first)
    mine = meshes.GATEWAY_HOST
    assert _route_for(bootstrap, "shop.example.com", "GET", "/") == meshes.TENANT_ROUTE
    assert _route_for(bootstrap, "10.0.0.7", "GET", "/v1/nope") == meshes.TENANT_ROUTE
    assert _route_for(bootstrap, mine, "GET", "/v1/nope") == "ice.closed"
    assert _route_for(bootstrap, f"{mine}:80", "GET", "/") == "ice.closed"
    assert _route_for(bootstrap, mine, "POST", "/v1/chat/completions") == "ice.chat"


def test_a_star_spec_beside_a_star_tenant_shares_one_virtual_host_in_creation_order() -> None:
    """What docs/deploy-istio.md warns of, with ``hosts: ['*']``: istiod merges both '*'
    VirtualServices into one virtual host, routes in creation order. ICE first: the tenant's
    GET / gets ICE's 404. The tenant first (its catch-all route): ICE's paths go to the
    tenant, unjudged."""
    spec = parse_spec({**DOC, "gateway": {"hosts": ["*"]}})
    ice_first = meshes.istio_gateway(spec, tenant_hosts=("*",), tenant_first=False)
    assert _route_for(ice_first, "shop.example.com", "GET", "/") == "ice.closed"
    tenant_first = meshes.istio_gateway(spec, tenant_hosts=("*",), tenant_first=True)
    assert _route_for(tenant_first, "any", "GET", "/v1/nope") == meshes.TENANT_ROUTE
    assert _route_for(tenant_first, "any", "POST", "/v1/chat/completions") == meshes.TENANT_ROUTE
