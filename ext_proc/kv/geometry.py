"""KV-cache geometry of one model on one tensor-parallel rank, and per-request block counts.

Job: turn a ``ModelShape`` plus serving options into a frozen ``KVGeometry`` computed once,
whose ``blocks_for_tokens`` / ``request_blocks`` the evaluator calls per request (plain int
arithmetic, no allocation: about 0.2-0.6 µs each; sliding groups with one span are summed
in one step via ``sliding_terms``).

Formulas (all per rank; bytes; "layer" = one attention layer holding KV):

- kv_heads_per_rank = max(1, kv_heads // tp); tp must divide the attention heads, and the
  KV heads must divide tp or be divisible by it (vLLM's QKV projection asserts the same).
  MLA: 1 latent "head" on every rank (the latent is replicated, not split).
- layer_bytes_per_token = K/V × kv_heads_per_rank × head_dim × kv_dtype_bytes, with K/V = 2
  (a key and a value) for MHA/GQA/MQA and 1 for MLA (the latent is kv_lora_rank +
  qk_rope_head_dim elements, no separate value).
- bytes_per_token = num_layers × layer_bytes_per_token (every layer, as if all were full).
- page_bytes = layer_bytes_per_token × block_size (one layer's share of one block).
- KV dtype bytes: float32 4; bfloat16, float16 2; fp8, fp8_e4m3, fp8_e5m2, fp8_inc 1 (vLLM's
  per-tensor fp8: no scales in the page). ``auto`` = the model dtype as vLLM resolves
  ``--dtype auto``: bfloat16/float16 as written, float32 checkpoints are served in a 16-bit
  type (bfloat16, or float16 on GPUs without bf16: 2 bytes either way).

Layer groups (vLLM's KV cache groups, ``vllm/v1/core/kv_cache_utils.py`` in 0.32): layers with
the same spec (full attention, or sliding with one window) form a bucket; one bucket is one
group of all layers. Several buckets (e.g. Gemma-3: 52 sliding + 10 full) are cut into groups
of ``group_size`` layers, group_size = the smallest bucket's layer count, or the largest's
when largest < 1.5 × smallest; a bucket of n layers gives ceil(n / group_size) groups, its
layers dealt round-robin. All groups draw blocks from one pool whose block is
``bytes_per_block`` = (layers in the widest group) × page_bytes. With the hybrid manager off
(``hybrid_kv_cache_manager=False``: vLLM's ``--disable-hybrid-kv-cache-manager``, which vLLM
also forces for KV connectors without hybrid support and on platforms without it), a
full/sliding mix is allocated as all-full. Every layer must have the same page
size (same KV heads, head_dim and dtype); MLA has no sliding layers.

Blocks one request holds (in pool blocks; n = ceil(tokens / block_size)):
- full-attention group: n.
- sliding group with window W: min(n, ceil(min(W − 1 + in_flight, tokens) / block_size) + 1),
  with in_flight = in_flight_batches × max_num_batched_tokens (default 1 × 8192). This is
  vLLM's per-request admission bound for a sliding layer (``SlidingWindowSpec``), capped at n
  because a request shorter than its window never frees (nor needs the spare) block.
- ``max_blocks_per_request(L)``: vLLM's own bound used for "Maximum concurrency" — the same
  but without the min(n, …) cap: full n, sliding ceil(min(W − 1 + in_flight, L) / bs) + 1.
- prefix-cache reuse (``request_blocks``): only whole cached blocks are saved, and vLLM always
  recomputes the last prompt token, so saved = full_groups × (min(cached, input − 1) //
  block_size). Sliding groups are charged in full (conservative).

vLLM versions: before ``max_in_flight_tokens`` existed the sliding bound used
``max_num_batched_tokens`` alone (in_flight_batches = 1, the default here); vLLM 0.32 uses
``max_concurrent_batches × max_num_batched_tokens`` with 2 batches under its default async
scheduling (pass ``in_flight_batches=2`` for that).

Invariant: pure; stdlib only; a ``KVGeometry`` never changes once built.
"""

from __future__ import annotations

from dataclasses import dataclass

from ext_proc.kv.errors import KVInputError, NotModelledError
from ext_proc.kv.hfconfig import ModelShape

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "DEFAULT_MAX_NUM_BATCHED_TOKENS",
    "KVGeometry",
    "KVGroup",
    "blocks_for_tokens",
    "build_geometry",
    "kv_dtype_bytes",
]

