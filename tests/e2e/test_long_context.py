"""A 2.76 MB conversation counted exactly through real Envoy: a verdict, then the next turn cached.

ICE runs with the tiny test tokenizer for ``dev-model`` and ``exact_count: always``. The
first request (about 700k tokens, cold) is counted by pieces in the helper, or, past
``exact_count_budget_ms``, judged from its size: either way it gets a verdict (before this,
Envoy's message timeout let it through unjudged). The next turn (the same history and two
new turns) is counted from the cache: exact.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import openai

from .harness import running_stack

TOKENIZER = Path(__file__).resolve().parents[1] / "data" / "vllm_cpu" / "tokenizer"


def history(nbytes: int) -> list[dict[str, str]]:
    turn = "the scheduler admits requests while kv blocks remain free and the queue is short "
    count = max(1, nbytes // (len(turn) * 30 + 40)) | 1
    roles = ("user", "assistant")
    return [{"role": roles[i % 2], "content": f"{i}: {turn * 30}"} for i in range(count)]


def send(client: openai.OpenAI, messages: list[dict[str, str]]) -> tuple[int, dict[str, str]]:
    try:
        raw = client.chat.completions.with_raw_response.create(
            model="dev-model",
            messages=messages,  # type: ignore[arg-type]
            max_tokens=16,
        )
        return raw.status_code, dict(raw.headers)
    except openai.APIStatusError as e:
        return e.status_code, dict(e.response.headers)


def test_a_long_conversation_gets_a_verdict_and_its_next_turn_is_counted_from_the_cache(
    tmp_path: Path,
) -> None:
    extra = f"tokenizers:\n  dev-model: {{model_dir: {TOKENIZER}}}\nexact_count: always\n"
    with running_stack(tmp_path, policy_extra=extra) as e2e:
        client = openai.OpenAI(base_url=f"{e2e.base_url}/v1", api_key="x", max_retries=0)
        messages: list[dict[str, Any]] = history(2_760_000)
        status, first = send(client, messages)
        assert "x-ice-decision" in first, (status, first)  # not Envoy's fail-open
        assert first.get("x-ice-tokens") == "exact" or first.get("x-ice-judged") == "headers"
        if first.get("x-ice-tokens") == "exact":
            # ~700k tokens against the e2e model's 8,192: refused in the OpenAI format
            assert status == 400 and first["x-ice-reason"] == "context_length_exceeded"
        time.sleep(1)  # a budget-cut first count still finishes in the helper, and is cached
        pieces = e2e.ice_metric("ice_token_counts_total", mode="pieces")
        turn = [
            *messages,
            {"role": "assistant", "content": "Done."},
            {"role": "user", "content": "Next step, please."},
        ]
        status, nxt = send(client, turn)
        assert nxt.get("x-ice-tokens") == "exact", (
            status,
            {k: v for k, v in first.items() if k.startswith("x-")},
            {k: v for k, v in nxt.items() if k.startswith("x-")},
        )
        assert status == 400 and nxt["x-ice-reason"] == "context_length_exceeded"
        assert e2e.ice_metric("ice_token_counts_total", mode="pieces") == pieces + 1
        client.close()
