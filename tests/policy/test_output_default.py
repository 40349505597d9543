"""What a request without an output limit is judged for (``ext_proc.policy.output_limit``): the
backend's own default, not 16 tokens, and the limit the ladder injects when less fits."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ext_proc.policy.decision import Downgrade, Pass, Reject
from ext_proc.policy.evaluate import KvFit, evaluate
from ext_proc.policy.output_limit import backend_output
from ext_proc.policy.pressure import Pressure
from ext_proc.policy.settings import Level, Profile
from ext_proc.schemas import RequestFeatures

PROFILE = Profile(name="p", max_model_len=8192, output_buffer_tokens=512, min_output_tokens=16)
LOW = Pressure(10.0, Level.LOW)
HIGH = Pressure(70.0, Level.HIGH)


def feats(
    schema: str = "openai.chat",
    input_tokens: int = 100,
    max_tokens: int | None = None,
    generates: bool = True,
    samples: int = 1,
) -> RequestFeatures:
    return RequestFeatures(
        schema=schema,
        model="m",
        input_tokens=input_tokens,
        max_tokens=max_tokens,
        max_tokens_field="max_tokens" if max_tokens is not None else None,
        stream=False,
        message_count=1,
        generates=generates,
        samples=samples,
    )


def blocks16(i: int, o: int) -> int:
    return -(-(i + o) // 16)


@pytest.mark.parametrize(
    ("features", "profile", "expected"),
    [
        (feats(max_tokens=300), PROFILE, 300),  # the client's limit
        (feats(), PROFILE, 8192 - 100),  # chat: the rest of the context
        (feats("openai.chat_batch", input_tokens=500), PROFILE, 8192 - 500),
        (feats("openai.responses", input_tokens=8191), PROFILE, 1),
        (feats("openai.completions"), PROFILE, 16),  # vLLM's CompletionRequest default
        (feats(generates=False), PROFILE, 0),  # embeddings
        (feats(), replace(PROFILE, default_output_tokens=2048), 2048),  # the server's default
        (feats(), replace(PROFILE, max_model_len=None), 16),  # unknown context: the floor
    ],
    ids=[
        "limit",
        "chat",
        "batch",
        "responses-full",
        "completions",
        "embeddings",
        "server",
        "no-context",
    ],
)
def test_the_output_the_backend_runs(
    features: RequestFeatures, profile: Profile, expected: int
) -> None:
    assert backend_output(features, profile) == expected


def test_no_limit_injects_what_the_free_blocks_hold() -> None:
    # 100 free blocks of 16: ceil((100 + out) / 16) ≤ 100 ⇔ out ≤ 1,500
    kv = KvFit(free_blocks=100, usable_blocks=1000, block_size=16, blocks=blocks16)
    got = evaluate(feats(), LOW, PROFILE, "standard", kv)
    assert got == Downgrade(LOW, 1500, None, "kv_free_blocks")


def test_no_limit_passes_when_the_whole_context_fits() -> None:
    # ceil(8192 / 16) = 512 blocks ≤ 600 free
    kv = KvFit(free_blocks=600, usable_blocks=1000, block_size=16, blocks=blocks16)
    assert evaluate(feats(), LOW, PROFILE, "standard", kv) == Pass(LOW)


def test_no_limit_takes_the_smaller_of_cap_and_fit() -> None:
    roomy = KvFit(free_blocks=600, usable_blocks=1000, block_size=16, blocks=blocks16)
    assert evaluate(feats(), HIGH, PROFILE, "standard", roomy) == Downgrade(
        HIGH, 1024, None, "pressure_cap"
    )
    # 40 free blocks: out ≤ 640 − 100 = 540 < the cap 1,024
    tight = replace(roomy, free_blocks=40)
    assert evaluate(feats(), HIGH, PROFILE, "standard", tight) == Downgrade(
        HIGH, 540, None, "kv_free_blocks"
    )


def test_no_limit_n_samples_are_fitted_together() -> None:
    # 4 sequences, no sharing: 4 × ceil((100 + out) / 16) ≤ 100 ⇔ ceil(...) ≤ 25 ⇔ out ≤ 300
    kv = KvFit(free_blocks=100, usable_blocks=1000, block_size=16, blocks=blocks16)
    got = evaluate(feats(samples=4), LOW, PROFILE, "standard", kv)
    assert got == Downgrade(LOW, 300, None, "kv_free_blocks")


def test_completions_without_a_limit_stay_at_sixteen() -> None:
    kv = KvFit(free_blocks=100, usable_blocks=1000, block_size=16, blocks=blocks16)
    assert evaluate(feats("openai.completions"), LOW, PROFILE, "standard", kv) == Pass(LOW)


def test_shed_mode_judges_a_no_limit_request_for_the_rest_of_the_context() -> None:
    shed = replace(PROFILE, on_kv_shortfall="shed")
    kv = KvFit(free_blocks=100, usable_blocks=1000, block_size=16, blocks=blocks16)
    got = evaluate(feats(), LOW, shed, "standard", kv)
    assert isinstance(got, Reject) and got.reason == "kv_exhausted"
