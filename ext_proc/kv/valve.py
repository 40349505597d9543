"""vLLM 0.32's own admission valve, sized as the last line *behind* ICE.

Job: from a ``CapacityPlan``, the values for ``vllm serve --max-num-queued-reqs N
--max-num-queued-tokens T`` that never refuse a request while ICE is in the path and do
refuse what gets around it (ICE failing open, a client that reaches vLLM directly).

What vLLM checks (``AsyncLLM.check_admission``, ``SchedulerConfig`` in 0.32), in its API
server, before a request is added, answering 503 when it refuses:

- reqs: refuse when unfinished requests (running + waiting; a request with ``n`` samples
  counts ``n``) + the new request's ``n`` > N. Counted across every data-parallel rank the
  API server routes to (and summed over ``--api-server-count`` processes).
- tokens: refuse when the prompt tokens of the requests still in prefill (no first token
  yet: waiting, or chunk-prefilling) ≥ T; each prompt at its full length, prefix-cache hits
  not taken off, the new request's own prompt not counted. Also across all DP ranks.

What ICE admits (``kv_hold: done``, the default): a request only when its whole need
(prompt + output limit, every sequence) fits the blocks not already reserved, so the
sequences in flight are about ``max_num_seqs_safe`` and their prompts never exceed the cache.

Formulas (dp = ``data_parallel_size``, the ranks behind one API server; per-rank figures
from ``ext_proc.kv.capacity``):

- max_num_queued_reqs = 2 × dp × max(1, max_num_seqs_safe): room for the KV-limited batch
  running plus as many waiting; a request beyond that would wait longer than one full
  batch's service. ``max_num_seqs_safe`` comes from ``avg_seq_len`` (or ``lengths``); without
  either: None. Not from max_model_len: at full length only the *fewest* requests ICE ever
  admits fit (1 on docs/kv-arithmetic.md's example, where 2,000-token requests run 15 at a
  time), so a valve sized there would refuse ordinary traffic behind ICE.
- max_num_queued_tokens = dp × max(num_blocks × block_size, kv_cache_tokens): prompts queued
  beyond one full cache's worth cannot all start before the cache has turned over. For full
  attention (and full/sliding hybrids, where a request holds ≥ ceil(L / block_size) blocks
  in each full group) the first term is the larger, and the prompts ICE admits stay below
  it (each need has ≥ 1 output token). A sliding-window-only model keeps just a window per
  request, so its cache holds more tokens than slots: vLLM's "KV cache size"
  (int(max_concurrency × max_model_len)) then is the larger; without max_model_len it is
  unknown there: None.
- Prefix caching: ICE takes a request's expected prefix-cache hit (the pool's hit ratio h)
  off its need, vLLM's token count does not, so at a high h ICE admits up to 1 / (1 − h)
  times the prompt tokens (and more requests): scale both figures by that where h is high
  and steady (docs/configuration.md, "vLLM's own valve and sleep mode").
- A plan with fewer than 2 blocks (no usable block: vLLM does not start) gives neither.

Invariant: pure; stdlib only; a figure is None exactly when its ``*_left_out`` says why.
"""

from __future__ import annotations

from dataclasses import dataclass

from ext_proc.kv.capacity import CapacityPlan
from ext_proc.kv.errors import KVInputError

__all__ = ["REQS_FACTOR", "ValveAdvice", "valve_advice"]

REQS_FACTOR = 2  # the KV-limited batch running + as many waiting


@dataclass(frozen=True, slots=True)
class ValveAdvice:
    """``--max-num-queued-reqs`` / ``--max-num-queued-tokens`` for one API server (module
    docstring); ``safe_sequences`` and ``tokens_per_rank`` are the per-rank inputs."""

    data_parallel_size: int
    safe_sequences: int | None  # max(1, max_num_seqs_safe) of one rank
    tokens_per_rank: int | None  # max(token_slots, kv_cache_tokens) of one rank
    max_num_queued_reqs: int | None
    max_num_queued_tokens: int | None
    reqs_left_out: str | None  # why max_num_queued_reqs is None
    tokens_left_out: str | None  # why max_num_queued_tokens is None


def valve_advice(plan: CapacityPlan, *, data_parallel_size: int = 1) -> ValveAdvice:
    """The valve for ``plan``'s rank × ``data_parallel_size`` ranks (module docstring)."""
    dp = data_parallel_size
    if dp < 1:
        raise KVInputError("data_parallel_size", f"must be ≥ 1, got {dp}")
    if plan.num_blocks < 2:
        why = "no usable KV block: vLLM does not start"
        return ValveAdvice(dp, None, None, None, None, why, why)
    safe = None if plan.max_num_seqs_safe is None else max(1, plan.max_num_seqs_safe)
    if plan.geometry.num_full_groups > 0 or plan.kv_cache_tokens is not None:
        tokens: int | None = max(plan.token_slots, plan.kv_cache_tokens or 0)
    else:
        tokens = None
    return ValveAdvice(
        data_parallel_size=dp,
        safe_sequences=safe,
        tokens_per_rank=tokens,
        max_num_queued_reqs=None if safe is None else REQS_FACTOR * dp * safe,
        max_num_queued_tokens=None if tokens is None else dp * tokens,
        reqs_left_out=None if safe is not None else "give --avg-seq-len or --lengths",
        tokens_left_out=(
            None
            if tokens is not None
            else "sliding-window-only model: give --max-model-len or --config"
        ),
    )
