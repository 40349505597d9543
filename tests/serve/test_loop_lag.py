"""The event loop's lag (``ext_proc.serve.looplag``) and what the backlog does with it
(``ext_proc.admit.backlog``: ``lag``), hand-computed.

Lag limit = LAG_FRACTION × message_timeout = 0.02 × 1 s = 20 ms. While it is exceeded and a
body is in flight, a body over 64 KiB is judged from its headers (``lag``) and the window
falls to its floor (4 MiB: one long body at a time), growing back by a quarter body per body
answered in time. Short bodies and a worker with nothing in flight are never refused for it.
"""

from __future__ import annotations

import asyncio
import time

from ext_proc.admit.backlog import LAG_FRACTION, MIN_WINDOW_BYTES, SMALL_BODY_BYTES, Backlog, Ticket
from ext_proc.serve.looplag import LoopLag

MIB = 1024 * 1024


def test_a_long_body_waits_for_its_headers_verdict_while_the_loop_lags() -> None:
    lag = {"s": 0.0}
    b = Backlog(max_inflight_bytes=16 * MIB, message_timeout_s=1.0, lag=lambda: lag["s"])
    assert b.lag_limit_s == LAG_FRACTION * 1.0 == 0.02
    first = b.admit(3 * MIB, "inline")
    assert isinstance(first, Ticket)
    lag["s"] = 0.021  # 21 ms late: headers are waiting behind the bodies
    assert b.admit(3 * MIB, "inline") == "lag"
    assert b.window == MIN_WINDOW_BYTES  # one long body at a time from now on
    # a short request is not refused for the lag (it costs the loop next to nothing)
    assert isinstance(b.admit(SMALL_BODY_BYTES, "inline"), Ticket)
    lag["s"] = 0.019  # under the limit again: 3 MiB + 64 KiB + 3 MiB > 4 MiB × 7/8
    assert b.admit(3 * MIB, "inline") == "bytes"


def test_a_worker_with_nothing_in_flight_admits_a_long_body_whatever_the_lag() -> None:
    b = Backlog(max_inflight_bytes=16 * MIB, message_timeout_s=1.0, lag=lambda: 0.5)
    assert isinstance(b.admit(3 * MIB, "inline"), Ticket)  # progress


def test_the_window_grows_back_after_the_lag_by_quarter_bodies() -> None:
    lag = {"s": 0.05}
    b = Backlog(max_inflight_bytes=16 * MIB, message_timeout_s=1.0, lag=lambda: lag["s"])
    t = b.admit(2 * MIB, "inline")
    assert isinstance(t, Ticket)
    assert b.admit(2 * MIB, "inline") == "lag" and b.window == 4 * MIB
    lag["s"] = 0.0
    b.answered(t)  # + 2 MiB / 4
    assert b.window == 4 * MIB + MIB / 2


def test_the_lag_is_the_most_the_loop_ran_late_lately_or_how_overdue_it_is_now() -> None:
    lag = LoopLag(every_s=0.01, window_s=0.1)
    assert lag.lag() == 0.0  # not started

    async def main() -> tuple[float, float, float]:
        lag.start()
        await asyncio.sleep(0.05)
        time.sleep(0.08)  # noqa: ASYNC251 (the loop held: its wake-up is overdue ≥ 70 ms)
        held = lag.lag()
        await asyncio.sleep(0.02)  # it woke ≥ 70 ms late, and remembers it for 100 ms
        after = lag.lag()
        lag.stop()
        return held, after, lag.lag()

    held, after, stopped = asyncio.run(main())
    assert held >= 0.07 - 1e-3  # lower bounds only: a slower machine is only later
    assert after >= 0.07 - 1e-3
    assert stopped == 0.0


def test_a_recorded_wake_up_counts_for_the_window_only() -> None:
    lag = LoopLag(every_s=0.01, window_s=0.1)
    lag._due = time.monotonic() + 10  # running, nothing overdue
    now = time.monotonic()
    lag.record(now - 0.5, 0.3)  # 0.3 s late, half a second ago: out of the window
    lag.record(now - 0.05, 0.04)
    assert lag.lag() == 0.04
