"""ICE's exact counts equal transformers' ``apply_chat_template`` + encode on every family.

The families (tests/token_families.py) are trained at test time: SentencePiece-style BPE and
Unigram with byte fallback and digits split (Metaspace ``first`` / ``always`` / split off,
Llama-2's legacy normalizer), ByteLevel with a prefix space, BERT's WordPiece, and the tiny
ByteLevel model, under ``[INST]``, Llama-3, Gemma, ChatML and BERT-style templates. Each
counts by pieces with the split its tokenizer needs (``ext_proc.tokencount.splits``), and
every count (generated conversations, the issue's two reproductions) is the reference's.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.token_families import Loaded, conversation, reference_count

SPLITS = {
    "tiny": "same",
    "sp-bpe-inst": "first",
    "sp-bpe-llama3": "first",
    "sp-unigram-gemma": "first",
    "sp-bpe-always": "same",
    "sp-legacy-normalizer": "same",
    "sp-nosplit-gemma": "first",
    "bytelevel-chatml": "same",
    "bert-wordpiece": "same",
    "tiny-chatml-plain": "same at text: '<|im_end|>\\n' | '<|im_start|>'",
}


def test_every_family_counts_by_pieces_with_the_split_its_tokenizer_needs(
    families: Loaded,
) -> None:
    assert set(families) == set(SPLITS)
    for name, (_, counter, _) in families.items():
        assert (name, counter.count_mode, counter.split) == (name, "pieces", SPLITS[name])


def test_a_literal_end_token_before_a_word_counts_as_the_tokenizer_does(families: Loaded) -> None:
    """The issue's first reproduction: ``{"role":"user","content":"</s>was"}``."""
    _, counter, hf = families["sp-bpe-inst"]
    messages = [{"role": "user", "content": "</s>was"}]
    text = counter.render_chat(messages)
    assert text == "<s>[INST] </s>was [/INST]"
    pieces = counter._pieces
    # each piece encoded alike ("same", ICE before) prepends "▁" to "was": not the whole count
    same = pieces._count_pieces(text, cache=False, split="same")
    assert same != pieces.count_whole(text)
    assert counter.count_chat(messages) == reference_count(hf, messages) == pieces.count_whole(text)


def test_strikethrough_markup_repeated_1100_times_counts_exactly(families: Loaded) -> None:
    """The issue's second reproduction: ``"<s>budget</s>batch, "`` × 1,100 (5,516 "exact"
    by ICE before, 8,816 by the tokenizer, on the issue's vocabulary)."""
    for name in ("sp-bpe-inst", "sp-bpe-llama3", "sp-unigram-gemma", "sp-nosplit-gemma"):
        _, counter, hf = families[name]
        messages = [{"role": "user", "content": "<s>budget</s>batch, " * 1100}]
        text = counter.render_chat(messages)
        exact = reference_count(hf, messages)
        assert counter.count_chat(messages) == exact > 8192, name
        if counter.split == "first":  # what counting each piece alike would have said
            assert counter._pieces._count_pieces(text, cache=False, split="same") != exact


CUTS = ["<s>", "</s>", "[INST]", "[/INST]", "<|eot_id|>", "<start_of_turn>", "<|im_start|>"]
ATOMS = st.one_of(
    st.sampled_from([*CUTS, "[SEP]", "[CLS]", "<|begin_of_text|>", "<end_of_turn>"]),
    st.sampled_from(list("ab cde\n\t.,!?'\"{}[]:0123456789émigré内存压力🙂😀<>/|_-▁")),
    st.sampled_from(["\r\n", "e\u0301", "\u0301", "  ", "was", "budget", "<0x41>", "12345"]),
)
CONTENT = st.lists(ATOMS, max_size=14).map("".join)
TURNS = st.lists(CONTENT, min_size=1, max_size=6)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(TURNS, st.one_of(st.none(), CONTENT))
def test_generated_conversations_count_as_transformers_counts_them(
    families: Loaded, contents: list[str], system: str | None
) -> None:
    for name, (family, counter, hf) in families.items():
        messages = conversation(family, contents, system)
        assert counter.count_chat(messages) == reference_count(hf, messages), name


def test_a_next_turn_counts_only_its_new_pieces_on_a_first_split_family(
    families: Loaded,
) -> None:
    _, counter, hf = families["sp-bpe-llama3"]
    history = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " + "word " * 40}
        for i in range(41)
    ]
    assert counter.count_chat(history) == reference_count(hf, history)
    pieces = counter._pieces
    hits = pieces.hits
    turn = [*history, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "go"}]
    assert counter.count_chat(turn) == reference_count(hf, turn)
    assert pieces.hits - hits >= 40  # the history's turns from the cache
