"""ICE's dashboard and alert rules on a real Prometheus scraping a real stack.

A Prometheus on loopback (scrape and rule evaluation every second) scrapes ICE's metrics port
(job ``ice``), Envoy's admin ``/stats/prometheus`` (job ``envoy``) and the dev backend's
``/metrics`` as the vLLM (job ``vllm``), and loads ``ops/prometheus/ice-alerts.yaml``. The
stack then sees every kind of event the dashboard shows: requests Envoy lets through while ICE
is down (fail-open), failed scrapes of the backend, a pass, a downgrade, a 429, a 400 decision,
a 400 for a broken body, a truncation (recency: the policy's embedding model does not exist, so
no model loads), and a body judged from its headers (chunked, so ICE must assume the largest
body). Then, through Prometheus's HTTP API:

- every dashboard query (Grafana's variables at their All value) parses and returns data, save
  ``ice_bodies_dropped_total``, which has no series until Envoy gives up on a body ICE is
  judging (tests/serve/test_servicer_flood.py makes that happen): for it the query must parse and
  ICE's page must declare the family;
- every alert rule loaded and evaluates without error; each alert's expression, without its
  threshold comparisons and split at ``and`` / ``unless`` / ``or``, returns data in every
  part; ICEFailOpen is pending or firing (ICE was down).

Prometheus and promtool come from ``tests/ops_tools.py``'s ``prometheus_tools`` (PATH, else
Debian's package unpacked into .scratch); Prometheus is stopped before the test ends.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from ext_proc.lab.redis_local import RedisServer
from ext_proc.lab.stack import free_port
from tests import ops_tools

from .harness import CHAT, E2E, HIGH, LOW, PROBE, PROBE_HEADERS, request, running_stack, slow_upload

SCRAPE_INTERVAL = "1s"
RATE_WINDOW = "1m"  # what $__rate_interval becomes: wide enough for two scrapes of each series
# Series that exist only after a fault the test cannot cause cheaply (see the module docstring).
NO_SERIES_UNTIL_A_FAULT = frozenset({"ice_bodies_dropped_total"})
PROFILE_EXTRA = """\
    truncation:
      enabled: true
      budget_tokens: {low: 600, medium: 600, high: 600, critical: 600}
      keep_last_turns: 1
"""
# A body bigger than Envoy's buffer never comes, but ICE must assume a chunked body may be
# this large: it judges it from its headers ("time": too long to read within the timeout).
ICE_EXTRA = ["--max-body-bytes", str(512 << 20)]


# --- a Prometheus ------------------------------------------------------------------------------
class Prometheus:
    """A Prometheus server on loopback and its HTTP API."""

    def __init__(self, port: int, log: Path) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.log = log

    def api(self, path: str, **params: str) -> Any:
        url = f"{self.base}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as e:  # 400 bad_data: the body says why
            return json.loads(e.read())

    def query(self, expr: str) -> Any:
        return self.api("query", query=expr)

    def log_tail(self, lines: int = 20) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        return ""


@contextlib.contextmanager
def running_prometheus(workdir: Path, e2e: E2E, rules: Path) -> Iterator[Prometheus]:
    """Prometheus scraping ``e2e``'s ICE, Envoy and backend, with ``rules``; stopped on exit."""
    tools = ops_tools.require_prometheus_tools()
    jobs = {
        "ice": (e2e.ice_metrics_port, "/metrics"),
        "envoy": (e2e.admin_port, "/stats/prometheus"),
        "vllm": (e2e.backend_port, "/metrics"),
    }
    config = {
        "global": {
            "scrape_interval": SCRAPE_INTERVAL,
            "scrape_timeout": "900ms",
            "evaluation_interval": SCRAPE_INTERVAL,
        },
        "rule_files": [str(rules)],
        "scrape_configs": [
            {
                "job_name": job,
                "metrics_path": path,
                "static_configs": [{"targets": [f"127.0.0.1:{port}"]}],
            }
            for job, (port, path) in jobs.items()
        ],
    }
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = workdir / "prometheus.log"
    argv = [
        str(tools.prometheus),
        f"--config.file={workdir / 'prometheus.yml'}",
        f"--storage.tsdb.path={workdir / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
    ]
    with log.open("w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    prom = Prometheus(port, log)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, f"prometheus exited {proc.returncode}:\n{prom.log_tail()}"
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(f"{prom.base}/-/ready", timeout=1) as resp,
            ):
                if resp.status == 200:
                    break
            assert time.monotonic() < deadline, f"prometheus not ready:\n{prom.log_tail()}"
            time.sleep(0.1)
        yield prom
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


