"""Which split of a rendered prompt counts exactly: derived from the tokenizer, checked at load.

Job: give ``pieces.PieceCounter`` the tokenizer(s) its pieces are encoded with, and the texts
a split must count exactly before it is used.

Why a split can be exact. A ``tokenizers`` tokenizer first cuts its input at its added tokens
that match raw text (``normalized`` false), then normalizes and pre-tokenizes each segment
between them *on its own*, and its model (BPE, Unigram, WordPiece, with or without byte
fallback) tokenizes each pre-token on its own. What a segment learns of its context is only
whether it starts at offset 0 of the input: Metaspace's ``prepend_scheme: first`` prepends "▁"
there and nowhere else. So for a text cut into segments s₀ c₁ s₁ … cₖ sₖ (s₀ the text before
the first cut token, possibly empty; each cᵢ one token):

    tokens(text) = tokens_T(s₀) + Σᵢ₌₁..ₖ tokens_C(sᵢ) + k

where T is the tokenizer and C its *continuation*: T with every Metaspace ``first`` made
``never``. For any other tokenizer C = T (split ``same``): Metaspace ``always`` and ``never``,
ByteLevel with or without ``add_prefix_space``, BERT's normalizer and pre-tokenizer,
``Prepend``/``Replace``/NFC normalizers, ``Digits`` and byte fallback all treat each segment
alike wherever it stands. With ``first`` the split is ``first``: s₀ with T, the rest with C.

Checked at load: ``choose`` counts ``adversarial_texts`` (the template's renders, and each cut
token followed and preceded by non-space text, digits, emoji, CRLF, combining marks, "▁",
byte-fallback look-alikes) both ways for each candidate split, ``same`` first; the first that
matches on every text is used. None matches (a pre-tokenizer this module does not know that
reads context): ``Choice.split`` is None and ``reason`` says which text differed, and the
counter counts whole texts (``count_mode`` ``whole``).

A template that writes no cut token between turns (ChatML's markers as plain text) has a
*turn marker* instead (``turn_marker``: the text it writes between every two turns of a
probe conversation, e.g. ``<|im_end|>\n<|im_start|>``); ``pieces`` cuts inside it, at an
offset where the character class changes (``marker_offsets``), and checks that cut the same
way (with the marker in place of the cut tokens, no token counted for the cut). Unlike a cut
at a token, this cut is exact because the check says so, not by construction: the text on
both sides of it is the template's own, the same in every render, so what the check sees at
the cut is what every request has there.

Invariants: pure functions; ``continuation`` never changes its argument (it builds a new
tokenizer from the serialized JSON), and returns None when C would equal T.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from tokenizers import Tokenizer

__all__ = [
    "TAILS",
    "Choice",
    "Split",
    "adversarial_conversations",
    "adversarial_texts",
    "choose",
    "continuation",
    "marker_offsets",
    "turn_marker",
]

Split = Literal["same", "first"]

# Text that meets a cut token in the adversarial checks: non-space starts (the "</s>was" case),
# spaces, digits, emoji, CRLF, combining marks, "▁" itself, a byte-fallback token's spelling,
# CJK, zero-width space, contractions and punctuation that regexes glue to a word.
TAILS = (
    "was",
    "budget</s>batch, ",
    " was",
    "  two spaces",
    "12345",
    "😀x",
    "🙂",
    "\r\nx",
    "\n\n",
    "\u0301a",
    "e\u0301",
    "▁x",
    "▁",
    "<0x41>",
    "内存压力",
    "\u200bz",
    "'s",
    ",,",
    "\t",
    "",
)


@dataclass(frozen=True, slots=True)
class Choice:
    """The split chosen (None: count whole texts) and, when none fits, why."""

    split: Split | None
    reason: str = ""


def continuation(tokenizer: Tokenizer) -> Tokenizer | None:
    """T with every Metaspace ``prepend_scheme: first`` made ``never`` (see the module doc);
    None when T has none (then every segment is encoded with T)."""
    try:
        config = json.loads(tokenizer.to_str())
    except Exception:  # a custom (Python) component cannot be serialized: no continuation
        return None
    if not _never_first(config.get("pre_tokenizer")):
        return None
    made = Tokenizer.from_str(json.dumps(config))
    made.no_truncation()
    made.no_padding()
    return made


def _never_first(node: Any) -> bool:
    """Make each Metaspace ``first`` in a pre-tokenizer JSON tree ``never``; whether any was."""
    if isinstance(node, list):
        return any([_never_first(n) for n in node])  # a list: every element is visited
    if not isinstance(node, dict):
        return False
    changed = False
    if node.get("type") == "Metaspace" and node.get("prepend_scheme") == "first":
        node["prepend_scheme"] = "never"
        changed = True
    for key in ("pretokenizers", "pre_tokenizers"):
        if key in node:
            changed = _never_first(node[key]) or changed
    return changed


def adversarial_texts(cuts: Sequence[str], renders: Sequence[str]) -> list[str]:
    """The renders, and short texts where each cut token meets every ``TAILS`` entry on
    either side, at the text's start and after other text (the cases of the module doc)."""
    texts = list(renders)
    for cut in cuts:
        for tail in TAILS:
            texts += [cut + tail, tail + cut + tail, "x" + cut + tail, cut + cut + tail]
            texts += [tail + cut, " " + cut + tail + " " + cut]
        for other in cuts:
            texts.append(f"{cut}{other}was {other}1{cut}")
    return texts


