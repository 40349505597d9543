"""Each tenant's share of a pool (``ext_proc.policy.tenant_share``): the formulas against
hand-computed values, and the loader's checks."""

from __future__ import annotations

import re
from types import MappingProxyType

import pytest

from ext_proc.policy.errors import PolicyError
from ext_proc.policy.load import parse_policy
from ext_proc.policy.settings import TenantShares
from ext_proc.policy.tenant_share import EXCEEDED, RESERVED, ShareFigures, share_verdict

SHARES = TenantShares(
    cap=0.5,
    caps=MappingProxyType({"heavy": 0.29}),
    guaranteed=MappingProxyType({"light": 0.3, "gold": 0.2}),
)


@pytest.mark.parametrize(
    ("tenant", "usable", "cap_blocks"),
    [
        ("heavy", 100, 29),  # floor(0.29 × 100) = 29 (not 28: 0.29 × 100 = 28.999… in floats)
        ("anyone", 100, 50),  # the default cap: floor(0.5 × 100)
        ("anyone", 23, 11),  # floor(0.5 × 23) = floor(11.5)
        ("heavy", 7, 2),  # floor(0.29 × 7) = floor(2.03)
    ],
    ids=["override", "default", "rounds-down", "small-pool"],
)
def test_cap_blocks_is_floor_of_cap_times_usable_blocks(
    tenant: str, usable: int, cap_blocks: int
) -> None:
    assert SHARES.cap_blocks(tenant, usable) == cap_blocks


def test_guaranteed_blocks_is_floor_of_share_times_usable_blocks() -> None:
    assert SHARES.guaranteed_blocks("light", 95) == 28  # floor(0.3 × 95) = floor(28.5)
    assert SHARES.guaranteed_blocks("gold", 95) == 19  # floor(0.2 × 95)
    assert SHARES.guaranteed_blocks("nobody", 95) == 0


def test_protected_counts_only_active_tenants_below_their_guarantee() -> None:
    # U = 100: light's 30, gold's 20 guaranteed
    idle = ShareFigures(100, 80, {})
    assert idle.protected(SHARES, "heavy") == 0  # nobody active: nothing kept back
    # light holds 12 (active): 30 − 12 = 18 kept; gold waits, holds 0: 20 kept
    busy = ShareFigures(100, 80, {"light": 12}, waiting={"gold"})
    assert busy.protected(SHARES, "heavy") == 18 + 20
    assert busy.protected(SHARES, "light") == 20  # its own guarantee is not kept from itself
    # light holds more than its guarantee: max(0, 30 − 35) = 0
    assert ShareFigures(100, 80, {"light": 35}).protected(SHARES, "heavy") == 0


@pytest.mark.parametrize(
    ("tenant", "need", "held", "free", "waiting", "reason"),
    [
        ("heavy", 5, {"heavy": 24}, 70, (), None),  # 24 + 5 = 29 ≤ 29
        ("heavy", 6, {"heavy": 24}, 70, (), EXCEEDED),  # 24 + 6 = 30 > 29, with room left
        ("other", 51, {}, 90, (), EXCEEDED),  # 51 > floor(0.5 × 100) on its first request
        ("other", 50, {}, 90, (), None),
        # light active with 10 of its 30: 20 kept; gold idle. F = 45: 45 − 20 = 25
        ("heavy", 26, {"heavy": 0, "light": 10}, 45, (), RESERVED),
        ("heavy", 25, {"light": 10}, 45, (), None),
        ("light", 40, {"light": 10}, 45, (), None),  # light may take its own kept room
        ("heavy", 26, {"light": 10}, 45, ("gold",), RESERVED),  # gold waits: 20 + 20 kept
        ("heavy", 5, {"light": 10}, 45, ("gold",), None),  # 5 ≤ 45 − 40
        ("heavy", 6, {"light": 10}, 45, ("gold",), RESERVED),  # 6 > 45 − 40
    ],
    ids=[
        "at-cap",
        "over-cap-with-room",
        "first-request-over-cap",
        "first-request-at-cap",
        "guarantee-kept",
        "guarantee-fits",
        "own-guarantee",
        "two-guarantees-kept",
        "fits-beside-two",
        "one-block-over",
    ],
)
def test_share_verdict_holds_back_by_cap_then_by_the_others_guarantees(
    tenant: str,
    need: int,
    held: dict[str, int],
    free: int,
    waiting: tuple[str, ...],
    reason: str | None,
) -> None:
    got = share_verdict(SHARES, tenant, need, ShareFigures(100, free, held, waiting), None, 3)
    assert (got.reason if got is not None else None) == reason
    if got is not None:
        assert got.retry_after_s == 3 and got.refusal().status == 429


def test_the_cap_message_names_the_figures() -> None:
    got = share_verdict(SHARES, "heavy", 6, ShareFigures(100, 70, {"heavy": 24}), None, 2)
    assert got is not None
    assert "holds 24" in got.message and "cap of 29" in got.message and "0.29 of 100" in got.message


def test_no_usable_blocks_or_no_need_never_holds_back() -> None:
    assert share_verdict(SHARES, "heavy", 6, ShareFigures(0, 0, {}), None, 1) is None
    assert share_verdict(SHARES, "heavy", 0, ShareFigures(100, 0, {"heavy": 99}), None, 1) is None


POOL = "pools:\n  default:\n    metrics_urls: ['http://127.0.0.1:1/metrics']\n"


def test_the_policy_loads_a_pools_tenant_shares() -> None:
    policy = parse_policy(
        POOL + "    tenant_shares: {cap: 0.5, caps: {heavy: 0.25}, guaranteed: {light: 0.3}}\n"
    )
    shares = policy.tenant_shares["default"]
    assert (shares.cap, dict(shares.caps), dict(shares.guaranteed)) == (
        0.5,
        {"heavy": 0.25},
        {"light": 0.3},
    )
    assert shares.named == {"heavy", "light"}
    assert parse_policy(POOL).tenant_shares == {}  # unset: no limit
    assert parse_policy(POOL + "    tenant_shares: {}\n").tenant_shares["default"].cap == 1.0


@pytest.mark.parametrize(
    ("block", "message"),
    [
        ("{cap: 0}", "tenant_shares.cap: must be in (0, 1]"),
        ("{cap: 1.5}", "tenant_shares.cap: must be in (0, 1]"),
        ("{caps: {a: 0}}", "tenant_shares.caps.a: must be in (0, 1]"),
        ("{cap: 0.2, guaranteed: {a: 0.3}}", "guaranteed.a: must be in [0, its cap 0.2]"),
        ("{guaranteed: {a: 0.6, b: 0.5}}", "guaranteed: the shares add up to 1.1"),
    ],
    ids=["zero-cap", "cap-over-one", "zero-override", "guarantee-over-cap", "over-one"],
)
def test_the_loader_refuses_shares_that_cannot_hold(block: str, message: str) -> None:
    with pytest.raises(PolicyError, match=re.escape(message)):
        parse_policy(POOL + f"    tenant_shares: {block}\n")