# --- traffic -----------------------------------------------------------------------------------
def _chat(max_tokens: int = 8, **extra: Any) -> dict[str, Any]:
    return {
        "model": "dev-model",
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": max_tokens,
        **extra,
    }


def _long_conversation() -> dict[str, Any]:
    messages: list[dict[str, str]] = []
    for i in range(8):
        messages.append({"role": "user", "content": f"question {i}: " + "word " * 120})
        messages.append({"role": "assistant", "content": "answer " * 120})
    messages.append({"role": "user", "content": "and the final question?"})
    return {"model": "dev-model", "messages": messages, "max_tokens": 8}


def fail_open_then_restart(e2e: E2E, extra: list[str]) -> None:
    """Stop ICE, send requests Envoy must let through unjudged, start ICE again."""
    e2e.stack.stop("ice")
    for _ in range(3):
        reply = e2e.post(CHAT, PROBE, PROBE_HEADERS)
        assert reply.status == 200 and reply.header("x-ice-decision") is None, reply
    e2e.stack.start_ice(
        e2e.ice_addresses[0],
        policy=e2e.workdir / "policy.yaml",
        metrics_address=f"127.0.0.1:{e2e.ice_metrics_port}",
        extra=extra,
    )
    e2e.wait_pressure("low", "0")


def failed_scrapes(e2e: E2E) -> None:
    """A page ICE cannot parse until ICE has counted failed scrapes, then the real page."""
    e2e.set_raw_metrics(b"\x00 not {prometheus text\n")
    deadline = time.monotonic() + 10
    while e2e.ice_metric("ice_scrape_errors_total", pool="default") < 2:
        assert time.monotonic() < deadline, e2e.log_tails()
        time.sleep(0.05)
    e2e.restore_metrics()


def every_decision(e2e: E2E) -> None:
    e2e.set_state(LOW, level="low")
    decided = {
        "pass": e2e.post(CHAT, _chat()),
        "reject 400": e2e.post(CHAT, _chat(n=17)),  # too_many_sequences
        "truncate": e2e.post(CHAT, _long_conversation()),
        "bad request": e2e.post(CHAT, b"{not json"),
    }
    # a slow upload holds 15 of the worker's 16 MiB: a body over 64 KiB is judged from its
    # size (a chat may name any n: a coarse 429, docs/flood.md)
    with slow_upload(e2e, 15_000_000):
        decided["coarse"] = e2e.post(CHAT, {**_chat(), "metadata": {"pad": "x" * 70_000}})
    e2e.set_state(HIGH, level="high")
    for _ in range(3):
        decided["downgrade"] = e2e.post(CHAT, _chat(max_tokens=4000))
        decided["reject 429"] = e2e.post(CHAT, _chat(), {"x-priority": "sheddable"})
    seen = {
        kind: (r.status, r.header("x-ice-decision"), r.header("x-ice-judged"))
        for kind, r in decided.items()
    }
    assert seen == {
        "pass": (200, "pass", None),
        "reject 400": (400, "reject", None),
        "truncate": (200, "truncate", None),
        "bad request": (400, "reject", None),
        "coarse": (429, "reject", "headers"),
        "downgrade": (200, "downgrade", None),
        "reject 429": (429, "reject", None),
    }, seen


# --- checks ------------------------------------------------------------------------------------
_THRESHOLD = re.compile(r"\s*(?:>=|<=|==|!=|>|<)\s*(?:bool\s+)?-?\d+(?:\.\d+)?(?:e[+-]?\d+)?")


def without_thresholds(expr: str) -> list[str]:
    """An alert expression's parts without their comparisons to a number, split at the
    top-level ``and`` / ``unless`` / ``or``: the signals that exist when all is well."""
    bare = _THRESHOLD.sub("", " ".join(expr.split()))
    parts, depth, start = [], 0, 0
    tokens = list(re.finditer(r"[()]|\b(?:and|unless|or)\b", bare))
    for tok in tokens:
        if tok.group() == "(":
            depth += 1
        elif tok.group() == ")":
            depth -= 1
        elif depth == 0:
            parts.append(bare[start : tok.start()])
            start = tok.end()
    parts.append(bare[start:])
    return [p.strip() for p in parts if p.strip()]


