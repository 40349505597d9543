"""The ladder judges a request's whole shape: fan-out in the KV arithmetic, the per-request
caps, embeddings without output, stored context, and downgrades that write every limit field
the backend might read (pure, hand-computed)."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from ext_proc.admit.outcome import Continue, plan
from ext_proc.placement.poolview import PoolViews
from ext_proc.policy.decision import Downgrade, Pass, Reject
from ext_proc.policy.evaluate import Shape, evaluate
from ext_proc.policy.pressure import Pressure
from ext_proc.policy.settings import Level, Profile
from ext_proc.schemas import ADAPTERS, SCHEMAS, RequestFeatures, rawjson
from ext_proc.signals.snapshot import BackendSignals, PoolSnapshot

PROFILE = Profile(name="p", max_model_len=8192, output_buffer_tokens=512, min_output_tokens=16)
LOW = Pressure(10.0, Level.LOW)
HIGH = Pressure(70.0, Level.HIGH)


def snapshot(
    blocks: int, block_size: int = 16, caching: bool | None = True, usage: float = 0.0
) -> PoolSnapshot:
    """A backend of ``blocks`` blocks: blocks − 1 usable (vLLM's null block), of which
    floor((blocks − 1) × (1 − usage)) are free."""
    backend = BackendSignals(
        url="u",
        kv_cache_usage=usage,
        num_gpu_blocks=blocks,
        block_size=block_size,
        prefix_caching=caching,
    )
    return PoolSnapshot(pool="p", backends=(backend,), taken_at_s=0.0)


def feats(
    prompts: tuple[int, ...], samples: int = 1, max_tokens: int | None = 256
) -> RequestFeatures:
    return RequestFeatures(
        schema="openai.completions",
        model="m",
        input_tokens=max(prompts),
        max_tokens=max_tokens,
        max_tokens_field="max_tokens" if max_tokens is not None else None,
        stream=False,
        message_count=len(prompts),
        prompt_tokens=prompts if len(prompts) > 1 else (),
        samples=samples,
    )


@pytest.mark.parametrize(
    ("prompts", "samples", "output", "caching", "expected"),
    [
        # one prompt of 300 tokens, 40 out, block 128: ceil(340/128) = 3 blocks
        ((300,), 1, 40, True, 3),
        # n=4 sharing the prompt's full blocks: 3 + 3 × (3 − floor(299/128) = 2) = 3 + 3 = 6
        ((300,), 4, 40, True, 6),
        # n=4 without prefix caching: 4 × 3 = 12
        ((300,), 4, 40, False, 12),
        # the page does not say: counted as not shared
        ((300,), 4, 40, None, 12),
        # four prompts of 300: nothing shared between prompts, 4 × 3 = 12
        ((300, 300, 300, 300), 1, 40, True, 12),
        # a batch of two, n=2: 2 × (3 + 1) = 8
        ((300, 300), 2, 40, True, 8),
        # a prompt of exactly 256 tokens: siblings re-compute its last block,
        # 3 + 3 × (ceil(296/128) − floor(255/128)) = 3 + 3 × (3 − 1) = 9
        ((256,), 4, 40, True, 9),
    ],
    ids=["single", "n4-shared", "n4-unshared", "n4-unknown", "batch4", "batch2-n2", "full-blocks"],
)
def test_blocks_of_a_fanned_out_request(
    prompts: tuple[int, ...], samples: int, output: int, caching: bool | None, expected: int
) -> None:
    fit = PoolViews().room(PROFILE, snapshot(64, block_size=128, caching=caching))
    assert fit is not None
    assert fit.need(Shape.of(feats(prompts, samples), PROFILE), output) == expected


def test_a_fanned_out_request_is_downgraded_as_a_whole() -> None:
    # 21 blocks → 20 free, block 16, n=4 of a 100-token prompt: c = ceil((100 + O) / 16),
    # need = c + 3 × (c − floor(99/16) = 6) = 4c − 18 ≤ 20 → c ≤ 9 → 100 + O ≤ 144 → O = 44
    views = PoolViews()
    fit = views.room(PROFILE, snapshot(21))
    d = evaluate(feats((100,), samples=4, max_tokens=4000), LOW, PROFILE, "standard", fit)
    assert d == Downgrade(LOW, 44, 4000, "kv_free_blocks")


def test_the_same_request_without_sharing_is_shed() -> None:
    # unshared: 4 × ceil((100 + 16) / 16) = 32 blocks for min_output_tokens > 20 free
    # (201 blocks, 90 % used: floor(200 × 0.1) = 20 free)
    fit = PoolViews().room(PROFILE, snapshot(201, caching=False, usage=0.9))
    d = evaluate(feats((100,), samples=4, max_tokens=4000), LOW, PROFILE, "standard", fit)
    assert isinstance(d, Reject) and (d.status, d.reason) == (429, "kv_exhausted")
    assert "32 KV-cache blocks" in d.message


def test_a_request_that_can_never_fit_the_pool_is_a_400() -> None:
    # 12 prompts of 2,000 tokens: 12 × ceil(2001 / 16) = 12 × 126 = 1512 blocks > 999 usable
    fit = PoolViews().room(PROFILE, snapshot(1000))
    d = evaluate(feats((2000,) * 12, max_tokens=10), LOW, PROFILE, "standard", fit)
    assert isinstance(d, Reject) and (d.status, d.reason) == (400, "kv_capacity_exceeded")
    assert "12 sequences" in d.message and "1512" in d.message


@pytest.mark.parametrize(
    ("f", "reason", "param"),
    [
        (feats((5,), samples=3000), "too_many_sequences", "n"),
        (feats((5,) * 3000), "too_many_sequences", "prompt"),
        (feats((5,) * 4, samples=5), "too_many_sequences", "n"),
        (
            replace(feats((5,)), schema="openai.chat", media_parts=17, media_tokens=17 * 576),
            "too_many_media_parts",
            "messages",
        ),
        (
            replace(
                feats((5,) * 5000, max_tokens=None),
                schema="openai.embeddings",
                generates=False,
                inputs=5000,
            ),
            "too_many_inputs",
            "input",
        ),
    ],
    ids=["n-3000", "prompts-3000", "4x5", "media-17", "embeddings-5000"],
)
def test_per_request_caps_are_400s(f: RequestFeatures, reason: str, param: str) -> None:
    d = evaluate(f, LOW, PROFILE, "standard")
    assert isinstance(d, Reject) and (d.status, d.reason, d.param) == (400, reason, param)


def test_sixteen_sequences_are_allowed_by_default() -> None:
    assert evaluate(feats((5,) * 4, samples=4), LOW, PROFILE, "standard") == Pass(LOW)


def test_embeddings_are_never_given_an_output_limit() -> None:
    f = replace(feats((5000,), max_tokens=None), schema="openai.embeddings", generates=False)
    # at high pressure a chat request without a limit gets the cap injected; embeddings not
    assert evaluate(f, HIGH, PROFILE, "critical") == Pass(HIGH)
    # but an input over the context is a 400
    big = replace(f, input_tokens=8193, prompt_tokens=())
    assert isinstance(evaluate(big, LOW, PROFILE, "standard"), Reject)
    # and exactly max_model_len fits: embeddings have no output
    assert evaluate(replace(f, input_tokens=8192), LOW, PROFILE, "standard") == Pass(LOW)


def test_stored_context_fills_the_window_in_the_kv_checks() -> None:
    # 1,025 blocks of 16, half used: 512 free = 8,192 tokens; a stored-context request counts
    # as the whole 8,192-token window: ceil(8192 / 16) = 512 blocks → fits; with 511 free
    # (usage 513/1024) it cannot
    f = replace(feats((10,), max_tokens=100), schema="openai.responses", stored_context=True)
    fits = PoolViews().room(PROFILE, snapshot(1025, usage=0.5))
    assert evaluate(f, LOW, PROFILE, "standard", fits) == Pass(LOW)
    tight = PoolViews().room(PROFILE, snapshot(1025, usage=513 / 1024))
    d = evaluate(f, LOW, PROFILE, "standard", tight)
    assert isinstance(d, Reject) and d.reason == "kv_exhausted"
    refuse = replace(PROFILE, stored_context="reject")
    d = evaluate(f, LOW, refuse, "standard", fits)
    assert isinstance(d, Reject) and (d.status, d.reason) == (400, "stored_context_unsupported")


def test_the_ledger_holds_every_sequence_of_a_passed_request() -> None:
    views = PoolViews()
    snap = snapshot(64, block_size=128)
    views.hold(PROFILE, snap, Shape.of(feats((300,), samples=4), PROFILE), 40)
    assert views.held(snap) == 6


# -- the rewrite lowers every limit field the backend might read


def rewrite(adapter: Any, raw: str, limit: int) -> dict[str, Any]:
    f = adapter.features(rawjson.decode_object(raw.encode()))
    out = plan(Downgrade(HIGH, limit, f.max_tokens, "pressure_cap"), adapter, raw.encode(), f)
    assert isinstance(out, Continue) and out.body is not None
    result: dict[str, Any] = json.loads(out.body)
    return result


@pytest.mark.parametrize(
    ("adapter", "raw", "limit", "expected"),
    [
        (
            ADAPTERS["/v1/chat/completions"],
            '{"messages":[],"max_completion_tokens":4000,"max_tokens":16}',
            1024,
            {"max_completion_tokens": 1024, "max_tokens": 16},
        ),
        (
            ADAPTERS["/v1/chat/completions"],
            '{"messages":[],"max_completion_tokens":4000,"max_tokens":9000}',
            1024,
            {"max_completion_tokens": 1024, "max_tokens": 1024},
        ),
        (
            ADAPTERS["/v1/responses"],
            '{"input":"a","max_output_tokens":100000000}',
            1024,
            {"max_output_tokens": 1024},
        ),
        (ADAPTERS["/v1/responses"], '{"input":"a"}', 256, {"max_output_tokens": 256}),
        (
            ADAPTERS["/v1/responses"],
            '{"input":"a","max_output_tokens":null}',
            256,
            {"max_output_tokens": 256},
        ),
        (
            ADAPTERS["/v1/chat/completions"],
            '{"messages":[],"max_tokens":null}',
            512,
            {"max_tokens": 512},
        ),
        (
            ADAPTERS["/inference/v1/generate"],
            '{"token_ids":[1],"sampling_params":{"max_tokens":5000,"n":2}}',
            1024,
            {"sampling_params": {"max_tokens": 1024, "n": 2}},
        ),
        (
            SCHEMAS["sglang_generate"],
            '{"text":"a"}',
            100,
            {"sampling_params": {"max_new_tokens": 100}},
        ),
        (
            SCHEMAS["sglang_generate"],
            '{"text":["a","b"],"sampling_params":[{"max_new_tokens":900},{"n":2}]}',
            100,
            {"sampling_params": [{"max_new_tokens": 100}, {"n": 2, "max_new_tokens": 100}]},
        ),
    ],
    ids=[
        "chat-mct-lowered-smaller-mt-kept",
        "chat-both-lowered",
        "responses",
        "responses-injected",
        "responses-null-replaced",
        "chat-null-replaced",
        "vllm-generate-nested",
        "sglang-injected",
        "sglang-list",
    ],
)
def test_a_downgrade_leaves_no_limit_field_above_the_new_limit(
    adapter: Any, raw: str, limit: int, expected: dict[str, Any]
) -> None:
    body = rewrite(adapter, raw, limit)
    assert {k: body[k] for k in expected} == expected


def test_a_null_limit_is_replaced_not_shadowed_by_a_second_key() -> None:
    raw = b'{"messages":[],"max_tokens":null}'
    adapter = ADAPTERS["/v1/chat/completions"]
    f = adapter.features(rawjson.decode_object(raw))
    out = plan(Downgrade(HIGH, 512, None, "pressure_cap"), adapter, raw, f)
    assert isinstance(out, Continue) and out.body is not None
    # a first-copy-wins parser would read a leading null as "no limit"
    assert out.body.count(b'"max_tokens"') == 1
    assert json.loads(out.body)["max_tokens"] == 512


def test_a_nested_rewrite_keeps_the_other_bytes() -> None:
    raw = '{"token_ids": [1],  "sampling_params": {"temperature": 1e-1 , "max_tokens": 5000}}'
    adapter = ADAPTERS["/inference/v1/generate"]
    f = adapter.features(rawjson.decode_object(raw.encode()))
    out = plan(Downgrade(HIGH, 7, 5000, "pressure_cap"), adapter, raw.encode(), f)
    assert isinstance(out, Continue)
    assert out.body == raw.replace("5000", "7").encode()
