"""2,000 mutated requests through real Envoy, ICE and the dev backend (``bench/fuzz.py``).

Every family of the fuzzer is sent (wrong types, huge numbers, NaN, deep nesting, BOM,
invalid UTF-8, cut-off JSON, repeated keys, content types, oversized and chunked bodies,
odd paths and methods, media headers of many steps, brackets in strings, chunked bodies
asking much, null output limits on every generating path, long bodies asking much beside
slow uploads). ICE must not crash or leave a request unjudged or pass one unread, nothing may
take over 5 s, every body the backend got must be the one sent or differ only in its output
limit (a downgrade), and ICE must answer no 5xx. The fuzzer must also really reach each
outcome, so that a tame generator cannot pass.
"""

from __future__ import annotations

from pathlib import Path

from .harness import load_bench, running_stack

fuzz = load_bench("fuzz")


def test_two_thousand_mutated_requests_break_nothing(tmp_path: Path) -> None:
    with running_stack(tmp_path) as e2e:
        backend = f"http://127.0.0.1:{e2e.backend_port}"
        report = fuzz.run(e2e.envoy_port, backend, 2000, seed=7, concurrency=4)
        assert e2e.stack.procs["ice"].poll() is None, "ICE crashed"
        assert report.sent == 2000
        assert not report.altered, report.altered[:5]
        assert not report.ice_5xx, report.ice_5xx[:5]
        assert not report.slow, report.slow[:5]
        assert not report.errors, report.errors[:5]
        assert not report.unjudged, report.unjudged[:5]
        families = report.families
        for family in (
            "media_walk",
            "brackets_string",
            "chunked_big_ask",
            "null_limit",
            "coarse_big_ask",
        ):
            assert sum(families[family].values()) > 0, family
        # a null limit is judged on every generating path: a verdict, never unjudged, and
        # on an idle pool the whole context fits (passed, or a budget's downgrade)
        nulls = families["null_limit"]
        assert nulls["passed"] > 0 and nulls["400:missing_field"] > 0, nulls
        outcomes = report.outcomes
        assert outcomes["passed"] > 0 and outcomes["mutated"] > 0
        assert any(k.startswith("400:invalid_json") for k in outcomes)
        assert outcomes["413:reset_before_read"] + outcomes["413:request_too_large"] > 0
        assert any(k.startswith("415:unsupported_media_type") for k in outcomes)
        assert any(k.startswith("404:") for k in outcomes)


def test_mutated_requests_beside_slow_uploads_are_never_passed_unread(tmp_path: Path) -> None:
    """``--busy``: every batch goes beside two slow uploads that hold 14.6 MB of ICE's 16 MiB
    window, so the 200 kB ``coarse_big_ask`` bodies (``n: 17`` or ``500``, ``max_tokens:
    1e6``) are judged from their size: none may pass (issue 44, item 2)."""
    with running_stack(tmp_path) as e2e:
        backend = f"http://127.0.0.1:{e2e.backend_port}"
        report = fuzz.run(e2e.envoy_port, backend, 380, seed=11, concurrency=4, busy=True)
        assert e2e.stack.procs["ice"].poll() is None, "ICE crashed"
        assert not report.coarse_passes, report.coarse_passes[:5]
        assert not report.unjudged, report.unjudged[:5]
        assert not report.altered, report.altered[:5]
        coarse = report.families["coarse_big_ask"]
        sent = sum(1 for c in fuzz.mutations(380, 11) if c.family == "coarse_big_ask")
        assert coarse["429:ice_busy"] == sum(coarse.values()) == sent > 0, coarse
