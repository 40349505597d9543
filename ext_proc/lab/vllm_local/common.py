"""Where the vLLM harness keeps its files, and the one error every step raises.

Invariant: every default path is under the repository root, so the harness never writes
outside the checkout (``.venv-vllm``, ``.scratch/vllm``); importing this module needs only
the standard library.
"""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "DEFAULT_MODEL_DIR",
    "DEFAULT_SCRATCH",
    "DEFAULT_VENV",
    "REPO_ROOT",
    "VllmError",
    "venv_python",
]

REPO_ROOT = Path(__file__).resolve().parents[3]
DEFAULT_VENV = REPO_ROOT / ".venv-vllm"
DEFAULT_MODEL_DIR = REPO_ROOT / ".scratch" / "vllm" / "model"
# vLLM's caches and TMPDIR (it leaves ZMQ sockets there; Unix socket paths must stay < 108 bytes).
DEFAULT_SCRATCH = REPO_ROOT / ".scratch" / "vllm" / "run"


class VllmError(RuntimeError):
    """The vLLM venv, model or server is missing, broken or did not start."""


def venv_python(venv: Path) -> Path:
    """The interpreter of ``venv`` (POSIX layout)."""
    return venv / "bin" / "python"
