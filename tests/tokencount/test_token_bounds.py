"""The estimate's bounds are measured per tokenizer, and ``needed`` never admits on an undercount.

``ext_proc.tokencount.calibration``: low = min(0.5, ⌊min r / 1.25⌋₀.₀₁), high = max(2.0,
⌈max r × 1.25⌉₀.₀₁) over r = exact ÷ estimate on the shipped sample; the pipeline's
``exact_count: needed`` judges at ⌈estimate × high⌉, so every exact count must lie below it
(a property over generated text per family), and needed refuses what always refuses on CSV,
digits and emoji bodies.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ext_proc.admit.counting import bounds
from ext_proc.admit.pipeline import RequestFacts
from ext_proc.admit.reload_carry import estimate_request
from ext_proc.policy.decision import Reject
from ext_proc.schemas import BY_NAME
from ext_proc.tokencount.calibration import (
    DEFAULT_BOUNDS,
    EstimateBounds,
    calibration_requests,
    measure_bounds,
)
from tests.builders import counting_pipeline
from tests.token_families import Loaded


def test_the_bounds_are_the_worst_ratios_with_a_margin_never_narrower_than_assumed() -> None:
    ratios = {"prose": 1.0, "digits": 3.7, "whitespace": 0.3}

    def exact(api: str, body: Any) -> int:
        return 0 if api != "openai.chat" else 1000

    def estimate(api: str, body: Any) -> int:
        name = body["messages"][0]["content"] if "messages" in body else ""
        return round(1000 / ratios.get(name, 1.0))

    import ext_proc.tokencount.calibration as cal

    original = cal.calibration_requests
    cal.calibration_requests = lambda: [  # type: ignore[assignment]
        (n, "openai.chat", {"messages": [{"role": "user", "content": n}]}) for n in ratios
    ]
    try:
        got = measure_bounds(exact, estimate)
    finally:
        cal.calibration_requests = original  # type: ignore[assignment]
    # digits: 1000 / round(1000 / 3.7) = 1000 / 270 = 3.7037 → × 1.25 = 4.6296 → 4.63
    # whitespace: 1000 / 3333 = 0.30003 → / 1.25 = 0.24002 → 0.24
    assert got == EstimateBounds(0.24, 4.63, "measured", "whitespace 0.30", "digits 3.70")
    # ratios within 0.5–2.0 measure as the assumed bounds: measuring only widens
    ratios.update(digits=1.2, whitespace=0.8)
    cal.calibration_requests = lambda: [  # type: ignore[assignment]
        (n, "openai.chat", {"messages": [{"role": "user", "content": n}]}) for n in ratios
    ]
    try:
        assert measure_bounds(exact, estimate).factors == DEFAULT_BOUNDS.factors
    finally:
        cal.calibration_requests = original  # type: ignore[assignment]


def test_the_calibration_sample_is_the_same_every_time_and_covers_every_class() -> None:
    first, second = calibration_requests(), calibration_requests()
    assert first == second
    names = {name for name, _, _ in first}
    for cls in ("prose", "code", "csv", "logs", "digits", "emoji", "cjk", "whitespace"):
        assert cls in names and f"{cls} (prompt)" in names
    for name, api, body in first:
        if api == "openai.completions":  # wide classes: 1,000 characters, 2 bytes and more each
            assert 1000 <= len(body["prompt"]) <= 2000, name


def test_byte_fallback_and_digit_splitting_vocabularies_measure_wider_than_assumed(
    families: Loaded,
) -> None:
    for name in ("sp-bpe-inst", "sp-unigram-gemma", "tiny"):
        bounds = families[name][1].bounds
        assert bounds.source == "measured"
        assert bounds.high > 4.0, (name, bounds)  # an arrow: 3 bytes, priced at half a token


CLASSES = st.sampled_from(
    [
        "0123456789",
        "😀🙂🎉🚀",
        "内存压力測試",
        "→↔⇒─│┼",
        "e\u0301a\u0300",
        ",;:-_=|#",
        "   \t\n",
        "abcdefghij ",
        "émigré Привет",
    ]
)
BODY_TEXT = st.lists(
    st.tuples(CLASSES, st.integers(1, 60)).map(
        lambda cn: "".join(cn[0][i % len(cn[0])] for i in range(cn[1]))
    ),
    min_size=1,
    max_size=12,
).map("".join)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(BODY_TEXT, min_size=1, max_size=3))
def test_needed_never_holds_a_request_below_its_exact_count(
    families: Loaded,
    contents: list[str],
) -> None:
    messages = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": c}
        for i, c in enumerate(contents[: len(contents) - (1 - len(contents) % 2)])
    ]
    body = {"messages": messages}
    features = BY_NAME["openai.chat"].features(body)
    nbytes = len(json.dumps(body).encode())
    for name, (_, counter, _) in families.items():
        exact = counter.count_chat(messages)
        # what ``needed`` judges at: the measured factors widened by the tokenizer's own
        # derived bounds (a trimming template or a tokenizer that drops text: no lower bound)
        lo, hi = bounds(features, nbytes, counter.bounds, body)
        assert lo.input_tokens <= exact <= hi.input_tokens, name


pipeline = counting_pipeline


BODIES = {
    "csv": "".join(
        f"{1000 + i},2026-05-01T12:{i % 60:02d}:03Z,web-{i % 9},{i * 3.25:.2f},200\n"
        for i in range(300)
    ),
    "digits": "".join(str((i * 7919) % 10) for i in range(10_000)),
    "emoji": "".join(chr(0x1F600 + i % 64) for i in range(3_000)),
}


@pytest.mark.parametrize("kind", list(BODIES))
@pytest.mark.parametrize("family", ["sp-bpe-inst", "sp-unigram-gemma"])
def test_needed_refuses_what_always_refuses_on_csv_digits_and_emoji_bodies(
    families: Loaded,
    family: str,
    kind: str,
) -> None:
    folder, counter = families[family][0].folder, families[family][1]
    request = {"model": "m", "messages": [{"role": "user", "content": BODIES[kind]}]}
    exact = counter.count_chat(request["messages"])  # type: ignore[arg-type]
    estimate = estimate_request("openai.chat", request)
    assert exact > 2 * estimate  # the assumed ×2 bound would have held it below its count
    limit = exact  # prompt + 1 output token: one over the window
    raw = json.dumps({**request, "max_tokens": 1}).encode()
    verdicts = {}
    for mode in ("always", "needed"):
        p = pipeline(str(folder), limit, mode)
        verdict = p.on_body(p.router.resolve(()), RequestFacts(adapter=BY_NAME["openai.chat"]), raw)
        assert verdict is not None and isinstance(verdict.decision, Reject), mode
        verdicts[mode] = (verdict.decision.status, verdict.decision.reason)
    assert verdicts["needed"] == verdicts["always"]


def test_the_load_log_names_each_models_split_and_bounds(
    families: Loaded,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from ext_proc.tokencount import CounterRegistry, TokenizerSpec

    folder = families["sp-bpe-llama3"][0].folder
    with caplog.at_level("INFO", logger="ext_proc.tokencount.registry"):
        registry = CounterRegistry({"m": TokenizerSpec.from_model_dir(folder)}, 0, estimate_request)
    bounds = registry.counter_for("m").bounds  # type: ignore[union-attr]
    line = caplog.records[-1].getMessage()
    assert line.startswith("tokenizer for m: counting by pieces (split first); estimate bounds ")
    assert f"{bounds.low:.2f}-{bounds.high:.2f} measured (lowest " in line
