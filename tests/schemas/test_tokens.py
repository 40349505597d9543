"""The token estimator against hand-computed values."""

from __future__ import annotations

import pytest

from ext_proc.schemas.estimate import estimate_text_tokens


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", 0),
        ("abcd", 1),
        ("abcde", 2),  # ceil(5/4)
        ("Hello, world!", 4),  # 13 ASCII → ceil(13/4)
        ("你好世界", 4),  # 4 CJK, one each
        ("Hi 你好", 3),  # 3 ASCII → 1, 2 CJK → 2
        ("こんにちは", 5),  # kana count as CJK
        ("héllo", 2),  # 4 ASCII → 1; 1 other → ceil(1/2) = 1
        ("Привет", 3),  # 6 Cyrillic → ceil(6/2)
    ],
    ids=["empty", "four", "five", "english", "chinese", "mixed", "kana", "accent", "cyrillic"],
)
def test_estimate_matches_the_documented_formula(text: str, expected: int) -> None:
    assert estimate_text_tokens(text) == expected


def test_chinese_is_not_four_characters_a_token() -> None:
    text = "内存压力" * 100  # 400 CJK characters
    assert estimate_text_tokens(text) == 400
    assert estimate_text_tokens(text) > len(text) // 4


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("😀😀", 2),  # 4-byte UTF-8: wide
        ("「你好」", 4),  # CJK brackets U+300C/U+300D are wide
        ("a—b", 2),  # em dash U+2014 (3 bytes, lead 0xE2) is narrow: 2 ASCII → 1, 1 narrow → 1
        ("\ud800", 1),  # a lone surrogate never raises
    ],
    ids=["emoji", "cjk-punctuation", "em-dash", "lone-surrogate"],
)
def test_wide_and_narrow_boundaries(text: str, expected: int) -> None:
    assert estimate_text_tokens(text) == expected
