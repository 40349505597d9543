"""ICE's throughput benchmark: the same requests through Envoy with ICE and with ext_proc off.

    .venv/bin/python bench/throughput.py [--duration 10] [--connections 1,8] [--workers 1]
        [--envoy-concurrency 1] [--threads 1] [--repeat 1] [--settle 30] [--json]
        [--py-spy FILE]

One Envoy (``envoy/bench.yaml``, run with ``--concurrency 1``) holds two routes to the same
fast upstream (a second listener of that Envoy answering a fixed chat.completion):
``/v1/chat/completions`` with ``x-bench-route: direct`` has ext_proc disabled (the baseline);
the same path without it goes through ICE with the production ext_proc configuration. The
request mix is one typical chat request (``bench/chat.lua``) that ICE parses, evaluates
against a real low-pressure snapshot (the upstream also serves a vLLM-style ``/metrics`` page
that ICE scrapes) and passes, annotated. wrk drives each configuration in turn, never both at
once, each after a 1 s warm-up.

Printed per connection count: req/s, p50/p99 for both routes, the ICE/direct throughput ratio,
the added p50/p99, ICE's CPU time per request (utime+stime of ICE's process tree from
/proc, over the measured run, divided by the requests wrk completed), ICE's RSS (VmRSS of
each process of its tree: with ``--workers`` the supervisor, its multiprocessing helper and
the workers), Envoy's CPU per request, and the "other load": CPU that neither Envoy, ICE nor
wrk used during the run. On a shared machine that is other people's work, which skews the
numbers: ``--settle`` waits for a quiet machine before each run, ``--repeat N`` keeps each
route's fastest of N alternating runs, and a warning flags a busy run.
ICE's CPU during the direct run is its idle background (the scraper).

Checks (the run aborts otherwise): before measuring, one request through each route shows
``x-ice-decision: pass`` with a real (low) pressure level on the ICE route and no ICE header on
the direct route; after each ICE run, Envoy's ext_proc counters show one stream per request
and no failure or timeout (with ``failure_mode_allow`` a failing ICE would silently turn into
a fast pass-through), ICE's own counters show a pass for every request, and no scrape failed.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import re
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ext_proc.lab.stack import (
    ENVOY_DIR,
    Stack,
    StackError,
    free_port,
    policy_passthrough_paths,
    render_envoy_config,
)

ROOT = Path(__file__).resolve().parent.parent
LUA = Path(__file__).resolve().parent / "chat.lua"
BENCH_YAML = ENVOY_DIR / "bench.yaml"
PROD_YAML = ENVOY_DIR / "envoy.yaml"
DEFAULT_POLICY = ROOT / "ext_proc" / "default_policy.yaml"
PATH = "/v1/chat/completions"
CLK_TCK = os.sysconf("SC_CLK_TCK")
WARMUP_S = 1

# Envoy's ext_proc counters that mean "ICE did not judge this request".
EXT_PROC_FAILURES = (
    "streams_failed",
    "failure_mode_allowed",
    "message_timeouts",
    "spurious_msgs_received",
    "rejected_header_mutations",
    "override_message_timeout_rejected",
)


class BenchError(RuntimeError):
    """The benchmark cannot produce trustworthy numbers."""


# --- /proc -----------------------------------------------------------------------------------


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants (via /proc/<pid>/task/*/children)."""
    found: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        if p in found or not Path(f"/proc/{p}").exists():
            continue
        found.append(p)
        for task in Path(f"/proc/{p}/task").glob("*"):
            with contextlib.suppress(OSError):
                todo += [int(c) for c in (task / "children").read_text().split()]
    return found


def cpu_seconds(pids: list[int]) -> float:
    """utime + stime of ``pids`` in seconds (fields 14 and 15 of /proc/<pid>/stat)."""
    ticks = 0
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # the command name may contain spaces
        ticks += int(fields[11]) + int(fields[12])
    return ticks / CLK_TCK