def _result(prom: Prometheus, expr: str) -> tuple[str, list[Any], str]:
    got = prom.query(expr)
    return got.get("status", "?"), got.get("data", {}).get("result", []), got.get("error", "")


def wait_for_every_query(prom: Prometheus, exprs: dict[str, str], timeout_s: float) -> None:
    """Until each expression returns data (parse errors fail at once)."""
    deadline = time.monotonic() + timeout_s
    missing = dict(exprs)
    while True:
        for where, expr in list(missing.items()):
            status, result, error = _result(prom, expr)
            assert status == "success", (where, expr, error)
            if result:
                del missing[where]
        if not missing:
            return
        assert time.monotonic() < deadline, (
            f"no data after {timeout_s} s for {json.dumps(missing, indent=1)}\n"
            f"targets: {_targets(prom)}\n{prom.log_tail()}"
        )
        time.sleep(0.5)


def _targets(prom: Prometheus) -> list[tuple[str, str, str]]:
    active = prom.api("targets").get("data", {}).get("activeTargets", [])
    return [(t["labels"].get("job", "?"), t["health"], t.get("lastError", "")) for t in active]


def test_dashboard_queries_and_alert_rules_on_a_real_prometheus(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    ops = ops_tools
    rules = ops.alert_rules()
    # ICE on the shared ledger too (a real Redis): its ice_ledger_backend gauge is scraped
    ice_extra = [*ICE_EXTRA, "--ledger", redis_server.url]
    with (
        running_stack(
            tmp_path / "stack",
            profile_extra=PROFILE_EXTRA,
            policy_extra=f"embedding:\n  model: {tmp_path / 'no-model'}\n"
            "prefix_tracking: {enabled: true, sample_every: 1}\n",
            ice_extra=ice_extra,
        ) as e2e,
        running_prometheus(tmp_path / "prometheus", e2e, ops.RULES) as prom,
    ):
        # Each target scraped once before the events: their counters' increases are seen.
        wait_for_every_query(prom, {"all targets up": "count(up == 1) == 3"}, timeout_s=15)
        fail_open_then_restart(e2e, ice_extra)
        failed_scrapes(e2e)
        every_decision(e2e)

        queries = {where: ops.expand(expr, RATE_WINDOW) for where, expr in ops.dashboard_queries()}
        rare = {
            where: expr
            for where, expr in queries.items()
            if {name for name, _ in ops.metric_selectors(expr)} <= NO_SERIES_UNTIL_A_FAULT
        }
        assert len(rare) == len(NO_SERIES_UNTIL_A_FAULT), rare
        signals = {
            f"{rule['alert']} part {i}": part
            for rule in rules
            for i, part in enumerate(without_thresholds(rule["expr"]))
        }
        wait_for_every_query(
            prom, {k: v for k, v in queries.items() if k not in rare} | signals, timeout_s=20
        )
        page = request(e2e.ice_metrics_port, "GET", "/metrics").body.decode()
        for where, expr in rare.items():
            assert _result(prom, expr)[0] == "success", (where, expr)
        for name in NO_SERIES_UNTIL_A_FAULT:
            assert f"# TYPE {name} counter" in page, name

        # The rules: all loaded, each evaluated without error; ICE was down, so fail-open.
        deadline = time.monotonic() + 10
        while True:
            groups = prom.api("rules", type="alert")["data"]["groups"]
            loaded = {r["name"]: r for g in groups for r in g["rules"]}
            if all(r.get("health") == "ok" for r in loaded.values()) and loaded:
                break
            assert time.monotonic() < deadline, json.dumps(loaded, indent=1)
            time.sleep(0.25)
        assert set(loaded) == {r["alert"] for r in rules}
        for rule in rules:
            assert loaded[rule["alert"]]["duration"] > 0, rule["alert"]
        assert loaded["ICEFailOpen"]["state"] in {"pending", "firing"}, loaded["ICEFailOpen"]
        assert loaded["ICENoDecisions"]["state"] == "inactive", loaded["ICENoDecisions"]
