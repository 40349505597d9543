"""Count a rendered prompt piece by piece, and remember the pieces already counted.

Job: an agent resends the same long history on every turn; counting it whole each time costs
~0.4 s per 190k tokens. A Hugging Face tokenizer splits its input at its added tokens before
anything else (``AddedVocabulary``: the special tokens a chat template writes between turns,
``<|im_start|>``, ``<|eot_id|>``, ``</s>`` …), and nothing merges across such a split, so

    tokens(text) = tokens_T(piece₀) + Σᵢ₌₁..ₖ tokens_C(pieceᵢ) + k,

where the pieces are the text between the k *cut tokens* (the tokenizer's added tokens that
match raw text exactly: ``normalized`` false, no ``lstrip`` / ``rstrip`` / ``single_word``,
which would let them take the whitespace next to them), piece₀ the text before the first one,
T the tokenizer and C its continuation (``splits``: T itself, or T without Metaspace's
``prepend_scheme: first`` when T has it, since only the input's offset 0 gets that "▁").

A template that writes no cut token (ChatML's markers as plain text, say) is cut instead
inside its *turn marker*, the text it writes between every two turns
(``splits.turn_marker``: ``<|im_end|>\n<|im_start|>``), at an offset where that text's own
characters stand on both sides (``<|im_end|>\n`` | ``<|im_start|>``): then no cut token is
counted (k = 0 above), and the cut is used only if it checks out like the others.

A turn that resends a history then tokenizes only its new pieces; the others' counts come
from a cache keyed by a 128-bit digest (SHA-256, truncated) of the piece's UTF-8 and which of
T and C encodes it (the cache never holds text), bounded by ``cache_bytes`` (``ENTRY_BYTES``
per entry, oldest first out). Pieces under ``MIN_CACHED_CHARS`` (role names, "\n\n") are
encoded once a call however often they recur. Uncached pieces are encoded together with
``encode_batch_fast`` (no offsets; the Rust side spreads a batch over the machine's cores).

The ICE worker counts a long body on its event loop only when little of it is new
(``ext_proc.serve.offload``): inside ``newtext.new_text_bound`` a count spends what it would
encode (uncached pieces, distinct short ones, whole texts) before encoding anything, and
inside ``newtext.noting_pieces`` it notes its cacheable pieces' (digest, count) pairs, which
``learn`` merges into another process's counter of the same ``identity``
(``newtext.tokenizer_identity``): the helper process teaches its worker.

``PieceCounter.verify`` checks the cut at load on the template's renders and on adversarial
texts (``splits.adversarial_texts``); when no split counts them all as the whole text does,
the counter counts whole texts (``mode`` ``whole``, ``reason`` says why), and says so in
``ice_token_counts_total{mode}`` and the log at load.

Invariants: ``count(text) == len(encode(text, add_special_tokens=False))`` whenever ``mode``
is ``pieces`` (tests/tokencount/test_token_families.py checks it against transformers over generated
conversations for every tokenizer family and template the tests build; test_token_splits.py
for every normalizer and pre-tokenizer kind); the cache's entries ≤ cache_bytes /
ENTRY_BYTES, learned ones included; the cache and a lesson hold digests and counts, never
text; a bounded count encodes nothing once its bound is passed; thread-safe under the GIL
(each dict operation is atomic; a lost update only costs a recount; the bound and the notes
live in context variables, so they belong to the thread or task that set them).
"""

from __future__ import annotations

import hashlib
import itertools
import re
from collections.abc import Sequence
from typing import Literal

from tokenizers import Tokenizer

from ext_proc.tokencount.newtext import (
    DIGEST_BYTES,
    MAX_LESSON_PIECES,
    Lesson,
    current_notes,
    spend_new_text,
)
from ext_proc.tokencount.splits import (
    Choice,
    Split,
    adversarial_texts,
    choose,
    continuation,
    marker_offsets,
)

__all__ = ["DEFAULT_CACHE_BYTES", "ENTRY_BYTES", "PieceCounter", "cut_tokens"]

DEFAULT_CACHE_BYTES = 32 * 1024 * 1024
# A dict slot, a 16-byte digest as bytes and an int: 133 bytes an entry measured with
# CPython 3.11 (tracemalloc over 100k entries), taken as 192.
ENTRY_BYTES = 192
# Pieces shorter than this are encoded every time (hashing them costs about as much).
MIN_CACHED_CHARS = 64

Mode = Literal["pieces", "whole"]
_WHICH = (b"\x00", b"\x01")  # a digest's first byte: the piece is encoded by T or by C
_Todo = tuple[list[str], list[str]]  # by which tokenizer encodes them: T, C
_Keys = tuple[list[bytes | None], list[bytes | None]]
_Short = tuple[dict[str, int], dict[str, int]]


def cut_tokens(tokenizer: Tokenizer) -> list[str]:
    """The added tokens the tokenizer cuts its input at without touching the text beside."""
    cuts = []
    for token in tokenizer.get_added_tokens_decoder().values():
        if token.normalized or token.lstrip or token.rstrip or token.single_word:
            continue
        if token.content:
            cuts.append(token.content)
    return sorted(set(cuts), key=len, reverse=True)  # longest first, as the tokenizer matches