def machine_busy_seconds() -> float:
    """CPU time all processes spent busy (first line of /proc/stat, without idle and iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / CLK_TCK


def wait_for_quiet(max_wait_s: float, threshold_cores: float = 0.15) -> float:
    """Wait (at most ``max_wait_s``) for a second in which the machine is nearly idle.

    On a shared machine other people's work takes cores from Envoy, ICE and wrk alike and
    skews the ratio; returns the last measured load (cores).
    """
    deadline = time.monotonic() + max_wait_s
    while True:
        b0 = machine_busy_seconds()
        time.sleep(1)
        load = machine_busy_seconds() - b0
        if load < threshold_cores or time.monotonic() >= deadline:
            return load


def children_cpu_seconds() -> float:
    """CPU time of this process and its reaped children (wrk runs are reaped children)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def rss_kib(pid: int) -> int:
    """VmRSS of ``pid`` in KiB (0 when gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def role(pid: int, root: int) -> str:
    """What a process of ICE's tree is: the started process, a worker, or a helper."""
    if pid == root:
        return "main"
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "gone"
    return "helper" if b"resource_tracker" in cmdline else "worker"


def tree_cpu(pid: int) -> float:
    return cpu_seconds(process_tree(pid))


# --- wrk -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WrkResult:
    requests: int
    seconds: float
    rps: float
    p50_ms: float
    p75_ms: float
    p90_ms: float
    p99_ms: float
    non_2xx: int
    socket_errors: int


_UNITS_MS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3, "h": 3600e3}


def _ms(text: str) -> float:
    m = re.fullmatch(r"([\d.]+)(us|ms|s|m|h)", text)
    if m is None:
        raise BenchError(f"cannot read wrk latency {text!r}")
    return float(m.group(1)) * _UNITS_MS[m.group(2)]


def parse_wrk(output: str) -> WrkResult:
    """Read wrk's ``--latency`` report."""
    pct = {p: _ms(v) for p, v in re.findall(r"^\s+(50|75|90|99)%\s+(\S+)$", output, re.M)}
    done = re.search(r"^\s+(\d+) requests in ([\d.]+)(us|ms|s|m)", output, re.M)
    rps = re.search(r"^Requests/sec:\s+([\d.]+)", output, re.M)
    if done is None or rps is None or len(pct) != 4:
        raise BenchError(f"cannot parse wrk output:\n{output}")
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", output)
    sock = re.search(
        r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", output
    )
    return WrkResult(
        requests=int(done.group(1)),
        seconds=_ms(done.group(2) + done.group(3)) / 1e3,
        rps=float(rps.group(1)),
        p50_ms=pct["50"],
        p75_ms=pct["75"],
        p90_ms=pct["90"],
        p99_ms=pct["99"],
        non_2xx=int(non_2xx.group(1)) if non_2xx else 0,
        socket_errors=sum(int(g) for g in sock.groups()) if sock else 0,
    )


def run_wrk(url: str, connections: int, duration_s: int, threads: int, direct: bool) -> WrkResult:
    argv = ["wrk", "--latency", "-t", str(min(threads, connections)), "-c", str(connections)]
    argv += ["-d", f"{duration_s}s", "-s", str(LUA), url]
    if direct:
        argv += ["--", "direct"]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise BenchError(f"wrk failed ({done.returncode}): {done.stderr or done.stdout}")
    return parse_wrk(done.stdout)


def request_body() -> bytes:
    """The body wrk sends, read from bench/chat.lua (one source of truth)."""
    text = LUA.read_text()
    assignment = text.split("wrk.body =", 1)[1].split("function", 1)[0]
    body = "".join(re.findall(r"'([^']*)'", assignment))
    json.loads(body)  # a broken script must not be measured
    return body.encode()


# --- the stack -------------------------------------------------------------------------------


