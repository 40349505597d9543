"""The stack and the comparison: vLLM, ICE and Envoy started together; the burst run each way.

- ``render_policy``: a policy template pointed at this vLLM's ``/metrics`` and its tokenizer.
- ``queue_policy``: a policy with the admission queue (``queue:``) on in every profile.
- ``overload_setup``: start ``vllm serve`` (``ext_proc.lab.vllm_local``: CPU, the tiny model, 24 KV
  blocks of 128 tokens), ICE with the rendered policy and real Envoy in front of vLLM
  (``ext_proc.lab.stack``); with ``queue=True`` also a second ICE with ``queue_policy`` of it
  behind a second Envoy (its own listener and admin port); ``ice_workers`` worker processes
  per ICE; ``valve``: vLLM started with that admission valve (``arms.Valve``), recorded in
  ``Setup.valve``; free ports unless given; ``warm_up`` unless ``warm=False``; yields a
  ``Setup``.
- ``compare``: ``rounds`` × (the burst in each of ``modes``: direct, ice, queue; then each
  control burst of ``controls`` in each mode), the order rotated by one per round (with two
  modes: alternating, as before); each run labelled with the setup's valve. Several vLLM
  configs (valves) are ``sweep``'s job: one setup, and one ``compare``, per config.

Invariants:

- every process ``overload_setup`` starts (vLLM's whole process group, both ICEs, both Envoys)
  is stopped when its ``with`` block exits, on error and on Ctrl-C too;
- the queue policy is loaded in this process before anything starts: an ICE that does not
  know ``queue`` fails ``overload_setup(queue=True)`` at once (``QueuePolicyError``), and
  without ``queue`` nothing of it is rendered or started;
- each run of ``compare`` starts with vLLM idle (nothing running or waiting on two samples in
  a row) and uses fresh prompt text (seeded per round, mode and control), so no run inherits
  another's queue or prefix cache; the plan (sizes, priorities, tenants, schedule) is the same
  for every mode;
- a ``Setup``'s valve is the one its vLLM was started with, so a run's label cannot name
  another; ``vllm_args`` that set a valve flag themselves are refused (``ValueError``);
- vLLM runs in its own venv as a subprocess: importing this needs ICE's dependencies only.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import sys
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ext_proc.lab import vllm_local as vl
from ext_proc.lab.overload.arms import Valve, valve_in_args
from ext_proc.lab.overload.burst import (
    CHAT,
    DEFAULT_MODES,
    MODES,
    POLICY,
    TENANT_HEADER,
    TTFT_SLO_S,
    VLLM_ARGS,
    VLLM_NICE,
    Planned,
)
from ext_proc.lab.overload.metrics import wait_idle
from ext_proc.lab.overload.policies import (
    MAX_TENANTS,
    QUEUE_LENGTH,
    QUEUE_WAIT_MS,
    QueuePolicyError,
    admission_policy,
    check_queue_policy,
    queue_policy,
    render_policy,
)
from ext_proc.lab.overload.results import one_line
from ext_proc.lab.overload.run import RunResult, run_burst
from ext_proc.lab.stack import (
    ENVOY_DIR,
    Stack,
    free_port,
    policy_passthrough_paths,
    render_envoy_config,
)

__all__ = [
    "MAX_TENANTS",
    "QUEUE_LENGTH",
    "QUEUE_WAIT_MS",
    "QueuePolicyError",
    "Setup",
    "admission_policy",
    "compare",
    "overload_setup",
    "queue_policy",
    "render_policy",
    "warm_up",
]

# Each mode's share of a run's prompt seed (fresh text per mode, round and control).
_SEED = {"direct": 0, "ice": 50_000, "queue": 25_000}


def _free_runs(counts: Sequence[int]) -> list[int]:
    """For each count, a first port of that many free ports in a row (ICE's workers listen on
    port, port + 1, ...), no two runs overlapping."""
    taken: set[int] = set()
    out: list[int] = []
    for count in counts:
        while True:
            base = free_port()
            run = set(range(base, base + count))
            if run & taken or not all(_port_free(p) for p in run - {base}):
                continue
            taken |= run
            out.append(base)
            break
    return out


def _port_free(port: int) -> bool:
    import socket

    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@dataclass
class Setup:
    """A real vLLM and, in front of it, Envoy with ICE (and, for the queue mode, a second
    Envoy with an ICE whose profiles queue)."""

    vllm_url: str
    envoy_url: str
    admin_port: int
    model: str
    stack: Stack
    vllm: vl.VllmServer
    ice_address: str = ""
    policy: Path = POLICY  # the rendered policy ICE runs with
    ice_metrics_url: str | None = None  # ICE's own /metrics
    # The queue mode (None: not started): its Envoy, admin port, ICE's /metrics and policy.
    queue_url: str | None = None
    queue_admin_port: int | None = None
    queue_ice_metrics_url: str | None = None
    queue_policy: Path | None = None
    ice_workers: int = 1
    valve: Valve | None = None  # vLLM's admission valve (None: started without one)

    @property
    def metrics_url(self) -> str:
        return f"{self.vllm_url}/metrics"

    def target(self, mode: str) -> tuple[str, int | None, str | None]:
        """Where ``mode``'s burst goes: (base URL, Envoy admin port, ICE's /metrics URL);
        ValueError for an unknown mode, or the queue mode of a setup started without it."""
        if mode == "direct":
            return self.vllm_url, None, None
        if mode == "ice":
            return self.envoy_url, self.admin_port, self.ice_metrics_url
        if mode == "queue":
            if self.queue_url is None:
                raise ValueError("mode queue: overload_setup(..., queue=True) was not asked")
            return self.queue_url, self.queue_admin_port, self.queue_ice_metrics_url
        raise ValueError(f"unknown mode {mode!r}: want one of {MODES}")

    def log_tails(self, lines: int = 20) -> str:
        return self.stack.log_tails(lines, extra={"vllm": self.vllm.log_path})


@contextlib.contextmanager
def overload_setup(
    workdir: Path,
    *,
    policy: Path = POLICY,
    vllm_args: Sequence[str] = VLLM_ARGS,
    vllm_nice: int = VLLM_NICE,
    vllm_port: int | None = None,
    ice_address: str | None = None,
    envoy_port: int | None = None,
    admin_port: int | None = None,
    warm: bool = True,
    ice_workers: int = 1,
    queue: bool = False,
    queue_wait_ms: int = QUEUE_WAIT_MS,
    queue_length: int = QUEUE_LENGTH,
    tenant_header: str = TENANT_HEADER,
    queue_critical: str = "pass",
    valve: Valve | None = None,
    history: Sequence[Planned] = (),
    serve: vl.ServeConfig | None = None,
) -> Iterator[Setup]:
    """Start vLLM (tiny model, 24 blocks), ICE with ``policy`` and Envoy; stop all on exit.

    ``queue``: also ICE with ``queue_policy`` of the rendered policy (``queue_wait_ms``,
    ``queue_length``, ``tenant_header``, ``queue_critical``) behind a second Envoy
    (``Setup.queue_url``); raises ``QueuePolicyError`` before starting anything when that
    policy does not load.
    ``ice_workers``: ICE's ``--workers`` (each ICE; Envoy balances over them). ``valve``:
    ``vllm serve`` also gets ``valve.vllm_args`` (ValueError when ``vllm_args`` set a valve
    flag themselves: the runs' labels would not say so). ``serve``: this vLLM instead of the
    tiny model's (``ext_proc.lab.gpupool.serve_config``; ``vllm_args`` and the valve are
    added to its own, its port kept). Ports not given
    are free ones (``ice_address``: the first worker's; the others follow it). Logs
    (``vllm.log``, ``ice.log``, ``envoy.log``, ``ice-queue.log``, ``envoy-queue.log``) and the
    rendered policies go to ``workdir``. ``warm``: one short request each way first, then wait
    until vLLM is idle.
    """
    own = valve_in_args(vllm_args)
    if own is not None:
        raise ValueError(f"vllm_args set the admission valve ({own}): give it as valve=")
    workdir.mkdir(parents=True, exist_ok=True)
    extra = (*vllm_args, *(valve.vllm_args if valve else ()))
    if serve is None:
        vl.ensure_model(vl.DEFAULT_MODEL_DIR)
        cfg = vl.ServeConfig(port=vllm_port or vl.free_port(), extra_args=extra)
    else:
        cfg = dataclasses.replace(serve, extra_args=(*serve.extra_args, *extra))
    rendered = render_policy(policy, workdir / "policy.yaml", cfg.port, cfg.model_dir)
    queued: Path | None = None
    if queue:
        queued = queue_policy(
            rendered,
            workdir / "policy-queue.yaml",
            queue_wait_ms,
            queue_length,
            tenant_header,
            critical=queue_critical,
        )
        check_queue_policy(queued)
    with (
        vl.start_server(cfg, log_path=workdir / "vllm.log") as server,
        Stack(workdir) as stack,
    ):
        if vllm_nice:
            # Every thread of vLLM's process group (API server, engine core, worker).
            os.setpriority(os.PRIO_PGRP, server.proc.pid, vllm_nice)
        backend = [f"127.0.0.1:{cfg.port}"]
        ice_port, queue_port = _free_runs([ice_workers, ice_workers])
        ice_address = ice_address or f"127.0.0.1:{ice_port}"
        ice_metrics = f"127.0.0.1:{free_port()}"
        ice = stack.start_ice(
            ice_address, policy=rendered, workers=ice_workers, metrics_address=ice_metrics
        )
        envoy_port = envoy_port or free_port()
        admin_port = admin_port or free_port()
        config = render_envoy_config(
            ENVOY_DIR / "envoy.yaml",
            admin_port=admin_port,
            listeners={"ingress": envoy_port},
            clusters={"ice": ice, "backend": backend},
            passthrough_paths=policy_passthrough_paths(rendered),
        )
        stack.start_envoy(config, admin_port)
        queue_url = queue_admin = queue_metrics = None
        if queued is not None:
            queue_metrics = f"127.0.0.1:{free_port()}"
            queue_ice = stack.start_ice(
                f"127.0.0.1:{queue_port}",
                policy=queued,
                workers=ice_workers,
                metrics_address=queue_metrics,
                name="ice-queue",
            )
            queue_envoy, queue_admin = free_port(), free_port()
            queue_config = render_envoy_config(
                ENVOY_DIR / "envoy.yaml",
                admin_port=queue_admin,
                listeners={"ingress": queue_envoy},
                clusters={"ice": queue_ice, "backend": backend},
                passthrough_paths=policy_passthrough_paths(queued),
            )
            stack.start_envoy(queue_config, queue_admin, name="envoy-queue")
            queue_url = f"http://127.0.0.1:{queue_envoy}"
        setup = Setup(
            vllm_url=server.base_url,
            envoy_url=f"http://127.0.0.1:{envoy_port}",
            admin_port=admin_port,
            model=cfg.served_model_name,
            stack=stack,
            vllm=server,
            ice_address=ice_address,
            policy=rendered,
            ice_metrics_url=f"http://{ice_metrics}/metrics",
            queue_url=queue_url,
            queue_admin_port=queue_admin,
            queue_ice_metrics_url=None
            if queue_metrics is None
            else f"http://{queue_metrics}/metrics",
            queue_policy=queued,
            ice_workers=ice_workers,
            valve=valve,
        )
        if warm:
            warm_up(setup)
        if history:
            prime(setup, history)
        yield setup


def warm_up(setup: Setup) -> None:
    """One short request each way (first-request costs; each ICE's first verdict), then
    idle."""
    body = json.dumps(
        {
            "model": setup.model,
            "messages": [{"role": "user", "content": "warm up"}],
            "max_tokens": 4,
        }
    ).encode()
    bases = [setup.vllm_url, setup.envoy_url]
    if setup.queue_url is not None:
        bases.append(setup.queue_url)
    for base in bases:
        req = urllib.request.Request(
            base + CHAT, data=body, headers={"content-type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=60) as resp:
            resp.read()
    wait_idle(setup.metrics_url)


def prime(setup: Setup, history: Sequence[Planned]) -> None:
    """Send ``history`` straight to vLLM (results dropped) and wait until it is idle: a
    server that has been serving such traffic, so its ``vllm:request_generation_tokens``
    holds the lengths the forecast reads (a fresh server has none, and the forecast then
    holds every request at its limit until ``forecast.min_observations`` finish)."""
    asyncio.run(
        run_burst(
            mode="direct",
            round_no=0,
            target=setup.vllm_url,
            metrics_url=setup.metrics_url,
            burst=history,
            model=setup.model,
            seed=987_654,
            variant="history",
        )
    )
    wait_idle(setup.metrics_url)


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def compare(
    setup: Setup,
    burst: Sequence[Planned],
    *,
    rounds: int,
    sample_s: float = 0.1,
    modes: Sequence[str] = DEFAULT_MODES,
    progress: Callable[[str], None] | None = _to_stderr,
    ttft_slo_s: float = TTFT_SLO_S,
    controls: Mapping[str, Sequence[Planned]] | None = None,
    seed_offset: int = 0,
) -> list[RunResult]:
    """``rounds`` × (the burst in each of ``modes``, then each of ``controls`` (variant name →
    a burst, e.g. ``{"light alone": alone(burst, "light")}``) in each of ``modes``); the order
    of those runs is rotated by one per round (two runs: alternating).

    ``progress`` gets one line per finished run (default: stderr; None: silent);
    ``ttft_slo_s``: the time-to-first-token SLO of each run's goodput; ``seed_offset``: added
    to every run's prompt seed (``sweep`` gives each vLLM config its own). Each run carries
    ``setup.valve`` (``RunResult.valve``).
    """
    valve = setup.valve.name if setup.valve else ""
    for mode in modes:
        setup.target(mode)  # an unknown mode, or queue without it, fails before any run
    jobs: list[tuple[str, str, Sequence[Planned], int]] = [(m, "", burst, 0) for m in modes]
    for k, (variant, control) in enumerate((controls or {}).items()):
        jobs += [(m, variant, control, 5_000 * (k + 1)) for m in modes]
    results: list[RunResult] = []
    for r in range(rounds):
        shift = r % len(jobs) if jobs else 0
        for mode, variant, planned, offset in jobs[shift:] + jobs[:shift]:
            wait_idle(setup.metrics_url)
            target, admin_port, ice_metrics_url = setup.target(mode)
            seed = seed_offset + 100_000 * (r + 1) + _SEED[mode] + offset
            result = asyncio.run(
                run_burst(
                    mode=mode,
                    round_no=r + 1,
                    target=target,
                    metrics_url=setup.metrics_url,
                    burst=planned,
                    model=setup.model,
                    seed=seed,
                    sample_s=sample_s,
                    admin_port=admin_port,
                    ice_metrics_url=ice_metrics_url,
                    ttft_slo_s=ttft_slo_s,
                    variant=variant,
                    valve=valve,
                )
            )
            results.append(result)
            if progress is not None:
                progress(f"[overload] round {r + 1} {result.label}: {one_line(result)}")
    wait_idle(setup.metrics_url)
    return results
