"""KV-cache capacity of one vLLM server rank: blocks, tokens, concurrency, fragmentation.

Job: from a ``KVGeometry`` and the memory left for the KV cache, compute the figures vLLM
prints at start-up (and exposes as ``vllm:cache_config_info`` labels), plus what an operator
asks next: the longest request that fits, how many average sequences fit, how much of the
allocated block space is wasted.

Formulas (bytes per rank; ``bpb`` = ``geometry.bytes_per_block``; ``bs`` = block size):

- available_kv_bytes = ``kv_memory`` as given (vLLM's "Available KV cache memory" or
  ``--kv-cache-memory-bytes``), or floor(gpu_memory × gpu_memory_utilization) −
  non_kv_memory (weights, activation peak, CUDA graphs, non-torch memory).
- num_blocks = available_kv_bytes // bpb (vLLM's rule; with tensor parallelism every rank
  has the same geometry, and vLLM keeps the minimum over ranks). ``num_blocks_override``
  (``--num-gpu-blocks-override``) replaces it.
- blocks_per_request = ``geometry.max_blocks_per_request(max_model_len)``; for full attention
  ceil(max_model_len / bs).
- max_concurrency = num_blocks / blocks_per_request (vLLM logs it with two decimals:
  "Maximum concurrency for L tokens per request: X.XXx").
- kv_cache_tokens = int(max_concurrency × max_model_len): vLLM 0.32's "KV cache size: N tokens"
  and the ``kv_cache_size_tokens`` label. (Older vLLM logged num_blocks × bs; the two agree
  when max_model_len is a multiple of bs.) token_slots = num_blocks × bs.
- bytes_needed_for_max_model_len = bpb × blocks_per_request; vLLM refuses to start unless it
  is ≤ available − bpb (one block is the permanent null block), i.e. unless
  blocks_per_request ≤ num_blocks − 1 (``fits_max_model_len``).
- estimated_max_model_len = the largest L with max_blocks_per_request(L) ≤ num_blocks − 1:
  the longest single request the cache holds (vLLM's estimate, not capped at max_model_len;
  for full attention (num_blocks − 1) × bs). ``None`` when only sliding layers exist and
  their bounded window fits: memory does not limit the length then.
- max_num_seqs_safe = (num_blocks − 1) // geometry.blocks_for_tokens(avg_seq_len): sequences
  of avg_seq_len tokens that fit at once without preemption. With ``lengths`` and no
  avg_seq_len: floor((num_blocks − 1) × len(lengths) / Σ blocks_for_tokens(L_i)).
- fragmentation = Σ (ceil(L_i / bs) × bs − L_i) / Σ ceil(L_i / bs) × bs over ``lengths`` (or
  the single avg_seq_len): the unused fraction of allocated block space (token slots in each
  sequence's last, partly filled block). Uniformly spread lengths waste about (bs − 1) / 2
  tokens a sequence.
- Without max_model_len the capacity (num_blocks, token_slots, bytes per block, the memory
  used, estimated_max_model_len) stands as it is; what needs the context length
  (blocks_per_request, max_concurrency, bytes_needed_for_max_model_len,
  fits_max_model_len) is None, and kv_cache_tokens is token_slots when every layer has full
  attention (int(num_blocks / ceil(L / bs) × L) = num_blocks × bs for any L that is a
  multiple of bs), else None (sliding windows make it depend on L).

Invariant: pure; stdlib only; ``KVInputError`` names the offending input.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ext_proc.kv.errors import KVInputError
from ext_proc.kv.geometry import KVGeometry

__all__ = ["CapacityPlan", "available_kv_bytes", "fragmentation", "plan_capacity"]


@dataclass(frozen=True, slots=True)
class CapacityPlan:
    """One rank's KV capacity (formulas in the module docstring)."""

    geometry: KVGeometry
    available_kv_bytes: int | None
    num_blocks_from_memory: int | None
    num_blocks: int
    max_model_len: int | None
    blocks_per_request: int | None
    max_concurrency: float | None
    kv_cache_tokens: int | None
    token_slots: int
    bytes_needed_for_max_model_len: int | None
    fits_max_model_len: bool | None
    estimated_max_model_len: int | None
    avg_seq_len: int | None
    max_num_seqs_safe: int | None
    fragmentation: float | None


def _decimal_ratio(text: str, field: str) -> tuple[int, int]:
    whole, _, frac = text.strip().partition(".")
    if not whole.isdigit() or (frac and not frac.isdigit()):
        raise KVInputError(field, f"not a decimal number: {text!r}")
    scale: int = 10 ** len(frac)
    return int(whole) * scale + int(frac or "0"), scale


