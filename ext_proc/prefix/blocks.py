"""Block hashes of a prompt, as vLLM's prefix cache keys them, and pseudo-tokens for text.

Job: cut a prompt's token ids into full blocks of ``block_size`` tokens and give each block a
hash that chains the previous block's hash and the block's own ids (vLLM's
``hash_block_tokens``: ``hash((parent_hash, block_token_ids, extra_keys))``), so two prompts
share block i's hash exactly when they share their first ``(i + 1) × block_size`` tokens.
Without a tokenizer, ``pseudo_tokens`` turns the rendered prompt text into deterministic
pseudo-token ids that keep the property that matters here: prompts that agree on their first
c characters agree on their first pseudo-tokens up to about character c.

Formula (``block_hashes``)::

    h(-1) = sha256(b"ice-prefix-root")                      (vLLM: NONE_HASH)
    h(i)  = sha256(h(i-1) ‖ uint32le(t[i·B]) ‖ … ‖ uint32le(t[i·B + B − 1]))
    for i in 0 .. floor(len(t) / B) − 1                       (only full blocks)

``B`` is the backend's block size in tokens (vLLM's ``--block-size``; default 16). Token ids
must fit in 32 bits (every vocabulary does). vLLM's ``extra_keys`` (LoRA name, multimodal
hashes, ``cache_salt``) are not modelled: a route's requests are assumed to share them.

Pseudo-tokens (``pseudo_tokens``): the text is split like GPT-2/Llama-3 pre-tokenizers (a
space joins the word after it) into pieces, each piece is one pseudo-token, its id the crc32
of its UTF-8 bytes::

    letters  " ?" + up to 6 letters (a longer word is several pieces)
    digits   " ?" + up to 3 digits (Llama-3 / GPT-4 style)
    CJK, kana, hangul: one character each
    other    one punctuation or symbol character (after an optional space); whitespace runs

Approximation and its error: English prose makes about one piece per 4–5 characters, BPE
tokenizers one token per 4 (Llama/GPT): pseudo-token counts run about 0.8–1.2× the real
count (more on code with long identifiers, fewer on symbol-dense text), so block boundaries
fall at other characters than the backend's. The share of blocks two prompts have in common
is nearly unaffected: both the shared and the total block counts scale with characters,
and a piece depends only on its own characters and the next one, so the shared count is off
by at most one block per prompt (the block holding the first difference). The prefix
stability score (a ratio of sums) is therefore off by about ±1 / (blocks per prompt).
Two different pieces share a crc32 with probability 2^-32 (a false match needs it at the
same position of two prompts).

Invariants: pure functions; ``"".join(pseudo_pieces(text)) == text`` for every ``str``;
hashes are 32-byte sha256 digests, identical across processes and runs.
Units: tokens, blocks of ``block_size`` tokens, characters of ``str`` (code points).
Cost: about 1 µs a block for ``block_hashes``; about 0.5 µs a piece for ``pseudo_tokens``.
"""

from __future__ import annotations

import hashlib
import re
import struct
import zlib
from collections.abc import Sequence

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "ROOT_HASH",
    "block_hashes",
    "hit_blocks",
    "pseudo_pieces",
    "pseudo_tokens",
    "shared_leading_blocks",
]

DEFAULT_BLOCK_SIZE = 16
ROOT_HASH = hashlib.sha256(b"ice-prefix-root").digest()

_WIDE = "\u2e80-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef"
_PIECE = re.compile(
    rf"[{_WIDE}]| ?[^\W\d_{_WIDE}]{{1,6}}| ?\d{{1,3}}| ?[^\w\s{_WIDE}]| ?_|\s+(?!\S)|\s+"
)


def block_hashes(tokens: Sequence[int], block_size: int = DEFAULT_BLOCK_SIZE) -> list[bytes]:
    """The chained sha256 of each full block of ``tokens`` (see the module formula).

    Raises ``ValueError`` for a block size below 1 or a token id outside 0..2^32 − 1."""
    if block_size < 1:
        raise ValueError(f"block_size must be at least 1, got {block_size}")
    pack = struct.Struct(f"<{block_size}I").pack
    out: list[bytes] = []
    parent = ROOT_HASH
    for start in range(0, len(tokens) - block_size + 1, block_size):
        try:
            data = pack(*tokens[start : start + block_size])
        except struct.error:
            raise ValueError(
                f"token ids must be integers in 0..2^32-1 (block at token {start})"
            ) from None
        parent = hashlib.sha256(parent + data).digest()
        out.append(parent)
    return out


def hit_blocks(n_tokens: int, block_size: int = DEFAULT_BLOCK_SIZE) -> int:
    """The most leading blocks a prompt of ``n_tokens`` can take from vLLM's prefix cache:
    ``floor((n_tokens − 1) / block_size)`` (vLLM recomputes the last prompt token to get
    its logits, ``max_cache_hit_length = num_tokens − 1``), 0 for an empty prompt."""
    return max(0, n_tokens - 1) // block_size


def shared_leading_blocks(
    a: Sequence[bytes], b: Sequence[bytes], b_tokens: int, block_size: int = DEFAULT_BLOCK_SIZE
) -> int:
    """Leading blocks of prompt ``b`` (``b_tokens`` tokens) that a cache holding prompt
    ``a``'s blocks serves: equal leading hashes, at most ``hit_blocks(b_tokens)``."""
    cap = min(len(a), len(b), hit_blocks(b_tokens, block_size))
    n = 0
    while n < cap and a[n] == b[n]:
        n += 1
    return n


def pseudo_pieces(text: str) -> list[str]:
    """The pieces ``pseudo_tokens`` makes of ``text``; they concatenate back to it."""
    return _PIECE.findall(text)


def pseudo_tokens(text: str, max_tokens: int | None = None) -> list[int]:
    """Deterministic pseudo-token ids of ``text`` (crc32 of each piece, see the module
    docstring). ``max_tokens`` keeps only the first ones (bounds the cost of huge bodies)."""
    out: list[int] = []
    crc = zlib.crc32
    for m in _PIECE.finditer(text):
        if max_tokens is not None and len(out) >= max_tokens:
            break
        out.append(crc(m.group().encode("utf-8", "surrogatepass")))
    return out
