"""``ice doctor`` sees the mesh's own traps in a config dump (ext_proc/tools/doctor/
envoy_mesh.py): ICE's cluster left out of the proxy (a Sidecar's egress scope, gateway
cluster filtering), the listener's buffer limit below the largest body a route accepts, an
EnvoyFilter patch that matched nothing (filters, routes), and a proxy older than the minimum
Istio / Envoy. Each dump is the Istio stand-in's (tests/e2e/meshes.py) with that one trap.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
from e2e import meshes

from ext_proc.policy.load import default_policy_text, parse_policy
from ext_proc.tools.doctor.dump import from_config_dump
from ext_proc.tools.doctor.envoy import view_checks
from ext_proc.tools.doctor.envoy_mesh import node_of
from ext_proc.tools.doctor.expect import Expected, expected
from ext_proc.tools.doctor.model import Check

NODE = {
    "user_agent_build_version": {"version": {"major_number": 1, "minor_number": 40}},
    "metadata": {"ISTIO_VERSION": "1.31.0"},
}


def _expected() -> Expected:
    text = default_policy_text()
    return expected(parse_policy(text), "test policy", text.encode(), None)


def _checks(dump: dict[str, Any]) -> list[Check]:
    return view_checks(from_config_dump(dump), _expected(), None, node_of(dump))


def _named(checks: list[Check], name: str) -> list[Check]:
    return [c for c in checks if c.name == name]


def _dump(bootstrap: dict[str, Any], node: dict[str, Any] | None = None) -> dict[str, Any]:
    return meshes.config_dump(bootstrap, NODE if node is None else node)


@pytest.mark.parametrize(
    "build", [meshes.istio_gateway, meshes.istio_sidecar], ids=["gateway", "sidecar"]
)
def test_the_patched_proxies_have_every_patch_in_force(build: Callable[[], Any]) -> None:
    checks = _checks(_dump(build()))
    assert [c.status for c in _named(checks, "envoy.istio_patches")] == ["PASS"]
    assert [c.status for c in _named(checks, "envoy.version")] == ["PASS"]
    assert [c.status for c in _named(checks, "envoy.istio_version")] == ["PASS"]


@pytest.mark.parametrize(
    "build", [meshes.istio_gateway, meshes.istio_sidecar], ids=["gateway", "sidecar"]
)
def test_ices_cluster_left_out_of_the_proxy_is_a_fail_naming_the_sidecar_scope(
    build: Callable[[], Any],
) -> None:
    bootstrap = build()
    res = bootstrap["static_resources"]
    res["clusters"] = [c for c in res["clusters"] if c["name"] != meshes.ISTIO_ICE]
    (check,) = _named(_checks(_dump(bootstrap)), "envoy.istio_patches")
    assert check.status == "FAIL"
    assert "Sidecar" in check.detail and "PILOT_FILTER_GATEWAY_CLUSTER_CONFIG" in check.detail


@pytest.mark.parametrize(
    "build", [meshes.istio_gateway, meshes.istio_sidecar], ids=["gateway", "sidecar"]
)
def test_a_listener_left_at_envoys_1_mib_is_a_fail(build: Callable[..., Any]) -> None:
    def no_listener_patch(patches: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [p for p in patches if p["applyTo"] != "LISTENER"]

    checks = _checks(_dump(build(edit=no_listener_patch)))
    (check,) = _named(checks, "envoy.istio_patches")
    assert check.status == "FAIL" and "the listener patch" in check.detail
    assert {c.status for c in _named(checks, "envoy.buffer_limit")} == {"FAIL"}


def test_filter_patches_by_the_services_port_match_nothing_and_fail() -> None:
    """The Service's port (80) where istiod keys the inbound chain by the container's
    (8000): no patch below the listener applies, the backend is reached unjudged."""
    spec = dataclasses.replace(
        meshes.SPEC, backend=dataclasses.replace(meshes.SPEC.backend, port=80, target_port=8000)
    )

    def by_service_port(patches: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for p in patches:
            for key in ("listener", "routeConfiguration"):
                if "portNumber" in p["match"].get(key, {}):
                    p["match"][key]["portNumber"] = 80
        return patches

    checks = _checks(_dump(meshes.istio_sidecar(spec, edit=by_service_port)))
    (check,) = _named(checks, "envoy.istio_patches")
    assert check.status == "FAIL" and "the filter patches" in check.detail
    assert "container's" in check.detail


def test_route_patches_that_matched_nothing_on_the_gateway_fail() -> None:
    def no_route_patches(patches: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [p for p in patches if p["applyTo"] != "HTTP_ROUTE"]

    checks = _checks(_dump(meshes.istio_gateway(edit=no_route_patches)))
    (check,) = _named(checks, "envoy.istio_patches")
    assert check.status == "FAIL" and "the route patches" in check.detail


@pytest.mark.parametrize(
    ("node", "name"),
    [
        (
            {"user_agent_build_version": {"version": {"major_number": 1, "minor_number": 36}}},
            "envoy.version",
        ),
        ({"metadata": {"ISTIO_VERSION": "1.28.3"}}, "envoy.istio_version"),
    ],
    ids=["envoy-1.36", "istio-1.28"],
)
def test_a_proxy_older_than_the_minimum_is_a_fail(node: dict[str, Any], name: str) -> None:
    (check,) = _named(_checks(_dump(meshes.istio_gateway(), node)), name)
    assert check.status == "FAIL"
    assert "1.29" in check.fix or "1.29" in check.detail


def test_a_proxy_that_is_not_istios_gets_no_istio_check() -> None:
    bootstrap = meshes.envoy_gateway()
    checks = _checks(meshes.config_dump(bootstrap, {}))
    assert _named(checks, "envoy.istio_patches") == []
    assert _named(checks, "envoy.version") == []
