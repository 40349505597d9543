"""KV arithmetic against a real vLLM 0.32 CPU server (recorded in tests/data/vllm_cpu/).

The server ran the 2-layer random-weight Llama of tests/data/kv/tiny-llama-vllm-cpu.json
(hidden 256, 4 heads, 2 KV heads → head_dim 64, bfloat16) with block_size 128,
kv_cache_memory_bytes 64 MiB, num_gpu_blocks_override 24, max_model_len 2048.
Hand-computed: 2 (K,V) × 2 KV heads × 64 × 2 B = 512 B per token per layer; a 128-token block
over both layers = 2 × 512 × 128 = 131,072 B; 64 MiB // 131,072 = 512 blocks (the log's
"Overriding num_gpu_blocks=512"); overridden to 24: concurrency 24 / ceil(2048 / 128) =
24 / 16 = 1.5; KV cache size int(1.5 × 2048) = 3,072 tokens.

Skipped while the recording is absent.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

import pytest

from ext_proc.kv import build_geometry, format_gib, plan_capacity, shape_from_config

HERE = Path(__file__).parents[1] / "data"
STARTUP_LOG = HERE / "vllm_cpu" / "startup.log"
METRICS = HERE / "vllm_cpu" / "metrics_idle.txt"
MODEL_CONFIG = HERE / "kv" / "tiny-llama-vllm-cpu.json"

pytestmark = pytest.mark.skipif(
    not (STARTUP_LOG.exists() and METRICS.exists()),
    reason="vLLM CPU recording (tests/data/vllm_cpu/startup.log, metrics_idle.txt) not present",
)


def _server_args(log: str) -> dict[str, Any]:
    m = re.search(r"non-default args: (\{.*\})", log)
    assert m, "no 'non-default args' line in startup.log"
    args: dict[str, Any] = ast.literal_eval(m.group(1))
    return args


def _cache_config_labels(metrics: str) -> dict[str, str]:
    m = re.search(r"^vllm:cache_config_info\{(.*)\}", metrics, re.MULTILINE)
    assert m, "no vllm:cache_config_info sample in metrics_idle.txt"
    return dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))


def test_matches_the_cpu_server() -> None:
    log = STARTUP_LOG.read_text()
    args = _server_args(log)
    labels = _cache_config_labels(METRICS.read_text())
    override = re.search(r"Overriding num_gpu_blocks=(\d+) with num_gpu_blocks_override=(\d+)", log)
    size = re.search(
        r"KV cache size: ([\d,]+) tokens, Maximum concurrency for ([\d,]+) tokens per request: "
        r"([\d.]+)x",
        log,
    )
    assert override and size

    shape = shape_from_config(json.loads(MODEL_CONFIG.read_text()))
    geometry = build_geometry(
        shape, block_size=int(labels["block_size"]), kv_dtype=labels["cache_dtype"]
    )
    assert geometry.block_size == args["block_size"] == 128
    assert geometry.bytes_per_block == 131_072
    max_model_len = int(size.group(2).replace(",", ""))
    assert max_model_len == args["max_model_len"] == 2048

    from_memory = plan_capacity(
        geometry, max_model_len=max_model_len, available_bytes=args["kv_cache_memory_bytes"]
    )
    assert from_memory.num_blocks == int(override.group(1)) == 512
    assert format_gib(args["kv_cache_memory_bytes"]) == "0.06"  # "Explicitly set (0.06/…) GiB"

    plan = plan_capacity(
        geometry,
        max_model_len=max_model_len,
        available_bytes=args["kv_cache_memory_bytes"],
        num_blocks_override=int(labels["num_gpu_blocks_override"]),
    )
    assert plan.num_blocks == int(labels["num_gpu_blocks"]) == int(override.group(2)) == 24
    assert plan.kv_cache_tokens == int(labels["kv_cache_size_tokens"]) == 3072
    assert f"{plan.kv_cache_tokens:,}" == size.group(1)
    assert plan.max_concurrency == float(labels["kv_cache_max_concurrency"]) == 1.5
    assert f"{plan.max_concurrency:.2f}" == size.group(3)
