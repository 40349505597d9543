"""Token-count estimation without a tokenizer.

Job: give the evaluator a quick, conservative-leaning estimate of how many prompt tokens a
request carries, for when no tokenizer is configured (exact counts are a later layer).

Formula (per text):
    tokens = ceil(ascii_chars / 4) + cjk_chars + ceil(other_non_ascii_chars / 2)
- ``ascii_chars / 4``: the usual BPE figure for English prose and code (GPT-2/Llama-family
  tokenizers average 3.5-4.5 ASCII characters a token).
- CJK ideographs, kana and hangul: about one token each (often more than one in Llama-2-era
  vocabularies, about 0.7 in newer ones), so counting one keeps the estimate honest where
  "four characters a token" would be 3-4x too low.
- Other non-ASCII characters (accented Latin, Cyrillic, emoji...) are counted two to a token.
Chat framing: each message adds ``PER_MESSAGE_TOKENS`` (role markers and separators of the
common chat templates) and the reply primer adds ``REPLY_PRIMER_TOKENS``.

Error: on English prose the estimate is typically within +-25% of a Llama/GPT tokenizer;
code with much whitespace or many symbols runs higher than estimated. The policy's
``output_buffer_tokens`` absorbs this error; exact counting replaces it when configured.

Invariant: pure functions of their inputs; never raises on any ``str``.
"""

from __future__ import annotations

import re

__all__ = ["PER_MESSAGE_TOKENS", "REPLY_PRIMER_TOKENS", "estimate_text_tokens"]

PER_MESSAGE_TOKENS = 4
REPLY_PRIMER_TOKENS = 3

_CJK = re.compile(
    "[\u1100-\u11ff\u2e80-\u2fdf\u3040-\u30ff\u3100-\u31ff\u3400-\u4dbf"
    "\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\U00020000-\U0003134f]"
)


def estimate_text_tokens(text: str) -> int:
    """Estimated token count of ``text`` (see the module docstring for the formula)."""
    n = len(text)
    if n == 0:
        return 0
    if text.isascii():
        return (n + 3) // 4
    non_ascii = n - len(text.encode("ascii", "ignore"))
    ascii_chars = n - non_ascii
    cjk = len(_CJK.findall(text))
    other = non_ascii - cjk
    return (ascii_chars + 3) // 4 + cjk + (other + 1) // 2
