"""Block hashing, the hit cap, pseudo-tokens and PrefixTracker, with hand-computed values."""

from __future__ import annotations

import hashlib
import struct
import threading

import pytest

from ext_proc.prefix import PrefixTracker, block_hashes, hit_blocks, pseudo_tokens
from ext_proc.prefix.blocks import ROOT_HASH, pseudo_pieces, shared_leading_blocks


def test_block_hash_chains_parent_and_ids_over_full_blocks_only() -> None:
    toks = list(range(10))
    hs = block_hashes(toks, 4)
    assert len(hs) == 2  # 10 tokens: two full blocks, the partial one is not hashed
    h0 = hashlib.sha256(ROOT_HASH + struct.pack("<4I", 0, 1, 2, 3)).digest()
    h1 = hashlib.sha256(h0 + struct.pack("<4I", 4, 5, 6, 7)).digest()
    assert hs == [h0, h1]
    # the same block after another parent hashes differently (chained)
    assert block_hashes([9, 9, 9, 9, 4, 5, 6, 7], 4)[1] != h1
    assert block_hashes([], 16) == []


def test_block_hash_rejects_bad_ids_and_sizes() -> None:
    with pytest.raises(ValueError):
        block_hashes([-1, 0, 0, 0], 4)
    with pytest.raises(ValueError):
        block_hashes([2**32, 0, 0, 0], 4)
    with pytest.raises(ValueError):
        block_hashes([1], 0)


def test_hit_cap_is_vllms_prompt_minus_one() -> None:
    assert hit_blocks(0, 16) == 0
    assert hit_blocks(32, 16) == 1  # block-aligned: the last block is recomputed
    assert hit_blocks(33, 16) == 2
    a = block_hashes(list(range(32)), 16)
    assert shared_leading_blocks(a, a, 32, 16) == 1
    b = block_hashes(list(range(33)), 16)
    assert shared_leading_blocks(b, b, 33, 16) == 2


def test_pseudo_pieces_cover_the_text_and_are_local() -> None:
    text = "Hello wonderful world, it's 2024-05-01!\n\n  中文字 x_y\u0301 12345"
    assert "".join(pseudo_pieces(text)) == text
    assert pseudo_pieces("Hello wonderful") == ["Hello", " wonder", "ful"]
    assert pseudo_pieces(" 12345") == [" 123", "45"]
    assert pseudo_pieces("中文") == ["中", "文"]
    assert pseudo_tokens("a b c") == pseudo_tokens("a b c")  # deterministic
    assert len(pseudo_tokens("x " * 100, max_tokens=7)) == 7
    # a change at character c leaves the pieces that end before it alone
    a, b = pseudo_tokens("the same words here then A"), pseudo_tokens("the same words here then B")
    assert a[:-1] == b[:-1] and a[-1] != b[-1]


def test_tracker_hand_computed_score_and_window() -> None:
    t = PrefixTracker(capacity_blocks=100, window=10, block_size=4)
    # r1: 10 tokens, 2 full blocks, nothing seen yet -> 0 of 2
    assert t.observe("r", list(range(1, 11))) == 0
    # r2: same first 8 tokens, 11 tokens (cap floor(10/4) = 2) -> 2 of 2
    assert t.observe("r", [*range(1, 9), 99, 100, 101]) == 2
    # r3: block 0 equal, block 1 differs, block 2 = [5..8] but after another parent -> 1 of 3
    assert t.observe("r", [1, 2, 3, 4, 7, 7, 7, 7, 5, 6, 7, 8]) == 1
    # r4: exactly 8 tokens (block-aligned, cap floor(7/4) = 1) -> 1 of 2
    assert t.observe("r", list(range(1, 9))) == 1
    assert t.score("r") == pytest.approx(4 / 9)
    assert t.scores() == {"r": pytest.approx(4 / 9)}
    stats = t.stats("r")
    assert stats is not None and (stats.requests, stats.shared_blocks, stats.total_blocks) == (
        4,
        4,
        9,
    )
    small = PrefixTracker(capacity_blocks=100, window=3, block_size=4)
    for toks in (
        list(range(1, 11)),
        [*range(1, 9), 99, 100, 101],
        [1, 2, 3, 4, 7, 7, 7, 7, 5, 6, 7, 8],
        list(range(1, 9)),
    ):
        small.observe("r", toks)
    assert small.score("r") == pytest.approx((2 + 1 + 1) / (2 + 3 + 2))  # last three
    assert small.score("other") is None
    t.observe("empty", [1, 2])  # no full block: no score yet
    assert t.score("empty") is None and "empty" not in t.scores()


def test_tracker_lru_eviction_and_route_bound() -> None:
    t = PrefixTracker(capacity_blocks=2, window=10, block_size=1, max_routes=2)
    t.observe("r", [1, 2, 9])  # table: h[1], h[1,2], h[1,2,9] -> keeps the last two
    assert t.observe("r", [1, 5]) == 0  # h[1] was evicted (LRU), so no leading hit
    t.observe("r", [1, 5])
    assert t.observe("r", [1, 5, 6]) == 2
    t.observe("a", [1, 2])
    t.observe("b", [1, 2])  # third route: "r" (least recently observed) is forgotten
    assert t.stats("r") is None and set(t.scores()) <= {"a", "b"}
    assert PrefixTracker().memory_bound_bytes() == 16 * (124 * 65536 + 120 * 1000)
    with pytest.raises(ValueError):
        PrefixTracker(capacity_blocks=0)


def test_tracker_is_thread_safe() -> None:
    t = PrefixTracker(capacity_blocks=50, window=100, block_size=2)

    def work(k: int) -> None:
        for i in range(200):
            t.observe(f"r{k % 2}", [1, 2, 3, 4, i % 7, k])

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for route in ("r0", "r1"):
        s = t.stats(route)
        assert s is not None and s.requests == 100 and 0 <= s.shared_blocks <= s.total_blocks