def available_kv_bytes(
    *,
    kv_memory: int | None = None,
    gpu_memory: int | None = None,
    gpu_memory_utilization: str | None = None,
    non_kv_memory: int | None = None,
) -> int:
    """Bytes left for the KV cache on one rank; exactly one of the two forms must be given.

    ``gpu_memory_utilization`` is a decimal string ("0.9") so the product is exact.
    """
    gpu_form = (gpu_memory, gpu_memory_utilization, non_kv_memory)
    if kv_memory is not None:
        if any(v is not None for v in gpu_form):
            raise KVInputError(
                "kv_memory",
                "give either kv_memory or gpu_memory + gpu_memory_utilization + non_kv_memory",
            )
        available = kv_memory
    else:
        names = ("gpu_memory", "gpu_memory_utilization", "non_kv_memory")
        missing = [n for n, v in zip(names, gpu_form, strict=True) if v is None]
        if len(missing) == 3:
            raise KVInputError("kv_memory", "missing (or give gpu_memory, its utilization, …)")
        if missing:
            raise KVInputError(missing[0], "missing (needed with " + ", ".join(names) + ")")
        assert gpu_memory is not None and gpu_memory_utilization is not None
        assert non_kv_memory is not None
        num, den = _decimal_ratio(gpu_memory_utilization, "gpu_memory_utilization")
        if not 0 < num <= den:
            raise KVInputError("gpu_memory_utilization", "must be in (0, 1]")
        available = gpu_memory * num // den - non_kv_memory
    if available <= 0:
        raise KVInputError("kv_memory", f"no memory left for the KV cache ({available} bytes)")
    return available


def fragmentation(lengths: Sequence[int], block_size: int) -> float:
    """Unused fraction of the block space ``lengths`` occupy (module docstring)."""
    allocated = sum(-(-n // block_size) * block_size for n in lengths)
    if allocated == 0:
        return 0.0
    return (allocated - sum(lengths)) / allocated


def _estimated_max_model_len(geometry: KVGeometry, budget_blocks: int) -> int | None:
    def fits(length: int) -> bool:
        return geometry.max_blocks_per_request(length) <= budget_blocks

    if geometry.num_full_groups == 0:
        plateau = max(geometry.sliding_spans)
        if fits(plateau):
            return None
        hi = plateau
    else:
        hi = max(budget_blocks, 0) * geometry.block_size
    if hi < 1 or not fits(1):
        return 0
    lo = 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def plan_capacity(
    geometry: KVGeometry,
    *,
    max_model_len: int | None,
    available_bytes: int | None = None,
    num_blocks_override: int | None = None,
    avg_seq_len: int | None = None,
    lengths: Sequence[int] | None = None,
) -> CapacityPlan:
    """The ``CapacityPlan`` for ``geometry`` with this much KV memory (or block override);
    ``max_model_len`` None: the figures that need it are None (module docstring)."""
    if max_model_len is not None and max_model_len < 1:
        raise KVInputError("max_model_len", f"must be ≥ 1, got {max_model_len}")
    bpb = geometry.bytes_per_block
    from_memory: int | None = None
    if available_bytes is not None:
        if available_bytes <= 0:
            raise KVInputError("kv_memory", f"no memory left for the KV cache ({available_bytes})")
        from_memory = available_bytes // bpb
    if num_blocks_override is not None:
        if num_blocks_override < 1:
            raise KVInputError("num_gpu_blocks_override", f"must be ≥ 1, got {num_blocks_override}")
        num_blocks = num_blocks_override
    elif from_memory is not None:
        num_blocks = from_memory
    else:
        raise KVInputError("kv_memory", "missing (give the KV memory or a block override)")
    top = max_model_len if max_model_len is not None else 2**63
    if avg_seq_len is not None and not 1 <= avg_seq_len <= top:
        raise KVInputError("avg_seq_len", f"must be in [1, max_model_len={max_model_len}]")
    if lengths is not None:
        if not lengths:
            raise KVInputError("lengths", "no lengths given")
        bad = next((n for n in lengths if not 1 <= n <= top), None)
        if bad is not None:
            raise KVInputError("lengths", f"length {bad} is not in [1, {max_model_len}]")

    budget = num_blocks - 1  # the null block is never handed out
    per_request: int | None = None
    concurrency: float | None = None
    tokens: int | None = None
    if max_model_len is not None:
        per_request = geometry.max_blocks_per_request(max_model_len)
        concurrency = num_blocks / per_request
        tokens = int(concurrency * max_model_len)
    elif all(grp.sliding_window is None for grp in geometry.groups):
        tokens = num_blocks * geometry.block_size
    if avg_seq_len is not None:
        safe: int | None = max(budget, 0) // geometry.blocks_for_tokens(avg_seq_len)
    elif lengths:
        need = sum(geometry.blocks_for_tokens(n) for n in lengths)
        safe = max(budget, 0) * len(lengths) // need
    else:
        safe = None
    frag_lengths = lengths or ([avg_seq_len] if avg_seq_len is not None else None)
    return CapacityPlan(
        geometry=geometry,
        available_kv_bytes=available_bytes,
        num_blocks_from_memory=from_memory,
        num_blocks=num_blocks,
        max_model_len=max_model_len,
        blocks_per_request=per_request,
        max_concurrency=concurrency,
        kv_cache_tokens=tokens,
        token_slots=num_blocks * geometry.block_size,
        bytes_needed_for_max_model_len=None if per_request is None else bpb * per_request,
        fits_max_model_len=None if per_request is None else per_request <= budget,
        estimated_max_model_len=_estimated_max_model_len(geometry, budget),
        avg_seq_len=avg_seq_len,
        max_num_seqs_safe=safe,
        fragmentation=(fragmentation(frag_lengths, geometry.block_size) if frag_lengths else None),
    )
