"""``ext_proc.lab.gpupool.fit``: vLLM's iteration lines parsed, and a fit against exact points."""

from __future__ import annotations

import pytest

from ext_proc.lab.gpupool.fit import Iteration, fit_step, parse_iterations

LINE = (
    "(APIServer pid=2522) INFO 12-07 23:40:24 [loggers.py:199] Engine 000: Iteration(7): "
    "1 context requests, 512 context tokens, 9 generation requests, 9 generation tokens, "
    "iteration elapsed time: 61.20 ms, CPU KV cache usage: 87.5%"
)


def test_parse() -> None:
    dummy = LINE.replace("61.20 ms", "0.00 ms (dummy)")
    got = parse_iterations([LINE, "INFO: GET /metrics 200", dummy])
    assert len(got) == 1
    assert (got[0].tokens, got[0].seqs, got[0].kv_usage) == (521, 10, 0.875)
    assert got[0].seconds == pytest.approx(0.0612)


def _step(tokens: int, seqs: int, kv_usage: float) -> Iteration:
    # base 3 ms, 40 µs a token, 200 µs a sequence, 1 µs a cached token; 2 blocks of 10 tokens
    seconds = 3e-3 + 40e-6 * tokens + 200e-6 * seqs + 1e-6 * kv_usage * 20
    return Iteration(tokens, seqs, kv_usage, seconds)


def test_fit_recovers_exact_constants() -> None:
    steps = [
        _step(1, 1, 0.5),
        _step(100, 1, 0.5),
        _step(5, 5, 1.0),
        _step(3, 2, 0.0),
        _step(9, 4, 0.5),
    ]
    report = fit_step(steps, name="toy", usable_blocks=2, block_size=10)
    fit = report.step
    got = (fit.base_s, fit.token_s, fit.seq_s, fit.kv_token_s)
    assert got == pytest.approx((3e-3, 40e-6, 200e-6, 1e-6))
    assert report.steps == 5 and report.mean_abs_error_s == pytest.approx(0.0, abs=1e-12)
    assert report.total_ratio == pytest.approx(1.0)


def test_fit_needs_varied_steps() -> None:
    with pytest.raises(ValueError, match="need at least 4"):
        fit_step([_step(1, 1, 0.5)] * 3, name="x", usable_blocks=2, block_size=10)
    with pytest.raises(ValueError, match="singular"):
        fit_step([_step(1, 1, 0.5)] * 4, name="x", usable_blocks=2, block_size=10)
