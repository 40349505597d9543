"""``KvFit.less``: the room less what ICE holds, never below zero, the same object when
nothing changes."""

from __future__ import annotations

from ext_proc.policy.kvfit import KvFit


def _fit(free: int, usable: int) -> KvFit:
    return KvFit(free, usable, 16, lambda p, o: -(-(p + o) // 16))


def test_less_takes_the_held_blocks_off_the_free_ones_only() -> None:
    fit = _fit(100, 500)
    less = fit.less(30)
    assert (less.free_blocks, less.usable_blocks, less.block_size) == (70, 500, 16)
    assert less.blocks(20, 12) == 2  # ceil(32 / 16): the need is kept


def test_less_never_goes_below_zero_and_can_set_the_usable_blocks() -> None:
    assert _fit(10, 500).less(25).free_blocks == 0
    narrower = _fit(100, 500).less(0, usable_blocks=300)
    assert (narrower.free_blocks, narrower.usable_blocks) == (100, 300)


def test_nothing_held_is_the_same_room() -> None:
    fit = _fit(100, 500)
    assert fit.less(0) is fit and fit.less(0, usable_blocks=500) is fit
