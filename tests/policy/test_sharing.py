"""Samples share prompt blocks only where vLLM reads the prefix cache: not with
``prompt_logprobs``, not with ``echo`` and logprobs, not with caching off (hand-computed; vLLM
0.32's rule: ``SamplingParams.skip_reading_prefix_cache``, see ``ext_proc.policy.kvfit``)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ext_proc.placement.poolview import PoolViews
from ext_proc.policy.decision import Pass, Reject
from ext_proc.policy.evaluate import Shape, evaluate
from ext_proc.policy.pressure import Pressure
from ext_proc.policy.settings import Level, Profile
from ext_proc.schemas import ADAPTERS, BadRequest, RequestFeatures, rawjson
from ext_proc.signals.snapshot import BackendSignals, PoolSnapshot

PROFILE = Profile(name="p", max_model_len=8192, output_buffer_tokens=512, min_output_tokens=16)
LOW = Pressure(10.0, Level.LOW)
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
GENERATE = "/inference/v1/generate"


def snapshot(
    blocks: int = 64, block_size: int = 128, caching: bool = True, hit_rate: float | None = None
) -> PoolSnapshot:
    backend = BackendSignals(
        url="u",
        kv_cache_usage=0.0,
        num_gpu_blocks=blocks,
        block_size=block_size,
        prefix_caching=caching,
        cache_hit_rate=hit_rate,
    )
    return PoolSnapshot(pool="p", backends=(backend,), taken_at_s=0.0)


def features(path: str, body: dict[str, Any]) -> RequestFeatures:
    return ADAPTERS[path].features(rawjson.decode_object(json.dumps(body).encode()))


def completions(**extra: Any) -> dict[str, Any]:
    # 300 token ids: 2 full blocks of 128 and 44 tokens
    return {"prompt": list(range(1, 301)), "n": 4, "max_tokens": 40, **extra}


def generate(**params: Any) -> dict[str, Any]:
    """vLLM's token-in endpoint: the sampling parameters sit in ``sampling_params``."""
    return {"model": "m", "token_ids": [1, 2, 3], "sampling_params": {"max_tokens": 8, **params}}


def chat(**extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": "hi"}], "n": 4, **extra}


@pytest.mark.parametrize(
    ("path", "body", "reads"),
    [
        (COMPLETIONS, completions(), True),
        (COMPLETIONS, completions(prompt_logprobs=0), False),
        (COMPLETIONS, completions(prompt_logprobs=None), True),
        (COMPLETIONS, completions(echo=True, logprobs=0), False),
        (COMPLETIONS, completions(echo=True), True),  # completions' logprobs default: None
        (COMPLETIONS, completions(logprobs=5), True),  # logprobs of the output only
        (COMPLETIONS, completions(echo=False, logprobs=5), True),
        (CHAT, chat(), True),
        (CHAT, chat(prompt_logprobs=1), False),
        (CHAT, chat(echo=True), False),  # chat's top_logprobs defaults to 0, not None
        (CHAT, chat(echo=True, top_logprobs=None), True),
        (CHAT, chat(logprobs=True, top_logprobs=5), True),
        (GENERATE, generate(), True),
        (GENERATE, generate(prompt_logprobs=0), False),
        (GENERATE, generate(logprobs=5), True),
    ],
    ids=[
        "completions-plain",
        "completions-prompt_logprobs",
        "completions-prompt_logprobs-null",
        "completions-echo-logprobs",
        "completions-echo-alone",
        "completions-logprobs-alone",
        "completions-echo-false",
        "chat-plain",
        "chat-prompt_logprobs",
        "chat-echo",
        "chat-echo-top_logprobs-null",
        "chat-top_logprobs",
        "generate-plain",
        "generate-prompt_logprobs",
        "generate-logprobs-alone",
    ],
)
def test_whether_a_request_reads_the_prefix_cache_follows_vllm(
    path: str, body: dict[str, Any], reads: bool
) -> None:
    assert features(path, body).reads_prefix_cache is reads


@pytest.mark.parametrize(
    ("extra", "caching", "expected"),
    [
        # n=4 of P=300, O=40, B=128: first ceil(340/128) = 3, a sibling 3 − floor(299/128) = 1
        ({}, True, 3 + 3 * 1),
        # prompt logprobs: vLLM reads no cached block, every sample prefills in full: 4 × 3
        ({"prompt_logprobs": 0}, True, 12),
        ({"echo": True, "logprobs": 0}, True, 12),
        # caching off: 4 × 3 as well
        ({}, False, 12),
        ({"prompt_logprobs": 0}, False, 12),
    ],
    ids=["shared", "prompt_logprobs", "echo-logprobs", "caching-off", "both"],
)
def test_samples_that_read_no_cache_share_no_block(
    extra: dict[str, Any], caching: bool, expected: int
) -> None:
    fit = PoolViews().room(PROFILE, snapshot(caching=caching))
    assert fit is not None
    f = features(COMPLETIONS, completions(**extra))
    assert fit.need(Shape.of(f, PROFILE), 40) == expected


def test_a_request_that_reads_no_cache_expects_no_hit() -> None:
    # one sample of P=300, O=40, the pool's hit ratio 0.5: cached = floor(300 × 0.5) = 150,
    # whole blocks 150 // 128 = 1 → ceil(340/128) − 1 = 2; with prompt_logprobs no hit: 3
    fit = PoolViews().room(PROFILE, snapshot(hit_rate=0.5))
    assert fit is not None
    plain = features(COMPLETIONS, completions(n=1))
    logprobs = features(COMPLETIONS, completions(n=1, prompt_logprobs=0))
    assert fit.need(Shape.of(plain, PROFILE), 40) == 2
    assert fit.need(Shape.of(logprobs, PROFILE), 40) == 3


def test_n8_of_a_2000_token_prompt_with_prompt_logprobs_is_refused() -> None:
    # The case. 200 blocks of 16 (199 usable, all free), P=2000 token ids, n=8,
    # max_tokens 16: shared, first = ceil(2016/16) = 126, a sibling 126 − floor(1999/16) = 2:
    # 126 + 7 × 2 = 140 ≤ 199 passes. With prompt_logprobs: 8 × 126 = 1008 > 199 usable:
    # the request can never fit, a 400.
    fit = PoolViews().room(PROFILE, snapshot(blocks=200, block_size=16))
    body = {"prompt": list(range(1, 2001)), "n": 8, "max_tokens": 16}
    shared = features(COMPLETIONS, body)
    assert evaluate(shared, LOW, PROFILE, "standard", fit) == Pass(LOW)
    unshared = features(COMPLETIONS, {**body, "prompt_logprobs": 1})
    d = evaluate(unshared, LOW, PROFILE, "standard", fit)
    assert isinstance(d, Reject) and (d.status, d.reason) == (400, "kv_capacity_exceeded")
    assert "1008" in d.message


def test_a_duplicated_sharing_key_is_a_400() -> None:
    raw = b'{"prompt":"hi","n":4,"prompt_logprobs":0,"prompt_logprobs":null}'
    with pytest.raises(BadRequest) as e:
        ADAPTERS[COMPLETIONS].features(rawjson.decode_object(raw))
    assert e.value.param == "prompt_logprobs"