def free_ports(n: int) -> int:
    """A base port such that base .. base+n-1 are free right now (ICE workers use a range)."""
    for _ in range(50):
        base = free_port()
        try:
            socks = []
            for i in range(n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", base + i))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise BenchError(f"no {n} consecutive free ports")


def write_policy(workdir: Path, metrics_url: str, endpoint_pick: str = "none") -> Path:
    """The built-in policy with its pool pointed at the fast upstream's /metrics page; with
    ``endpoint_pick`` ice or header, a pool of two endpoints (the same page read as
    127.0.0.1 and as localhost), so that ICE places every request."""
    policy = yaml.safe_load(DEFAULT_POLICY.read_text())
    for pool in policy["pools"].values():
        pool["metrics_urls"] = [metrics_url]
        if endpoint_pick != "none":
            pool["metrics_urls"].append(metrics_url.replace("127.0.0.1", "localhost"))
            pool["endpoint_pick"] = endpoint_pick
    path = workdir / "policy.yaml"
    path.write_text(yaml.safe_dump(policy, sort_keys=False))
    return path


def check_production_config() -> list[str]:
    """Differences between bench.yaml's ext_proc setup and envoy.yaml's (should be none)."""

    def parts(path: Path) -> tuple[Any, Any]:
        res = yaml.safe_load(path.read_text())["static_resources"]
        ingress = next(x for x in res["listeners"] if x["name"] == "ingress")
        hcm = ingress["filter_chains"][0]["filters"][0]["typed_config"]
        ice = dict(next(c for c in res["clusters"] if c["name"] == "ice"))
        ice.pop("load_assignment")
        return hcm["http_filters"], ice

    bench, prod = parts(BENCH_YAML), parts(PROD_YAML)
    problems = []
    if bench[0] != prod[0]:
        problems.append("http_filters of the ingress listener")
    if bench[1] != prod[1]:
        problems.append("the ice cluster")
    return problems


def envoy_stats(admin_port: int) -> dict[str, int]:
    url = f"http://127.0.0.1:{admin_port}/stats?filter=ext_proc&format=json"
    with urllib.request.urlopen(url, timeout=5) as resp:
        doc = json.load(resp)
    return {
        s["name"].rsplit(".", 1)[1]: int(s["value"])
        for s in doc.get("stats", [])
        if "value" in s and ".ext_proc." in s["name"]
    }


def ice_counters(metrics_port: int) -> dict[str, float]:
    """ICE's own counters: passes, all decisions, scrape errors (summed over labels)."""
    from prometheus_client.parser import text_string_to_metric_families

    url = f"http://127.0.0.1:{metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    out = {"decisions": 0.0, "passes": 0.0, "scrape_errors": 0.0}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "ice_decisions_total":
                out["decisions"] += s.value
                if s.labels.get("decision") == "pass":
                    out["passes"] += s.value
            elif s.name == "ice_scrape_errors_total":
                out["scrape_errors"] += s.value
    return out


def probe(port: int, body: bytes, direct: bool) -> dict[str, str]:
    """One request through the ingress; its status and response headers."""
    headers = {"content-type": "application/json"}
    if direct:
        headers["x-bench-route"] = "direct"
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("POST", PATH, body=body, headers=headers)
        resp = conn.getresponse()
        resp.read()
        return {":status": str(resp.status), **{k.lower(): v for k, v in resp.getheaders()}}
    finally:
        conn.close()


def verify_routes(port: int, body: bytes) -> None:
    """ICE route: pass with a real (low) pressure; direct route: no verdict. Else abort."""
    deadline = time.monotonic() + 10
    ice: dict[str, str] = {}
    while time.monotonic() < deadline:  # the first scrape may not have landed yet
        ice = probe(port, body, direct=False)
        if ice.get("x-mem-pressure") == "low":
            break
        time.sleep(0.2)
    if ice.get(":status") != "200" or ice.get("x-ice-decision") != "pass":
        raise BenchError(f"ICE route did not answer 200 with x-ice-decision: pass: {ice}")
    if ice.get("x-mem-pressure") != "low":
        raise BenchError(f"ICE has no low-pressure snapshot of the fast upstream: {ice}")
    direct = probe(port, body, direct=True)
    if direct.get(":status") != "200" or any(k.startswith("x-ice-") for k in direct):
        raise BenchError(f"direct route must answer 200 without ICE headers: {direct}")
    print(
        f"verified: ICE route → 200, x-ice-decision: {ice['x-ice-decision']}, "
        f"x-mem-pressure: {ice['x-mem-pressure']} ({ice.get('x-mem-pressure-score')}); "
        "direct route → 200, no x-ice-* headers"
    )


# --- measuring -------------------------------------------------------------------------------


@dataclass
class RouteRun:
    route: str  # "direct" or "ice"
    wrk: WrkResult
    ice_cpu_s: float
    envoy_cpu_s: float
    other_cpu_s: float  # everything else on the machine: other people's work skews the run
    ext_proc: dict[str, int] = field(default_factory=dict)

    @property
    def other_cores(self) -> float:
        return self.other_cpu_s / self.wrk.seconds

    @property
    def ice_cpu_us_per_req(self) -> float:
        return 1e6 * self.ice_cpu_s / max(1, self.wrk.requests)

    @property
    def envoy_cpu_us_per_req(self) -> float:
        return 1e6 * self.envoy_cpu_s / max(1, self.wrk.requests)


@dataclass
class ConnResult:
    connections: int
    direct: RouteRun
    ice: RouteRun
    ice_rss: list[tuple[str, float]]  # (role, VmRSS MiB) per process of ICE's tree

    @property
    def rss_total_mib(self) -> float:
        return sum(mib for _, mib in self.ice_rss)

    @property
    def rss_workers_mib(self) -> float:
        """The serving processes: the workers, or the one process without --workers."""
        workers = [mib for r, mib in self.ice_rss if r == "worker"]
        return sum(workers) if workers else self.rss_total_mib

    @property
    def ratio(self) -> float:
        return self.ice.wrk.rps / self.direct.wrk.rps if self.direct.wrk.rps else 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "connections": self.connections,
            "direct": self._route(self.direct),
            "ice": self._route(self.ice),
            "ratio": round(self.ratio, 3),
            "added_p50_ms": round(self.ice.wrk.p50_ms - self.direct.wrk.p50_ms, 3),
            "added_p99_ms": round(self.ice.wrk.p99_ms - self.direct.wrk.p99_ms, 3),
            "ice_cpu_us_per_req": round(self.ice.ice_cpu_us_per_req, 1),
            "ice_idle_cpu_ms_per_s": round(
                1e3 * self.direct.ice_cpu_s / self.direct.wrk.seconds, 2
            ),
            "ice_rss_total_mib": round(self.rss_total_mib, 1),
            "ice_rss_workers_mib": round(self.rss_workers_mib, 1),
            "ice_rss_by_process": [[r, round(mib, 1)] for r, mib in self.ice_rss],
            "ext_proc_counters": self.ice.ext_proc,
        }

    @staticmethod
    def _route(run: RouteRun) -> dict[str, Any]:
        return {
            **asdict(run.wrk),
            "envoy_cpu_us_per_req": round(run.envoy_cpu_us_per_req, 1),
            "other_load_cores": round(run.other_cores, 2),
        }


