"""``fit``: a ``timing.FittedStep`` from the steps a real vLLM logged about itself.

vLLM 0.32 started with ``--enable-logging-iteration-details`` logs one line per engine step
(``vllm/v1/metrics/loggers.py``, ``LoggingStatLogger._log_iteration_details``)::

    Iteration(812): 1 context requests, 512 context tokens, 9 generation requests,
    9 generation tokens, iteration elapsed time: 61.20 ms, CPU KV cache usage: 87.0%

``elapsed`` is the forward pass and the sampling (``EngineCore.step``: from after the step was
sent to the worker to its sampled tokens), not the scheduler's own time. ``parse_iterations``
reads those lines; ``fit_step`` fits, by ordinary least squares,

    seconds = base_s + token_s × T + seq_s × S + kv_token_s × K

with T = context + generation tokens, S = context + generation requests, and K = the tokens
the KV cache holds after the step (usage × ``usable_blocks`` × ``block_size``: whole blocks,
so an upper bound of Σ (context + new) over the step's sequences; the fake executor feeds
``timing.fitted_step_time`` the exact sum). ``FitReport`` gives the fit's error over the
steps it was fitted on: the mean absolute error and the ratio of total modelled to measured
time (what a run's pace depends on).

Invariant: pure (stdlib only, no I/O); the same lines give the same fit.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ext_proc.lab.gpupool.timing import FittedStep

__all__ = ["FitReport", "Iteration", "fit_step", "parse_iterations"]

_LINE = re.compile(
    r"Iteration\((?P<i>\d+)\): (?P<cr>\d+) context requests, (?P<ct>\d+) context tokens, "
    r"(?P<gr>\d+) generation requests, (?P<gt>\d+) generation tokens, "
    r"iteration elapsed time: (?P<ms>[\d.]+) ms(?P<dummy> \(dummy\))?, "
    r"\w+ KV cache usage: (?P<kv>[\d.]+)%"
)


@dataclass(frozen=True, slots=True)
class Iteration:
    """One logged engine step: its tokens, sequences, KV usage (0–1) and seconds."""

    tokens: int
    seqs: int
    kv_usage: float
    seconds: float


@dataclass(frozen=True, slots=True)
class FitReport:
    """The fitted step and its error over the ``steps`` it was fitted on."""

    step: FittedStep
    steps: int
    mean_abs_error_s: float
    total_ratio: float  # Σ modelled / Σ measured


def parse_iterations(lines: Iterable[str]) -> list[Iteration]:
    """Every non-dummy ``Iteration(...)`` line of a vLLM log (module docstring)."""
    out: list[Iteration] = []
    for line in lines:
        m = _LINE.search(line)
        if m is None or m["dummy"]:
            continue
        out.append(
            Iteration(
                tokens=int(m["ct"]) + int(m["gt"]),
                seqs=int(m["cr"]) + int(m["gr"]),
                kv_usage=float(m["kv"]) / 100.0,
                seconds=float(m["ms"]) / 1000.0,
            )
        )
    return out


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    """``a x = b`` by Gaussian elimination with partial pivoting (a small square system)."""
    n = len(b)
    m = [[*row, rhs] for row, rhs in zip(a, b, strict=True)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-12:
            raise ValueError("singular fit: the steps do not vary in every term")
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(n):
            if r != col:
                f = m[r][col] / m[col][col]
                m[r] = [x - f * y for x, y in zip(m[r], m[col], strict=True)]
    return [m[i][n] / m[i][i] for i in range(n)]


def fit_step(
    steps: Sequence[Iteration], *, name: str, usable_blocks: int, block_size: int
) -> FitReport:
    """The least-squares ``FittedStep`` of ``steps`` (module docstring); ValueError when too
    few steps vary to fit four terms."""
    rows = [(1.0, s.tokens, s.seqs, s.kv_usage * usable_blocks * block_size) for s in steps]
    if len(rows) < 4:
        raise ValueError(f"{len(rows)} steps: need at least 4")
    ata = [[sum(r[i] * r[j] for r in rows) for j in range(4)] for i in range(4)]
    atb = [sum(r[i] * s.seconds for r, s in zip(rows, steps, strict=True)) for i in range(4)]
    base, token, seq, kv = _solve(ata, atb)
    fit = FittedStep(name=name, base_s=base, token_s=token, seq_s=seq, kv_token_s=kv)
    modelled = [base + token * r[1] + seq * r[2] + kv * r[3] for r in rows]
    measured = [s.seconds for s in steps]
    mae = sum(abs(x - y) for x, y in zip(modelled, measured, strict=True)) / len(rows)
    return FitReport(fit, len(rows), mae, sum(modelled) / sum(measured))
