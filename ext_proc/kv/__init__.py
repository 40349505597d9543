"""KV-cache arithmetic for vLLM-style servers: a pure core with no I/O (stdlib only).

Modules, each with one job (formulas in their docstrings):

- ``units``: "3.81GiB" → exact bytes.
- ``hfconfig``: a Hugging Face config.json dict → ``ModelShape`` (layers, heads, head_dim,
  MLA, per-layer sliding windows, derived max_model_len); refuses hybrids it cannot model.
- ``geometry``: ``ModelShape`` + tp / KV dtype / block size → frozen ``KVGeometry`` (bytes per
  token and block, vLLM's layer groups) with the per-request ``blocks_for_tokens`` and
  ``request_blocks`` the evaluator calls.
- ``capacity``: ``KVGeometry`` + memory → ``CapacityPlan`` (blocks, tokens, concurrency,
  longest request, safe sequence count, fragmentation) as vLLM computes and logs them.
- ``valve``: ``CapacityPlan`` → ``ValveAdvice``, vLLM's own admission valve
  (``--max-num-queued-reqs``, ``--max-num-queued-tokens``) sized to sit behind ICE.
- ``cli``: ``ice plan``.

Errors: ``KVInputError`` (``field`` names the input), ``NotModelledError`` (a recognised cache
that is not modelled, e.g. Mamba hybrids) — never a silently wrong number.
"""

from __future__ import annotations

from ext_proc.kv.capacity import CapacityPlan, available_kv_bytes, fragmentation, plan_capacity
from ext_proc.kv.errors import KVInputError, NotModelledError
from ext_proc.kv.geometry import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    KVGeometry,
    KVGroup,
    blocks_for_tokens,
    build_geometry,
    kv_dtype_bytes,
)
from ext_proc.kv.hfconfig import ModelShape, shape_from_config, shape_from_numbers
from ext_proc.kv.units import format_gib, parse_size

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "DEFAULT_MAX_NUM_BATCHED_TOKENS",
    "CapacityPlan",
    "KVGeometry",
    "KVGroup",
    "KVInputError",
    "ModelShape",
    "NotModelledError",
    "available_kv_bytes",
    "blocks_for_tokens",
    "build_geometry",
    "format_gib",
    "fragmentation",
    "kv_dtype_bytes",
    "parse_size",
    "plan_capacity",
    "shape_from_config",
    "shape_from_numbers",
]