def measure_route(
    args: argparse.Namespace,
    url: str,
    connections: int,
    direct: bool,
    ice_pid: int,
    envoy_pid: int,
    admin_port: int,
    metrics_port: int,
    profile: Path | None = None,
) -> RouteRun:
    if args.settle > 0:
        wait_for_quiet(args.settle)
    run_wrk(url, connections, WARMUP_S, args.threads, direct)
    stats0, counters0 = envoy_stats(admin_port), ice_counters(metrics_port)
    spy = start_py_spy(profile, ice_pid, args.duration) if profile else None
    ice0, envoy0 = tree_cpu(ice_pid), cpu_seconds([envoy_pid])
    busy0, self0 = machine_busy_seconds(), children_cpu_seconds()
    result = run_wrk(url, connections, args.duration, args.threads, direct)
    busy1, self1 = machine_busy_seconds(), children_cpu_seconds()
    ice1, envoy1 = tree_cpu(ice_pid), cpu_seconds([envoy_pid])
    ours = (ice1 - ice0) + (envoy1 - envoy0) + (self1 - self0)
    if spy is not None:
        out, _ = spy.communicate(timeout=60)
        if spy.returncode != 0:
            print(f"py-spy failed ({spy.returncode}): {out[-2000:]}", file=sys.stderr)
        else:
            print(f"py-spy profile of ICE under load written to {profile} (numbers below skewed)")
    stats1, counters1 = envoy_stats(admin_port), ice_counters(metrics_port)
    delta = {k: v - stats0.get(k, 0) for k, v in stats1.items() if v - stats0.get(k, 0)}
    ice = {k: counters1[k] - counters0[k] for k in counters1}
    if result.non_2xx or result.socket_errors:
        raise BenchError(f"{'direct' if direct else 'ICE'} run had errors: {result}")
    if not direct:
        failed = {k: delta[k] for k in EXT_PROC_FAILURES if delta.get(k)}
        if failed:
            raise BenchError(f"ICE did not judge every request (Envoy ext_proc {failed})")
        if delta.get("streams_started", 0) < result.requests:
            raise BenchError(f"fewer ext_proc streams than requests: {delta} vs {result}")
        # Every request evaluated and passed, against a fresh snapshot (no failed scrape).
        if ice["passes"] < result.requests or ice["passes"] != ice["decisions"]:
            raise BenchError(f"ICE did not pass every request: {ice} vs {result.requests}")
    if ice["scrape_errors"]:
        raise BenchError(f"ICE's scrapes of the fast upstream failed: {ice}")
    return RouteRun(
        route="direct" if direct else "ice",
        wrk=result,
        ice_cpu_s=ice1 - ice0,
        envoy_cpu_s=envoy1 - envoy0,
        other_cpu_s=max(0.0, (busy1 - busy0) - ours),
        ext_proc=delta,
    )


