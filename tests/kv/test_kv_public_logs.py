"""KV arithmetic against figures printed by real vLLM servers in public logs.

vLLM rounds what it prints (sizes to 0.01 GiB, concurrency to 0.01x), so each case shows the
exact available-bytes range that yields the printed block count, checks both ends of it print
as the log did, and asserts the rest at the printed precision.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ext_proc.kv import (
    KVGeometry,
    build_geometry,
    format_gib,
    parse_size,
    plan_capacity,
    shape_from_config,
)

DATA = Path(__file__).parents[1] / "data" / "kv"


def _llama31_8b_geometry() -> KVGeometry:
    shape = shape_from_config(json.loads((DATA / "llama-3.1-8b.json").read_text()))
    return build_geometry(shape, block_size=16)


# vLLM issue 10517 (RTX 3090, Llama-3.1-8B-Instruct, bf16, block 16), two start-ups:
#   kv_cache_size=3.81GiB → "# GPU blocks: 1952" → "Maximum concurrency for 20000 tokens per
#   request: 1.56x"
#   kv_cache_size=2.89GiB → "# GPU blocks: 1478" → "… for 29000 tokens per request: 0.82x" and
#   "max seq len (29000) is larger than the maximum number of tokens that can be stored in KV
#   cache (23648)"
# Geometry: 2 (K,V) × 32 layers × 8 KV heads × 128 head_dim × 2 B = 131,072 B per token;
# a 16-token block = 2,097,152 B (2 MiB).
# 1952 blocks ⇔ available ∈ [1952 × 2 MiB, 1953 × 2 MiB) = [4,093,640,704, 4,095,737,856)
#   = [3.8125, 3.8145) GiB, printed "3.81" at both ends.
#   concurrency = 1952 / ceil(20000 / 16) = 1952 / 1250 = 1.5616 → "1.56x";
#   tokens = 1952 × 16 = 31,232 = int(1.5616 × 20000).
# 1478 blocks ⇔ available ∈ [3,099,590,656, 3,101,687,808) = [2.8867, 2.8887) GiB → "2.89".
#   concurrency = 1478 / ceil(29000 / 16) = 1478 / 1813 = 0.8152 → "0.82x";
#   token slots = 1478 × 16 = 23,648 < 29,000, so one max-length request does not fit.
@pytest.mark.parametrize(
    (
        "printed_gib",
        "max_model_len",
        "blocks",
        "printed_concurrency",
        "token_slots",
        "fits",
    ),
    [
        ("3.81", 20000, 1952, "1.56", 31232, True),
        ("2.89", 29000, 1478, "0.82", 23648, False),
    ],
    ids=["issue10517-20k", "issue10517-29k"],
)
def test_llama31_8b_rtx3090(
    printed_gib: str,
    max_model_len: int,
    blocks: int,
    printed_concurrency: str,
    token_slots: int,
    fits: bool,
) -> None:
    geometry = _llama31_8b_geometry()
    assert geometry.bytes_per_token == 131_072
    assert geometry.bytes_per_block == 2 * 2**20
    low, high = blocks * 2 * 2**20, (blocks + 1) * 2 * 2**20  # the exact range [low, high)
    for available in (low, high - 1):
        assert format_gib(available) == printed_gib
        plan = plan_capacity(geometry, max_model_len=max_model_len, available_bytes=available)
        assert plan.num_blocks == blocks
        assert f"{plan.max_concurrency:.2f}" == printed_concurrency
        assert plan.token_slots == token_slots
        assert plan.fits_max_model_len is fits
    assert plan_capacity(
        geometry, max_model_len=max_model_len, available_bytes=high
    ).num_blocks == (blocks + 1)


def test_printed_gib_alone_is_not_exact() -> None:
    # floor(3.81 × 2^30) = 4,090,956,349 B gives 1950 blocks, not the logged 1952: the log's
    # "3.81GiB" is a rounded print of 3.8125..3.8145 GiB, so assert ranges, never the print.
    plan = plan_capacity(
        _llama31_8b_geometry(), max_model_len=20000, available_bytes=parse_size("3.81GiB")
    )
    assert plan.num_blocks == 1950


# vLLM PR 13596 (the change to token-count logging) shows one start-up both ways:
#   "# GPU blocks: 127626" / "Maximum concurrency for 2048 tokens per request: 997.08x" became
#   "GPU KV cache size: 2,042,016 tokens" / "… for 2,048 tokens per request: 997.08x".
# Model not stated, so only the block → token → concurrency rules are checked, with the
# geometry of Llama-3.1-8B (any 16-token block gives the same figures):
#   tokens = 127626 × 16 = 2,042,016; concurrency = 127626 / ceil(2048 / 16) = 127626 / 128
#   = 997.078 → "997.08x"; int(997.078125 × 2048) = 2,042,016.
def test_pr13596_blocks_tokens_concurrency() -> None:
    plan = plan_capacity(_llama31_8b_geometry(), max_model_len=2048, num_blocks_override=127626)
    assert plan.token_slots == 2_042_016
    assert plan.kv_cache_tokens == 2_042_016
    assert f"{plan.max_concurrency:.2f}" == "997.08"