DEFAULT_BLOCK_SIZE = 16
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192

_DTYPE_ALIASES = {
    "float32": "float32",
    "fp32": "float32",
    "float": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
    "fp8": "fp8",
    "fp8_e4m3": "fp8_e4m3",
    "fp8_e5m2": "fp8_e5m2",
    "fp8_inc": "fp8_inc",
}
_DTYPE_BYTES = {
    "float32": 4,
    "bfloat16": 2,
    "float16": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "fp8_inc": 1,
}
_NOT_MODELLED_KV_DTYPES = (
    "nvfp4",
    "int4",
    "int8",
    "per_token_head",
    "turboquant",
    "ultraquant",
    "ds_mla",
)


def _canonical_dtype(name: str, field: str) -> str:
    key = name.strip().lower().removeprefix("torch.")
    if key in _DTYPE_ALIASES:
        return _DTYPE_ALIASES[key]
    if any(tag in key for tag in _NOT_MODELLED_KV_DTYPES):
        raise NotModelledError(field, f"{name!r} (a quantised format with scales) is not modelled")
    raise KVInputError(field, f"unknown dtype {name!r} (float32, bfloat16, float16, fp8, …)")


def kv_dtype_bytes(kv_dtype: str, model_dtype: str | None) -> tuple[str, int]:
    """(resolved KV dtype name, bytes per element); ``auto`` follows the model dtype."""
    if kv_dtype.strip().lower() == "auto":
        if model_dtype is None:
            raise KVInputError("dtype", "kv dtype 'auto' needs the model dtype (--dtype)")
        resolved = _canonical_dtype(model_dtype, "dtype")
        if resolved == "float32":  # vLLM serves float32 checkpoints in 16 bits under auto
            resolved = "bfloat16"
        elif resolved not in ("bfloat16", "float16"):
            raise KVInputError("dtype", f"model dtype {model_dtype!r} is not a float type")
        return resolved, 2
    resolved = _canonical_dtype(kv_dtype, "kv_dtype")
    return resolved, _DTYPE_BYTES[resolved]


@dataclass(frozen=True, slots=True)
class KVGroup:
    """One KV cache group: ``num_layers`` layers sharing one block table."""

    sliding_window: int | None  # None = full attention
    num_layers: int


