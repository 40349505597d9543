"""What a count may encode, and what it teaches: the new text of a count, bounded and shared.

Job: the ICE worker counts a long body on its event loop only when little of its text is new
to its piece cache (``ext_proc.serve.offload``), and the helper process, which counts the
others, hands its piece counts back to the worker. ``pieces.PieceCounter`` calls in here:

- ``new_text_bound(n)``: every count made inside encodes at most ``n`` characters in all
  (uncached pieces, distinct short pieces, whole texts); the count that would pass it raises
  ``NewTextOverBound`` before encoding anything (``spend_new_text``), and so does every later
  count inside the same bound.
- ``noting_pieces()``: collects, by counter ``identity``, the (digest, count) pairs of the
  cacheable pieces counted inside (at most ``MAX_LESSON_PIECES`` a counter); ``lessons``
  packs them as ``Lesson`` values (digests and counts, never text) for another process,
  whose counter of the same identity merges them (``PieceCounter.learn``).
- ``tokenizer_identity``: a digest of the tokenizer file and its added tokens, what a
  piece's count depends on; counters with equal identities count every piece alike.

Invariants: the bound and the notes live in context variables, so they belong to the thread
or task that set them and end with their ``with`` block; a lesson holds no text; a bounded
count encodes nothing once its bound is passed.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from tokenizers import Tokenizer

__all__ = [
    "DIGEST_BYTES",
    "MAX_LESSON_PIECES",
    "Lesson",
    "NewTextOverBound",
    "Noted",
    "current_notes",
    "lessons",
    "new_text_bound",
    "noting_pieces",
    "spend_new_text",
    "tokenizer_identity",
]

# The (digest, count) pairs one counter notes for a lesson: 24 bytes each on the wire, so a
# lesson is at most ~200 KB (a 190k-token conversation of 250-word turns has ~600 pieces).
MAX_LESSON_PIECES = 8192
DIGEST_BYTES = 16


class NewTextOverBound(Exception):
    """A count inside ``new_text_bound`` would encode more characters than it allows;
    raised before encoding anything (the caller counts elsewhere)."""


@dataclass(slots=True)
class _Budget:
    left: int
    tripped: bool = False


@dataclass(frozen=True, slots=True)
class Lesson:
    """Piece counts one process teaches another: the counter's ``identity``, the pieces'
    digests (``DIGEST_BYTES`` each, concatenated) and their counts (``array("q")`` bytes)."""

    identity: bytes
    digests: bytes
    counts: bytes

    def __len__(self) -> int:
        return len(self.digests) // DIGEST_BYTES

    def pairs(self) -> Iterator[tuple[bytes, int]]:
        counts = array("q")
        counts.frombytes(self.counts)
        d = self.digests
        for i, n in enumerate(counts):
            yield d[i * DIGEST_BYTES : (i + 1) * DIGEST_BYTES], n


Noted = dict[bytes, dict[bytes, int]]  # counter identity → {digest: count}, in order seen
_BOUND: ContextVar[_Budget | None] = ContextVar("ice_new_text_bound", default=None)
_NOTES: ContextVar[Noted | None] = ContextVar("ice_noted_pieces", default=None)


@contextmanager
def new_text_bound(max_chars: int) -> Iterator[None]:
    """Counts made inside encode at most ``max_chars`` characters in all; the count that
    would pass it, and every one after it, raises ``NewTextOverBound`` instead."""
    token = _BOUND.set(_Budget(max(0, max_chars)))
    try:
        yield
    finally:
        _BOUND.reset(token)


def spend_new_text(chars: int) -> None:
    """Take ``chars`` characters about to be encoded from the bound in force, if any."""
    budget = _BOUND.get()
    if budget is None:
        return
    if budget.tripped or chars > budget.left:
        budget.tripped = True
        raise NewTextOverBound(f"{chars} new characters to encode, {budget.left} allowed")
    budget.left -= chars


@contextmanager
def noting_pieces() -> Iterator[Noted]:
    """Collect the cacheable pieces' (digest, count) pairs of the counts made inside, by
    counter identity (counters without one note nothing); ``lessons`` packs them."""
    noted: Noted = {}
    token = _NOTES.set(noted)
    try:
        yield noted
    finally:
        _NOTES.reset(token)


def current_notes(identity: bytes) -> dict[bytes, int] | None:
    """Where a counter of ``identity`` notes its pieces now (None: not noting)."""
    noted = _NOTES.get()
    return None if noted is None or not identity else noted.setdefault(identity, {})


def lessons(noted: Noted) -> tuple[Lesson, ...]:
    """What ``noting_pieces`` collected, packed for another process."""
    out = []
    for identity, pairs in noted.items():
        if pairs:
            counts = array("q", pairs.values()).tobytes()
            out.append(Lesson(identity, b"".join(pairs), counts))
    return tuple(out)


def tokenizer_identity(tokenizer_json: bytes, tokenizer: Tokenizer) -> bytes:
    """A digest of what a piece's count depends on: the tokenizer file and its added tokens
    (a config's special tokens included) with their flags; equal identities count alike."""
    digest = hashlib.sha256(b"ice-piece-counts-1\x00")
    digest.update(tokenizer_json)
    for token in sorted(str(t) for t in tokenizer.get_added_tokens_decoder().values()):
        digest.update(b"\x00" + token.encode("utf-8", "surrogatepass"))
    return digest.digest()[:DIGEST_BYTES]
