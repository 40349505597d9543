"""A GPU-shaped vLLM pool on this CPU: vLLM's own API server, scheduler, KV cache manager,
preemption and ``/metrics`` at a real model's geometry, with the forward pass timed, not run.

- ``timing``: the modelled GPU step time (a roofline with its constants and their sources).
- ``pool``: ``PoolSpec`` (model, TP, GPU, vLLM options, dilation k), its KV blocks from ICE's
  own arithmetic (``ext_proc.kv``), the served model folder and the ``vllm serve`` config.
- ``fit``: a fitted step time (``timing.FittedStep``) from a real vLLM's logged steps.
- ``executor``: the vLLM ``Executor`` that runs no model (imported by vLLM only, in its venv).

docs/gpu-pool.md says what is real, what is modelled and how. Invariant: importing this package
needs ICE's own dependencies only (``executor`` is not imported here).
"""

from ext_proc.lab.gpupool.pool import (
    ACTIVATION_BYTES,
    CONFIG_DIR,
    EXECUTOR,
    MODELS,
    SPEC_ENV,
    PoolSpec,
    cpu_tiny,
    load_config,
    serve_config,
    write_served_model,
)
from ext_proc.lab.gpupool.timing import (
    CPU_TINY,
    H100_SXM,
    Chunk,
    FittedStep,
    GpuSpec,
    ModelCost,
    Pacer,
    StepTime,
    fitted_step_time,
    step_time,
)

__all__ = [
    "ACTIVATION_BYTES",
    "CONFIG_DIR",
    "CPU_TINY",
    "EXECUTOR",
    "H100_SXM",
    "MODELS",
    "SPEC_ENV",
    "Chunk",
    "FittedStep",
    "GpuSpec",
    "ModelCost",
    "Pacer",
    "PoolSpec",
    "StepTime",
    "cpu_tiny",
    "fitted_step_time",
    "load_config",
    "serve_config",
    "step_time",
    "write_served_model",
]