def _pattern(cuts: Sequence[str]) -> re.Pattern[str] | None:
    return re.compile("(" + "|".join(re.escape(c) for c in cuts) + ")") if cuts else None


class _Cutter:
    """``re.split`` of ``_pattern(cuts)`` (pieces and the cut tokens between them), ~15×
    faster: ``re`` scans for a literal first character quickly but for a set of them one
    character at a time, so there is one pattern per first character (``<(?:/s>|s>)``) and
    their matches are merged, leftmost first and the longest at one place, as the tokenizer
    matches; where two groups' matches overlap, the single pattern decides."""

    def __init__(self, cuts: Sequence[str]) -> None:
        self._one = _pattern(cuts)
        groups: dict[str, list[str]] = {}
        for cut in sorted(cuts, key=len, reverse=True):
            groups.setdefault(cut[0], []).append(cut)
        self._by_first = [
            re.compile(re.escape(first) + "(?:" + "|".join(re.escape(c[1:]) for c in g) + ")")
            for first, g in groups.items()
        ]

    def split(self, text: str) -> list[str]:
        if len(self._by_first) == 1:
            spans = [m.span() for m in self._by_first[0].finditer(text)]
        else:
            spans = sorted(m.span() for p in self._by_first for m in p.finditer(text))
            if any(a[1] > b[0] for a, b in itertools.pairwise(spans)):
                assert self._one is not None
                return self._one.split(text)
        parts = []
        start = 0
        for a, b in spans:
            parts += [text[start:a], text[a:b]]
            start = b
        parts.append(text[start:])
        return parts


