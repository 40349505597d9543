"""Count a rendered prompt piece by piece, and remember the pieces already counted.

Job: an agent resends the same long history on every turn; counting it whole each time costs
~0.4 s per 190k tokens. A Hugging Face tokenizer splits its input at its added tokens before
anything else (``AddedVocabulary``: the special tokens a chat template writes between turns,
``<|im_start|>``, ``<|eot_id|>``, ``</s>`` …), and nothing merges across such a split, so

    tokens(text) = Σ tokens(piece) + number of cut tokens,

where the pieces are the text between the *cut tokens*: the tokenizer's added tokens that
match raw text exactly (``normalized`` false, no ``lstrip`` / ``rstrip`` / ``single_word``,
which would let them take the whitespace next to them). A turn that resends a history then
tokenizes only its new pieces; the others' counts come from a cache keyed by a 128-bit
BLAKE2b digest of the piece's UTF-8 (the cache never holds text), bounded by
``cache_bytes`` (``ENTRY_BYTES`` per entry, oldest first out). Uncached pieces are encoded
together with ``encode_batch_fast`` (no offsets; the Rust side spreads a batch over the
machine's cores).

The identity can fail for a tokenizer whose pre-tokenizer treats the *first* piece of its
input specially (SentencePiece's ``prepend_scheme: first`` adds "▁" to the whole input's
start only), and a template may write no cut token at all. ``PieceCounter.verify`` therefore
counts sample conversations both ways at load; on any difference (or with no cut token in
the samples) the counter counts whole texts (``mode`` ``whole``), and says so in
``ice_token_counts_total{mode}``.

Invariants: ``count(text) == len(encode(text, add_special_tokens=False))`` whenever ``mode``
is ``pieces`` for the samples' shapes (tests/test_token_pieces.py checks it over generated
conversations for every template the project ships or tests); the cache's entries ≤
cache_bytes / ENTRY_BYTES; thread-safe under the GIL (each dict operation is atomic; a lost
update only costs a recount).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from typing import Literal

from tokenizers import Tokenizer

__all__ = ["DEFAULT_CACHE_BYTES", "ENTRY_BYTES", "PieceCounter", "cut_tokens"]

DEFAULT_CACHE_BYTES = 32 * 1024 * 1024
# A dict slot, a 16-byte digest as bytes and an int: 133 bytes an entry measured with
# CPython 3.11 (tracemalloc over 100k entries), taken as 192.
ENTRY_BYTES = 192
# Pieces shorter than this are encoded every time (hashing them costs about as much).
MIN_CACHED_CHARS = 64

Mode = Literal["pieces", "whole"]


def cut_tokens(tokenizer: Tokenizer) -> list[str]:
    """The added tokens the tokenizer cuts its input at without touching the text beside."""
    cuts = []
    for token in tokenizer.get_added_tokens_decoder().values():
        if token.normalized or token.lstrip or token.rstrip or token.single_word:
            continue
        if token.content:
            cuts.append(token.content)
    return sorted(set(cuts), key=len, reverse=True)  # longest first, as the tokenizer matches


class PieceCounter:
    """Counts texts for one tokenizer, piece by piece with a cache (see the module doc)."""

    def __init__(self, tokenizer: Tokenizer, cache_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self._tokenizer = tokenizer
        cuts = cut_tokens(tokenizer)
        self._split = re.compile("(" + "|".join(re.escape(c) for c in cuts) + ")") if cuts else None
        self.max_entries = max(0, cache_bytes // ENTRY_BYTES)
        self._cache: dict[bytes, int] = {}
        self.mode: Mode = "pieces" if self._split is not None else "whole"
        self.hits = self.misses = 0

    def verify(self, samples: Sequence[str]) -> Mode:
        """Keep only the cut tokens ``samples`` (the template's renders) contain, then count
        the samples whole and by pieces; any difference (or no cut token in them) turns
        pieces off for good. Returns the mode."""
        if self._split is None:
            self.mode = "whole"
            return self.mode
        seen = sorted(
            {m.group(0) for text in samples for m in self._split.finditer(text)},
            key=len,
            reverse=True,
        )
        if not seen:  # the template writes no cut token
            self.mode = "whole"
            return self.mode
        # cut only at the tokens the template writes (a short pattern: a tokenizer may have
        # a thousand added tokens); others inside a piece are split by the tokenizer itself
        self._split = re.compile("(" + "|".join(re.escape(c) for c in seen) + ")")
        for text in samples:
            if self._count_pieces(text, cache=False) != self.count_whole(text):
                self.mode = "whole"
                return self.mode
        self.mode = "pieces"
        return self.mode

    def count_whole(self, text: str) -> int:
        """Tokens of ``text`` without the post-processor's special tokens."""
        return len(self._tokenizer.encode_batch_fast([text], add_special_tokens=False)[0])

    def count(self, text: str) -> int:
        """Tokens of ``text`` (``add_special_tokens=False``): by pieces when verified."""
        if self.mode == "pieces":
            return self._count_pieces(text, cache=self.max_entries > 0)
        return self.count_whole(text)

    def _count_pieces(self, text: str, *, cache: bool) -> int:
        assert self._split is not None
        parts = self._split.split(text)
        total = len(parts) // 2  # every odd part is a cut token: one token each
        todo: list[str] = []
        keys: list[bytes | None] = []
        for piece in parts[0::2]:
            if not piece:
                continue
            key = None
            if cache and len(piece) >= MIN_CACHED_CHARS:
                key = _digest(piece)
                known = self._cache.get(key)
                if known is not None:
                    self.hits += 1
                    total += known
                    continue
                self.misses += 1
            todo.append(piece)
            keys.append(key)
        if todo:
            encoded = self._tokenizer.encode_batch_fast(todo, add_special_tokens=False)
            for key, enc in zip(keys, encoded, strict=True):
                n = len(enc)
                total += n
                if key is not None:
                    self._remember(key, n)
        return total

    def _remember(self, key: bytes, count: int) -> None:
        cache = self._cache
        while len(cache) >= self.max_entries and cache:
            del cache[next(iter(cache))]  # the oldest entry
        cache[key] = count

    @property
    def entries(self) -> int:
        return len(self._cache)


def _digest(piece: str) -> bytes:
    data = piece.encode("utf-8", "surrogatepass")
    return hashlib.blake2b(data, digest_size=16).digest()
