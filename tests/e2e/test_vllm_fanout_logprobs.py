"""ICE's count of ``n`` samples that read no prefix cache against a real vLLM's block table.

vLLM 0.32 reads no cached block for a request that asks for prompt logprobs:
``prompt_logprobs``, or completions' ``echo`` with ``logprobs`` (``to_sampling_params`` in
``entrypoints/openai/completion/protocol.py`` turns it into ``prompt_logprobs``), sets
``SamplingParams.skip_reading_prefix_cache`` (``sampling_params.py``) and
``KVCacheManager.prefix_cache_lookup_enabled`` (``v1/core/kv_cache_manager.py``) is then
False: each of the ``n`` children prefills its whole prompt, so ICE counts
``n × ceil((P + O) / B)`` blocks, as with caching off.

The method is ``test_vllm_fanout``'s (its servers, its poller, its figures: the rig in
``vllm_fanout.py``): one
``/v1/completions`` request per case, ICE's count from the idle ``/metrics`` page and the
body through the adapter, vLLM's peak used blocks while it runs. Needs ``.venv-vllm`` and
``ICE_VLLM=1``; ``pytest -s`` prints the figures.
"""

from __future__ import annotations

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

CASES = {
    "n4_prompt_logprobs": {"prompt_logprobs": 0},
    "n4_echo_logprobs": {"echo": True, "logprobs": 0},
}


def _body(name: str, extra: dict[str, Any], salt: str) -> dict[str, Any]:
    return {
        "model": "tiny",
        "prompt": [prompt_ids(f"{salt}/{name}", PROMPT)],
        "n": 4,
        "max_tokens": OUTPUT,
        "min_tokens": OUTPUT,
        "ignore_eos": True,
        "temperature": 1.0,
        **extra,
    }


@pytest.mark.parametrize("name", list(CASES))
def test_samples_that_read_no_cache_hold_their_own_blocks(
    server: Server,  # noqa: F811
    name: str,
) -> None:
    mode = "caching" if server.prefix_caching else "no-caching"
    for attempt in range(1, ATTEMPTS + 1):
        body = _body(name, CASES[name], salt=f"logprobs/{mode}/{attempt}")
        idle = idle_page(server)
        num_blocks = int(vl.metric_labels(idle, "vllm:cache_config_info")["num_gpu_blocks"])
        assert num_blocks == NUM_BLOCKS
        assert used_blocks(idle, num_blocks) == 0, "vLLM holds blocks before the request: not idle"
        ice, snapshot = ice_blocks(idle, server.vllm.base_url, body)
        assert snapshot.prefix_caching is server.prefix_caching, snapshot
        seen = observe(server, body, idle)
        if seen.plateau:
            break
    line = (
        f"[fanout] {mode} {name}: 1 prompt of P={PROMPT} × n=4, O={OUTPUT}, B={BLOCK}: "
        f"ICE {ice} blocks, vLLM peak {seen.peak_used} ({seen.polls_at_peak}/{seen.polls} "
        f"polls at peak); prefix-cache hits {seen.hit_tokens:.0f}/{seen.query_tokens:.0f} "
        f"tokens; completion tokens, choices {seen.completion_tokens}; {seen.wall_s:.2f} s; "
        f"attempt {attempt}"
    )
    print("\n" + line)
    assert seen.completion_tokens == (4 * OUTPUT, 4), line
    assert ice == 4 * -(-(PROMPT + OUTPUT) // BLOCK) == 12, line  # 4 × ceil(380 / 128)
    assert ice == seen.peak_used, line
