"""vLLM's own admission valve behind ICE (ext_proc.kv.valve): hand-computed figures on the
`ice plan` example in docs/kv-arithmetic.md (Llama-3.1-8B bf16, 1,952 blocks of 16 tokens,
max_model_len 20,000) and on the geometry kinds whose token ceiling differs (sliding-only,
hybrid), and a check that the recommended values never refuse what ICE itself admits.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ext_proc.kv import CapacityPlan, KVInputError, build_geometry, plan_capacity, shape_from_config
from ext_proc.kv.valve import valve_advice

DATA = Path(__file__).parents[1] / "data" / "kv"
GiB = 2**30
README_BYTES = 1952 * 2 * 2**20  # 1,952 blocks of 2 MiB (docs/kv-arithmetic.md's 3.8125GiB)


def _plan(
    name: str,
    available: int,
    max_model_len: int | None,
    **workload: Any,
) -> CapacityPlan:
    shape = shape_from_config(json.loads((DATA / f"{name}.json").read_text()))
    return plan_capacity(
        build_geometry(shape), max_model_len=max_model_len, available_bytes=available, **workload
    )


# (config, available, max_model_len, workload, dp, reqs, tokens)
CASES = [
    # docs/kv-arithmetic.md's example: avg 2000 → ceil(2000 / 16) = 125 blocks;
    # (1952 − 1) // 125 = 15 safe → 2 × 15 = 30; tokens 1952 × 16 = 31,232 (= vLLM's KV
    # cache size here).
    ("llama-3.1-8b", README_BYTES, 20000, {"avg_seq_len": 2000}, 1, 30, 31_232),
    # avg 3000 → 188 blocks; 1951 // 188 = 10 → 20.
    ("llama-3.1-8b", README_BYTES, 20000, {"avg_seq_len": 3000}, 1, 20, 31_232),
    # Two data-parallel ranks behind one API server: 2 × 2 × 15 = 60; 2 × 31,232 = 62,464.
    ("llama-3.1-8b", README_BYTES, 20000, {"avg_seq_len": 2000}, 2, 60, 62_464),
    # avg 32,000 (max_model_len 40,000): 2000 blocks > 1951 usable → safe 0 → max(1, 0) = 1
    # → 2 (one running, one waiting), never 0 (which would refuse everything).
    ("llama-3.1-8b", README_BYTES, 40000, {"avg_seq_len": 32000}, 1, 2, 31_232),
    # lengths 1, 16, 17, 100 → 11 blocks for 4: 1951 × 4 // 11 = 709 → 1418.
    ("llama-3.1-8b", README_BYTES, 20000, {"lengths": [1, 16, 17, 100]}, 1, 1418, 31_232),
    # Only max_model_len: no request count (not 2 × max(1, 1951 // 1250) = 2, the fewest
    # requests ICE ever admits); the tokens still stand.
    ("llama-3.1-8b", README_BYTES, 20000, {}, 1, None, 31_232),
    # No max_model_len either: full attention holds 1952 × 16 tokens whatever the length.
    ("llama-3.1-8b", README_BYTES, None, {}, 1, None, 31_232),
    # Mistral-7B-v0.1, all sliding W=4096, 10 GiB: 5120 blocks = 81,920 slots, but vLLM's KV
    # cache size is int(5120 / 769 × 32768) = 218,169 (a request keeps only its window):
    # the larger. avg 2000 → min(125, ceil(2000 / 16) + 1) = 125 blocks → 5119 // 125 = 40
    # → 80.
    ("mistral-7b-v0.1", 10 * GiB, 32768, {"avg_seq_len": 2000}, 1, 80, 218_169),
    # Gemma-2-9B hybrid, 20 GiB: 7801 blocks = 124,816 slots > KV cache size 62,347 (each
    # request holds a block per 16 tokens in its full group, and its sliding blocks too).
    # avg 2000 → 125 full + 125 sliding = 250 blocks → 7800 // 250 = 31 → 62.
    ("gemma-2-9b", 20 * GiB, 8192, {"avg_seq_len": 2000}, 1, 62, 124_816),
]


@pytest.mark.parametrize(
    ("name", "available", "max_model_len", "workload", "dp", "reqs", "tokens"),
    CASES,
    ids=[
        "readme-avg-2000",
        "readme-avg-3000",
        "readme-dp2",
        "avg-over-the-cache",
        "lengths",
        "max-model-len-only",
        "nothing-but-memory",
        "mistral-sliding-only",
        "gemma2-hybrid",
    ],
)
def test_valve_figures(
    name: str,
    available: int,
    max_model_len: int | None,
    workload: dict[str, Any],
    dp: int,
    reqs: int | None,
    tokens: int,
) -> None:
    valve = valve_advice(_plan(name, available, max_model_len, **workload), data_parallel_size=dp)
    assert (valve.max_num_queued_reqs, valve.max_num_queued_tokens) == (reqs, tokens)
    assert (valve.reqs_left_out is None) is (reqs is not None)
    assert valve.tokens_left_out is None


def test_sliding_only_without_max_model_len_gives_no_token_figure() -> None:
    shape = shape_from_config(json.loads((DATA / "mistral-7b-v0.1.json").read_text()))
    plan = plan_capacity(build_geometry(shape), max_model_len=None, available_bytes=10 * GiB)
    valve = valve_advice(plan)
    assert valve.max_num_queued_tokens is None and valve.tokens_per_rank is None
    assert valve.tokens_left_out is not None and "--max-model-len" in valve.tokens_left_out


def test_no_usable_block_gives_neither() -> None:
    shape = shape_from_config(json.loads((DATA / "llama-3.1-8b.json").read_text()))
    plan = plan_capacity(
        build_geometry(shape), max_model_len=16, num_blocks_override=1, avg_seq_len=16
    )
    valve = valve_advice(plan)
    assert (valve.max_num_queued_reqs, valve.max_num_queued_tokens) == (None, None)
    assert valve.reqs_left_out == valve.tokens_left_out == "no usable KV block: vLLM does not start"


def test_data_parallel_size_must_be_positive() -> None:
    plan = _plan("llama-3.1-8b", README_BYTES, 20000)
    with pytest.raises(KVInputError) as e:
        valve_advice(plan, data_parallel_size=0)
    assert e.value.field == "data_parallel_size"


@pytest.mark.parametrize(
    ("name", "available", "max_model_len"),
    [
        ("llama-3.1-8b", README_BYTES, 20000),
        ("mistral-7b-v0.1", 10 * GiB, 32768),
        ("gemma-2-9b", 20 * GiB, 8192),
    ],
    ids=["full", "sliding-only", "hybrid"],
)
def test_the_token_valve_never_refuses_what_ice_admits(
    name: str, available: int, max_model_len: int
) -> None:
    # ICE (kv_hold: done) admits k = (num_blocks − 1) // blocks(L) requests of L tokens; their
    # prompts (at most L − 1: one output token) all awaiting prefill at once stay below T, the
    # count vLLM compares with ≥, for every L up to max_model_len.
    plan = _plan(name, available, max_model_len)
    tokens = valve_advice(plan).max_num_queued_tokens
    assert tokens is not None
    g, budget = plan.geometry, plan.num_blocks - 1
    worst = max(
        budget // g.blocks_for_tokens(length) * (length - 1)
        for length in range(2, max_model_len + 1)
    )
    assert worst < tokens
