"""The operations kit (ops/): the Grafana dashboard, the alert rules and their PrometheusRule.

Checks: the checked-in dashboard JSON and PrometheusRule are what ``ops/dashboard.py`` writes;
every dashboard query and alert expression parses (``promtool check rules``); every metric
they read is one of ICE's documented ones (docs/configuration.md, with its labels), one of
vLLM's the docs name, or one of Envoy's ext_proc / cluster stats; ``promtool test rules``
passes, each alert having a case where it fires and one where it stays quiet; a broken rule
file and a wrong expectation fail. tests/e2e/test_prometheus.py runs the same queries and
rules on a real Prometheus.

``tests/ops_tools.py`` (shared with the e2e test) finds ``prometheus`` and ``promtool`` and
reads the dashboard and the rules as data. Where no Prometheus can be had the tests fail,
saying what was tried.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.ops_tools import (
    DASHBOARD_JSON,
    ENVOY_LABELS,
    ENVOY_METRICS,
    OPERATIONS_DOC,
    PROMETHEUS_RULE,
    RULE_TESTS,
    RULES,
    TARGET_LABELS,
    VLLM_LABELS,
    PromTools,
    alert_rules,
    dashboard_queries,
    documented_ice_metrics,
    documented_vllm_metrics,
    expand,
    grouping_labels,
    load_generator,
    metric_selectors,
    panels,
    require_prometheus_tools,
)


@pytest.fixture(scope="session")
def tools() -> PromTools:
    return require_prometheus_tools()


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
