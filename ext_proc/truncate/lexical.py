"""Lexical overlap between the question and each turn: what the embedding model cannot read.

all-MiniLM-L6-v2 is an English model: it sees Chinese as a bag of characters and its cosines
between Chinese texts are close to noise. Lexical overlap of the question's terms with a
turn's is a reliable signal in any script, so truncation blends the two
(``runner.truncate``):

    similarity = (1 − w) × cosine + w × lexical
    w = the profile's lexical_weight, or by default the share of CJK characters among the
        question's letters (an English question: w ≈ 0, pure semantic; a Chinese one: w ≈ 1)

Terms: lower-cased words of two or more ASCII letters or digits, and every pair of adjacent
CJK characters (Chinese has no spaces; character bigrams are the usual unit of Chinese
retrieval). ``lexical`` is the IDF-weighted share of the question's terms that the turn holds:

    lexical(turn) = Σ_{t ∈ Q ∩ T} idf(t) / Σ_{t ∈ Q} idf(t),   idf(t) = ln(1 + N / (1 + df(t)))

over the N turns being ranked, df(t) = the turns holding t: a term every turn shares counts
little, a term only one turn shares counts most. 0 when the question has no terms.

Invariant: pure, stdlib only; linear in the texts' length.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

__all__ = ["cjk_share", "lexical_similarities", "terms"]

_WORD = re.compile(r"[a-z0-9]{2,}")
_CJK_RUN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+")
_LETTER = re.compile(r"[a-zA-Z\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")


def terms(text: str) -> set[str]:
    """ASCII words (2+ characters) and CJK character bigrams of ``text``."""
    found = set(_WORD.findall(text.lower()))
    for run in _CJK_RUN.findall(text):
        if len(run) == 1:
            found.add(run)
        found.update(run[i : i + 2] for i in range(len(run) - 1))
    return found


def cjk_share(text: str) -> float:
    """CJK characters / (CJK characters + ASCII letters) in ``text`` (0 when it has none)."""
    letters = _LETTER.findall(text)
    if not letters:
        return 0.0
    return sum(1 for c in letters if not c.isascii()) / len(letters)


def lexical_similarities(query: str, texts: Sequence[str]) -> list[float]:
    """IDF-weighted coverage of the question's terms by each text (see the docstring)."""
    q = terms(query)
    if not q or not texts:
        return [0.0] * len(texts)
    bags = [terms(t) & q for t in texts]  # only the question's terms matter
    n = len(texts)
    idf = {t: math.log(1 + n / (1 + sum(1 for b in bags if t in b))) for t in q}
    total = sum(idf.values())
    return [sum(idf[t] for t in bag) / total for bag in bags]
