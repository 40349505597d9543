"""The processes of the replicas bench: one backend, then per setting N ICE replicas + Envoy.

- ``Backend``: where the requests go and what the pool is (``block_size``,
  ``num_gpu_blocks``; ``usable_blocks`` = num_gpu_blocks − 1), and the policy every replica
  runs (rendered to scrape that backend).
- ``dev_backend(workdir, ...)``: ``ext_proc.lab.devbackend`` with a small pool set through
  ``PUT /_dev/state`` (``DEV_STATE``: 64 blocks of 16 tokens, KV usage 0, nothing running or
  waiting; the dev backend cannot turn prefix caching off: its ``cache_config_info`` always
  says ``True``, which only matters for requests of ``n`` > 1, and it exports no hit
  counters, so ICE expects no hit) and ``DEV_POLICY`` rendered for it.
- ``vllm_backend(workdir, ...)``: the overload lab's real vLLM (``ext_proc.lab.vllm_local``:
  CPU, the tiny model, 24 blocks of 128) with its policy
  (``ext_proc.lab.overload.render_policy`` of ``vllm_tiny_policy.yaml``) less
  ``truncation`` (each replica would load the embedding model; a single-turn request never
  truncates); the pool's geometry is read from vLLM's ``vllm:cache_config_info``.
- ``replicas_up(workdir, backend, n, shape, ...)``: ``n`` separate ``ice serve`` processes
  (``--workers 1``, each its own port and ``--metrics-address``; names ``ice0``...), one
  Envoy (``envoy/envoy.yaml``) whose ``ice`` cluster lists them in order, and the backend
  as its ``backend`` cluster. ``shape``: ``local`` (each replica its own ledger, Envoy's round
  robin), ``redis`` (each also ``--ledger <url>``, one Redis for all) or ``standby``
  (``render_envoy_config(..., standby_clusters=("ice",))``: the ICE cluster in priority
  levels, the first replica the active one). Yields ``Replicas``; ``Replicas.kill(i)``
  SIGKILLs replica ``i`` (its whole process group: a crash).
- ``metric_sum(url, name, **labels)``: one sample name summed on a ``/metrics`` page (ICE's
  own: passes per replica, the shared ledger's errors), None when the page is gone.
- ``shape_available(shape)``: None, or why this checkout cannot run the shape (``ice serve``
  without ``--ledger``; ``render_envoy_config`` without ``standby_clusters``).

Invariants: every process started here is stopped when its ``with`` block exits, on error and
on Ctrl-C too (``ext_proc.lab.stack.Stack``); a setting's replicas and Envoy are all stopped
before ``replicas_up`` returns, so no two settings share an ICE; the backend outlives the
settings (one vLLM start for the whole bench); ``replicas_up`` raises ``ShapeUnavailable``
before starting anything for a shape this checkout lacks; each replica is started only once
its predecessor answers gRPC health, and the setting is yielded only once every replica
judges with a known pressure (``warm``).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from ext_proc.lab.overload.burst import POLICY as VLLM_POLICY
from ext_proc.lab.overload.setup import render_policy
from ext_proc.lab.stack import (
    ENVOY_DIR,
    Stack,
    free_port,
    policy_passthrough_paths,
    render_envoy_config,
)

__all__ = [
    "BACKENDS",
    "DEV_POLICY",
    "DEV_STATE",
    "SHAPES",
    "Backend",
    "Replicas",
    "ShapeUnavailable",
    "cache_config",
    "dev_backend",
    "metric_sum",
    "replicas_up",
    "set_dev_state",
    "shape_available",
    "vllm_backend",
]

BACKENDS = ("dev", "vllm")
SHAPES = ("local", "redis", "standby")
DEV_POLICY = Path(__file__).resolve().with_name("dev_policy.yaml")
DEV_STATE: dict[str, Any] = {
    "num_gpu_blocks": 64,
    "block_size": 16,
    "kv_cache_usage_perc": 0.0,
    "num_requests_running": 0,
    "num_requests_waiting": 0,
}


class ShapeUnavailable(RuntimeError):
    """This checkout cannot run the shape (the message says what is missing)."""


@dataclass(frozen=True)
class Backend:
    """The inference backend every setting shares, its pool and the replicas' policy."""

    kind: str  # "dev" or "vllm"
    url: str  # http://127.0.0.1:PORT
    model: str
    policy: Path  # the rendered policy each replica runs
    block_size: int
    num_gpu_blocks: int
    # The longest prompt + output the backend takes (None: more than any request here needs).
    max_model_len: int | None = None

    @property
    def metrics_url(self) -> str:
        return f"{self.url}/metrics"

    @property
    def usable_blocks(self) -> int:
        """The blocks requests can hold: vLLM keeps one null block."""
        return self.num_gpu_blocks - 1

    @property
    def address(self) -> str:
        return self.url.removeprefix("http://")


