"""ICE's KV count for a request's fan-out against a real vLLM's block table.

ICE counts ``n`` samples per prompt and every prompt of a completions batch as sequences of
their own (``KvFit.need``, ``PoolViews._fit``): per prompt of P tokens with O output tokens,
``first = ceil((P + O) / B)`` and, when the backend caches prefixes, each further sample
needs only ``ceil((P + O) / B) − floor((P − 1) / B)`` (its full prompt blocks are shared).

Here ``vllm serve`` (CPU, the tiny model, 64 blocks of 128 tokens) gets one
``/v1/completions`` request per case, prompts as token-id lists (exact lengths, random ids
so no two prompts share a block), ``min_tokens = max_tokens = O`` and ``ignore_eos`` so every
sequence runs its full length. P + O stays inside the ceil((P + O) / B) = 3 blocks a
sequence holds from prefill (or from its first decode step when P is a multiple of B) on, so
the request's block count is constant while it decodes; a poller on its own connection reads
``vllm:kv_cache_usage_perc`` as fast as it can, and the largest
``round(usage × (num_gpu_blocks − 1))`` it saw is vLLM's figure (usage is used blocks over
``num_gpu_blocks − 1``: the pool keeps one null block; cached blocks no request holds count
as free, so the counter is back to 0 between cases). ICE's figure comes from ICE's own code:
the idle ``/metrics`` page through ``parse_engine`` and ``backend_signals`` (the collector's
path, ``enable_prefix_caching`` included), the body through the completions adapter, then
``PoolViews().room(...).need(Shape.of(...), O)``. The two must be equal.

Two servers: prefix caching on (vLLM's default) and ``--no-enable-prefix-caching``.

What vLLM 0.32 does (``vllm/`` in ``.venv-vllm``): ``AsyncLLM.add_request`` splits ``n > 1``
into n child requests with the same prompt (``v1/engine/async_llm.py``,
``ParentRequest.get_child_info``); the completions server sends each prompt of a batch as a
request of its own (``entrypoints/openai/completion/serving.py``). The scheduler looks up the
prefix cache per waiting request (``get_computed_blocks``: at most P − 1 tokens, full blocks
only) and ``allocate_slots`` caches a request's full blocks as soon as they are allocated, so
a child scheduled in the same step as the first already hits them; the partial last block is
never cached (``cache_blocks`` stops at ``num_tokens // block_size``), each child has its own.

Needs ``.venv-vllm`` (``make vllm-install``) and ``ICE_VLLM=1``; ``pytest -s`` prints the
figures.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from ext_proc.lab import vllm_local as vl

from .vllm_fanout import (
    ATTEMPTS,
    BLOCK,
    NUM_BLOCKS,
    OUTPUT,
    PROMPT,
    Server,
    ice_blocks,
    idle_page,
    observe,
    prompt_ids,
    server,  # noqa: F401  (the module's servers: prefix caching on and off)
    used_blocks,
)
from .vllm_fanout import VLLM_MARKS as pytestmark  # noqa: F401  (the vllm mark, the timeout, the ICE_VLLM=1 skip)


@dataclass(frozen=True)
class Case:
    name: str
    prompts: int
    n: int
    prompt_tokens: int = PROMPT


CASES = (
    Case("n4", prompts=1, n=4),
    Case("batch4", prompts=4, n=1),
    Case("n2_batch2", prompts=2, n=2),
    # P a multiple of B: the hit stops at P − 1 tokens, so a sibling shares only
    # floor(255 / 128) = 1 block and recomputes the prompt's second block in a block of its own.
    Case("n4_aligned", prompts=1, n=4, prompt_tokens=2 * BLOCK),
)


def _body(case: Case, salt: str) -> dict[str, Any]:
    prompts = [
        prompt_ids(f"{salt}/{case.name}/{i}", case.prompt_tokens) for i in range(case.prompts)
    ]
    return {
        "model": "tiny",
        "prompt": prompts,
        "n": case.n,
        "max_tokens": OUTPUT,
        "min_tokens": OUTPUT,
        "ignore_eos": True,
        "temperature": 1.0,  # greedy refuses n > 1 (SamplingParams._verify_greedy_sampling)
    }


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_ice_counts_the_blocks_vllm_holds(
    server: Server,  # noqa: F811  (the fixture imported above)
    case: Case,
) -> None:
    mode = "caching" if server.prefix_caching else "no-caching"
    # A run the poller saw only in passing (the 2 cores are busy) is run again with new
    # prompts (nothing of the last run in the cache); a real mismatch shows as a plateau.
    for attempt in range(1, ATTEMPTS + 1):
        body = _body(case, salt=f"{mode}/{attempt}")
        idle = idle_page(server)
        num_blocks = int(vl.metric_labels(idle, "vllm:cache_config_info")["num_gpu_blocks"])
        assert num_blocks == NUM_BLOCKS
        assert used_blocks(idle, num_blocks) == 0, "vLLM holds blocks before the request: not idle"
        ice, snapshot = ice_blocks(idle, server.vllm.base_url, body)
        assert snapshot.prefix_caching is server.prefix_caching, snapshot
        seen = observe(server, body, idle)
        if seen.plateau:
            break
        print(
            f"\n[fanout] {mode} {case.name}: attempt {attempt} seen in passing: peak "
            f"{seen.peak_used} on {seen.polls_at_peak}/{seen.polls} polls in {seen.wall_s:.2f} s"
        )

    line = (
        f"[fanout] {mode} {case.name}: {case.prompts} prompt(s) of P={case.prompt_tokens} "
        f"× n={case.n}, O={OUTPUT}, B={BLOCK}: ICE {ice} blocks, vLLM peak {seen.peak_used} "
        f"({seen.polls_at_peak}/{seen.polls} polls at peak; used over time {seen.used_seen}); "
        f"prefix-cache hits {seen.hit_tokens:.0f}/{seen.query_tokens:.0f} tokens; "
        f"completion tokens, choices {seen.completion_tokens}; {seen.wall_s:.2f} s; "
        f"attempt {attempt}"
    )
    print("\n" + line)
    # Every sequence ran its full length: the block count held for the whole decode.
    assert seen.completion_tokens == (case.prompts * case.n * OUTPUT, case.prompts * case.n), line
    assert seen.peak_used > 0, f"the poller never saw the request's blocks\n{line}"
    assert ice == seen.peak_used, line
