"""Exact counts only when the verdict depends on them (ext_proc/admit/counting.py), hand-computed.

The estimate's bounds are lo = ⌈text × 0.5⌉ + media and hi = ⌈text × 2⌉ + media; when the
ladder gives both the same verdict the estimate decides at hi (``x-ice-tokens: estimate``),
else the tokenizer counts (``exact``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from ext_proc.admit.counting import bounds, same_verdict
from ext_proc.admit.pipeline import Pipeline, RequestFacts
from ext_proc.policy.coarse import coarse_tokens
from ext_proc.policy.decision import Downgrade, Pass, Reject
from ext_proc.schemas import BY_NAME, RequestFeatures
from tests.builders import exact_pipeline

DATA = Path(__file__).parents[1] / "data"


def features(tokens: int, media: int = 0, prompts: tuple[int, ...] = ()) -> RequestFeatures:
    return RequestFeatures(
        schema="openai.chat", model="tiny", input_tokens=tokens, max_tokens=None,
        max_tokens_field=None, stream=False, message_count=1, media_tokens=media,
        prompt_tokens=prompts,
    )  # fmt: skip


def test_bounds_scale_the_text_and_keep_the_media() -> None:
    lo, hi = bounds(features(1001, media=201), nbytes=100_000)
    # text = 800: lo = 400 + 201, hi = 1,600 + 201
    assert (lo.input_tokens, hi.input_tokens) == (601, 1801)
    lo, hi = bounds(features(900, prompts=(900, 101)), nbytes=100_000)
    assert (lo.prompt_tokens, hi.prompt_tokens) == ((450, 51), (1800, 202))


def test_bounds_use_the_tokenizers_measured_factors() -> None:
    # text = 800: lo = ⌈800 × 0.25⌉ + 201 = 401, hi = ⌈800 × 7.51⌉ + 201 = 6,008 + 201
    lo, hi = bounds(features(1001, media=201), nbytes=100_000, factors=(0.25, 7.51))
    assert (lo.input_tokens, hi.input_tokens) == (401, 6209)


def test_the_upper_bound_never_passes_the_bodys_byte_bound() -> None:
    # 300 bytes: at most 300 + 256 tokens, whatever the estimate says
    _, hi = bounds(features(400), nbytes=300)
    assert hi.input_tokens == 556


def test_same_verdict_is_both_pass_or_the_same_refusal() -> None:
    a = Reject(None, 429, "kv_exhausted", "x")
    assert same_verdict(Pass(None), Pass(None))
    assert same_verdict(a, Reject(None, 429, "kv_exhausted", "other message"))
    assert not same_verdict(a, Reject(None, 429, "memory_pressure", "x"))
    assert not same_verdict(Pass(None), a)
    assert not same_verdict(Downgrade(None, 10, None, "context_budget"), Pass(None))


def pipeline(max_model_len: int, exact_count: str = "needed") -> Pipeline:
    return exact_pipeline(max_model_len, exact_count)


def request_of(content: str, max_tokens: int = 8) -> dict[str, object]:
    return {
        "model": "tiny",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
    }


def judge(p: Pipeline, content: str, max_tokens: int = 8) -> tuple[object, dict[str, str]]:
    route = p.router.resolve(())
    body = request_of(content, max_tokens)
    verdict = p.on_body(
        route, RequestFacts(adapter=BY_NAME["openai.chat"]), json.dumps(body).encode()
    )
    assert verdict is not None and verdict.features is not None
    return verdict, dict(verdict.outcome.headers)


def test_far_from_every_limit_the_estimate_decides_at_its_upper_bound() -> None:
    p = pipeline(max_model_len=100_000)
    verdict, headers = judge(p, "word " * 400)  # ~500 tokens: far below 100k either way
    assert headers["x-ice-tokens"] == "estimate"
    f = verdict.features  # type: ignore[attr-defined]
    assert f.input_tokens_source == "estimate"
    # the estimate: ⌈2,000 ASCII characters / 4⌉ + 4 for the message + 3 for the reply
    # primer = 507; judged and held at hi = ⌈507 × the tiny tokenizer's measured high⌉ (7.51:
    # it spends 3 tokens on an arrow the estimate prices at ½), capped by the byte bound
    high = p.counters.counter_for("tiny").bounds.high
    nbytes = len(json.dumps(request_of("word " * 400)).encode())
    assert high == 7.51
    assert f.input_tokens == min(math.ceil(507 * high), coarse_tokens(nbytes, None)) == 2337
    assert isinstance(verdict.decision, Pass)  # type: ignore[attr-defined]


def test_near_the_context_the_tokenizer_counts() -> None:
    p = pipeline(max_model_len=600)
    # ~400–500 tokens of text: lo (≈ 250) fits 600 with its 8 output tokens, hi (≈ 1,000) does
    # not: the verdicts differ, so the exact count decides
    verdict, headers = judge(p, "word " * 400)
    assert headers["x-ice-tokens"] == "exact"
    assert verdict.features.input_tokens_source == "exact"  # type: ignore[attr-defined]


def test_exact_count_always_counts_every_request() -> None:
    verdict, headers = judge(pipeline(100_000, "always"), "word " * 400)
    assert headers["x-ice-tokens"] == "exact"
    assert verdict.features.input_tokens_source == "exact"  # type: ignore[attr-defined]


def test_a_model_without_a_tokenizer_says_nothing_about_tokens() -> None:
    p = pipeline(max_model_len=100_000)
    route = p.router.resolve(())
    body = {"model": "other", "messages": [{"role": "user", "content": "hi"}]}
    verdict = p.on_body(
        route, RequestFacts(adapter=BY_NAME["openai.chat"]), json.dumps(body).encode()
    )
    assert verdict is not None and "x-ice-tokens" not in dict(verdict.outcome.headers)


def test_text_the_tokenizer_cannot_count_is_judged_at_the_estimates_upper_bound() -> None:
    p = pipeline(max_model_len=100_000, exact_count="always")
    route = p.router.resolve(())
    # a lone surrogate is valid JSON but no valid text for the tokenizer
    body = b'{"model": "tiny", "messages": [{"role": "user", "content": "' + b"word " * 400
    body += b'\\ud800"}], "max_tokens": 8}'
    verdict = p.on_body(route, RequestFacts(adapter=BY_NAME["openai.chat"]), body)
    assert verdict is not None and verdict.features is not None
    f = verdict.features
    assert f.input_tokens_source == "fallback"
    # the estimate: ⌈2,000 ASCII / 4⌉ + 1 narrow character's ⌈1/2⌉ + 4 + 3 = 508; × the
    # measured high (7.51), capped by the body's byte bound
    high = p.counters.counter_for("tiny").bounds.high
    assert f.input_tokens == min(math.ceil(508 * high), coarse_tokens(len(body), None))
    assert dict(verdict.outcome.headers)["x-ice-tokens"] == "estimate"


def test_a_body_of_many_tiny_distinct_turns_caches_nothing() -> None:
    from tokenizers import Tokenizer

    from ext_proc.tokencount.pieces import PieceCounter

    tok = Tokenizer.from_file(str(DATA / "vllm_cpu" / "tokenizer" / "tokenizer.json"))
    pc = PieceCounter(tok)
    text = "</s>".join(f"t{i}" for i in range(20_000))  # 20,000 distinct short pieces
    assert pc.count(text) == pc.count_whole(text)
    assert pc.entries == 0  # pieces under 64 characters are not worth a cache entry
