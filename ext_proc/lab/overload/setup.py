"""The stack and the comparison: vLLM, ICE and Envoy started together; the burst run both ways.

- ``render_policy``: a policy template pointed at this vLLM's ``/metrics`` and its tokenizer.
- ``overload_setup``: start ``vllm serve`` (``ext_proc.lab.vllm_local``: CPU, the tiny model, 24 KV
  blocks of 128 tokens), ICE with the rendered policy and real Envoy in front of vLLM
  (``ext_proc.lab.stack``); free ports unless given; ``warm_up`` unless ``warm=False``; yields a
  ``Setup``.
- ``compare``: ``rounds`` × (the burst direct, the burst through ICE), order alternating.

Invariants:

- every process ``overload_setup`` starts (vLLM's whole process group, ICE, Envoy) is stopped
  when its ``with`` block exits, on error and on Ctrl-C too;
- each run of ``compare`` starts with vLLM idle (nothing running or waiting on two samples in
  a row) and uses fresh prompt text (seeded per round and mode), so no run inherits another's
  queue or prefix cache; the plan (sizes, priorities, schedule) is the same for both modes;
- vLLM runs in its own venv as a subprocess: importing this needs ICE's dependencies only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ext_proc.lab import vllm_local as vl
from ext_proc.lab.overload.burst import CHAT, MODES, POLICY, VLLM_ARGS, VLLM_NICE, Planned
from ext_proc.lab.overload.metrics import wait_idle
from ext_proc.lab.overload.results import one_line
from ext_proc.lab.overload.run import RunResult, run_burst
from ext_proc.lab.stack import (
    ENVOY_DIR,
    Stack,
    free_port,
    policy_passthrough_paths,
    render_envoy_config,
)

__all__ = ["Setup", "compare", "overload_setup", "render_policy", "warm_up"]


def render_policy(template: Path, out: Path, vllm_port: int, model_dir: Path) -> Path:
    """``template`` with its pools scraping ``vllm_port`` and its tokenizers at ``model_dir``."""
    policy: dict[str, Any] = yaml.safe_load(template.read_text())
    for pool in policy.get("pools", {}).values():
        pool["metrics_urls"] = [f"http://127.0.0.1:{vllm_port}/metrics"]
    for spec in (policy.get("tokenizers") or {}).values():
        if "model_dir" in spec:
            spec["model_dir"] = str(model_dir)
    out.write_text(yaml.safe_dump(policy, sort_keys=False))
    return out


@dataclass
class Setup:
    """A real vLLM and, in front of it, Envoy with ICE."""

    vllm_url: str
    envoy_url: str
    admin_port: int
    model: str
    stack: Stack
    vllm: vl.VllmServer
    ice_address: str = ""
    policy: Path = POLICY  # the rendered policy ICE runs with
    ice_metrics_url: str | None = None  # ICE's own /metrics

    @property
    def metrics_url(self) -> str:
        return f"{self.vllm_url}/metrics"

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
) -> Iterator[Setup]:
    """Start vLLM (tiny model, 24 blocks), ICE with ``policy`` and Envoy; stop all on exit.

    Ports not given are free ones. Logs (``vllm.log``, ``ice.log``, ``envoy.log``) and the
    rendered policy go to ``workdir``. ``warm``: one short request each way first, then wait
    until vLLM is idle.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    vl.ensure_model(vl.DEFAULT_MODEL_DIR)
    cfg = vl.ServeConfig(port=vllm_port or vl.free_port(), extra_args=tuple(vllm_args))
    with (
        vl.start_server(cfg, log_path=workdir / "vllm.log") as server,
        Stack(workdir) as stack,
    ):
        if vllm_nice:
            # Every thread of vLLM's process group (API server, engine core, worker).
            os.setpriority(os.PRIO_PGRP, server.proc.pid, vllm_nice)
        rendered = render_policy(policy, workdir / "policy.yaml", cfg.port, cfg.model_dir)
        ice_address = ice_address or f"127.0.0.1:{free_port()}"
        ice_metrics = f"127.0.0.1:{free_port()}"
        ice = stack.start_ice(ice_address, policy=rendered, metrics_address=ice_metrics)
        envoy_port = envoy_port or free_port()
        admin_port = admin_port or free_port()
        config = render_envoy_config(
            ENVOY_DIR / "envoy.yaml",
            admin_port=admin_port,
            listeners={"ingress": envoy_port},
            clusters={"ice": ice, "backend": [f"127.0.0.1:{cfg.port}"]},
            passthrough_paths=policy_passthrough_paths(rendered),
        )
        stack.start_envoy(config, admin_port)
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
        )
        if warm:
            warm_up(setup)
        yield setup


def warm_up(setup: Setup) -> None:
    """One short request each way (first-request costs; ICE's first verdict), then idle."""
    body = json.dumps(
        {
            "model": setup.model,
            "messages": [{"role": "user", "content": "warm up"}],
            "max_tokens": 4,
        }
    ).encode()
    for base in (setup.vllm_url, setup.envoy_url):
        req = urllib.request.Request(
            base + CHAT, data=body, headers={"content-type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=60) as resp:
            resp.read()
    wait_idle(setup.metrics_url)


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def compare(
    setup: Setup,
    burst: Sequence[Planned],
    *,
    rounds: int,
    sample_s: float = 0.1,
    modes: Sequence[str] = MODES,
    progress: Callable[[str], None] | None = _to_stderr,
) -> list[RunResult]:
    """``rounds`` × (the burst direct, the burst through ICE); order alternates per round.

    ``progress`` gets one line per finished run (default: stderr; None: silent).
    """
    results: list[RunResult] = []
    for r in range(rounds):
        order = list(modes) if r % 2 == 0 else list(modes)[::-1]
        for mode in order:
            wait_idle(setup.metrics_url)
            target = setup.vllm_url if mode == "direct" else setup.envoy_url
            seed = 100_000 * (r + 1) + (0 if mode == "direct" else 50_000)
            result = asyncio.run(
                run_burst(
                    mode=mode,
                    round_no=r + 1,
                    target=target,
                    metrics_url=setup.metrics_url,
                    burst=burst,
                    model=setup.model,
                    seed=seed,
                    sample_s=sample_s,
                    admin_port=setup.admin_port if mode == "ice" else None,
                    ice_metrics_url=setup.ice_metrics_url if mode == "ice" else None,
                )
            )
            results.append(result)
            if progress is not None:
                progress(f"[overload] round {r + 1} {mode}: {one_line(result)}")
    wait_idle(setup.metrics_url)
    return results
