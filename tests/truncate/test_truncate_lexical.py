"""Lexical overlap: terms, the CJK share that weights it, and IDF coverage (hand-computed)."""

from __future__ import annotations

import math

import pytest

from ext_proc.truncate.lexical import cjk_share, lexical_similarities, terms


def test_terms_are_ascii_words_and_cjk_bigrams() -> None:
    assert terms("Redis 缓存过期, a TTL!") == {"redis", "ttl", "缓存", "存过", "过期"}
    assert terms("猫") == {"猫"}
    assert terms("") == set()


def test_cjk_share_counts_letters_only() -> None:
    assert cjk_share("红烧肉") == 1.0
    assert cjk_share("hello 123") == 0.0
    assert cjk_share("Redis 缓存") == pytest.approx(2 / 7)
    assert cjk_share("!!!") == 0.0


def test_lexical_similarity_is_idf_weighted_coverage_of_the_question() -> None:
    # question terms: {kyoto, ryokan, dinner}; 3 texts
    # df: kyoto 2 (t0, t1), ryokan 1 (t0), dinner 0
    # idf = ln(1 + 3 / (1 + df)): kyoto ln 2, ryokan ln 2.5, dinner ln 4
    sims = lexical_similarities(
        "kyoto ryokan dinner", ["a ryokan in Kyoto", "Kyoto trains", "git rebase"]
    )
    total = math.log(2) + math.log(2.5) + math.log(4)
    assert sims[0] == pytest.approx((math.log(2) + math.log(2.5)) / total)
    assert sims[1] == pytest.approx(math.log(2) / total)
    assert sims[2] == 0.0


def test_a_question_without_terms_scores_nothing() -> None:
    assert lexical_similarities("?!", ["anything"]) == [0.0]
    assert lexical_similarities("words", []) == []