def start_py_spy(out: Path, pid: int, duration_s: int) -> subprocess.Popen[str]:
    """Sample ICE's processes (native frames too) for the measured run: collapsed stacks."""
    exe = Path(sys.executable).parent / "py-spy"
    if not exe.exists():
        raise BenchError("py-spy not installed: .venv/bin/pip install py-spy")
    argv = [str(exe), "record", "--pid", str(pid), "--subprocesses", "--native"]
    argv += ["--rate", "100", "--format", "raw", "-o", str(out), "-d", str(duration_s)]
    spy = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    time.sleep(0.5)  # let it attach before the load starts
    return spy


def print_table(r: ConnResult, args: argparse.Namespace) -> None:
    d, i = r.direct.wrk, r.ice.wrk
    print(
        f"\n== {r.connections} connection(s), {args.duration} s"
        f"{f' (best of {args.repeat})' if args.repeat > 1 else ''}, ICE workers {args.workers}, "
        f"Envoy concurrency {args.envoy_concurrency}, wrk threads "
        f"{min(args.threads, r.connections)} =="
    )
    print(
        f"{'':<8}{'req/s':>10}{'p50 ms':>9}{'p99 ms':>9}{'requests':>10}{'Envoy µs/req':>14}"
        f"{'other load':>12}"
    )
    for name, w, run in (("direct", d, r.direct), ("ICE", i, r.ice)):
        print(
            f"{name:<8}{w.rps:>10.0f}{w.p50_ms:>9.3f}{w.p99_ms:>9.3f}{w.requests:>10}"
            f"{run.envoy_cpu_us_per_req:>14.0f}{run.other_cores:>7.2f} cores"
        )
    print(
        f"ratio ICE/direct {r.ratio:.3f}   added p50 {i.p50_ms - d.p50_ms:+.3f} ms   "
        f"added p99 {i.p99_ms - d.p99_ms:+.3f} ms"
    )
    busy = max(r.direct.other_cores, r.ice.other_cores)
    if busy > 0.2:
        print(f"WARNING: other processes used up to {busy:.2f} cores during these runs")
    idle = 1e3 * r.direct.ice_cpu_s / d.seconds
    print(
        f"ICE CPU {r.ice.ice_cpu_us_per_req:.0f} µs/request   "
        f"ICE idle CPU {idle:.1f} ms/s (scraper, during the direct run)"
    )
    parts = " + ".join(f"{mib:.1f} {role}" for role, mib in r.ice_rss)
    print(f"ICE RSS {r.rss_total_mib:.1f} MiB = {parts}; serving processes {r.rss_workers_mib:.1f}")


