"""Per-piece counting equals whole counting for every normalizer and pre-tokenizer kind.

``ext_proc.tokencount.splits``: tokens(text) = tokens_T(piece₀) + Σ tokens_C(pieceᵢ) + cuts,
C being T without Metaspace's ``prepend_scheme: first``. Checked for Metaspace with each
prepend scheme, split on and off; ByteLevel with and without its prefix space; BERT's
normalizer and pre-tokenizer; byte fallback with digits split; Llama-2's legacy normalizer;
Gemma's space-replacing normalizer with a Split pre-tokenizer; NFKC with Strip; Unigram; over
generated text that puts cut tokens next to non-space, digits, emoji, CRLF and combining
marks. A pre-tokenizer that reads its context has no exact split:
the counter counts whole texts and says why. The fast cutter and the turn-marker cut equal
the regular expressions they replace.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
from tokenizers.pre_tokenizers import PreTokenizer

from ext_proc.tokencount.pieces import PieceCounter
from ext_proc.tokencount.splits import Choice, choose, continuation

SPECIALS = ["<unk>", "<s>", "</s>", "<|x|>"]
CORPUS = ["the memory was new old budget batch 12345 émigré 内存 🙂 café, tabs\tand"] * 20


def metaspace(scheme: str, split: bool) -> Any:
    return pre_tokenizers.Metaspace(prepend_scheme=scheme, split=split)


def _bytes(config: dict[str, Any]) -> None:
    model = config["model"]
    if model["type"] == "BPE":
        for b in range(256):
            model["vocab"].setdefault(f"<0x{b:02X}>", len(model["vocab"]))
    else:
        model["vocab"] += [[f"<0x{b:02X}>", -20.0] for b in range(256)]
    model["byte_fallback"] = True


def make(
    pre: Any = None, norm: Any = None, kind: str = "BPE", byte_fallback: bool = False
) -> Tokenizer:
    if kind == "BPE":
        tok = Tokenizer(models.BPE(unk_token="<unk>"))
        trainer: Any = trainers.BpeTrainer(vocab_size=200, special_tokens=SPECIALS)
    elif kind == "Unigram":
        tok = Tokenizer(models.Unigram())
        trainer = trainers.UnigramTrainer(
            vocab_size=200, special_tokens=SPECIALS, unk_token="<unk>"
        )
    else:
        tok = Tokenizer(models.WordPiece(unk_token="<unk>"))
        trainer = trainers.WordPieceTrainer(vocab_size=200, special_tokens=SPECIALS)
    if pre is not None:
        tok.pre_tokenizer = pre
    if norm is not None:
        tok.normalizer = norm
    tok.train_from_iterator(CORPUS, trainer)
    config = json.loads(tok.to_str())
    if byte_fallback:
        _bytes(config)
    return Tokenizer.from_str(json.dumps(config))


def digits_first() -> Any:
    return pre_tokenizers.Sequence(
        [metaspace("first", True), pre_tokenizers.Digits(individual_digits=True)]
    )


KINDS: dict[str, tuple[Callable[[], Tokenizer], str]] = {
    **{
        f"metaspace-{scheme}-{'split' if split else 'nosplit'}": (
            lambda scheme=scheme, split=split: make(metaspace(scheme, split), byte_fallback=True),
            "first" if scheme == "first" else "same",
        )
        for scheme in ("always", "first", "never")
        for split in (True, False)
    },
    "bytelevel-prefix": (lambda: make(pre_tokenizers.ByteLevel(add_prefix_space=True)), "same"),
    "bytelevel-noprefix": (
        lambda: make(pre_tokenizers.ByteLevel(add_prefix_space=False)),
        "same",
    ),
    "bert": (
        lambda: make(pre_tokenizers.BertPreTokenizer(), normalizers.BertNormalizer(), "WordPiece"),
        "same",
    ),
    "byte-fallback-digits-first": (lambda: make(digits_first(), byte_fallback=True), "first"),
    "legacy-prepend-normalizer": (
        lambda: make(
            None,
            normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]),
            byte_fallback=True,
        ),
        "same",
    ),
    "nfkc-strip-whitespace": (
        lambda: make(
            pre_tokenizers.Whitespace(),
            normalizers.Sequence([normalizers.NFKC(), normalizers.Strip()]),
        ),
        "same",
    ),
    "gemma-replace-normalizer-split": (
        lambda: make(
            pre_tokenizers.Split(" ", "merged_with_previous"),
            normalizers.Replace(" ", "▁"),
            byte_fallback=True,
        ),
        "same",
    ),
    "unigram-first": (
        lambda: make(digits_first(), kind="Unigram", byte_fallback=True),
        "first",
    ),
}
SAMPLES = ["<s>the memory</s>was new</s> old<|x|>12345", "hello <s> world </s>"]
COUNTERS: dict[str, PieceCounter] = {}


def counter(kind: str) -> PieceCounter:
    if kind not in COUNTERS:
        pc = PieceCounter(KINDS[kind][0]())
        pc.verify(SAMPLES)
        COUNTERS[kind] = pc
    return COUNTERS[kind]


@pytest.mark.parametrize("kind", list(KINDS))
def test_each_kind_gets_the_split_its_pre_tokenizer_needs(kind: str) -> None:
    pc = counter(kind)
    assert (pc.mode, pc.split) == ("pieces", KINDS[kind][1])


TEXT = st.lists(
    st.one_of(
        st.sampled_from(["<s>", "</s>", "<|x|>"]),
        st.sampled_from(list("ab cde\n\t.,!?0123456789émigré内存🙂😀▁")),
        st.sampled_from(["\r\n", "e\u0301", "\u0301", "  ", "was", "<0x41>", "12345", "\u200b"]),
    ),
    max_size=30,
).map("".join)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(TEXT)
def test_pieces_equal_the_whole_text_for_every_kind(text: str) -> None:
    for kind in KINDS:
        pc = counter(kind)
        assert pc.count(text) == pc.count_whole(text), kind


def test_the_continuation_turns_first_into_never_and_leaves_the_tokenizer_alone() -> None:
    tok = make(digits_first(), byte_fallback=True)
    before = tok.to_str()
    cont = continuation(tok)
    assert cont is not None and tok.to_str() == before
    pre = json.loads(cont.to_str())["pre_tokenizer"]["pretokenizers"][0]
    assert (pre["type"], pre["prepend_scheme"]) == ("Metaspace", "never")
    assert continuation(make(metaspace("always", True))) is None
    assert continuation(make(pre_tokenizers.ByteLevel())) is None


class _ThirdSplitUpper:
    """A pre-tokenizer that reads its context: segments after the second are upper-cased."""

    def split(self, i: int, s: Any) -> list[Any]:
        if i >= 2:
            s.uppercase()
        return [s]

    def pre_tokenize(self, pretok: Any) -> None:
        pretok.split(self.split)


def test_a_pre_tokenizer_that_reads_context_has_no_exact_split_and_counts_whole() -> None:
    tok = make(pre_tokenizers.Whitespace())
    tok.pre_tokenizer = PreTokenizer.custom(_ThirdSplitUpper())
    pc = PieceCounter(tok)
    assert pc.verify(SAMPLES) == "whole"
    assert pc.reason.startswith("split 'same': ") and "by pieces" in pc.reason
    text = "the memory</s>was new</s>old"
    assert pc.count(text) == len(tok.encode(text, add_special_tokens=False).ids)


def test_choose_takes_the_first_split_that_matches_every_text() -> None:
    texts = ["a", "bb", "ccc"]
    # "same" is off by one on "bb"; "first" matches all
    by = {"same": {"a": 1, "bb": 3, "ccc": 3}, "first": {"a": 1, "bb": 2, "ccc": 3}}
    chosen = choose(["same", "first"], texts, lambda t, s: by[s][t], len)
    assert chosen == Choice("first")
    none = choose(["same"], texts, lambda t, s: by[s][t], len)
    assert none.split is None and none.reason == "split 'same': 'bb' counts 3 by pieces, 2 whole"


CUT_SETS = [["<s>", "</s>", "[INST]", "[/INST]"], ["<a", "a>", "<", "<ab>"], ["ab", "b", "ba"]]


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(range(len(CUT_SETS))),
    st.lists(st.sampled_from(["<", ">", "a", "b", "s", "/", "[", "]", "INST", " "]), max_size=40),
)
def test_the_fast_cutter_splits_as_the_single_pattern_does(which: int, chars: list[str]) -> None:
    from ext_proc.tokencount.pieces import _Cutter, _pattern

    cuts = sorted(CUT_SETS[which], key=len, reverse=True)
    text = "".join(chars)
    one = _pattern(cuts)
    assert one is not None
    assert _Cutter(cuts).split(text) == one.split(text)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["<|e|>", "\n", "<|s|>", "x", "<", "|", ">"]), max_size=30))
def test_cutting_inside_the_turn_marker_is_the_zero_width_pattern(chars: list[str]) -> None:
    import re

    from ext_proc.tokencount.pieces import _cut_inside

    marker, text = "<|e|>\n<|s|>", "".join(chars)
    for k in range(1, len(marker)):
        left, right = re.escape(marker[:k]), re.escape(marker[k:])
        assert _cut_inside(text, marker, k) == re.split(f"(?<={left})(?={right})", text)


def test_the_turn_marker_is_the_text_between_every_two_turns() -> None:
    from ext_proc.tokencount.splits import marker_offsets, turn_marker

    def chatml(messages: list[dict[str, str]]) -> str:
        return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)

    def inst(messages: list[dict[str, str]]) -> str:
        return "".join(
            f"[INST] {m['content']} [/INST]" if m["role"] == "user" else m["content"] + "</s>"
            for m in messages
        )

    def refuses(messages: list[dict[str, str]]) -> str:
        raise ValueError("roles must alternate")

    marker = turn_marker(chatml)
    assert marker == "<|im_end|>\n<|im_start|>"
    # class changes: | > \n < | … the most central first
    assert marker_offsets(marker)[:2] == [11, 10]
    assert turn_marker(inst) is None  # " [/INST]" and "</s>[INST] " share nothing
    assert turn_marker(refuses) is None


def test_a_template_with_nothing_to_cut_at_counts_whole_and_warns_at_load(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from ext_proc.tokencount import CounterRegistry, TokenizerSpec

    tok = make(metaspace("first", True), byte_fallback=True)
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "chat.jinja").write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    spec = TokenizerSpec(tmp_path / "tokenizer.json", chat_template=tmp_path / "chat.jinja")
    with caplog.at_level("INFO", logger="ext_proc.tokencount.registry"):
        registry = CounterRegistry({"m": spec})
    record = caplog.records[-1]
    assert record.levelname == "WARNING"
    assert (
        "counting by whole (split whole: the template writes no cut token)" in record.getMessage()
    )
    counter = registry.counter_for("m")
    assert counter is not None and counter.count_mode == "whole"
    messages = [{"role": "user", "content": "</s>was"}, {"role": "user", "content": " new"}]
    text = counter.render_chat(messages)
    assert counter.count_chat(messages) == len(tok.encode(text, add_special_tokens=False).ids)


def test_truncation_and_padding_in_the_tokenizer_file_never_change_a_count(tmp_path: Any) -> None:
    from ext_proc.tokencount import ExactCounter, TokenizerSpec

    tok = make(metaspace("first", True), byte_fallback=True)
    text = "the memory was new " * 40
    full = len(tok.encode(text, add_special_tokens=False).ids)
    tok.enable_truncation(max_length=8)
    tok.enable_padding(length=512)
    tok.save(str(tmp_path / "tokenizer.json"))
    counter = ExactCounter.load(TokenizerSpec(tmp_path / "tokenizer.json"))
    assert full > 8
    assert counter.count_text(text) == full
