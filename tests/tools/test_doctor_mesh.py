"""``ice doctor`` sees the mesh's own traps in a config dump (ext_proc/tools/doctor/
envoy_mesh.py): ICE's cluster left out of the proxy (a Sidecar's egress scope, gateway
cluster filtering), the listener's buffer limit below the largest body a route accepts, an
EnvoyFilter patch that matched nothing (filters, routes), a proxy older than the minimum
Istio / Envoy, and a mesh spec whose container port is not the pods' (a Service port apart
from the container's with ``target_port`` unset), seen from the sidecar and the gateway.
Each dump is the Istio stand-in's (tests/e2e/meshes.py) with that one trap.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from ext_proc.policy.load import default_policy_text, parse_policy
from ext_proc.tools.doctor.checks import Check
from ext_proc.tools.doctor.dump import from_config_dump
from ext_proc.tools.doctor.envoy import view_checks
from ext_proc.tools.doctor.envoy_mesh import (
    PORTS,
    endpoint_port_checks,
    endpoint_ports,
    node_of,
)
from ext_proc.tools.doctor.expect import Expected, expected
from ext_proc.tools.envoygen.spec import Backend, MeshSpec
from tests.e2e import meshes

NODE = {
    "user_agent_build_version": {"version": {"major_number": 1, "minor_number": 40}},
    "metadata": {"ISTIO_VERSION": "1.31.0"},
}


def _expected() -> Expected:
    text = default_policy_text()
    return expected(parse_policy(text), "test policy", text.encode(), None)


def _checks(dump: dict[str, Any]) -> list[Check]:
    return view_checks(from_config_dump(dump), _expected(), None, node_of(dump))


def _checks_with(bootstrap: dict[str, Any], ex: Expected) -> list[Check]:
    dump = _dump(bootstrap)
    return view_checks(from_config_dump(dump), ex, None, node_of(dump))


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


# --- envoy.istio_ports: the spec's container port against the pods' -------------------------

SERVICE_80_PODS_8000 = dataclasses.replace(meshes.SPEC.backend, port=80, target_port=8000)


def _with_backend(backend: Backend) -> tuple[MeshSpec, Expected]:
    spec = dataclasses.replace(meshes.SPEC, backend=backend)
    return spec, dataclasses.replace(_expected(), backend=backend)


def _port_checks(dump: dict[str, Any], ex: Expected) -> list[Check]:
    return _named(view_checks(from_config_dump(dump), ex, None, node_of(dump)), PORTS)


def test_a_service_port_apart_from_the_containers_without_target_port_fails_on_the_sidecar() -> (
    None
):
    """The issue's deployment: Service port 80 → pods' 8000, the spec without target_port.
    istiod builds the sidecar from the cluster (chain and route table by 8000); the patches
    come from the spec (by 80): only the listener patch applies. The doctor names the port."""
    spec, ex = _with_backend(dataclasses.replace(meshes.SPEC.backend, port=80, target_port=None))
    bootstrap = meshes.istio_sidecar(spec, actual=SERVICE_80_PODS_8000)
    (check,) = _port_checks(_dump(bootstrap), ex)
    assert check.status == "FAIL", check
    assert "port 80 reaches the pods on 8000" in check.detail
    assert "no target_port" in check.detail
    assert "target_port: 8000" in check.fix
    (patches,) = _named(_checks_with(bootstrap, ex), "envoy.istio_patches")
    assert patches.status == "FAIL"  # and the generic check still says what is not in force


def test_a_wrong_target_port_fails_on_the_sidecar_too() -> None:
    spec, ex = _with_backend(dataclasses.replace(meshes.SPEC.backend, port=80, target_port=8001))
    (check,) = _port_checks(_dump(meshes.istio_sidecar(spec, actual=SERVICE_80_PODS_8000)), ex)
    assert check.status == "FAIL" and "target_port 8001" in check.detail, check
    assert "target_port: 8000" in check.fix


def test_a_spec_whose_service_port_the_sidecar_never_saw_fails_naming_the_pods_ports() -> None:
    """Neither the spec's container port nor its Service port in the sidecar (another Service,
    or istiod naming its virtual host otherwise): still a FAIL, with the ports it has."""
    spec, ex = _with_backend(dataclasses.replace(meshes.SPEC.backend, port=81, target_port=None))
    (check,) = _port_checks(_dump(meshes.istio_sidecar(spec, actual=SERVICE_80_PODS_8000)), ex)
    assert check.status == "FAIL", check
    assert "no inbound chain for container port 81" in check.detail
    assert "the pods' ports here: 8000" in check.detail


@pytest.mark.parametrize(
    "backend",
    [
        dataclasses.replace(meshes.SPEC.backend, port=8000, target_port=None),
        SERVICE_80_PODS_8000,
    ],
    ids=["same-port-no-target-port", "target-port-set"],
)
def test_no_false_alarm_when_the_spec_has_the_pods_port(backend: Backend) -> None:
    spec, ex = _with_backend(backend)
    (check,) = _port_checks(_dump(meshes.istio_sidecar(spec)), ex)
    assert check.status == "PASS", check
    gateway = _with_endpoints(meshes.istio_gateway(spec), backend, backend.container_port)
    (check,) = _port_checks(_dump(gateway), ex)
    assert check.status == "PASS", check


def _with_endpoints(bootstrap: dict[str, Any], backend: Backend, pods_port: int) -> dict[str, Any]:
    """The gateway's cluster for the backend's Service port with its pods' addresses (EDS
    gives the pods' IPs at the container's port)."""
    name = f"outbound|{backend.port}||{backend.host}"
    for cluster in bootstrap["static_resources"]["clusters"]:
        if cluster["name"] == name:
            cluster["load_assignment"]["endpoints"] = [
                {
                    "lb_endpoints": [
                        {
                            "endpoint": {
                                "address": {
                                    "socket_address": {"address": ip, "port_value": pods_port}
                                }
                            }
                        }
                        for ip in ("10.0.0.5", "10.0.0.6")
                    ]
                }
            ]
    return bootstrap


def test_the_gateway_sees_the_mismatch_in_its_endpoints() -> None:
    """``ice doctor`` pointed at the gateway (as docs/deploy-istio.md's step 4 does), where
    every ICE patch is in force: the backend cluster's endpoints show the pods' port."""
    backend = dataclasses.replace(meshes.SPEC.backend, port=80, target_port=None)
    spec, ex = _with_backend(backend)
    gateway = _with_endpoints(meshes.istio_gateway(spec), backend, 8000)
    checks = _checks_with(gateway, ex)
    assert [c.status for c in _named(checks, "envoy.istio_patches")] == ["PASS"]
    (check,) = _named(checks, PORTS)
    assert check.status == "FAIL" and "target_port: 8000" in check.fix, check


def test_the_gateway_reads_the_pods_port_from_envoys_clusters_page() -> None:
    """Live (``--envoy-admin``): Istio's clusters are EDS, so the ports come from
    ``/clusters?format=json``."""
    backend = dataclasses.replace(meshes.SPEC.backend, port=80, target_port=None)
    spec, _ = _with_backend(backend)
    view = from_config_dump(_dump(meshes.istio_gateway(spec)))
    name = f"outbound|80||{backend.host}"
    statuses = {
        "cluster_statuses": [
            {
                "name": name,
                "host_statuses": [
                    {"address": {"socket_address": {"address": "10.0.0.5", "port_value": 8000}}}
                ],
            }
        ]
    }
    assert endpoint_port_checks(endpoint_ports(view, {}), backend) == []  # nothing seen
    (check,) = endpoint_port_checks(endpoint_ports(view, statuses), backend)
    assert check.status == "FAIL" and f"{name}'s endpoints are at :8000" in check.detail
    fixed = dataclasses.replace(backend, target_port=8000)
    (check,) = endpoint_port_checks(endpoint_ports(view, statuses), fixed)
    assert check.status == "PASS"
    assert endpoint_port_checks(endpoint_ports(view, statuses), None) == []  # no spec read
