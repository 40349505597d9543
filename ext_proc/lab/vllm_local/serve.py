"""``serve``: ``vllm serve`` of the tiny model, offline on loopback, with a small KV cache.

``serve_command`` gives the argv and environment; ``start_server`` runs them in a new process
group, waits for ``/health`` and stops the group on exit; ``VllmServer.close`` is that stop.

Invariants: the server listens on 127.0.0.1 only and never reaches the network
(``HF_HUB_OFFLINE``, ``TRANSFORMERS_OFFLINE``, no usage stats); every cache, temporary file and
socket it makes is under ``ServeConfig.scratch``; the KV cache is sized by ``num_gpu_blocks``
alone (nothing from the caller's environment resizes it); after ``close`` no process of the
group is left.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from ext_proc.lab.stack import free_port, signals_deferred
from ext_proc.lab.vllm_local.common import (
    DEFAULT_MODEL_DIR,
    DEFAULT_SCRATCH,
    DEFAULT_VENV,
    VllmError,
)
from ext_proc.lab.vllm_local.install import venv_ready
from ext_proc.lab.vllm_local.model import model_ready

__all__ = [
    "ServeConfig",
    "VllmServer",
    "free_port",
    "serve_command",
    "start_server",
]


@dataclass(frozen=True)
class ServeConfig:
    """``vllm serve`` of the tiny model with a KV cache of ``num_gpu_blocks`` blocks.

    24 blocks of 128 tokens hold 3,072 tokens (``kv_cache_size_tokens``), of which 23 blocks are
    usable: the pool keeps one null block, and ``kv_cache_usage_perc`` is used / 23. vLLM
    refuses to start unless ``max_model_len`` fits in those (2,944 starts, 2,945 does not);
    2,048 gives the logged maximum concurrency 24 / 16 = 1.50x. Twenty concurrent requests of
    ~1,000 prompt + 200 output tokens run two at a time and queue (see ``record.OVERLOAD_RUNS``).
    """

    model_dir: Path = DEFAULT_MODEL_DIR
    port: int = 8000
    host: str = "127.0.0.1"
    served_model_name: str = "tiny"
    max_model_len: int = 2048
    num_gpu_blocks: int = 24
    block_size: int = 128
    # An explicit KV size skips the CPU worker's start-up check that
    # `--gpu-memory-utilization` (0.92) of the NUMA node's memory is free (it fails on a
    # shared 2-core machine) and its warm-up pass; the block override then sizes the cache.
    # None: no flag (an executor that answers ``determine_available_memory`` itself sizes it).
    kv_cache_memory_bytes: int | None = 64 * 2**20
    venv: Path = DEFAULT_VENV
    scratch: Path = DEFAULT_SCRATCH
    extra_args: tuple[str, ...] = ()
    # Set in vLLM's environment after everything else (``ext_proc.lab.gpupool``'s spec file).
    env: tuple[tuple[str, str], ...] = ()

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def kv_cache_tokens(self) -> int:
        return self.num_gpu_blocks * self.block_size


# Variables that must not reach vLLM from the caller's environment: an empty
# VLLM_CPU_KVCACHE_SPACE crashes start-up; a set one would resize the cache we pin.
_DROPPED_ENV = ("VLLM_CPU_KVCACHE_SPACE",)


def serve_command(
    cfg: ServeConfig, base_env: Mapping[str, str] | None = None
) -> tuple[list[str], dict[str, str]]:
    """The argv and environment that start ``vllm serve`` for ``cfg`` (offline, one scratch)."""
    argv = [
        str(cfg.venv / "bin" / "vllm"),
        "serve",
        str(cfg.model_dir),
        "--host",
        cfg.host,
        "--port",
        str(cfg.port),
        "--served-model-name",
        cfg.served_model_name,
        "--enforce-eager",
        "--max-model-len",
        str(cfg.max_model_len),
        "--block-size",
        str(cfg.block_size),
        "--num-gpu-blocks-override",
        str(cfg.num_gpu_blocks),
        *(
            ()
            if cfg.kv_cache_memory_bytes is None
            else ("--kv-cache-memory-bytes", str(cfg.kv_cache_memory_bytes))
        ),
        *cfg.extra_args,
    ]
    env = {k: v for k, v in (os.environ if base_env is None else base_env).items()}
    for key in _DROPPED_ENV:
        env.pop(key, None)
    scratch = str(cfg.scratch)
    env.update(
        {
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "HF_HOME": str(cfg.scratch / "hf"),
            "VLLM_CACHE_ROOT": scratch,
            "TORCHINDUCTOR_CACHE_DIR": scratch,
            "TMPDIR": scratch,
            "VLLM_TARGET_DEVICE": "cpu",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "PATH": os.pathsep.join([str(cfg.venv / "bin"), env.get("PATH", "")]),
        }
    )
    env.pop("VIRTUAL_ENV", None)
    env.update(dict(cfg.env))
    return argv, env


@dataclass
class VllmServer:
    """A running ``vllm serve``; ``close`` stops its whole process group."""

    cfg: ServeConfig
    proc: subprocess.Popen[bytes]
    log_path: Path
    startup_s: float = 0.0

    @property
    def base_url(self) -> str:
        return self.cfg.base_url

    def close(self, timeout_s: float = 20.0) -> None:
        with signals_deferred():  # a second stop signal must not leave the server running
            self._close(timeout_s)

    def _close(self, timeout_s: float) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout_s)
        # The engine core is a child in the same group: make sure nothing is left behind.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        for entry in self.cfg.scratch.iterdir() if self.cfg.scratch.is_dir() else ():
            if entry.is_socket() or entry.name.startswith("vllm_dist_"):
                entry.unlink(missing_ok=True)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def _http_status(url: str, timeout_s: float = 2.0) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as e:
        e.close()
        return int(e.code)
    except OSError:
        return None


@contextlib.contextmanager
def start_server(
    cfg: ServeConfig, *, log_path: Path | None = None, timeout_s: float = 300.0
) -> Iterator[VllmServer]:
    """Start ``vllm serve`` for ``cfg``, wait for ``/health`` to answer 200, stop it on exit."""
    if not venv_ready(cfg.venv):
        raise VllmError(f"{cfg.venv} is not installed: python -m ext_proc.lab.vllm_local install")
    if not model_ready(cfg.model_dir):
        raise VllmError(
            f"no model at {cfg.model_dir}: python -m ext_proc.lab.vllm_local build-model"
        )
    cfg.scratch.mkdir(parents=True, exist_ok=True)
    log_path = log_path or cfg.scratch / f"vllm-{cfg.port}.log"
    argv, env = serve_command(cfg)
    t0 = time.monotonic()
    with log_path.open("wb") as log, signals_deferred():  # started: then stopped
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        server = VllmServer(cfg, proc, log_path)
    try:
        deadline = t0 + timeout_s
        while True:
            if proc.poll() is not None:
                tail = "".join(server.log_text().splitlines(keepends=True)[-40:])
                raise VllmError(f"vllm serve exited with {proc.returncode}:\n{tail}")
            if _http_status(f"{cfg.base_url}/health") == 200:
                break
            if time.monotonic() > deadline:
                raise VllmError(f"vllm serve not healthy after {timeout_s} s; log {log_path}")
            time.sleep(0.25)
        server.startup_s = time.monotonic() - t0
        yield server
    finally:
        server.close()
