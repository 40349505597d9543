"""Cross-check against vLLM's own KV-cache code (vllm/v1/core/kv_cache_utils.py, 0.32).

Runs only where the local vLLM environment exists (``.venv-vllm``, see FACTS.md; git-ignored,
so skipped elsewhere). A subprocess builds vLLM's per-layer specs (FullAttentionSpec,
SlidingWindowSpec, MLAAttentionSpec) for each geometry, lets vLLM group them
(``get_kv_cache_groups``), size the pool block (``_get_kv_cache_bytes_per_block``), compute the
concurrency (``get_max_concurrency_for_kv_cache_config``) and the longest request
(``_estimate_max_model_len_from_groups``), and the results must equal ``ext_proc.kv``'s.
About 8 s (importing vLLM).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from ext_proc.kv import build_geometry, plan_capacity, shape_from_config

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
DATA = Path(__file__).parents[1] / "data" / "kv"
GiB = 2**30

pytestmark = pytest.mark.skipif(
    not VLLM_PYTHON.exists(), reason="no local vLLM environment (.venv-vllm)"
)

_DRIVER = r"""
import json, sys
from types import SimpleNamespace as NS
import torch, vllm
if not vllm.__version__.startswith("0.32"):
    print(json.dumps({"skip": vllm.__version__})); sys.exit(0)
import vllm.v1.core.kv_cache_utils as u
from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec, MLAAttentionSpec
from vllm.v1.kv_cache_layout import KVCacheLayout

def config(mml, in_flight, hybrid_off):
    return NS(
        scheduler_config=NS(disable_hybrid_kv_cache_manager=hybrid_off,
                            max_num_batched_tokens=in_flight),
        cache_config=NS(get_resolved_kv_cache_layout=lambda: KVCacheLayout.LBHNC,
                        num_gpu_blocks_override=None, prefix_cache_retention_interval=0),
        attention_config=NS(hisparse_config=None),
        model_config=NS(max_model_len=mml, original_max_model_len=mml),
        parallel_config=NS(decode_context_parallel_size=1, tensor_parallel_size=1),
        max_in_flight_tokens=in_flight, speculative_config=None,
        num_prefill_lookahead_tokens=0,
    )

dtypes = {1: torch.uint8, 2: torch.bfloat16, 4: torch.float32}
out = []
for c in json.load(sys.stdin):
    bs, dt = c["block_size"], dtypes[c["dtype_bytes"]]
    specs = {}
    for i, w in enumerate(c["windows"]):
        if c["mla"]:
            s = MLAAttentionSpec(block_size=bs, num_kv_heads=1, head_size=c["head_dim"], dtype=dt)
        elif w is None:
            s = FullAttentionSpec(block_size=bs, num_kv_heads=c["kv_heads"],
                                  head_size=c["head_dim"], dtype=dt)
        else:
            s = SlidingWindowSpec(block_size=bs, num_kv_heads=c["kv_heads"],
                                  head_size=c["head_dim"], dtype=dt, sliding_window=w)
        specs[f"layers.{i}"] = s
    cfg = config(c["max_model_len"], c["in_flight"], c["hybrid_off"])
    groups = u.get_kv_cache_groups(cfg, dict(specs))
    bpb = u._get_kv_cache_bytes_per_block(groups, KVCacheLayout.LBHNC)
    blocks = c["available"] // bpb
    kvc = NS(num_blocks=blocks, kv_cache_groups=groups, hisparse_host_num_blocks=None)
    conc = u.get_max_concurrency_for_kv_cache_config(cfg, kvc)
    search = config(c["search_limit"], c["in_flight"], c["hybrid_off"])
    est = u._estimate_max_model_len_from_groups(search, groups, c["available"] - bpb)
    out.append({"groups": len(groups), "bytes_per_block": bpb, "num_blocks": blocks,
                "max_concurrency": conc, "estimated_max_model_len": est})
print(json.dumps(out))
"""

# (config, tp, kv_dtype, block_size, in_flight_batches, hybrid manager, max_model_len, available)
CASES: list[tuple[str, int, str, int, int, bool, int, int]] = [
    ("llama-3.1-8b", 1, "auto", 16, 1, True, 20000, 1952 * 2 * 2**20),
    ("llama-3.1-8b", 8, "fp8", 16, 1, True, 131072, 30 * GiB),
    ("llama-2-7b", 1, "auto", 32, 1, True, 4096, 20 * GiB),
    ("qwen2-1.5b-instruct", 4, "auto", 16, 1, True, 32768, 5 * GiB),
    ("mistral-7b-v0.1", 1, "auto", 16, 1, True, 32768, 10 * GiB),
    ("mistral-7b-v0.1", 1, "auto", 16, 2, True, 32768, 10 * GiB),
    ("deepseek-v2-lite", 2, "auto", 64, 1, True, 163840, 10 * GiB),
    ("gemma-2-9b", 1, "auto", 16, 1, True, 8192, 20 * GiB),
    ("gemma-2-9b", 1, "auto", 16, 1, False, 8192, 20 * GiB),
    ("gemma-3-27b-it", 2, "auto", 16, 1, True, 131072, 40 * GiB),
    ("gemma-3-27b-it", 1, "fp8", 16, 2, False, 131072, 40 * GiB),
    ("gpt-oss-20b", 1, "auto", 16, 1, True, 131072, 10 * GiB),
]
SEARCH_LIMIT = 10_000_000  # vLLM searches up to max_model_len; ours is uncapped


def _ours(case: tuple[str, int, str, int, int, bool, int, int]) -> tuple[dict[str, Any], Any]:
    name, tp, kv_dtype, block_size, in_flight, hybrid, mml, available = case
    shape = shape_from_config(json.loads((DATA / f"{name}.json").read_text()))
    g = build_geometry(
        shape,
        tp=tp,
        kv_dtype=kv_dtype,
        block_size=block_size,
        in_flight_batches=in_flight,
        hybrid_kv_cache_manager=hybrid,
    )
    request = {
        "windows": list(shape.layer_windows),
        "mla": shape.mla,
        "kv_heads": g.kv_heads_per_rank,
        "head_dim": g.head_dim,
        "dtype_bytes": g.kv_dtype_bytes,
        "block_size": block_size,
        "in_flight": in_flight * 8192,
        "hybrid_off": not hybrid,
        "max_model_len": mml,
        "available": available,
        "search_limit": SEARCH_LIMIT,
    }
    return request, plan_capacity(g, max_model_len=mml, available_bytes=available)


def test_matches_vllm_kv_cache_utils() -> None:
    requests, plans = zip(*(_ours(c) for c in CASES), strict=True)
    proc = subprocess.run(
        [str(VLLM_PYTHON), "-c", _DRIVER],
        input=json.dumps(requests),
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        cwd="/",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    if isinstance(results, dict):
        pytest.skip(f"local vLLM is {results['skip']}, not 0.32")
    for case, plan, vllm in zip(CASES, plans, results, strict=True):
        ours = {
            "groups": len(plan.geometry.groups),
            "bytes_per_block": plan.geometry.bytes_per_block,
            "num_blocks": plan.num_blocks,
            "max_concurrency": plan.max_concurrency,
            "estimated_max_model_len": (
                SEARCH_LIMIT
                if plan.estimated_max_model_len is None
                else min(plan.estimated_max_model_len, SEARCH_LIMIT)
            ),
        }
        assert ours == vllm, case
