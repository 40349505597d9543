"""``ice envoy-config``: the checked-in files are its output, the same input gives the same
bytes, a route's profile reaches every flavour, and a bad spec writes nothing."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from ext_proc.tools.envoygen.cli import main, render_all
from ext_proc.tools.envoygen.spec import SpecError, load_spec, parse_spec

REPO = Path(__file__).resolve().parents[2]
SPEC = REPO / "envoy" / "mesh.yaml"
POLICY = REPO / "ext_proc" / "default_policy.yaml"


def test_checked_in_files_are_the_generators_output() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ext_proc.cli", "envoy-config", "--check", "--spec", str(SPEC)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_the_same_spec_gives_the_same_bytes() -> None:
    assert render_all(SPEC) == render_all(SPEC)


def _spec_with(tmp_path: Path, **changes: object) -> Path:
    doc = yaml.safe_load(SPEC.read_text())
    doc["policy"] = str(POLICY)
    doc.update(changes)
    path = tmp_path / "mesh.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _two_profile_policy(tmp_path: Path) -> Path:
    policy = yaml.safe_load(POLICY.read_text())
    policy["profiles"]["batch"] = dict(policy["profiles"]["default"])
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(policy, sort_keys=False))
    return path


def test_a_routes_profile_reaches_every_flavour_as_grpc_metadata(tmp_path: Path) -> None:
    spec = _spec_with(
        tmp_path,
        policy=str(_two_profile_policy(tmp_path)),
        routes=[
            {"name": "chat", "path": "/v1/chat/completions"},
            {"name": "completions", "path": "/v1/completions", "profile": "batch"},
        ],
    )
    files = render_all(spec)
    profile = {"key": "x-ice-profile", "value": "batch"}
    for name in (
        "envoy.yaml",
        "bench.yaml",
        "k8s/overlays/istio/generated/istio.yaml",
        "k8s/overlays/envoy-gateway/generated/envoy-gateway.yaml",
    ):
        text = files[name]
        assert "value: batch" in text, name
        assert text.count("key: x-ice-profile") == text.count("value: batch"), name
    local = yaml.safe_load(files["envoy.yaml"])
    routes = local["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0][
        "typed_config"
    ]["route_config"]["virtual_hosts"][0]["routes"]
    by_name = {r["name"]: r for r in routes}
    meta = by_name["completions"]["typed_per_filter_config"]["envoy.filters.http.ext_proc"]
    assert meta["overrides"]["grpc_initial_metadata"][1] == profile
    chat = by_name["chat"]["typed_per_filter_config"]["envoy.filters.http.ext_proc"]
    assert len(chat["overrides"]["grpc_initial_metadata"]) == 1


def _local_routes(text: str) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The virtual host of a generated bootstrap, and its routes by name."""
    hcm = yaml.safe_load(text)["static_resources"]["listeners"][0]["filter_chains"][0]
    vhost = hcm["filters"][0]["typed_config"]["route_config"]["virtual_hosts"][0]
    return vhost, {r["name"]: r for r in vhost["routes"]}


PREVIOUS_HOSTS = [
    {
        "name": "envoy.retry_host_predicates.previous_hosts",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3"
            ".PreviousHostsPredicate"
        },
    }
]


