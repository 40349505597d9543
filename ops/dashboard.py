"""ICE's Grafana dashboard as code: writes ``ops/grafana/ice-dashboard.json``.

It also writes ``envoy/k8s/components/alerts/prometheusrule.yaml``, the alert rules of
``ops/prometheus/ice-alerts.yaml`` wrapped in a prometheus-operator PrometheusRule.
Run ``.venv/bin/python ops/dashboard.py`` after changing a panel or a rule (``--check`` exits
1 when a checked-in file is not what this script writes; ``tests/lab/test_ops.py`` runs the same
check).

Built with Grafana's own typed builders (the ``grafana-foundation-sdk`` package, ``dev``
extra), so the JSON is the shape Grafana's schema has, not hand-written.

What the panels read:

- ICE's own metrics (docs/configuration.md "ICE's own metrics"), scraped from
  ``ice serve --metrics-address``; the pool metrics are filtered by the ``$pool`` variable;
- vLLM's ``/metrics`` (``vllm:*``: queue depth, KV usage, ``vllm:cache_config_info`` for the
  block count), filtered by the ``$backend_job`` variable (the scrape job of the backends);
- Envoy's admin ``/stats/prometheus`` (``envoy_http_ext_proc_*``: fail-open and failed
  streams; ``envoy_cluster_upstream_cx_connect_fail`` of the cluster named by ``$ice_cluster``).

Invariants: the output depends only on this file and the rules file (same input, same
bytes: no ids from a clock or a counter outside them); every query reads only metrics named in
docs/configuration.md or Envoy's/vLLM's own (tests/lab/test_ops.py checks both, and
tests/e2e/test_prometheus.py runs every query against a real Prometheus); the pressure levels
are the built-in profile's thresholds (``LEVELS``) and the alert lines the rules' thresholds
(both checked by tests/lab/test_ops.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml
from grafana_foundation_sdk.builders import common as common_b
from grafana_foundation_sdk.builders import dashboard as dash_b
from grafana_foundation_sdk.builders import prometheus as prom_b
from grafana_foundation_sdk.builders import statetimeline, table, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common, dashboard
from grafana_foundation_sdk.models import prometheus as prom_m

OPS = Path(__file__).resolve().parent
OUTPUT = OPS / "grafana" / "ice-dashboard.json"
RULES = OPS / "prometheus" / "ice-alerts.yaml"
PROMETHEUS_RULE = OPS.parent / "envoy" / "k8s" / "components" / "alerts" / "prometheusrule.yaml"
UID = "ice-overview"

# Where each pressure level starts (profile `pressure.thresholds`, built-in default).
LEVELS: tuple[tuple[str, float, str], ...] = (
    ("low", 0.0, "green"),
    ("medium", 40.0, "yellow"),
    ("high", 65.0, "orange"),
    ("critical", 85.0, "red"),
)
# The 429 reasons (docs/headers.md `x-ice-reason`): shedding, as opposed to a 400.
SHED_REASONS = "memory_pressure|kv_exhausted"
# The shed share and the body-phase p99 the alerts (ops/prometheus/ice-alerts.yaml) fire at.
SHED_ALERT_SHARE = 0.2
BODY_P99_ALERT_S = 0.25

DS = dashboard.DataSourceRef(type_val="prometheus", uid="${datasource}")
RATE = "$__rate_interval"
POOL = 'pool=~"$pool"'
BACKEND = 'job=~"$backend_job"'
VLLM_USAGE = (
    f"vllm:kv_cache_usage_perc{{{BACKEND}}} or vllm:gpu_cache_usage_perc{{{BACKEND}}}"  # legacy
)


def _query(expr: str, legend: str, ref: str = "A") -> prom_b.Dataquery:
    return prom_b.Dataquery().expr(expr).legend_format(legend).ref_id(ref).datasource(DS)


def _instant_table(expr: str, ref: str) -> prom_b.Dataquery:
    return (
        prom_b.Dataquery()
        .expr(expr)
        .ref_id(ref)
        .datasource(DS)
        .instant()
        .format(prom_m.PromQueryFormat.TABLE)
    )


def _steps(*steps: tuple[float | None, str]) -> dash_b.ThresholdsConfig:
    return (
        dash_b.ThresholdsConfig()
        .mode(dashboard.ThresholdsMode.ABSOLUTE)
        .steps([dashboard.Threshold(value=v, color=c) for v, c in steps])
    )


def _legend() -> common_b.VizLegendOptions:
    return (
        common_b.VizLegendOptions()
        .display_mode(common.LegendDisplayMode.TABLE)
        .placement(common.LegendPlacement.BOTTOM)
        .show_legend(True)
        .calcs(["lastNotNull", "max"])
    )


def _series(title: str, description: str, unit: str, *queries: prom_b.Dataquery) -> Any:
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(DS)
        .unit(unit)
        .span(12)
        .height(8)
        .legend(_legend())
        .fill_opacity(10)
    )
    for q in queries:
        panel = panel.with_target(q)
    return panel


def _threshold_lines(panel: Any, *steps: tuple[float | None, str]) -> Any:
    return panel.thresholds(_steps(*steps)).thresholds_style(
        common_b.GraphThresholdsStyleConfig().mode(common.GraphThresholdsStyleMode.DASHED)
    )


def _level_mappings() -> list[dashboard.ValueMapping]:
    """Score → level text, highest level first (a score on a boundary is the higher level)."""
    bounds = [*(start for _, start, _ in LEVELS[1:]), None]
    out: list[dashboard.ValueMapping] = []
    for (name, start, color), end in reversed(list(zip(LEVELS, bounds, strict=True))):
        result = dashboard.ValueMappingResult(text=name, color=color)
        out.append(
            dashboard.RangeMap(
                dashboard.DashboardRangeMapOptions(from_val=start, to=end, result=result)
            )
        )
    return out


def _transform(id_: str, options: dict[str, Any]) -> dashboard.DataTransformerConfig:
    return dashboard.DataTransformerConfig(id_val=id_, options=options)


def decisions_row(d: dash_b.Dashboard) -> dash_b.Dashboard:
    d = d.with_row(dash_b.Row("Decisions"))
    d = d.with_panel(
        _series(
            "Decisions per second by decision and reason",
            "ice_decisions_total: every evaluated request, by what ICE did (pass, downgrade, "
            "truncate, reject) and why (docs/headers.md x-ice-reason).",
            "reqps",
            _query(
                f"sum by (decision, reason) (rate(ice_decisions_total[{RATE}]))",
                "{{decision}} / {{reason}}",
            ),
        ).stacking(common_b.StackingConfig().mode(common.StackingMode.NORMAL))
    )
    shed = _series(
        "Share of decisions shed (429) by route",
        f"429s ({SHED_REASONS}) over all decisions. The ICEShedding alert fires above "
        f"{SHED_ALERT_SHARE:.0%} over 5 minutes.",
        "percentunit",
        _query(
            'sum by (route) (rate(ice_decisions_total{decision="reject",'
            f'reason=~"{SHED_REASONS}"}}[{RATE}])) / sum by (route) '
            f"(rate(ice_decisions_total[{RATE}]))",
            "{{route}}",
        ),
    )
    d = d.with_panel(_threshold_lines(shed, (None, "green"), (SHED_ALERT_SHARE, "red")))
    d = d.with_panel(
        _series(
            "Answered 4xx for breaking the API contract",
            "ice_bad_requests_total by reason (invalid JSON, duplicate keys, ...): the "
            "client's fault, not the pool's.",
            "reqps",
            _query(f"sum by (reason) (rate(ice_bad_requests_total[{RATE}]))", "{{reason}}"),
        )
    )
    return d.with_panel(
        _series(
            "ext_proc streams (Envoy) and decisions (ICE)",
            "Envoy's ext_proc streams against ICE's decisions: streams with no decisions is "
            "the ICENoDecisions alert (ICE unreachable, or not judging).",
            "reqps",
            _query(f"sum(rate(envoy_http_ext_proc_streams_started[{RATE}]))", "Envoy streams"),
            _query(f"sum(rate(ice_decisions_total[{RATE}]))", "ICE decisions", "B"),
        )
    )


def pressure_row(d: dash_b.Dashboard) -> dash_b.Dashboard:
    d = d.with_row(dash_b.Row("Pool pressure"))
    level_steps = [(None if i == 0 else start, color) for i, (_, start, color) in enumerate(LEVELS)]
    score = f"max by (pool) (ice_mem_pressure_score{{{POOL}}})"
    panel = _series(
        "Memory-pressure score",
        "ice_mem_pressure_score (0-100) under the default profile; the lines are where the "
        "levels start (profile pressure.thresholds).",
        "none",
        _query(score, "{{pool}}"),
    )
    d = d.with_panel(_threshold_lines(panel.min(0).max(100), *level_steps))
    d = d.with_panel(
        statetimeline.Panel()
        .title("Pressure level")
        .description("The level ICE judges each pool at (x-mem-pressure).")
        .datasource(DS)
        .span(12)
        .height(8)
        .with_target(_query(score, "{{pool}}"))
        .thresholds(_steps(*level_steps))
        .color_scheme(dash_b.FieldColor().mode(dashboard.FieldColorModeId.THRESHOLDS))
        .mappings(_level_mappings())
    )
    d = d.with_panel(
        _series(
            "KV-cache usage",
            "ICE's view of each pool (ice_pool_kv_cache_usage) and each backend's own "
            "vllm:kv_cache_usage_perc.",
            "percentunit",
            _query(f"max by (pool) (ice_pool_kv_cache_usage{{{POOL}}})", "ICE pool {{pool}}"),
            _query(f"max by (instance) ({VLLM_USAGE})", "vLLM {{instance}}", "B"),
        )
        .min(0)
        .max(1)
    )
    d = d.with_panel(
        table.Panel()
        .title("Free KV blocks per backend (vLLM)")
        .description(
            "vllm:cache_config_info's num_gpu_blocks (less vLLM's one null block) times the "
            "free share 1 - vllm:kv_cache_usage_perc, as ICE counts them."
        )
        .datasource(DS)
        .span(12)
        .height(8)
        .with_target(
            _instant_table(
                "max by (instance, block_size, num_gpu_blocks) "
                f"(vllm:cache_config_info{{{BACKEND}}})",
                "A",
            )
        )
        .with_target(_instant_table(f"1 - max by (instance) ({VLLM_USAGE})", "B"))
        .transformations(
            [
                _transform("merge", {}),
                _transform(
                    "convertFieldType",
                    {
                        "conversions": [
                            {"targetField": "num_gpu_blocks", "destinationType": "number"},
                            {"targetField": "block_size", "destinationType": "number"},
                        ],
                        "fields": {},
                    },
                ),
                _transform(
                    "calculateField",
                    {
                        "mode": "binary",
                        "binary": {"left": "num_gpu_blocks", "operator": "-", "right": "1"},
                        "alias": "usable blocks",
                    },
                ),
                _transform(
                    "calculateField",
                    {
                        "mode": "binary",
                        "binary": {"left": "usable blocks", "operator": "*", "right": "Value #B"},
                        "alias": "free blocks",
                    },
                ),
                _transform(
                    "organize",
                    {
                        "excludeByName": {"Time": True, "Value #A": True, "usable blocks": True},
                        "renameByName": {"instance": "backend", "Value #B": "free share"},
                        "indexByName": {},
                    },
                ),
            ]
        )
    )
    return d.with_panel(
        _series(
            "Queue depth (vLLM)",
            "vllm:num_requests_waiting and vllm:num_requests_running per backend: the queue "
            "term of the pressure score.",
            "none",
            _query(
                f"sum by (instance) (vllm:num_requests_waiting{{{BACKEND}}})",
                "waiting {{instance}}",
            ),
            _query(
                f"sum by (instance) (vllm:num_requests_running{{{BACKEND}}})",
                "running {{instance}}",
                "B",
            ),
        )
    )


def freshness_row(d: dash_b.Dashboard) -> dash_b.Dashboard:
    d = d.with_row(dash_b.Row("Freshness of the pool view"))
    d = d.with_panel(
        statetimeline.Panel()
        .title("Pool view stale")
        .description(
            "ice_pool_stale: 1 while the pool's view holds or lacks stale sources (x-ice-stale)."
        )
        .datasource(DS)
        .span(8)
        .height(8)
        .with_target(_query(f"max by (pool) (ice_pool_stale{{{POOL}}})", "{{pool}}"))
        .thresholds(_steps((None, "green"), (1, "red")))
        .color_scheme(dash_b.FieldColor().mode(dashboard.FieldColorModeId.THRESHOLDS))
        .mappings(
            [
                dashboard.ValueMap(
                    {
                        "0": dashboard.ValueMappingResult(text="fresh", color="green"),
                        "1": dashboard.ValueMappingResult(text="stale", color="red"),
                    }
                )
            ]
        )
    )
    d = d.with_panel(
        _series(
            "Age of the last good scrape",
            "time() - ice_pool_snapshot_timestamp_seconds: how old ICE's newest view of the "
            "pool is.",
            "s",
            _query(
                f"time() - max by (pool) (ice_pool_snapshot_timestamp_seconds{{{POOL}}})",
                "{{pool}}",
            ),
        ).span(8)
    )
    return d.with_panel(
        _series(
            "Scrape errors per second",
            "ice_scrape_errors_total: failed reads of the pool's /metrics pages, Prometheus "
            "queries, DCGM exporters, NVML and DNS lookups.",
            "short",
            _query(f"sum by (pool) (rate(ice_scrape_errors_total{{{POOL}}}[{RATE}]))", "{{pool}}"),
        ).span(8)
    )


def ice_row(d: dash_b.Dashboard) -> dash_b.Dashboard:
    d = d.with_row(dash_b.Row("ICE itself"))
    buckets = f"rate(ice_processing_seconds_bucket[{RATE}])"
    latency = _series(
        "Processing time p50 / p99 by phase",
        "ice_processing_seconds: from a message's arrival in ICE to its answer (the body "
        "phase includes the offload helper and truncation). The ICEBodyPhaseSlow alert fires "
        f"when the body phase's p99 is above {BODY_P99_ALERT_S * 1000:.0f} ms.",
        "s",
        _query(f"histogram_quantile(0.5, sum by (le, phase) ({buckets}))", "p50 {{phase}}"),
        _query(f"histogram_quantile(0.99, sum by (le, phase) ({buckets}))", "p99 {{phase}}", "B"),
    )
    d = d.with_panel(_threshold_lines(latency, (None, "green"), (BODY_P99_ALERT_S, "red")))
    d = d.with_panel(
        _series(
            "Judged without the body, and bodies dropped",
            "ice_coarse_verdicts_total (x-ice-judged: headers, by why) and "
            "ice_bodies_dropped_total (Envoy had given up on the body, by reason).",
            "reqps",
            _query(f"sum by (why) (rate(ice_coarse_verdicts_total[{RATE}]))", "coarse: {{why}}"),
            _query(
                f"sum by (reason) (rate(ice_bodies_dropped_total[{RATE}]))",
                "dropped: {{reason}}",
                "B",
            ),
        )
    )
    d = d.with_panel(
        _series(
            "Truncation: tokens saved per second",
            "ice_truncation_saved_tokens_total: input tokens history truncation removed.",
            "short",
            _query(
                f"sum by (route) (rate(ice_truncation_saved_tokens_total[{RATE}]))", "{{route}}"
            ),
        )
    )
    d = d.with_panel(
        _series(
            "Prefix stability of the prompts",
            "ice_prefix_stability_score (prefix_tracking on): the share of sampled prompts' KV "
            "blocks a prefix cache could reuse. Read it beside the pool's cache hit ratio "
            "(ice_cache_efficiency_ratio, when the engine reports prefix-cache hits): stable "
            "prompts with a low hit ratio mean the cache is too small; unstable prompts, see "
            "ice_prefix_divergence_character and ice prefix-report.",
            "percentunit",
            _query("max by (route) (ice_prefix_stability_score)", "{{route}}"),
        )
    )
    return d.with_panel(
        _series(
            "Truncations per second, and fallbacks to recency",
            "ice_truncations_total by mode; ice_truncation_fallbacks_total by reason "
            "(deadline, unavailable: the embedding worker is slow or down).",
            "reqps",
            _query(f"sum by (mode) (rate(ice_truncations_total[{RATE}]))", "{{mode}}"),
            _query(
                f"sum by (reason) (rate(ice_truncation_fallbacks_total[{RATE}]))",
                "fallback: {{reason}}",
                "B",
            ),
        )
    )


def envoy_row(d: dash_b.Dashboard) -> dash_b.Dashboard:
    d = d.with_row(dash_b.Row("Envoy: requests not judged (fail-open)"))
    per_hcm = "sum by (envoy_http_conn_manager_prefix)"
    return d.with_panel(
        _series(
            "Fail-open and failed ext_proc streams",
            "Envoy's ext_proc stats: failure_mode_allowed counts requests Envoy let through "
            "unjudged (ICE down, slow or erroring: the ICEFailOpen alert); connect failures "
            "to the ICE cluster ($ice_cluster).",
            "reqps",
            _query(
                f"{per_hcm} (rate(envoy_http_ext_proc_failure_mode_allowed[{RATE}]))",
                "fail-open {{envoy_http_conn_manager_prefix}}",
            ),
            _query(
                f"{per_hcm} (rate(envoy_http_ext_proc_streams_failed[{RATE}]))",
                "streams failed {{envoy_http_conn_manager_prefix}}",
                "B",
            ),
            _query(
                f"{per_hcm} (rate(envoy_http_ext_proc_message_timeouts[{RATE}]))",
                "message timeouts {{envoy_http_conn_manager_prefix}}",
                "C",
            ),
            _query(
                "sum(rate(envoy_cluster_upstream_cx_connect_fail"
                f'{{envoy_cluster_name=~"$ice_cluster"}}[{RATE}]))',
                "connect failures to ICE",
                "D",
            ),
        ).span(24)
    )


def build() -> dict[str, Any]:
    """The dashboard, as the JSON object Grafana imports."""
    d = (
        dash_b.Dashboard("ICE: Inference Constraint Evaluator")
        .uid(UID)
        .description(
            "ICE's decisions, the pools' memory pressure and freshness, ICE's own latency, and "
            "Envoy's fail-open. Generated by ops/dashboard.py: edit that, not this JSON."
        )
        .tags(["ice", "envoy", "vllm"])
        .editable()
        .tooltip(dashboard.DashboardCursorSync.CROSSHAIR)
        .refresh("30s")
        .time("now-1h", "now")
        .timezone("browser")
        .with_variable(
            dash_b.DatasourceVariable("datasource").label("Prometheus").type("prometheus")
        )
        .with_variable(
            dash_b.QueryVariable("pool")
            .label("Pool")
            .datasource(DS)
            .query("label_values(ice_pool_stale, pool)")
            .refresh(dashboard.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(dashboard.VariableSort.ALPHABETICAL_ASC)
            .multi(True)
            .include_all(True)
            .all_value(".*")
        )
        .with_variable(
            dash_b.QueryVariable("backend_job")
            .label("vLLM scrape job")
            .description("The Prometheus job that scrapes the pool's vLLM backends.")
            .datasource(DS)
            .query("label_values(vllm:num_requests_waiting, job)")
            .refresh(dashboard.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(dashboard.VariableSort.ALPHABETICAL_ASC)
            .multi(True)
            .include_all(True)
            .all_value(".*")
        )
        .with_variable(
            dash_b.TextBoxVariable("ice_cluster")
            .label("Envoy cluster of ICE")
            .description(
                "Regex of the Envoy cluster name(s) that reach ICE (envoy/envoy.yaml: ice)."
            )
            .default_value("ice")
        )
    )
    for row in (decisions_row, pressure_row, freshness_row, ice_row, envoy_row):
        d = row(d)
    out: dict[str, Any] = json.loads(json.dumps(d.build(), cls=JSONEncoder))
    for i, panel in enumerate(out["panels"], start=1):  # stable ids: the panel's position
        panel["id"] = i
    return out


def render() -> str:
    """The dashboard file's text."""
    return json.dumps(build(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def render_prometheus_rule(rules: Path = RULES) -> str:
    """The PrometheusRule (prometheus-operator) holding the groups of the rules file."""
    obj = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "ice",
            "namespace": "ice-system",
            "labels": {"app.kubernetes.io/name": "ice"},
        },
        "spec": yaml.safe_load(rules.read_text()),
    }
    head = (
        "# GENERATED by ops/dashboard.py from ops/prometheus/ice-alerts.yaml: edit that file and\n"
        "# rerun the script. Your Prometheus must select this rule: kube-prometheus-stack, for\n"
        "# one, selects only rules labelled `release: <its release name>` unless\n"
        "# ruleSelectorNilUsesHelmValues is false; add that label in your overlay if so.\n"
    )
    return head + yaml.dump(obj, Dumper=_BlockDumper, sort_keys=False, width=100)


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings (the longer exprs) as ``|`` blocks, as in the rules file."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_BlockDumper.add_representer(str, _str)


def outputs() -> dict[Path, str]:
    """Each file this script writes, and its text."""
    return {OUTPUT: render(), PROMETHEUS_RULE: render_prometheus_rule()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a file is stale")
    args = parser.parse_args(argv)
    stale = 0
    for path, text in outputs().items():
        if args.check:
            if not path.exists() or path.read_text() != text:
                print(f"{path} is stale: run python ops/dashboard.py", file=sys.stderr)
                stale = 1
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path}")
    return stale


if __name__ == "__main__":
    sys.exit(main())
