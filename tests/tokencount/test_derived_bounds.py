"""The estimate's bounds hold for the tokenizer in use, on adversarial text (issue 44, item 9).

``ext_proc.tokencount.derived`` derives, from the tokenizer itself, the fewest and the most
tokens a text can count for its estimate, and the most tokens a byte of text can become. The
families trained here (no download): SentencePiece-style BPE with byte fallback (``[INST]``),
Unigram with byte fallback (Gemma, a template that trims), WordPiece (BERT), ByteLevel BPE
(ChatML specials), and NFKC + ByteLevel BPE. The texts: characters NFKC expands (ﷺ → 18
characters, 33 bytes; ㍿ → 株式会社), a CJK word the vocabulary holds whole (内存压力), literal
special tokens repeated, long runs of one symbol.

The pipeline tests fail on the bounds before (exact ÷ estimate measured on a sample, and one
token a byte for the header-only verdict): ``needed`` refused what ``always`` passed and
passed what it refused, and the header-only worst case held fewer tokens than the body.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import pre_tokenizers

from ext_proc.admit.pipeline import Pipeline, RequestFacts
from ext_proc.admit.reload_carry import estimate_request
from ext_proc.policy.decision import Pass, Reject
from ext_proc.schemas import BY_NAME
from ext_proc.tokencount import TokenizerSpec
from ext_proc.tokencount.counter import ExactCounter
from tests import token_families as tf
from tests.builders import build_nfkc_bytelevel, counting_pipeline

FAMILIES = ("sp-bpe-inst", "sp-unigram-gemma", "bert-wordpiece", "bytelevel-chatml")
Loaded = dict[str, tuple[Path, ExactCounter]]


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> Loaded:
    root = tmp_path_factory.mktemp("derived")
    folders = {f.name: f.folder for f in tf.build(root) if f.name in FAMILIES}
    folders["nfkc-bytelevel"] = build_nfkc_bytelevel(root)
    return {
        name: (
            folder,
            ExactCounter.load(TokenizerSpec.from_model_dir(folder), 0, estimate_request),
        )
        for name, folder in folders.items()
    }


def derived(loaded: Loaded, name: str) -> Any:
    d = loaded[name][1].bounds.derived
    assert d is not None
    return d


# -- the derivation, against hand-computed figures


def test_nfkc_expansion_sets_the_high_side_and_the_tokens_per_byte(loaded: Loaded) -> None:
    d = derived(loaded, "nfkc-bytelevel")
    # ﷺ (U+FDFA: 3 bytes, a "wide" character priced at 1) becomes "صلى الله عليه وسلم":
    # 15 Arabic letters of 2 bytes and 3 spaces = 33 bytes, each a byte-level symbol
    assert d.widest_high == "ﷺ"
    assert d.high == 33.0
    assert d.tokens_per_byte == 11.0  # 33 symbols ÷ 3 bytes
    # without an expanding normalizer: an arrow (3 bytes, priced at 1/2) sets it, 1 per byte
    for name in ("sp-bpe-inst", "bytelevel-chatml"):
        assert (derived(loaded, name).high, derived(loaded, name).tokens_per_byte) == (6.0, 1.0)


def test_the_widest_token_sets_the_low_side(loaded: Loaded) -> None:
    d = derived(loaded, "bytelevel-chatml")
    # " 内存压力": Ġ (a space, 1/4) and 12 bytes of four wide characters (1/3 a byte)
    cjk = pre_tokenizers.ByteLevel(add_prefix_space=False).pre_tokenize_str("内存压力")[0][0]
    assert d.widest_token == "Ġ" + cjk
    assert d.token_weight == pytest.approx(0.25 + 12 / 3)
    assert d.low == pytest.approx(1 / (4 * 4.25))
    assert not d.deletes


def test_nfkc_reaches_a_token_from_wide_characters(loaded: Loaded) -> None:
    # NFKC maps the fullwidth "ｔｈｅ" (wide: 1 each) to "the": each of its bytes may stand
    # for a whole wide character, so a token of ASCII letters weighs 1 a letter, not 1/4
    d = derived(loaded, "nfkc-bytelevel")
    assert d.token_weight >= 3.0


@pytest.mark.parametrize(
    ("name", "why"),
    [("bert-wordpiece", "drops whitespace, one [UNK] per word"), ("sp-unigram-gemma", "| trim")],
)
def test_a_tokenizer_or_template_that_deletes_text_has_no_lower_bound(
    loaded: Loaded, name: str, why: str
) -> None:
    d = derived(loaded, name)
    assert d.deletes and d.low == 0.0, why
    assert d.lower(10_000, 1) == 0


def test_derivation_is_cached_per_tokenizer(loaded: Loaded) -> None:
    folder, counter = loaded["sp-bpe-inst"]
    again = ExactCounter.load(TokenizerSpec.from_model_dir(folder))
    assert again.bounds.derived is counter.bounds.derived  # the same object: not derived again
    assert counter.bounds.derived is not None and counter.bounds.derived.derive_s > 0


def test_the_formulas_by_hand() -> None:
    from ext_proc.tokencount.derived import DerivedBounds

    d = DerivedBounds(
        high=6.0,
        tokens_per_byte=1.0,
        token_weight=4.25,
        deletes=False,
        prefix_tokens=1,
        special_tokens=1,
        framing_first=50,
        framing_per_turn=30,
    )
    # upper(E=100, M=2) = ⌈6 × 100⌉ + P 1 + K × (M + 1) 3 + max(0, 50 − 42) 8
    #                     + 2 × max(0, 30 + 2 − 24) 16 = 628
    assert d.upper(100, 2) == 628
    # lower(E=100, M=2) = ⌊(100 − 8 − 3) / (4 × 4.25)⌋ = ⌊89 / 17⌋ = 5
    assert d.lower(100, 2) == 5
    assert d.low == pytest.approx(1 / 17)
    assert DerivedBounds(6.0, 1.0, 4.25, True, 1, 1, 50, 30).lower(100, 2) == 0
    assert DerivedBounds(6.0, 1.0, math.inf, False, 1, 1, 50, 30).lower(10**9, 0) == 0


@pytest.mark.parametrize(
    ("body", "plain"),
    [
        ({"messages": [{"role": "user", "content": "x", "name": "a"}]}, True),
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}]}, True),
        ({"prompt": "x", "max_tokens": 3, "stop": ["\n"]}, True),
        ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}, False),
        ({"messages": [], "chat_template_kwargs": {"junk": "x" * 99}}, False),
        ({"messages": [{"role": "assistant", "content": "", "tool_calls": []}]}, False),
        ({"messages": [{"role": "assistant", "content": "", "reasoning_content": "x"}]}, False),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, False),
        (None, False),
    ],
    ids=[
        "string",
        "text parts",
        "prompt",
        "tools",
        "kwargs",
        "tool calls",
        "reasoning",
        "image",
        "none",
    ],
)
def test_only_a_plain_body_has_a_lower_bound(
    loaded: Loaded, body: dict[str, Any] | None, plain: bool
) -> None:
    from ext_proc.admit.counting import bounds
    from ext_proc.admit.counting import plain as is_plain

    assert is_plain(body) is plain
    counter = loaded["bytelevel-chatml"][1]
    features = BY_NAME["openai.chat"].features(
        {"messages": [{"role": "user", "content": "#" * 4000}]}
    )
    lo, _ = bounds(features, 5000, counter.bounds, body)
    assert (lo.input_tokens > 0) is plain


# -- the property: lower ≤ exact ≤ upper for adversarial text

ADVERSARIAL = st.sampled_from(
    [
        "ﷺ",
        "㍿",
        "内存压力",
        "<|im_start|>",
        "[INST]",
        "<start_of_turn>",
        "[SEP]",
        "<s>",
        "#" * 16,
        " " * 8,
        "\n\n",
        "→⇒",
        "😀",
        "ｈｅｌｌｏ",
        "e\u0301",
        "\u1100\u1161\u11a8",
        "12345",
        "the memory cache ",
    ]
)
TEXT = st.lists(
    st.one_of(
        st.tuples(ADVERSARIAL, st.integers(1, 40)).map(lambda t: t[0] * t[1]),
        st.text(st.characters(exclude_categories=["Cs"]), max_size=20),
    ),
    min_size=1,
    max_size=8,
).map("".join)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(contents=st.lists(TEXT, min_size=1, max_size=3))
def test_every_exact_count_lies_between_the_derived_bounds(
    loaded: Loaded, contents: list[str]
) -> None:
    from ext_proc.admit.counting import bounds
    from ext_proc.policy.coarse import coarse_tokens

    messages = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": c}
        for i, c in enumerate(contents[: len(contents) - (1 - len(contents) % 2)])
    ]
    body = {"model": "m", "messages": messages}
    nbytes = len(json.dumps(body, ensure_ascii=False).encode())
    features = BY_NAME["openai.chat"].features(body)
    for name, (_, counter) in loaded.items():
        exact = counter.count_request("openai.chat", body)
        lo, hi = bounds(features, nbytes, counter.bounds, body)
        assert lo.input_tokens <= exact <= hi.input_tokens, (name, messages)
        per_byte = counter.bounds.derived.tokens_per_byte  # type: ignore[union-attr]
        assert exact <= coarse_tokens(nbytes, None, per_byte), name  # the header-only bound


# -- through the pipeline: needed gives always's verdict; the header-only bound holds


pipeline = counting_pipeline


def verdict(p: Pipeline, raw: bytes) -> tuple[str, int, str]:
    v = p.on_body(p.router.resolve(()), RequestFacts(adapter=BY_NAME["openai.chat"]), raw)
    assert v is not None
    d = v.decision
    if isinstance(d, Reject):
        return "reject", d.status, d.reason
    assert isinstance(d, Pass), d
    return "pass", 200, ""


CASES = {
    # low side: the estimate prices what the vocabulary holds whole at 3-4× its count
    "cjk word": ("sp-bpe-inst", "内存压力" * 300, 0),
    "specials": ("bytelevel-chatml", "<|im_start|>" * 300, 0),
    # high side: NFKC turns each ﷺ into ~33 tokens the estimate prices at 1
    "nfkc ﷺ": ("nfkc-bytelevel", "ﷺ" * 400, 1),
    "nfkc ㍿": ("nfkc-bytelevel", "㍿" * 400, 1),
}


@pytest.mark.parametrize("case", list(CASES))
def test_needed_gives_the_verdict_always_gives_on_adversarial_text(
    loaded: Loaded, case: str
) -> None:
    family, text, over = CASES[case]
    folder, counter = loaded[family]
    request = {"model": "m", "messages": [{"role": "user", "content": text}]}
    exact = counter.count_request("openai.chat", request)
    # the window: exactly the prompt + 1 output token (low side: always passes), or one
    # token short of it (high side: always refuses)
    window = exact + 1 - over
    raw = json.dumps({**request, "max_tokens": 1}, ensure_ascii=False).encode()
    always = verdict(pipeline(folder, window, "always"), raw)
    needed = verdict(pipeline(folder, window, "needed"), raw)
    assert always[0] == ("reject" if over else "pass")
    assert needed == always, (case, exact, window)


def test_the_header_only_worst_case_holds_what_an_nfkc_body_counts(loaded: Loaded) -> None:
    folder, counter = loaded["nfkc-bytelevel"]
    request = {"model": "m", "messages": [{"role": "user", "content": "ﷺ" * 400}]}
    raw = json.dumps(request, ensure_ascii=False).encode()
    exact = counter.count_request("openai.chat", request)
    assert exact > 10 * len(raw) // 2  # ~10.5 tokens a byte
    p = pipeline(folder, 1_000_000, "needed")
    coarse = p.on_size(p.router.resolve(()), RequestFacts(adapter=BY_NAME["openai.chat"]), len(raw))
    assert coarse.features is not None
    assert coarse.features.input_tokens >= exact
    assert math.isclose(p.counters.tokens_per_byte, 11.0)