def run(args: argparse.Namespace) -> list[ConnResult]:
    if shutil.which("wrk") is None:
        raise BenchError("wrk not found: apt-get install wrk")
    for problem in check_production_config():
        print(f"WARNING: envoy/bench.yaml differs from envoy/envoy.yaml in {problem}")
    body = request_body()
    with tempfile.TemporaryDirectory(prefix="ice-bench-") as tmp, Stack(Path(tmp)) as stack:
        ingress, upstream, admin = free_port(), free_port(), free_port()
        ice_base, metrics_port = free_ports(args.workers), free_port()
        policy = write_policy(Path(tmp), f"http://127.0.0.1:{upstream}/metrics", args.endpoint_pick)
        # ICE first, so Envoy's first health check of the ice cluster finds it serving; ICE's
        # scraper reaches the fast upstream's /metrics once Envoy is up (verify_routes waits).
        ice_addresses = stack.start_ice(
            f"127.0.0.1:{ice_base}",
            policy=policy,
            workers=args.workers,
            metrics_address=f"127.0.0.1:{metrics_port}",
        )
        config = render_envoy_config(
            BENCH_YAML,
            admin_port=admin,
            listeners={"ingress": ingress, "fast_upstream": upstream},
            clusters={"ice": ice_addresses, "fast_upstream": [f"127.0.0.1:{upstream}"]},
            passthrough_paths=policy_passthrough_paths(policy),
        )
        stack.start_envoy(config, admin, concurrency=args.envoy_concurrency)
        ice_pid, envoy_pid = stack.procs["ice"].pid, stack.procs["envoy"].pid
        verify_routes(ingress, body)
        url = f"http://127.0.0.1:{ingress}{PATH}"
        results = []
        for c in args.connections:
            # Alternate the routes; keep each route's fastest run (interference only slows).
            directs, ices = [], []
            for i in range(args.repeat):
                last = c == args.connections[-1] and i == args.repeat - 1
                directs.append(
                    measure_route(args, url, c, True, ice_pid, envoy_pid, admin, metrics_port)
                )
                profile = args.py_spy if last else None
                ices.append(
                    measure_route(
                        args, url, c, False, ice_pid, envoy_pid, admin, metrics_port, profile
                    )
                )
            direct = max(directs, key=lambda r: r.wrk.rps)
            ice = max(ices, key=lambda r: r.wrk.rps)
            tree = process_tree(ice_pid)
            rss = [(role(p, ice_pid), rss_kib(p) / 1024) for p in sorted(tree)]
            result = ConnResult(c, direct, ice, rss)
            print_table(result, args)
            results.append(result)
        return results


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--duration", type=int, default=10, help="seconds per measured run")
    ap.add_argument(
        "--connections",
        type=lambda s: [int(x) for x in s.split(",") if x],
        default=[1, 8],
        help="comma-separated connection counts (default 1,8)",
    )
    ap.add_argument("--workers", type=int, default=1, help="ICE worker processes")
    ap.add_argument(
        "--envoy-concurrency", type=int, default=1, help="Envoy worker threads (default 1)"
    )
    ap.add_argument("--threads", type=int, default=1, help="wrk threads (at most connections)")
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        metavar="N",
        help="measure each route N times, alternating, and keep each one's fastest run",
    )
    ap.add_argument(
        "--settle",
        type=float,
        default=30,
        metavar="S",
        help="before each run, wait up to S seconds for an idle machine (0: do not wait)",
    )
    ap.add_argument(
        "--endpoint-pick",
        choices=("none", "ice"),
        default="none",
        help="the pool's endpoint_pick: ice places each request on one of two endpoints "
        "(the cost of picking; Envoy's bench upstream ignores the pick)",
    )
    ap.add_argument("--json", action="store_true", help="also print the results as JSON")
    ap.add_argument(
        "--py-spy",
        type=Path,
        metavar="FILE",
        help="sample ICE with py-spy during the last ICE run (collapsed stacks to FILE; "
        "summarise with bench/profile_hotpath.py --collapsed FILE)",
    )
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    try:
        results = run(args)
    except (BenchError, StackError) as e:
        print(f"bench: {e}", file=sys.stderr)
        return 1
    if args.json:
        doc = {
            "duration_s": args.duration,
            "repeat": args.repeat,
            "workers": args.workers,
            "envoy_concurrency": args.envoy_concurrency,
            "wrk_threads": args.threads,
            "results": [r.summary() for r in results],
        }
        print(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