def choose(
    candidates: Sequence[Split],
    texts: Sequence[str],
    by_pieces: Callable[[str, Split], int],
    whole: Callable[[str], int],
) -> Choice:
    """The first of ``candidates`` whose piecewise count equals the whole count on every
    text the tokenizer can count; Choice(None, reason) when none does."""
    counted: list[tuple[str, int]] = []
    for text in texts:
        try:
            counted.append((text, whole(text)))
        except Exception:  # e.g. no unk token for a character: such text is never counted
            continue
    reason = "no candidate split"
    for split in candidates:
        for text, expected in counted:
            try:
                got = by_pieces(text, split)
            except Exception:
                got = -1
            if got != expected:
                reason = f"split {split!r}: {text[:60]!r} counts {got} by pieces, {expected} whole"
                break
        else:
            return Choice(split)
    return Choice(None, reason)


def adversarial_conversations(cuts: Sequence[str]) -> list[list[dict[str, str]]]:
    """Conversations whose contents put each cut token before and after ``TAILS`` text (the
    "</s>was" case), as system, user and assistant turns, for the template to render."""
    out: list[list[dict[str, str]]] = []
    for cut in cuts:
        contents = [cut + tail for tail in TAILS] + [tail + cut for tail in TAILS[:6]]
        for i in range(0, len(contents), 4):
            chunk = contents[i : i + 4]
            turns = [{"role": "system", "content": chunk[0]}]
            turns += [
                {"role": "user" if j % 2 == 0 else "assistant", "content": c}
                for j, c in enumerate(chunk)
            ]
            if turns[-1]["role"] != "user":
                turns.append({"role": "user", "content": chunk[-1]})
            out += [turns, turns[1:]]  # with and without a system turn (some templates refuse it)
    return out


# Private-use characters no template writes: the probe's turn contents.
_PROBE = ("\ue000", "\ue001", "\ue002")


def turn_marker(render: Callable[[list[dict[str, str]]], str]) -> str | None:
    """The text a template writes between every two turns (the common prefix or suffix,
    whichever is longer, of what stands between user→assistant and assistant→user turns of
    a probe conversation); None when the template writes none of two characters or more
    or refuses the probe. ``render`` raises ValueError when the template refuses."""
    a, b, c = _PROBE
    try:
        text = render(
            [
                {"role": "user", "content": a},
                {"role": "assistant", "content": b},
                {"role": "user", "content": c},
            ]
        )
    except ValueError:
        return None
    if not all(text.count(x) == 1 for x in _PROBE):
        return None
    first = text[text.index(a) + 1 : text.index(b)]
    second = text[text.index(b) + 1 : text.index(c)]
    prefix = _common(first, second)
    suffix = _common(first[::-1], second[::-1])[::-1]
    marker = max(prefix, suffix, key=len)
    return marker if len(marker) >= 2 else None


def marker_offsets(marker: str, most: int = 8) -> list[int]:
    """Where to try cutting inside ``marker``: offsets 1 … len − 1 where the character class
    changes (space, word, other); first those right after whitespace (where pre-tokenizers
    split), each group the most central first; at most ``most``."""

    def kind(ch: str) -> int:
        return 0 if ch.isspace() else 1 if ch.isalnum() else 2

    changes = [k for k in range(1, len(marker)) if kind(marker[k - 1]) != kind(marker[k])]
    changes.sort(key=lambda k: (not marker[k - 1].isspace(), abs(len(marker) - 2 * k)))
    return changes[:most]


def _common(x: str, y: str) -> str:
    n = 0
    while n < min(len(x), len(y)) and x[n] == y[n]:
        n += 1
    return x[:n]