def _get(url: str, timeout_s: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        return str(resp.read().decode())


def cache_config(metrics_url: str) -> tuple[int, int]:
    """``(block_size, num_gpu_blocks)`` from the ``vllm:cache_config_info`` labels of the
    page at ``metrics_url``; ValueError when the page has none."""
    for family in text_string_to_metric_families(_get(metrics_url)):
        for sample in family.samples:
            if sample.name == "vllm:cache_config_info":
                return int(sample.labels["block_size"]), int(sample.labels["num_gpu_blocks"])
    raise ValueError(f"{metrics_url}: no vllm:cache_config_info")


def metric_sum(metrics_url: str, name: str, **labels: str) -> float | None:
    """The sum of the samples named ``name`` (with ``labels``) on the page at
    ``metrics_url``; None when the page cannot be read (a replica that is gone)."""
    try:
        page = _get(metrics_url, timeout_s=2.0)
    except OSError:
        return None
    total = 0.0
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += float(sample.value)
    return total


def set_dev_state(url: str, state: dict[str, Any]) -> dict[str, Any]:
    """``PUT /_dev/state`` on the dev backend at ``url``; the state it then reports."""
    req = urllib.request.Request(
        f"{url}/_dev/state",
        data=json.dumps(state).encode(),
        method="PUT",
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=5) as resp:
        out: dict[str, Any] = json.loads(resp.read())
    return out


def _without_truncation(policy: Path) -> Path:
    """The policy at ``policy`` rewritten in place without any profile's ``truncation``."""
    doc: dict[str, Any] = yaml.safe_load(policy.read_text())
    for profile in (doc.get("profiles") or {}).values():
        profile.pop("truncation", None)
    policy.write_text(yaml.safe_dump(doc, sort_keys=False))
    return policy


@contextlib.contextmanager
def dev_backend(
    workdir: Path,
    *,
    num_gpu_blocks: int = DEV_STATE["num_gpu_blocks"],
    block_size: int = DEV_STATE["block_size"],
    policy: Path = DEV_POLICY,
) -> Iterator[Backend]:
    """The dev backend with a pool of ``num_gpu_blocks`` × ``block_size`` (idle gauges) and
    ``policy`` rendered for it (``workdir/policy.yaml``); stopped on exit."""
    workdir.mkdir(parents=True, exist_ok=True)
    with Stack(workdir / "backend") as stack:
        port = free_port()
        url = stack.start_backend(port)
        set_dev_state(
            url, {**DEV_STATE, "num_gpu_blocks": num_gpu_blocks, "block_size": block_size}
        )
        rendered = render_policy(policy, workdir / "policy.yaml", port, workdir)
        yield Backend("dev", url, "dev-model", rendered, block_size, num_gpu_blocks)


@contextlib.contextmanager
def vllm_backend(
    workdir: Path, *, policy: Path = VLLM_POLICY, vllm_args: Sequence[str] = ()
) -> Iterator[Backend]:
    """The overload lab's tiny vLLM (its log ``workdir/vllm.log``) and ``policy`` rendered for
    it, without truncation; stopped on exit (its whole process group)."""
    from ext_proc.lab import vllm_local as vl

    workdir.mkdir(parents=True, exist_ok=True)
    vl.ensure_model(vl.DEFAULT_MODEL_DIR)
    cfg = vl.ServeConfig(port=vl.free_port(), extra_args=tuple(vllm_args))
    rendered = _without_truncation(
        render_policy(policy, workdir / "policy.yaml", cfg.port, cfg.model_dir)
    )
    with vl.start_server(cfg, log_path=workdir / "vllm.log") as server:
        block_size, blocks = cache_config(f"{server.base_url}/metrics")
        yield Backend(
            "vllm",
            server.base_url,
            cfg.served_model_name,
            rendered,
            block_size,
            blocks,
            max_model_len=cfg.max_model_len,
        )


@functools.cache
def _serve_has_ledger() -> bool:
    """Whether this checkout's ``ice serve`` takes ``--ledger``."""
    out = subprocess.run(
        [sys.executable, "-m", "ext_proc.cli", "serve", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return "--ledger" in out.stdout


def _envoy_has_standby() -> bool:
    return "standby_clusters" in inspect.signature(render_envoy_config).parameters


def shape_available(shape: str) -> str | None:
    """None when this checkout can run ``shape``, else why not."""
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}: want one of {SHAPES}")
    if shape == "redis" and not _serve_has_ledger():
        return "`ice serve` has no --ledger yet (the shared Redis ledger)"
    if shape == "standby" and not _envoy_has_standby():
        return "ext_proc.lab.stack.render_envoy_config has no standby_clusters yet"
    return None


@dataclass
class Replicas:
    """One setting's processes: ``n`` ICE replicas (in the ``ice`` cluster's order) and
    Envoy in front of the backend."""

    shape: str
    stack: Stack
    names: list[str]
    addresses: list[str]
    metrics_urls: list[str]
    envoy_url: str
    admin_port: int
    ledger_url: str | None = None
    killed: list[int] = field(default_factory=list)
    stopped: list[int] = field(default_factory=list)
    policy: Path | None = None
    ice_args: tuple[str, ...] = ()

    def kill(self, index: int) -> None:
        """SIGKILL replica ``index`` (its process group), as a crash."""
        self.stack.stop(self.names[index], sig=signal.SIGKILL, timeout_s=5.0)
        self.killed.append(index)

    def freeze(self, index: int) -> None:
        """SIGSTOP replica ``index``: a hung ICE (its sockets accept, nothing answers)."""
        proc = self.stack.procs[self.names[index]]
        os.killpg(proc.pid, signal.SIGSTOP)
        self.stopped.append(index)

    def thaw(self, index: int) -> None:
        """SIGCONT a frozen replica."""
        proc = self.stack.procs[self.names[index]]
        os.killpg(proc.pid, signal.SIGCONT)
        self.stopped.remove(index)

    def restart(self, index: int) -> None:
        """Start replica ``index`` again on its address and metrics address (after ``kill``);
        returns once its gRPC health answers SERVING."""
        name = f"{self.names[index]}-again"
        metrics = self.metrics_urls[index].removeprefix("http://").removesuffix("/metrics")
        extra = [*(["--ledger", self.ledger_url] if self.ledger_url else []), *self.ice_args]
        self.stack.start_ice(
            self.addresses[index],
            policy=self.policy,
            workers=1,
            metrics_address=metrics,
            extra=extra,
            name=name,
        )
        self.names[index] = name
        self.killed.remove(index)

    def close_frozen(self) -> None:
        """Thaw what is still frozen, so that the stack's SIGTERM reaches it."""
        for index in list(self.stopped):
            with contextlib.suppress(ProcessLookupError, KeyError):
                self.thaw(index)

    def log_tails(self, lines: int = 15) -> str:
        return self.stack.log_tails(lines)


def _envoy_config(
    backend: Backend, shape: str, ice: list[str], envoy_port: int, admin_port: int
) -> dict[str, Any]:
    extra: dict[str, Any] = {"standby_clusters": ("ice",)} if shape == "standby" else {}
    return render_envoy_config(
        ENVOY_DIR / "envoy.yaml",
        admin_port=admin_port,
        listeners={"ingress": envoy_port},
        clusters={"ice": ice, "backend": [backend.address]},
        passthrough_paths=policy_passthrough_paths(backend.policy),
        **extra,
    )


_WARM_BODY = {"messages": [{"role": "user", "content": "warm up"}], "max_tokens": 1}


def warm(envoy_url: str, model: str, replicas: int, timeout_s: float = 60.0) -> None:
    """Until 2 × ``replicas`` requests in a row through Envoy came back judged with a known
    pressure (``x-mem-pressure`` other than ``unknown``): under round robin every replica has
    had one and has a view of the pool (standby: the active one). RuntimeError past
    ``timeout_s``."""
    body = json.dumps({"model": model, **_WARM_BODY}).encode()
    deadline = time.monotonic() + timeout_s
    good = 0
    last = "-"
    while good < 2 * replicas:
        if time.monotonic() > deadline:
            raise RuntimeError(f"replicas not judging after {timeout_s} s (last: {last})")
        req = urllib.request.Request(
            f"{envoy_url}/v1/chat/completions",
            data=body,
            headers={"content-type": "application/json", "x-priority": "critical"},
        )
        pressure: str | None = None
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                resp.read()
                pressure = resp.headers.get("x-mem-pressure")
                last = pressure or "no x-mem-pressure (unjudged)"
        except OSError as e:
            last = str(e)
        good = good + 1 if pressure not in (None, "", "unknown") else 0
        if good == 0:
            time.sleep(0.1)


@contextlib.contextmanager
def replicas_up(
    workdir: Path,
    backend: Backend,
    n: int,
    shape: str,
    *,
    ledger_url: str | None = None,
    ice_args: Sequence[str] = (),
) -> Iterator[Replicas]:
    """``n`` ICE replicas of ``shape`` and one Envoy in front of ``backend``; logs in
    ``workdir`` (``ice0.log``..., ``envoy.log``). ``ledger_url``: the Redis of shape
    ``redis`` (required there, refused elsewhere); ``ice_args``: more ``ice serve``
    arguments for every replica. ShapeUnavailable (before anything starts) for a shape this
    checkout lacks."""
    if n < 1:
        raise ValueError(f"replicas must be ≥ 1, not {n}")
    missing = shape_available(shape)
    if missing is not None:
        raise ShapeUnavailable(f"shape {shape}: {missing}")
    if (shape == "redis") != (ledger_url is not None):
        raise ValueError("a ledger URL goes with shape redis, and only there")
    with Stack(workdir) as stack:
        names, addresses, metrics = [], [], []
        for i in range(n):
            address, metrics_address = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
            extra = [*(["--ledger", ledger_url] if ledger_url else []), *ice_args]
            stack.start_ice(
                address,
                policy=backend.policy,
                workers=1,
                metrics_address=metrics_address,
                extra=extra,
                name=f"ice{i}",
            )
            names.append(f"ice{i}")
            addresses.append(address)
            metrics.append(f"http://{metrics_address}/metrics")
        envoy_port, admin_port = free_port(), free_port()
        stack.start_envoy(
            _envoy_config(backend, shape, addresses, envoy_port, admin_port), admin_port
        )
        envoy_url = f"http://127.0.0.1:{envoy_port}"
        warm(envoy_url, backend.model, n)
        reps = Replicas(
            shape,
            stack,
            names,
            addresses,
            metrics,
            envoy_url,
            admin_port,
            ledger_url,
            policy=backend.policy,
            ice_args=tuple(ice_args),
        )
        try:
            yield reps
        finally:
            reps.close_frozen()
