"""Exact token counts through the pipeline: a policy naming the model's tokenizer makes ICE
judge with the count vLLM itself reports (recorded from a real vLLM CPU server)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from ext_proc.admit.pipeline import Pipeline, RequestFacts
from ext_proc.policy.load import PolicyError, parse_policy
from ext_proc.schemas import schema_for_path
from ext_proc.signals.snapshot import BackendSignals, PoolSnapshot
from tests.builders import exact_pipeline as pipeline

DATA = Path(__file__).parents[1] / "data"
RECORDED = json.loads((DATA / "tokens" / "vllm_usage.json").read_text())
CASES = [
    c
    for c in RECORDED["cases"]
    if c["template"] == "tiny" and c["status"] == 200 and c["endpoint"] != "/v1/completions"
]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_judged_input_tokens_equal_vllm_prompt_tokens(case: dict[str, object]) -> None:
    p = pipeline(4096)
    route = p.router.resolve([])
    adapter = schema_for_path(str(case["endpoint"]))
    assert adapter is not None
    request = {"max_tokens": 1, **case["request"], "model": "tiny"}  # type: ignore[dict-item]
    body = json.dumps(request).encode()  # recorded with max_tokens 1
    verdict = p.on_body(route, RequestFacts(adapter=adapter), body)
    assert verdict is not None and verdict.features is not None
    assert verdict.features.input_tokens_source == "exact"
    assert verdict.features.input_tokens == case["prompt_tokens"]


def test_exact_count_decides_the_context_budget() -> None:
    case = CASES[0]  # 22 prompt tokens by vLLM's count
    body = json.dumps({**case["request"], "model": "tiny", "max_tokens": 100}).encode()
    adapter = schema_for_path("/v1/chat/completions")
    # max_model_len 50, buffer 0: safe output = 50 − 22 = 28 exactly
    p = pipeline(50)
    verdict = p.on_body(p.router.resolve([]), RequestFacts(adapter=adapter), body)
    assert verdict is not None and verdict.outcome.body is not None  # type: ignore[union-attr]
    assert json.loads(verdict.outcome.body)["max_tokens"] == 50 - case["prompt_tokens"]  # type: ignore[union-attr]


def test_models_without_a_tokenizer_keep_the_estimate() -> None:
    p = pipeline(4096)
    body = b'{"model": "other", "messages": [{"role": "user", "content": "hi"}]}'
    verdict = p.on_body(
        p.router.resolve([]), RequestFacts(adapter=schema_for_path("/v1/chat/completions")), body
    )
    assert verdict is not None and verdict.features is not None
    assert verdict.features.input_tokens_source == "estimate"


def test_missing_tokenizer_file_stops_start_up(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match=r"tokenizers\.m\.tokenizer_json: no such file"):
        parse_policy("tokenizers: {m: {tokenizer_json: nope.json}}", base_dir=tmp_path)


def test_expected_prefix_reuse_lowers_the_blocks_a_request_needs() -> None:
    from ext_proc.signals.scrapes import Derived

    policy = parse_policy("profiles: {default: {on_kv_shortfall: shed}}")
    derived = Derived(window_s=10.0, prefix_cache_hit_ratio=0.5, prompt_tokens_per_s=100.0)
    # 101 blocks of 16 tokens, usage 0.9 → floor(100 × 0.1) = 10 blocks (160 tokens) free
    backend = BackendSignals(
        url="u",
        kv_cache_usage=0.9,
        num_requests_waiting=0,
        num_gpu_blocks=101,
        block_size=16,
        derived=derived,
    )
    snap = PoolSnapshot(pool="default", backends=(backend,), taken_at_s=time.monotonic())
    p = Pipeline(policy, lambda _pool: snap)
    kv = p.views.room(p.router.resolve([]).profile, snap)
    assert kv is not None and kv.free_blocks == 10
    # input 200, output 40: ceil(240 / 16) = 15 blocks; expected hit floor(200 × 0.5) = 100
    # tokens → 6 whole blocks already cached → 9 new blocks ≤ 10 free
    assert kv.blocks(200, 40) == 15 - 6