class PieceCounter:
    """Counts texts for one tokenizer, piece by piece with a cache (see the module doc)."""

    def __init__(
        self, tokenizer: Tokenizer, cache_bytes: int = DEFAULT_CACHE_BYTES, identity: bytes = b""
    ) -> None:
        self._tokenizer = tokenizer
        # what another process's counter must have to teach this one (b"": learns nothing)
        self.identity = identity
        self._continuation = continuation(tokenizer)
        cuts = cut_tokens(tokenizer)
        self._cut_re = _pattern(cuts)
        self._splitter: _Cutter | None = None if self._cut_re is None else _Cutter(cuts)
        self._cuts_counted = True  # False: zero-width cuts inside the turn marker
        self._marker: tuple[str, int] | None = None  # (marker, offset) when cutting inside it
        self.max_entries = max(0, cache_bytes // ENTRY_BYTES)
        self._cache: dict[bytes, int] = {}
        self.mode: Mode = "pieces" if self._splitter is not None else "whole"
        self.split: Split = "same"
        self.boundary = "cut tokens"
        self.reason = "" if self._splitter is not None else "the tokenizer has no cut token"
        self.hits = self.misses = 0

    def verify(
        self, samples: Sequence[str], marker: str | None = None, cuts: Sequence[str] | None = None
    ) -> Mode:
        """Cut at ``cuts`` (default: the cut tokens ``samples``, the template's renders,
        contain), checking each candidate split (``splits.choose``) on the samples and
        adversarial texts; failing that, cut inside the template's turn ``marker`` (text
        between every two turns) at the first offset that checks out. Neither: whole texts
        for good. Returns the mode."""
        seen = self.template_cuts(samples) if cuts is None else list(cuts)
        reason = "the template writes no cut token"
        if seen:
            # cut only at the tokens the template writes (a short pattern: a tokenizer may
            # have a thousand added tokens); others inside a piece are split by the tokenizer
            chosen = self._try(_Cutter(seen), True, adversarial_texts(seen, samples))
            if chosen.split is not None:
                return self.mode
            reason = chosen.reason
        if marker:
            texts = adversarial_texts([marker], samples)
            for k in marker_offsets(marker):
                self._marker = (marker, k)
                if self._try(None, False, texts).split:
                    self.boundary = f"text: {marker[:k]!r} | {marker[k:]!r}"
                    return self.mode
            self._marker = None
            reason += f"; no exact cut inside the turn marker {marker!r}"
        self.mode, self._splitter, self.reason = "whole", None, reason
        return self.mode

    def _try(self, pattern: _Cutter | None, cuts_counted: bool, texts: list[str]) -> Choice:
        self._splitter, self._cuts_counted = pattern, cuts_counted
        candidates: list[Split] = ["same"] if self._continuation is None else ["same", "first"]
        chosen = choose(
            candidates,
            texts,
            lambda text, split: self._count_pieces(text, cache=False, split=split),
            self.count_whole,
        )
        if chosen.split is not None:
            self.mode, self.split, self.reason = "pieces", chosen.split, ""
        return chosen

    def template_cuts(self, samples: Sequence[str]) -> list[str]:
        """The cut tokens that occur in ``samples``, longest first."""
        if self._cut_re is None:
            return []
        found = {m.group(0) for text in samples for m in self._cut_re.finditer(text)}
        return sorted(found, key=len, reverse=True)

    def count_whole(self, text: str) -> int:
        """Tokens of ``text`` without the post-processor's special tokens."""
        spend_new_text(len(text))
        return len(self._tokenizer.encode_batch_fast([text], add_special_tokens=False)[0])

    def count(self, text: str) -> int:
        """Tokens of ``text`` (``add_special_tokens=False``): by pieces when verified."""
        if self.mode == "pieces":
            return self._count_pieces(text, cache=self.max_entries > 0, split=self.split)
        return self.count_whole(text)

    def _count_pieces(self, text: str, *, cache: bool, split: Split) -> int:
        parts, total = self._parts(text)
        # (piece, which tokenizer): 0 = T, 1 = C; only piece₀ keeps T when the split is "first"
        todo: _Todo = ([], [])
        keys: _Keys = ([], [])
        # short pieces (role names, "\n\n") are encoded once a call however often they recur
        short: _Short = ({}, {})
        notes = current_notes(self.identity) if cache else None
        hits = new = 0
        for i, piece in enumerate(parts):
            if not piece:
                continue
            which = 1 if split == "first" and i > 0 else 0
            key = None
            if len(piece) < MIN_CACHED_CHARS:
                seen = short[which]
                if piece not in seen:
                    new += len(piece)
                seen[piece] = seen.get(piece, 0) + 1
                continue
            if cache:
                key = _digest(piece, which)
                known = self._cache.get(key)
                if known is not None:
                    hits += 1
                    total += known
                    if notes is not None and len(notes) < MAX_LESSON_PIECES:
                        notes[key] = known
                    continue
            new += len(piece)
            todo[which].append(piece)
            keys[which].append(key)
        spend_new_text(new)  # before anything is encoded
        if cache:
            self.hits += hits
            self.misses += len(todo[0]) + len(todo[1])
        return total + self._encode(todo, keys, short, notes)

    def _parts(self, text: str) -> tuple[list[str], int]:
        """The text's pieces, and the tokens of the cut tokens between them."""
        if self._marker is not None:
            parts = _cut_inside(text, *self._marker)
        else:
            assert self._splitter is not None
            parts = self._splitter.split(text)
        if self._cuts_counted:  # every odd part is a cut token: one token each
            return parts[0::2], len(parts) // 2
        return parts, 0  # zero-width cuts in the turn marker: every part is text

    def _encode(
        self, todo: _Todo, keys: _Keys, short: _Short, notes: dict[bytes, int] | None
    ) -> int:
        """Tokens of the uncached and short pieces, each encoded once (uncached ones are
        remembered, and noted when ``notes`` is given)."""
        total = 0
        for which, tokenizer in ((0, self._tokenizer), (1, self._continuation)):
            if not todo[which] and not short[which]:
                continue
            assert tokenizer is not None
            pieces = todo[which] + list(short[which])
            encoded = tokenizer.encode_batch_fast(pieces, add_special_tokens=False)
            times = [1] * len(todo[which]) + list(short[which].values())
            for key, enc, k in zip(
                keys[which] + [None] * len(short[which]), encoded, times, strict=True
            ):
                n = len(enc)
                total += n * k
                if key is not None:
                    self._remember(key, n)
                    if notes is not None and len(notes) < MAX_LESSON_PIECES:
                        notes[key] = n
        return total

    def learn(self, lesson: Lesson) -> int:
        """Merge the piece counts another process's counter of the same ``identity`` made
        (its cache's bound kept); returns how many were new here (0: not the same)."""
        if not self.identity or lesson.identity != self.identity or self.max_entries <= 0:
            return 0
        cache, added = self._cache, 0
        for key, count in itertools.islice(lesson.pairs(), self.max_entries):
            if len(key) == DIGEST_BYTES and key not in cache:
                self._remember(key, count)
                added += 1
        return added

    def _remember(self, key: bytes, count: int) -> None:
        cache = self._cache
        while len(cache) >= self.max_entries and cache:
            del cache[next(iter(cache))]  # the oldest entry
        cache[key] = count

    @property
    def entries(self) -> int:
        return len(self._cache)


def _digest(piece: str, which: int) -> bytes:
    digest = hashlib.sha256(_WHICH[which])  # SHA-256 runs in hardware: faster than BLAKE2b
    digest.update(piece.encode("utf-8", "surrogatepass"))
    return digest.digest()[:DIGEST_BYTES]


def _cut_inside(text: str, marker: str, k: int) -> list[str]:
    """``text`` cut at offset ``k`` of every occurrence of ``marker`` (occurrences found by
    ``str.find``, overlapping ones too: what ``(?<=marker[:k])(?=marker[k:])`` matches)."""
    parts = []
    start = 0
    i = text.find(marker)
    while i >= 0:
        cut = i + k
        if cut > start:
            parts.append(text[start:cut])
            start = cut
        i = text.find(marker, i + 1)
    parts.append(text[start:])
    return parts
