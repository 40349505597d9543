"""The worker's body backlog: admission by bytes and by time, the window, the cost, hand-computed.

Figures follow ``ext_proc/admit/backlog.py``'s docstring: window W (starting at
max_inflight_bytes), bodies over 64 KiB stop at W × 7/8, budget = 0.5 × message_timeout in a
busy lane and the whole timeout in an empty one, cost c in seconds per byte.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ext_proc.admit.backlog import (
    DEFAULT_COST_S_PER_BYTE,
    MIN_WINDOW_BYTES,
    SMALL_BODY_BYTES,
    Backlog,
    Ticket,
)

MIB = 1024 * 1024


def test_bodies_are_admitted_until_seven_eighths_of_the_window() -> None:
    b = Backlog(max_inflight_bytes=8 * MIB)
    first = b.admit(3 * MIB, "inline")
    second = b.admit(3 * MIB, "inline")
    assert isinstance(first, Ticket) and isinstance(second, Ticket)
    assert b.inflight_bytes == 6 * MIB
    # 6 MiB + 1.5 MiB = 7.5 MiB > 8 MiB × 7/8 = 7 MiB: judged from the headers
    assert b.admit(3 * MIB // 2, "inline") == "bytes"
    # a short request may use the last eighth: 6 MiB + 64 KiB ≤ 8 MiB
    assert isinstance(b.admit(SMALL_BODY_BYTES, "inline"), Ticket)
    assert b.inflight_bytes == 6 * MIB + SMALL_BODY_BYTES


def test_a_worker_with_nothing_in_flight_admits_any_body() -> None:
    b = Backlog(max_inflight_bytes=1 * MIB)
    ticket = b.admit(8 * MIB, "inline")  # larger than the limit: admitted alone
    assert isinstance(ticket, Ticket)
    assert b.admit(1, "inline") == "bytes"  # 8 MiB + 1 byte > 1 MiB
    b.release(ticket)
    assert b.idle and isinstance(b.admit(1, "inline"), Ticket)


def test_time_budget_is_half_the_timeout_behind_others_and_all_of_it_alone() -> None:
    b = Backlog(max_inflight_bytes=1024 * MIB, message_timeout_s=1.0)
    c = DEFAULT_COST_S_PER_BYTE["helper"]  # 100 ns/byte
    # alone: 9 MB × 100 ns = 0.9 s ≤ 1.0 s (the whole timeout)
    assert isinstance(b.admit(9_000_000, "helper"), Ticket)
    # behind it: (9 MB + 1.2 MB) × 100 ns = 1.02 s > 0.5 s
    assert b.admit(1_200_000, "helper") == "time"
    # the other lane is empty: 1 MB inline × 10 ns = 0.01 s
    assert isinstance(b.admit(1_000_000, "inline"), Ticket)
    assert (9_000_000 + 1_200_000) * c == pytest.approx(1.02)
    alone = Backlog(max_inflight_bytes=1024 * MIB, message_timeout_s=1.0)
    assert alone.admit(11_000_000, "helper") == "time"  # 1.1 s even alone


def test_a_body_is_late_when_its_wait_and_the_lane_ahead_pass_the_budget() -> None:
    b = Backlog(max_inflight_bytes=1024 * MIB, message_timeout_s=1.0)
    t1 = b.admit(2_000_000, "helper")
    t2 = b.admit(2_000_000, "helper")
    assert isinstance(t1, Ticket) and isinstance(t2, Ticket)
    b.arrived(t1, 2_000_000, "helper")
    b.arrived(t2, 2_000_000, "helper")
    # t2 has t1 ahead: 0.05 s waited + 4 MB × 100 ns = 0.45 s ≤ 0.5 s
    assert not b.late(t2, 0.05)
    # 0.15 s + 0.4 s = 0.55 s > 0.5 s
    assert b.late(t2, 0.15)
    assert not b.expired(1.0) and b.expired(1.01)
    b.release(t1)  # now nothing is ahead of t2: the whole timeout is its budget
    assert not b.late(t2, 0.5)  # 0.5 s + 2 MB × 100 ns = 0.7 s ≤ 1.0 s
    assert b.late(t2, 0.85)  # 0.85 s + 0.2 s > 1.0 s


def test_arrival_turns_the_promise_into_the_size() -> None:
    b = Backlog(max_inflight_bytes=64 * MIB)
    t = b.admit(8 * MIB, "inline")  # chunked: promised max_body_bytes
    assert isinstance(t, Ticket)
    b.arrived(t, 100_000, "helper")  # it was small, and heavy: judged in the helper
    assert b.inflight_bytes == 100_000
    assert b.lane_bytes == {"inline": 0, "helper": 100_000}
    assert b.queued_bytes["helper"] == 100_000
    b.release(t)
    b.release(t)  # idempotent
    assert b.inflight_bytes == 0 and b.lane_bytes == {"inline": 0, "helper": 0}
    assert b.queued_bytes == {"inline": 0, "helper": 0}


def test_cost_is_an_exponential_mean_of_long_bodies_only() -> None:
    b = Backlog()
    b.observe("inline", 5_000_000, 0.1)  # 20 ns/byte
    assert b.cost["inline"] == pytest.approx(0.8 * 10e-9 + 0.2 * 20e-9)  # 12 ns/byte
    b.observe("inline", 1000, 5.0)  # a short body: fixed costs, not counted
    assert b.cost["inline"] == pytest.approx(12e-9)


def test_window_halves_once_per_timeout_and_grows_back_by_quarter_bodies() -> None:
    now = [100.0]
    b = Backlog(max_inflight_bytes=32 * MIB, message_timeout_s=1.0, clock=lambda: now[0])
    b.lost()
    assert b.window == 16 * MIB
    b.lost()  # the same burst of timeouts: no second cut
    assert b.window == 16 * MIB
    now[0] += 1.5
    b.lost()
    assert b.window == 8 * MIB
    for _ in range(3):
        now[0] += 1.5
        b.lost()
    assert b.window == MIN_WINDOW_BYTES  # 4 MiB floor
    # a body of 3 MiB over 7/8 × 4 MiB = 3.5 MiB with 1 MiB in flight: refused …
    assert isinstance(b.admit(1 * MIB, "inline"), Ticket)
    assert b.admit(3 * MIB, "inline") == "bytes"
    t = Ticket(4 * MIB, "inline")
    b.answered(t)  # … until bodies answered in time grow it: + 4 MiB / 4
    assert b.window == 5 * MIB
    b.answered(Ticket(10, "inline"))  # a short body grows it by 64 KiB / 4
    assert b.window == 5 * MIB + SMALL_BODY_BYTES / 4
    for _ in range(200):
        b.answered(t)
    assert b.window == 32 * MIB  # never above max_inflight_bytes


def test_invalid_limits_are_refused() -> None:
    with pytest.raises(ValueError):
        Backlog(max_inflight_bytes=0)
    with pytest.raises(ValueError):
        Backlog(message_timeout_s=0)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["admit", "arrive", "release"]),
            st.integers(min_value=1, max_value=12 * MIB),
            st.sampled_from(["inline", "helper"]),
            st.integers(min_value=0, max_value=50),
        ),
        max_size=60,
    )
)
def test_inflight_bytes_is_the_sum_of_live_tickets(
    ops: list[tuple[str, int, str, int]],
) -> None:
    b = Backlog(max_inflight_bytes=16 * MIB)
    live: list[Ticket] = []
    for op, nbytes, lane, pick in ops:
        if op == "admit":
            t = b.admit(nbytes, lane)  # type: ignore[arg-type]
            if isinstance(t, Ticket):
                live.append(t)
        elif live:
            t = live[pick % len(live)]
            if op == "arrive":
                b.arrived(t, nbytes, lane)  # type: ignore[arg-type]
            else:
                b.release(t)
                live.remove(t)
        assert b.inflight_bytes == sum(t.nbytes for t in live) >= 0
        assert sum(b.lane_bytes.values()) == b.inflight_bytes
        assert all(v >= 0 for v in b.queued_bytes.values())
    for t in live:
        b.release(t)
    assert b.idle and b.queued_bytes == {"inline": 0, "helper": 0}


def test_the_default_message_timeout_is_the_shipped_envoy_configs() -> None:
    import yaml

    from ext_proc.admit.backlog import DEFAULT_MESSAGE_TIMEOUT_S
    from ext_proc.lab.stack import ENVOY_DIR

    for name in ("envoy.yaml", "bench.yaml"):
        config = yaml.safe_load((ENVOY_DIR / name).read_text())
        ingress = config["static_resources"]["listeners"][0]
        hcm = ingress["filter_chains"][0]["filters"][0]["typed_config"]
        ext_proc = next(
            f for f in hcm["http_filters"] if f["name"] == "envoy.filters.http.ext_proc"
        )
        assert ext_proc["typed_config"]["message_timeout"] == f"{DEFAULT_MESSAGE_TIMEOUT_S:g}s"
        # Envoy bounds its own memory under the same flood (overload manager on its heap)
        actions = {a["name"] for a in config["overload_manager"]["actions"]}
        assert "envoy.overload_actions.stop_accepting_requests" in actions


def test_envoys_timer_for_a_body_is_taken_from_the_headers_answer_or_the_transfer_bound() -> None:
    """T = min(A, max(H, A − lag − L × 150 ns)) (``timer_started``)."""
    from ext_proc.admit.backlog import TRANSFER_S_PER_BYTE, timer_started

    assert pytest.approx(150e-9) == TRANSFER_S_PER_BYTE
    # a fast client: the body was buffered before ICE answered its headers at H = 10.0;
    # 6.4 MB arriving at A = 10.9: 10.9 − 0 − 0.96 = 9.94 < H, so T = H
    assert timer_started(10.0, 10.9, 6_400_000, 0.0) == pytest.approx(10.0)
    # a slow upload: headers answered at 1.0, a 100 kB body at 30.0, the loop 20 ms late:
    # 30.0 − 0.02 − 0.015 = 29.965
    assert timer_started(1.0, 30.0, 100_000, 0.02) == pytest.approx(29.965)
    # never after the arrival (a negative lag counts as none)
    assert timer_started(5.0, 5.0, 0, -1.0) == pytest.approx(5.0)
    b = Backlog(message_timeout_s=1.0, lag=lambda: 0.1)
    clock = b.clock(1.0, 30.0, 100_000)  # 30.0 − 0.1 − 0.015
    assert clock.arrived_s == 30.0 and clock.timer_from_s == pytest.approx(29.885)
    assert b.answer_by(clock) == pytest.approx(29.885 + 1.0 - 0.1)  # less 10 % of 1 s