def test_a_route_whose_pool_has_several_endpoints_retries_a_503_on_another(
    tmp_path: Path,
) -> None:
    policy = yaml.safe_load(POLICY.read_text())
    policy["pools"]["pair"] = {
        "metrics_urls": ["http://10.0.0.1:8000/metrics", "http://10.0.0.2:8000/metrics"]
    }
    policy["pools"]["headless"] = {"dns": {"name": "vllm.llm.svc.cluster.local"}}
    policy["routes"]["chat"] = {"profile": "default", "pool": "pair"}
    policy["routes"]["messages"] = {"profile": "default", "pool": "headless"}
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(policy, sort_keys=False))
    routes = [
        {"name": "chat", "path": "/v1/chat/completions"},  # two metrics_urls
        {"name": "messages", "path": "/v1/messages"},  # endpoints found by DNS
        {"name": "completions", "path": "/v1/completions"},  # the default pool: one
    ]
    spec = _spec_with(tmp_path, policy=str(path), routes=routes)
    several = {r.name: r.several_endpoints for r in load_spec(spec).routes}
    assert several == {"chat": True, "messages": True, "completions": False}
    files = render_all(spec)
    vhost, by_name = _local_routes(files["envoy.yaml"])
    for name in ("chat", "messages"):
        assert by_name[name]["route"]["retry_policy"] == {
            "retry_on": "connect-failure,retriable-status-codes",
            "num_retries": 1,
            "retry_host_predicate": PREVIOUS_HOSTS,
            "host_selection_retry_max_attempts": "5",
            "retriable_status_codes": [503],
        }, name
    # one endpoint: a retry would meet the same backend; the virtual host's connect-failure
    # retry applies alone
    assert "retry_policy" not in by_name["completions"]["route"]
    assert vhost["retry_policy"]["retry_on"] == "connect-failure"
    assert "retriable_status_codes" not in vhost["retry_policy"]
    _, bench = _local_routes(files["bench.yaml"])
    assert not [n for n, r in bench.items() if "retry_policy" in r.get("route", {})]


def test_the_shipped_pool_has_one_endpoint_so_no_route_retries_a_503() -> None:
    _, by_name = _local_routes((REPO / "envoy" / "envoy.yaml").read_text())
    assert not [n for n, r in by_name.items() if "retry_policy" in r.get("route", {})]


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        (
            {"routes": [{"name": "chat", "path": "/v1/chat/completions", "profile": "nope"}]},
            "routes[0].profile: unknown profile 'nope'",
        ),
        ({"routes": [{"name": "chat"}]}, "routes[0].path: missing"),
        ({"routes": [{"name": "chat", "path": "v1/chat"}]}, "routes[0].path:"),
        ({"routes": [{"name": "chat", "path": "/v1/chat?x=1"}]}, "routes[0].path:"),
        ({"routes": [{"name": "nope", "path": "/v1/x"}]}, "routes[0].name: 'nope' is not a route"),
        ({"ice": {"service": "ice", "port": 70000}}, "ice.port: 70000 is not a port"),
        ({"ice": {"service": "Bad_Name"}}, "ice.service: 'Bad_Name' is not a valid name"),
        ({"backend": {"selector": {}}}, "backend.selector: needs at least one label"),
        ({"routes": []}, "routes: expected a non-empty list"),
        ({"colour": "blue"}, "colour: unknown field"),
    ],
    ids=[
        "unknown-profile",
        "no-path",
        "relative-path",
        "query",
        "unknown-route",
        "bad-port",
        "bad-service",
        "empty-selector",
        "no-routes",
        "unknown-field",
    ],
)
def test_a_bad_spec_names_the_field_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], changes: dict[str, object], field: str
) -> None:
    spec = _spec_with(tmp_path, **changes)
    out = tmp_path / "out"
    assert main(["--spec", str(spec), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ice envoy-config: ") and field in err, err
    assert len(err.splitlines()) == 1
    assert not out.exists()


def test_generating_into_a_folder_writes_every_file_and_check_then_passes(tmp_path: Path) -> None:
    spec = tmp_path / "mesh.yaml"
    shutil.copy(SPEC, spec)
    spec.write_text(spec.read_text().replace("../ext_proc/default_policy.yaml", str(POLICY)))
    assert main(["--spec", str(spec)]) == 0
    assert main(["--spec", str(spec), "--check"]) == 0
    (tmp_path / "envoy.yaml").write_text("# edited by hand\n")
    assert main(["--spec", str(spec), "--check"]) == 1


def test_load_spec_of_the_shipped_file_lists_the_policy_routes() -> None:
    spec = load_spec(SPEC)
    assert [r.name for r in spec.routes][:3] == ["chat", "completions", "messages"]
    with pytest.raises(SpecError, match="routes: expected"):
        parse_spec({"policy": str(POLICY), "gateway": {"hosts": ["llm.example.com"]}})
