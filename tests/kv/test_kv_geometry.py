"""KV geometry from public config.json excerpts (tests/data/kv), hand-computed.

Bytes are per tensor-parallel rank. Full attention: 2 (K,V) × kv_heads_per_rank × head_dim ×
dtype bytes per token per layer; MLA: 1 × (kv_lora_rank + qk_rope_head_dim) × dtype bytes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ext_proc.kv import (
    KVGroup,
    KVInputError,
    NotModelledError,
    blocks_for_tokens,
    build_geometry,
    shape_from_config,
    shape_from_numbers,
)

DATA = Path(__file__).parents[1] / "data" / "kv"


def _config(name: str) -> dict[str, Any]:
    cfg: dict[str, Any] = json.loads((DATA / f"{name}.json").read_text())
    return cfg


# (config, tp, kv_dtype, attention, kv_heads_per_rank, head_dim, layer bytes/token, bytes/token,
#  bytes per 16-token pool block)
GEOMETRY_CASES = [
    # Llama-3.1-8B: GQA 8 KV heads, 128 dims, bf16: 2×8×128×2 = 4096 B/layer; ×32 = 131,072;
    # block = 32 × 4096 × 16 = 2,097,152.
    ("llama-3.1-8b", 1, "auto", "GQA", 8, 128, 4096, 131_072, 2_097_152),
    # fp8 KV halves it: 2×8×128×1 = 2048; ×32 = 65,536; block 1,048,576.
    ("llama-3.1-8b", 1, "fp8", "GQA", 8, 128, 2048, 65_536, 1_048_576),
    ("llama-3.1-8b", 1, "fp8_e5m2", "GQA", 8, 128, 2048, 65_536, 1_048_576),
    # fp32 KV doubles it: 2×8×128×4 = 8192; ×32 = 262,144.
    ("llama-3.1-8b", 1, "float32", "GQA", 8, 128, 8192, 262_144, 4_194_304),
    # tp=8: 8 // 8 = 1 KV head per rank: 2×1×128×2 = 512; ×32 = 16,384; block 262,144.
    ("llama-3.1-8b", 8, "auto", "GQA", 1, 128, 512, 16_384, 262_144),
    # Llama-2-7B: MHA 32 KV heads, fp16: 2×32×128×2 = 16,384; ×32 = 524,288; block 8 MiB.
    ("llama-2-7b", 1, "auto", "MHA", 32, 128, 16_384, 524_288, 8_388_608),
    # Qwen2-7B: 28 heads, 4 KV heads, head_dim 3584/28 = 128, bf16.
    # tp=1: 2×4×128×2 = 2048; ×28 layers = 57,344; block 28 × 2048 × 16 = 917,504.
    ("qwen2-7b-instruct", 1, "auto", "GQA", 4, 128, 2048, 57_344, 917_504),
    # tp=2: 2 KV heads per rank: 1024; ×28 = 28,672; block 458,752.
    ("qwen2-7b-instruct", 2, "auto", "GQA", 2, 128, 1024, 28_672, 458_752),
    # tp=4: 1 per rank: 512; ×28 = 14,336; block 229,376.
    ("qwen2-7b-instruct", 4, "auto", "GQA", 1, 128, 512, 14_336, 229_376),
    # Qwen2-1.5B: 12 heads, 2 KV heads, head_dim 1536/12 = 128. tp=4 > 2 KV heads: each rank
    # keeps max(1, 2 // 4) = 1 replicated head: 512 B/layer; ×28 = 14,336 (same as tp=2).
    ("qwen2-1.5b-instruct", 2, "auto", "GQA", 1, 128, 512, 14_336, 229_376),
    ("qwen2-1.5b-instruct", 4, "auto", "GQA", 1, 128, 512, 14_336, 229_376),
    # DeepSeek-V2-Lite MLA: latent 512 + 64 = 576, no K/V factor: 576 × 2 = 1152 B/layer;
    # ×27 = 31,104; block 27 × 1152 × 16 = 497,664 — the same on every rank at tp=2.
    ("deepseek-v2-lite", 1, "auto", "MLA", 1, 576, 1152, 31_104, 497_664),
    ("deepseek-v2-lite", 2, "auto", "MLA", 1, 576, 1152, 31_104, 497_664),
    ("deepseek-v2-lite", 1, "fp8", "MLA", 1, 576, 576, 15_552, 248_832),
    # Gemma-2-9B: head_dim 256, 8 KV heads; the checkpoint is float32 but vLLM's "auto"
    # serves it in 16 bits: 2×8×256×2 = 8192; ×42 = 344,064. Pool block = 21 layers (the
    # widest group: 21 sliding + 21 full → 2 groups of 21) × 8192 × 16 = 2,752,512.
    ("gemma-2-9b", 1, "auto", "GQA", 8, 256, 8192, 344_064, 2_752_512),
    # Gemma-3-27B (text_config): 16 KV heads × 128: 8192 B/layer; ×62 = 507,904; pool block
    # = 10 layers (widest group) × 8192 × 16 = 1,310,720.
    ("gemma-3-27b-it", 1, "auto", "GQA", 16, 128, 8192, 507_904, 1_310_720),
    # gpt-oss-20b: 8 KV heads × 64, bf16: 2048 B/layer; ×24 = 49,152; 12 sliding + 12 full →
    # 2 groups of 12: block = 12 × 2048 × 16 = 393,216.
    ("gpt-oss-20b", 1, "auto", "GQA", 8, 64, 2048, 49_152, 393_216),
    # Mistral-7B-v0.1: every layer slides → one group of 32: like Llama-3.1-8B.
    ("mistral-7b-v0.1", 1, "auto", "GQA", 8, 128, 4096, 131_072, 2_097_152),
]


@pytest.mark.parametrize(
    (
        "name",
        "tp",
        "kv_dtype",
        "attention",
        "kv_heads_per_rank",
        "head_dim",
        "layer_bpt",
        "bytes_per_token",
        "bytes_per_block",
    ),
    GEOMETRY_CASES,
    ids=[f"{c[0]}-tp{c[1]}-{c[2]}" for c in GEOMETRY_CASES],
)
def test_geometry_from_public_configs(
    name: str,
    tp: int,
    kv_dtype: str,
    attention: str,
    kv_heads_per_rank: int,
    head_dim: int,
    layer_bpt: int,
    bytes_per_token: int,
    bytes_per_block: int,
) -> None:
    g = build_geometry(shape_from_config(_config(name)), tp=tp, kv_dtype=kv_dtype, block_size=16)
    assert g.attention == attention
    assert g.kv_heads_per_rank == kv_heads_per_rank
    assert g.head_dim == head_dim
    assert g.layer_bytes_per_token == layer_bpt
    assert g.bytes_per_token == bytes_per_token
    assert g.bytes_per_block == bytes_per_block
    assert g.page_bytes == layer_bpt * 16


# (config, expected groups, full groups, sliding spans with the defaults 8192 × 1)
GROUP_CASES = [
    ("llama-3.1-8b", (KVGroup(None, 32),), 1, ()),
    # Qwen2: sliding_window 131072 is ignored because use_sliding_window is false.
    ("qwen2-7b-instruct", (KVGroup(None, 28),), 1, ()),
    # Mistral-7B-v0.1: all 32 layers slide over 4096 → one sliding group; span 4095 + 8192.
    ("mistral-7b-v0.1", (KVGroup(4096, 32),), 0, (12287,)),
    # Gemma-2: even layers slide (21), odd are full (21); 21 < 1.5 × 21 → group size 21.
    ("gemma-2-9b", (KVGroup(4096, 21), KVGroup(None, 21)), 1, (12287,)),
    # Gemma-3: full where (i + 1) % 6 == 0 → 10 full, 52 sliding; 52 ≥ 1.5 × 10 → group size
    # 10; 52 sliding layers → ceil(52 / 10) = 6 groups dealt round-robin: 9, 9, 9, 9, 8, 8.
    (
        "gemma-3-27b-it",
        (
            KVGroup(1024, 9),
            KVGroup(1024, 9),
            KVGroup(1024, 9),
            KVGroup(1024, 9),
            KVGroup(1024, 8),
            KVGroup(1024, 8),
            KVGroup(None, 10),
        ),
        1,
        (9215,) * 6,
    ),
    # gpt-oss: layer_types alternate, sliding first → 12 + 12.
    ("gpt-oss-20b", (KVGroup(128, 12), KVGroup(None, 12)), 1, (8319,)),
]


@pytest.mark.parametrize(
    ("name", "groups", "full_groups", "spans"),
    GROUP_CASES,
    ids=[c[0] for c in GROUP_CASES],
)
def test_layer_groups(
    name: str, groups: tuple[KVGroup, ...], full_groups: int, spans: tuple[int, ...]
) -> None:
    g = build_geometry(shape_from_config(_config(name)))
    assert g.groups == groups
    assert g.num_full_groups == full_groups
    assert g.sliding_spans == spans


def test_disabled_hybrid_manager_allocates_sliding_layers_as_full() -> None:
    # Gemma-2 with --disable-hybrid-kv-cache-manager: one group of all 42 layers,
    # block = 42 × 8192 × 16 = 5,505,024.
    g = build_geometry(shape_from_config(_config("gemma-2-9b")), hybrid_kv_cache_manager=False)
    assert g.groups == (KVGroup(None, 42),)
    assert g.bytes_per_block == 5_505_024
    # An all-sliding model stays sliding (vLLM only promotes a full/sliding mix).
    m = build_geometry(shape_from_config(_config("mistral-7b-v0.1")), hybrid_kv_cache_manager=False)
    assert m.groups == (KVGroup(4096, 32),)


def test_in_flight_batches_widen_the_sliding_span() -> None:
    # vLLM 0.32 with async scheduling: 2 × 8192 in flight → 4095 + 16384 = 20479.
    g = build_geometry(shape_from_config(_config("mistral-7b-v0.1")), in_flight_batches=2)
    assert g.sliding_spans == (20479,)


def test_any_block_size() -> None:
    shape = shape_from_config(_config("llama-3.1-8b"))
    for block_size in (1, 8, 16, 32, 128, 256):
        g = build_geometry(shape, block_size=block_size)
        assert g.bytes_per_block == 131_072 * block_size


@pytest.mark.parametrize(
    ("tokens", "block_size", "expected"),
    [(0, 16, 0), (1, 16, 1), (16, 16, 1), (17, 16, 2), (20000, 16, 1250), (2048, 128, 16)],
    ids=["zero", "one", "exact", "one-over", "20k", "cpu-128"],
)
def test_blocks_for_tokens(tokens: int, block_size: int, expected: int) -> None:
    assert blocks_for_tokens(tokens, block_size) == expected


# Per-request blocks in the shared pool (block 16).
REQUEST_CASES = [
    # Llama-3.1-8B, one full group: ceil(1200 / 16) = 75.
    ("llama-3.1-8b", 1000, 200, 0, 75),
    # 640 cached tokens = 40 whole blocks saved: 75 − 40 = 35.
    ("llama-3.1-8b", 1000, 200, 640, 35),
    # 650 cached: still 40 whole blocks (the partial block is not shared).
    ("llama-3.1-8b", 1000, 200, 650, 35),
    # Whole prompt cached: vLLM recomputes the last token → min(1000, 999) // 16 = 62 saved.
    ("llama-3.1-8b", 1000, 200, 1000, 13),
    # Mistral (sliding 4096, span 12287): a short request needs only its own blocks, ceil(1000/16)
    ("mistral-7b-v0.1", 900, 100, 0, 63),
    # A long one plateaus at ceil(12287 / 16) + 1 = 769 blocks however long it grows.
    ("mistral-7b-v0.1", 19000, 1000, 0, 769),
    ("mistral-7b-v0.1", 30000, 2000, 0, 769),
    # Cache hits do not shrink sliding groups (charged in full, conservatively).
    ("mistral-7b-v0.1", 19000, 1000, 16000, 769),
    # Gemma-3: full ceil(20000/16) = 1250, + 6 sliding groups × (ceil(9215/16) + 1 = 577).
    ("gemma-3-27b-it", 19000, 1000, 0, 1250 + 6 * 577),
    # …and short: 1 full + 6 sliding groups each ceil(100/16) = 7 → 7 × 7 = 49.
    ("gemma-3-27b-it", 90, 10, 0, 49),
    # …with 64 cached tokens: only the full group saves 4 blocks → 45.
    ("gemma-3-27b-it", 90, 10, 64, 45),
]


@pytest.mark.parametrize(
    ("name", "input_tokens", "output_tokens", "cached", "expected"),
    REQUEST_CASES,
    ids=[f"{c[0]}-{c[1]}+{c[2]}-cached{c[3]}" for c in REQUEST_CASES],
)
def test_request_blocks(
    name: str, input_tokens: int, output_tokens: int, cached: int, expected: int
) -> None:
    g = build_geometry(shape_from_config(_config(name)))
    assert g.request_blocks(input_tokens, output_tokens, cached) == expected


def test_head_dim_and_kv_heads_defaults() -> None:
    # No head_dim: hidden_size // heads; no num_key_value_heads: MHA.
    shape = shape_from_config(
        {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 256, "dtype": "float16"}
    )
    assert (shape.num_kv_heads, shape.head_dim) == (4, 64)
    # Falcon-7B style multi-query: one KV head.
    falcon = shape_from_config(
        {
            "model_type": "falcon",
            "num_hidden_layers": 32,
            "num_attention_heads": 71,
            "hidden_size": 4544,
            "multi_query": True,
            "torch_dtype": "bfloat16",
        }
    )
    assert (falcon.num_kv_heads, falcon.head_dim) == (1, 64)
    assert build_geometry(falcon).attention == "MQA"


@pytest.mark.parametrize(
    ("name", "max_model_len"),
    [
        ("llama-3.1-8b", 131072),  # llama3 RoPE: no factor
        ("llama-2-7b", 4096),
        ("deepseek-v2-lite", 163840),  # yarn: no factor
        ("gemma-3-27b-it", 131072),  # Gemma-3: already scaled
        ("qwen2-7b-instruct", 32768),
    ],
    ids=["llama3-rope", "plain", "yarn", "gemma3", "qwen2"],
)
def test_derived_max_model_len(name: str, max_model_len: int) -> None:
    assert shape_from_config(_config(name)).max_model_len == max_model_len


def test_linear_rope_factor_scales_max_model_len() -> None:
    cfg = {
        "num_hidden_layers": 1,
        "num_attention_heads": 1,
        "hidden_size": 64,
        "max_position_embeddings": 4096,
        "rope_scaling": {"type": "linear", "factor": 2.0},
    }
    assert shape_from_config(cfg).max_model_len == 8192


HYBRID_CASES: list[tuple[dict[str, Any], str]] = [
    (_config("hybrid-jamba"), "model_type"),
    ({"model_type": "mamba", "num_hidden_layers": 64}, "model_type"),
    ({"model_type": "falcon_h1", "num_hidden_layers": 24}, "model_type"),
    ({"model_type": "nemotron_h", "hybrid_override_pattern": "M-M-M*-"}, "model_type"),
    ({"model_type": "granitemoehybrid", "layer_types": ["mamba", "attention"]}, "model_type"),
    ({"model_type": "qwen3_next", "full_attention_interval": 4}, "model_type"),
    ({"model_type": "custom", "layers_block_type": ["mamba", "attention"]}, "layers_block_type"),
    ({"model_type": "custom", "hybrid_override_pattern": "M*M*"}, "hybrid_override_pattern"),
    (
        {
            "model_type": "custom",
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "hidden_size": 256,
            "layer_types": ["linear_attention", "full_attention"],
        },
        "layer_types",
    ),
    ({"model_type": "llama4_text", "attention_chunk_size": 8192}, "attention_chunk_size"),
    ({"model_type": "deepseek_v32", "kv_lora_rank": 512, "index_topk": 2048}, "index_topk"),
    (
        {
            "model_type": "qwen2",
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "hidden_size": 256,
            "sliding_window": 4096,
            "use_sliding_window": True,
        },
        "use_sliding_window",
    ),
]


@pytest.mark.parametrize(
    ("config", "field"),
    HYBRID_CASES,
    ids=[
        "jamba",
        "mamba",
        "falcon-h1",
        "nemotron-h",
        "granite-hybrid",
        "qwen3-next",
        "layers-block-type",
        "override-pattern",
        "linear-attention-layer",
        "chunked-local",
        "dsa-indexer",
        "qwen-partial-sliding",
    ],
)
def test_unmodelled_caches_are_refused(config: dict[str, Any], field: str) -> None:
    with pytest.raises(NotModelledError) as err:
        shape_from_config(config)
    assert err.value.field == field
    assert "not modelled" in str(err.value)


def test_attention_only_hybrid_config_is_modelled() -> None:
    # granite-4.0-micro: a "hybrid" config whose layers are all attention.
    shape = shape_from_config(
        {
            "model_type": "custom",
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "hidden_size": 256,
            "layers_block_type": ["attention", "attention"],
            "dtype": "bfloat16",
        }
    )
    assert shape.num_layers == 2


@pytest.mark.parametrize(
    ("name", "tp", "field"),
    [
        ("qwen2-7b-instruct", 8, "tp"),  # 28 heads % 8 ≠ 0
        ("qwen2-7b-instruct", 3, "tp"),  # 28 % 3 ≠ 0
        ("qwen2-1.5b-instruct", 3, "tp"),  # 12 % 3 = 0 but 2 KV heads and 3 do not divide
        ("llama-3.1-8b", 0, "tp"),
    ],
    ids=["qwen2-7b-tp8", "qwen2-7b-tp3", "qwen2-1.5b-tp3", "tp0"],
)
def test_tp_must_divide_heads(name: str, tp: int, field: str) -> None:
    with pytest.raises(KVInputError) as err:
        build_geometry(shape_from_config(_config(name)), tp=tp)
    assert err.value.field == field


@pytest.mark.parametrize(
    ("kwargs", "kv_dtype", "field", "exc"),
    [
        ({}, "auto", "dtype", KVInputError),  # numbers without --dtype
        ({"dtype": "float16"}, "int8_per_token_head", "kv_dtype", NotModelledError),
        ({"dtype": "float16"}, "nvfp4", "kv_dtype", NotModelledError),
        ({"dtype": "float16"}, "fp7", "kv_dtype", KVInputError),
        ({"dtype": "int8"}, "auto", "dtype", NotModelledError),
    ],
    ids=["auto-without-dtype", "int8-scales", "nvfp4", "unknown", "int-model"],
)
def test_dtype_errors(
    kwargs: dict[str, Any], kv_dtype: str, field: str, exc: type[KVInputError]
) -> None:
    shape = shape_from_numbers(layers=2, kv_heads=2, head_dim=64, **kwargs)
    with pytest.raises(exc) as err:
        build_geometry(shape, kv_dtype=kv_dtype)
    assert err.value.field == field


def test_numbers_model() -> None:
    # 32 × 8 × 128 bf16 numbers = Llama-3.1-8B.
    shape = shape_from_numbers(layers=32, kv_heads=8, head_dim=128, dtype="bf16")
    g = build_geometry(shape)
    assert (g.bytes_per_token, g.bytes_per_block, g.kv_dtype) == (131_072, 2_097_152, "bfloat16")
    sliding = build_geometry(
        shape_from_numbers(layers=32, kv_heads=8, head_dim=128, dtype="bf16", sliding_window=4096)
    )
    assert sliding.groups == (KVGroup(4096, 32),)
    with pytest.raises(KVInputError, match="attention_heads"):
        shape_from_numbers(layers=32, kv_heads=8, head_dim=128, attention_heads=12)


def test_public_api_does_not_drift() -> None:
    import ext_proc.kv

    assert sorted(ext_proc.kv.__all__) == [
        "CapacityPlan",
        "DEFAULT_BLOCK_SIZE",
        "DEFAULT_MAX_NUM_BATCHED_TOKENS",
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
    for name in ext_proc.kv.__all__:
        assert hasattr(ext_proc.kv, name)
