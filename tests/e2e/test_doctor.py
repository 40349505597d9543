"""``ice doctor`` against real deployments: the local stack (real Envoy, ICE, the dev
backend) healthy, with ICE down, and with a backend whose metrics go stale; and the Envoy
checks on the mesh flavours' proxies (Istio's gateway and sidecar, Envoy Gateway), built as
those meshes build them from the generated manifests (``meshes``), and an Istio sidecar
whose patches a spec without ``target_port`` keyed by the Service's port (real Envoy).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from ext_proc.lab.stack import free_port
from ext_proc.policy.load import default_policy_text, load_policy
from ext_proc.tools.doctor import main
from ext_proc.tools.doctor.dump import from_bootstrap
from ext_proc.tools.doctor.envoy import view_checks
from ext_proc.tools.doctor.expect import expected
from ext_proc.tools.envoygen.spec import load_spec

from . import meshes
from .harness import E2E, LOW, LOW_SCORE, MAX_AGE_S, running_stack


def doctor(e2e: E2E, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, set[str]], str]:
    """Run ``ice doctor --json`` against ``e2e``: exit status, check name → statuses, output."""
    rc = main(
        [
            "--envoy-admin",
            f"http://127.0.0.1:{e2e.admin_port}",
            *(a for address in e2e.ice_addresses for a in ("--ice", address)),
            "--ice-metrics",
            f"http://127.0.0.1:{e2e.ice_metrics_port}/metrics",
            "--policy",
            str(e2e.workdir / "policy.yaml"),
            "--timeout",
            "3",
            "--json",
        ]
    )
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err
    by_name: dict[str, set[str]] = {}
    for check in json.loads(out.out):
        by_name.setdefault(check["name"], set()).add(check["status"])
    return rc, by_name, out.out


def test_doctor_passes_on_the_running_stack(stack: E2E, capsys: pytest.CaptureFixture[str]) -> None:
    rc, checks, out = doctor(stack, capsys)
    assert rc == 0, out
    assert not any("FAIL" in s for s in checks.values()), out
    envoy = {n: s for n, s in checks.items() if n.startswith("envoy.")}
    assert len(envoy) >= 17 and all(s == {"PASS"} for s in envoy.values()), out
    for name in ("ice.health", "ice.metrics", "ice.pool_freshness", "backend.metrics"):
        assert checks[name] == {"PASS"}, out
    assert checks["backend.kv_metrics"] == checks["backend.prefix_caching"] == {"PASS"}
    assert checks["ice.policy_in_force"] <= {"PASS", "MANUAL"}  # MANUAL: ICE does not say


def test_ice_down_fails_the_health_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with running_stack(tmp_path, start_ice=False) as e2e:
        rc, checks, out = doctor(e2e, capsys)
    assert rc == 1
    assert checks["ice.health"] == {"FAIL"}, out
    assert checks["envoy.ice_hosts"] == {"FAIL"}, out  # Envoy's own health checks agree
    assert checks["ice.metrics"] == {"FAIL"}, out
    assert checks["envoy.ext_proc"] == {"PASS"}  # the configuration itself is right
    assert checks["backend.metrics"] == {"PASS"}


def test_slow_backend_metrics_make_the_pool_stale(
    stack: E2E, capsys: pytest.CaptureFixture[str]
) -> None:
    stack.set_state(LOW, level="low", score=LOW_SCORE)  # (and the stack is reset afterwards)
    stack.backend("PUT", "/_dev/state", b'{"metrics_delay_s": 1.0}')  # > scrape_timeout_s 0.5
    stack.wait_pressure("unknown", timeout_s=MAX_AGE_S + 10)
    rc, checks, out = doctor(stack, capsys)
    assert checks["ice.pool_freshness"] <= {"WARN", "FAIL"}, out
    assert checks["backend.metrics"] == {"WARN"}, out  # answered, after scrape_timeout_s
    assert rc == (1 if any("FAIL" in s for s in checks.values()) else 0)


def test_garbage_backend_metrics_fail(stack: E2E, capsys: pytest.CaptureFixture[str]) -> None:
    stack.set_raw_metrics(b"\x00 this is {not prometheus text\n")
    stack.wait_pressure("unknown", timeout_s=MAX_AGE_S + 10)
    rc, checks, out = doctor(stack, capsys)
    assert rc == 1
    assert checks["backend.metrics"] == {"FAIL"}, out
    assert checks["ice.pool_freshness"] <= {"WARN", "FAIL"}, out


MESHES: dict[str, Callable[[], dict[str, Any]]] = {
    "istio-gateway": meshes.istio_gateway,
    "istio-sidecar": meshes.istio_sidecar,
    "envoy-gateway": meshes.envoy_gateway,
}


@pytest.mark.parametrize("flavour", list(MESHES))
def test_mesh_flavours_pass_the_envoy_checks(flavour: str) -> None:
    ex = expected(load_policy(None), "built-in", default_policy_text().encode(), None)
    checks = view_checks(from_bootstrap(MESHES[flavour]()), ex)
    bad = [c for c in checks if c.status == "FAIL"]
    assert bad == []
    judged = [c for c in checks if c.name == "envoy.judged_routes"]
    assert judged and all(c.status == "PASS" for c in judged)
    # Istio builds ICE's cluster without health checks; its shared gateway keeps the mesh's
    # path normalisation (ICE's exact routes send odd forms to the 404): the expected warnings.
    warned = {c.name for c in checks if c.status == "WARN"}
    shared = {"envoy.path_normalisation"} if flavour == "istio-gateway" else set()
    assert warned <= {"envoy.ice_health_checks", *shared}


def test_a_sidecar_keyed_by_the_service_port_passes_chats_unjudged_and_the_doctor_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Service port 80 → pods' 8000, ``envoy/mesh.yaml`` without ``target_port``: through
    real Envoy, a chat reaches the backend with no verdict and an operator path reaches it
    too (only the listener patch applied); ``ice doctor`` against that Envoy's admin names
    the Service's port, the pods' and the fix."""
    mesh = yaml.safe_load((meshes.REPO / "envoy" / "mesh.yaml").read_text())
    mesh["policy"] = str(meshes.REPO / "ext_proc" / "default_policy.yaml")
    mesh["backend"] = {**mesh["backend"], "port": 80}
    del mesh["backend"]["target_port"]
    (tmp_path / "mesh.yaml").write_text(yaml.safe_dump(mesh))
    spec = load_spec(tmp_path / "mesh.yaml")
    actual = dataclasses.replace(spec.backend, target_port=8000)
    envoy_port, backend_port = free_port(), free_port()
    bootstrap = meshes.istio_sidecar(
        spec, redirect_port=envoy_port, app_port=backend_port, actual=actual
    )
    (tmp_path / "sidecar.json").write_text(json.dumps(bootstrap))
    with running_stack(
        tmp_path,
        envoy_template=tmp_path / "sidecar.json",
        listener=meshes.SIDECAR_LISTENER,
        ice_cluster=meshes.ISTIO_ICE,
        backend_cluster="no-static-backend",
        envoy_port=envoy_port,
        backend_port=backend_port,
        start_ice=False,  # nothing would call it
    ) as e2e:
        body = {"model": "dev-model", "messages": [{"role": "user", "content": "hi"}]}
        chat = e2e.post("/v1/chat/completions", body)
        assert chat.status == 200 and chat.header("x-ice-decision") is None, chat
        assert e2e.post("/v1/load_lora_adapter", {"lora_name": "x"}).status != 404
        rc = main(
            [
                "--envoy-admin",
                f"http://127.0.0.1:{e2e.admin_port}",
                "--ice",
                "127.0.0.1:1",
                "--mesh",
                str(tmp_path / "mesh.yaml"),
                "--json",
            ]
        )
    out = capsys.readouterr().out
    assert rc == 1
    (ports,) = [c for c in json.loads(out) if c["name"] == "envoy.istio_ports"]
    assert ports["status"] == "FAIL", ports
    assert "port 80 reaches the pods on 8000" in ports["detail"], ports
    assert "target_port: 8000" in ports["fix"], ports
