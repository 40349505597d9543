"""Capacity figures (blocks, tokens, concurrency, longest request, safe sequences,
fragmentation) for public model geometries, hand-computed. No public start-up log backs these
cases (those are in test_kv_public_logs.py): they pin vLLM 0.32's formulas on each geometry
kind (MHA, sliding-only, MLA, hybrid sliding/full, tensor-parallel, fp8).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ext_proc.kv import (
    CapacityPlan,
    KVInputError,
    available_kv_bytes,
    build_geometry,
    fragmentation,
    plan_capacity,
    shape_from_config,
)

DATA = Path(__file__).parents[1] / "data" / "kv"
GiB = 2**30


def _plan(name: str, available: int, max_model_len: int, **geometry_options: Any) -> CapacityPlan:
    shape = shape_from_config(json.loads((DATA / f"{name}.json").read_text()))
    geometry = build_geometry(shape, **geometry_options)
    return plan_capacity(geometry, max_model_len=max_model_len, available_bytes=available)


# (config, options, available, max_model_len, blocks, blocks per request, printed concurrency,
#  kv_cache_tokens, estimated max model len (None: unbounded))
CAPACITY_CASES = [
    # Llama-2-7B fp16 MHA: block 8 MiB; 20 GiB // 8 MiB = 2560 blocks; 4096 / 16 = 256 per
    # request → 10.00x; int(10 × 4096) = 40,960 tokens; longest = (2560 − 1) × 16 = 40,944.
    ("llama-2-7b", {}, 20 * GiB, 4096, 2560, 256, "10.00", 40_960, 40_944),
    # Llama-3.1-8B fp8 KV: block 1 MiB, so the 1952-block memory of the RTX 3090 log holds
    # 3904 blocks; 3904 / 1250 = 3.1232 → "3.12x"; int(3.1232 × 20000) = 62,464 tokens.
    (
        "llama-3.1-8b",
        {"kv_dtype": "fp8"},
        1952 * 2 * 2**20,
        20000,
        3904,
        1250,
        "3.12",
        62_464,
        3903 * 16,
    ),
    # Qwen2-7B at tp=2: block 458,752 B per rank; 10 GiB per rank // 458,752 = 23,405 blocks;
    # 32768 / 16 = 2048 per request → 11.428 → "11.43x"; int(11.42822265625 × 32768) = 374,480;
    # longest (23,405 − 1) × 16 = 374,464.
    ("qwen2-7b-instruct", {"tp": 2}, 10 * GiB, 32768, 23_405, 2048, "11.43", 374_480, 374_464),
    # Mistral-7B-v0.1, all sliding W=4096: block 2 MiB; 10 GiB → 5120 blocks; per request
    # ceil(min(4095 + 8192, 32768) / 16) + 1 = 768 + 1 = 769 → 5120 / 769 = 6.658 → "6.66x";
    # int(6.657997… × 32768) = 218,169; a bounded window always fits: longest unbounded.
    ("mistral-7b-v0.1", {}, 10 * GiB, 32768, 5120, 769, "6.66", 218_169, None),
    # …with vLLM 0.32's 2 in-flight batches: ceil(20479 / 16) + 1 = 1281 → 3.997 → "4.00x";
    # int(3.99687… × 32768) = 130,969.
    (
        "mistral-7b-v0.1",
        {"in_flight_batches": 2},
        10 * GiB,
        32768,
        5120,
        1281,
        "4.00",
        130_969,
        None,
    ),
    # DeepSeek-V2-Lite MLA bf16: block 497,664 B; 10 GiB // 497,664 = 21,575 blocks;
    # 163840 / 16 = 10,240 per request → 2.1069 → "2.11x"; int(2.10693359375 × 163840) =
    # 345,200; longest (21,575 − 1) × 16 = 345,184.
    ("deepseek-v2-lite", {}, 10 * GiB, 163840, 21_575, 10_240, "2.11", 345_200, 345_184),
    # Gemma-2-9B: pool block 2,752,512 B (21 layers); 20 GiB → 7801 blocks; per request at
    # 8192: full 512 + sliding ceil(min(12287, 8192) / 16) + 1 = 513 → 1025; 7801 / 1025 =
    # 7.6107 → "7.61x"; int(7.6107… × 8192) = 62,347. Longest L: ceil(L/16) + 769 ≤ 7800 →
    # L = 7031 × 16 = 112,496.
    ("gemma-2-9b", {}, 20 * GiB, 8192, 7801, 1025, "7.61", 62_347, 112_496),
    # …hybrid manager off: one 42-layer group, block 5,505,024 → 3900 blocks; 512 per
    # request → 7.6171875 → "7.62x"; int(7.6171875 × 8192) = 62,400; longest 3899 × 16.
    (
        "gemma-2-9b",
        {"hybrid_kv_cache_manager": False},
        20 * GiB,
        8192,
        3900,
        512,
        "7.62",
        62_400,
        62_384,
    ),
    # Gemma-3-27B: pool block 1,310,720 B (10 layers); 40 GiB → 32,768 blocks; per request at
    # 131072: full 8192 + 6 sliding × (ceil(9215 / 16) + 1 = 577) = 11,654 → 2.8117 → "2.81x";
    # int(2.81173845… × 131072) = 368,540. Longest: ceil(L/16) ≤ 32,767 − 3462 = 29,305 →
    # L = 468,880.
    ("gemma-3-27b-it", {}, 40 * GiB, 131072, 32_768, 11_654, "2.81", 368_540, 468_880),
    # gpt-oss-20b: pool block 393,216 B; 10 GiB → 27,306 blocks; per request at 131072:
    # 8192 + ceil(8319 / 16) + 1 = 8192 + 521 = 8713 → 3.1339 → "3.13x"; int(3.13393… ×
    # 131072) = 410,771. Longest: ceil(L/16) ≤ 27,305 − 521 = 26,784 → 428,544.
    ("gpt-oss-20b", {}, 10 * GiB, 131072, 27_306, 8713, "3.13", 410_771, 428_544),
]


@pytest.mark.parametrize(
    (
        "name",
        "options",
        "available",
        "max_model_len",
        "blocks",
        "per_request",
        "concurrency",
        "tokens",
        "longest",
    ),
    CAPACITY_CASES,
    ids=[
        "llama2-7b-mha",
        "llama31-8b-fp8",
        "qwen2-7b-tp2",
        "mistral-sliding",
        "mistral-sliding-async",
        "deepseek-v2-lite-mla",
        "gemma2-hybrid",
        "gemma2-hybrid-off",
        "gemma3-hybrid",
        "gpt-oss-hybrid",
    ],
)
def test_capacity(
    name: str,
    options: dict[str, object],
    available: int,
    max_model_len: int,
    blocks: int,
    per_request: int,
    concurrency: str,
    tokens: int,
    longest: int | None,
) -> None:
    plan = _plan(name, available, max_model_len, **options)
    assert plan.num_blocks == blocks
    assert plan.blocks_per_request == per_request
    assert f"{plan.max_concurrency:.2f}" == concurrency
    assert plan.kv_cache_tokens == tokens
    assert plan.estimated_max_model_len == longest
    assert plan.bytes_needed_for_max_model_len == per_request * plan.geometry.bytes_per_block
    assert plan.fits_max_model_len is (per_request <= blocks - 1)


def test_estimated_max_model_len_is_the_largest_that_fits() -> None:
    plan = _plan("gemma-3-27b-it", 40 * GiB, 131072)
    g, longest = plan.geometry, plan.estimated_max_model_len
    assert longest is not None
    assert g.max_blocks_per_request(longest) <= plan.num_blocks - 1
    assert g.max_blocks_per_request(longest + 1) > plan.num_blocks - 1


def test_too_little_memory_for_one_block() -> None:
    plan = _plan("llama-3.1-8b", 2 * 2**20 - 1, 8192)
    assert (plan.num_blocks, plan.max_concurrency, plan.estimated_max_model_len) == (0, 0.0, 0)
    assert plan.fits_max_model_len is False


@pytest.mark.parametrize(
    ("avg", "lengths", "safe", "frag"),
    [
        # 1952 blocks, 1951 usable; avg 3000 → ceil(3000/16) = 188 blocks → 1951 // 188 = 10;
        # waste = 188 × 16 − 3000 = 8 of 3008 slots.
        (3000, None, 10, 8 / 3008),
        # avg 16 → 1 block each: 1951 sequences, no waste.
        (16, None, 1951, 0.0),
        # lengths 1, 16, 17, 100 → blocks 1, 1, 2, 7 = 11 for 4 sequences:
        # safe = 1951 × 4 // 11 = 709; slots 16 + 16 + 32 + 112 = 176, used 134 → 42 / 176.
        (None, [1, 16, 17, 100], 709, 42 / 176),
        # both: avg decides the sequence count, lengths the fragmentation.
        (3000, [1, 16, 17, 100], 10, 42 / 176),
    ],
    ids=["avg-3000", "avg-one-block", "lengths", "avg-and-lengths"],
)
def test_safe_sequences_and_fragmentation(
    avg: int | None, lengths: list[int] | None, safe: int, frag: float
) -> None:
    shape = shape_from_config(json.loads((DATA / "llama-3.1-8b.json").read_text()))
    plan = plan_capacity(
        build_geometry(shape),
        max_model_len=20000,
        available_bytes=1952 * 2 * 2**20,
        avg_seq_len=avg,
        lengths=lengths,
    )
    assert plan.max_num_seqs_safe == safe
    assert plan.fragmentation == pytest.approx(frag)


def test_fragmentation_formula() -> None:
    assert fragmentation([], 16) == 0.0
    assert fragmentation([16, 32], 16) == 0.0
    assert fragmentation([1], 16) == pytest.approx(15 / 16)
    assert fragmentation([129], 128) == pytest.approx(127 / 256)


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"kv_memory": 3 * GiB}, 3 * GiB),
        # floor(80 GiB × 9 / 10) − 17 GiB = 85,899,345,920 × 0.9 = 77,309,411,328 − 18,253,611,008
        (
            {"gpu_memory": 80 * GiB, "gpu_memory_utilization": "0.9", "non_kv_memory": 17 * GiB},
            77_309_411_328 - 17 * GiB,
        ),
        ({"gpu_memory": 24 * GiB, "gpu_memory_utilization": "1", "non_kv_memory": 0}, 24 * GiB),
    ],
    ids=["kv-memory", "gpu-form", "util-one"],
)
def test_available_kv_bytes(kwargs: dict[str, object], expected: int) -> None:
    assert available_kv_bytes(**kwargs) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({}, "kv_memory"),
        ({"kv_memory": 1, "gpu_memory": 2}, "kv_memory"),
        ({"gpu_memory": 80 * GiB}, "gpu_memory_utilization"),
        ({"gpu_memory": 80 * GiB, "gpu_memory_utilization": "0.9"}, "non_kv_memory"),
        ({"gpu_memory_utilization": "0.9", "non_kv_memory": 1}, "gpu_memory"),
        (
            {"gpu_memory": 1, "gpu_memory_utilization": "1.5", "non_kv_memory": 0},
            "gpu_memory_utilization",
        ),
        (
            {"gpu_memory": 1, "gpu_memory_utilization": "abc", "non_kv_memory": 0},
            "gpu_memory_utilization",
        ),
        (
            {"gpu_memory": 20 * GiB, "gpu_memory_utilization": "0.9", "non_kv_memory": 20 * GiB},
            "kv_memory",
        ),
        ({"kv_memory": 0}, "kv_memory"),
    ],
    ids=[
        "nothing",
        "both-forms",
        "no-util",
        "no-non-kv",
        "no-gpu",
        "util-over-one",
        "util-text",
        "nothing-left",
        "zero",
    ],
)
def test_available_kv_bytes_errors(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(KVInputError) as err:
        available_kv_bytes(**kwargs)  # type: ignore[arg-type]
    assert err.value.field == field


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_model_len": 0, "available_bytes": GiB}, "max_model_len"),
        ({"max_model_len": 100}, "kv_memory"),
        ({"max_model_len": 100, "num_blocks_override": 0}, "num_gpu_blocks_override"),
        ({"max_model_len": 100, "available_bytes": GiB, "avg_seq_len": 101}, "avg_seq_len"),
        ({"max_model_len": 100, "available_bytes": GiB, "lengths": []}, "lengths"),
        ({"max_model_len": 100, "available_bytes": GiB, "lengths": [5, 0]}, "lengths"),
    ],
    ids=["mml-zero", "no-memory", "override-zero", "avg-over-mml", "no-lengths", "zero-length"],
)
def test_plan_errors(kwargs: dict[str, object], field: str) -> None:
    shape = shape_from_config(json.loads((DATA / "llama-3.1-8b.json").read_text()))
    with pytest.raises(KVInputError) as err:
        plan_capacity(build_geometry(shape), **kwargs)  # type: ignore[arg-type]
    assert err.value.field == field