def blocks_for_tokens(tokens: int, block_size: int) -> int:
    """ceil(tokens / block_size): blocks one full-attention layer group needs."""
    return -(-tokens // block_size)


@dataclass(frozen=True, slots=True)
class KVGeometry:
    """Per-rank KV-cache geometry (formulas in the module docstring)."""

    block_size: int
    tp: int
    num_layers: int
    attention: str  # "MHA" | "GQA" | "MQA" | "MLA" | "K/V" (query heads unknown)
    kv_heads: int  # whole model
    kv_heads_per_rank: int
    head_dim: int
    kv_dtype: str
    kv_dtype_bytes: int
    layer_bytes_per_token: int
    bytes_per_token: int
    page_bytes: int
    bytes_per_block: int
    groups: tuple[KVGroup, ...]
    num_full_groups: int
    sliding_spans: tuple[int, ...]  # per sliding group: W − 1 + in_flight tokens
    sliding_terms: tuple[tuple[int, int], ...]  # (span, groups with that span), for speed

    def blocks_for_tokens(self, tokens: int) -> int:
        """Pool blocks one request of ``tokens`` tokens holds (all groups)."""
        bs = self.block_size
        n = -(-tokens // bs)
        total = self.num_full_groups * n
        for span, count in self.sliding_terms:
            w = -(-(span if span < tokens else tokens) // bs) + 1
            total += count * (w if w < n else n)
        return total

    def request_blocks(
        self, input_tokens: int, output_tokens: int, cached_prefix_tokens: int = 0
    ) -> int:
        """Pool blocks a request needs at its end; whole cached prefix blocks are not new."""
        total = self.blocks_for_tokens(input_tokens + output_tokens)
        if cached_prefix_tokens > 0 and input_tokens > 1:
            hit = cached_prefix_tokens if cached_prefix_tokens < input_tokens else input_tokens - 1
            total -= self.num_full_groups * (hit // self.block_size)
        return total

    def max_blocks_per_request(self, max_model_len: int) -> int:
        """vLLM's per-request block bound at ``max_model_len`` (its concurrency divisor)."""
        bs = self.block_size
        total = self.num_full_groups * -(-max_model_len // bs)
        for span in self.sliding_spans:
            total += -(-min(span, max_model_len) // bs) + 1
        return total


def _group(windows: tuple[int | None, ...]) -> tuple[tuple[KVGroup, ...], int]:
    """vLLM's grouping (module docstring) → (groups, layers in the widest group)."""
    buckets: dict[int | None, int] = {}
    for w in windows:
        buckets[w] = buckets.get(w, 0) + 1
    if len(buckets) == 1:
        ((w, n),) = buckets.items()
        return (KVGroup(w, n),), n
    smallest, largest = min(buckets.values()), max(buckets.values())
    group_size = largest if largest < smallest * 1.5 else smallest
    groups: list[KVGroup] = []
    widest = 0
    for w, n in buckets.items():
        num_groups = -(-n // group_size)
        for i in range(num_groups):
            layers = len(range(i, n, num_groups))
            groups.append(KVGroup(w, layers))
            widest = max(widest, layers)
    return tuple(groups), widest


def build_geometry(
    shape: ModelShape,
    *,
    tp: int = 1,
    kv_dtype: str = "auto",
    block_size: int = DEFAULT_BLOCK_SIZE,
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
    in_flight_batches: int = 1,
    hybrid_kv_cache_manager: bool = True,
) -> KVGeometry:
    """The per-rank ``KVGeometry`` of ``shape`` served with these options."""
    if tp < 1:
        raise KVInputError("tp", f"must be ≥ 1, got {tp}")
    if block_size < 1:
        raise KVInputError("block_size", f"must be ≥ 1, got {block_size}")
    if max_num_batched_tokens < 1:
        raise KVInputError("max_num_batched_tokens", f"must be ≥ 1, got {max_num_batched_tokens}")
    if in_flight_batches < 1:
        raise KVInputError("in_flight_batches", f"must be ≥ 1, got {in_flight_batches}")
    heads = shape.num_attention_heads
    if heads is not None and heads % tp:
        raise KVInputError(
            "tp", f"tensor-parallel size {tp} does not divide the {heads} attention heads"
        )
    kv_heads = shape.num_kv_heads
    if shape.mla:
        per_rank, kv_factor, attention = 1, 1, "MLA"
    else:
        if (kv_heads >= tp and kv_heads % tp) or (kv_heads < tp and tp % kv_heads):
            raise KVInputError(
                "tp", f"tensor-parallel size {tp} and the {kv_heads} KV heads do not divide"
            )
        per_rank, kv_factor = max(1, kv_heads // tp), 2
        if heads is None:
            attention = "K/V"  # query heads not given: MHA, GQA or MQA
        elif kv_heads == heads:
            attention = "MHA"
        else:
            attention = "MQA" if kv_heads == 1 else "GQA"
    dtype_name, dtype_bytes = kv_dtype_bytes(kv_dtype, shape.model_dtype)
    layer_bpt = kv_factor * per_rank * shape.head_dim * dtype_bytes
    page = layer_bpt * block_size

    windows = shape.layer_windows
    if not hybrid_kv_cache_manager and len(set(windows)) > 1 and None in windows:
        windows = (None,) * len(windows)
    groups, widest = _group(windows)
    in_flight = in_flight_batches * max_num_batched_tokens
    spans = tuple(g.sliding_window - 1 + in_flight for g in groups if g.sliding_window is not None)
    return KVGeometry(
        block_size=block_size,
        tp=tp,
        num_layers=shape.num_layers,
        attention=attention,
        kv_heads=kv_heads,
        kv_heads_per_rank=per_rank,
        head_dim=shape.head_dim,
        kv_dtype=dtype_name,
        kv_dtype_bytes=dtype_bytes,
        layer_bytes_per_token=layer_bpt,
        bytes_per_token=layer_bpt * shape.num_layers,
        page_bytes=page,
        bytes_per_block=widest * page,
        groups=groups,
        num_full_groups=sum(1 for g in groups if g.sliding_window is None),
        sliding_spans=spans,
        sliding_terms=tuple((span, spans.count(span)) for span in dict.fromkeys(spans)),
    )
