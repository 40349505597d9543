"""Several vLLM configs in one comparison: a ``Setup`` and a ``compare`` per group of arms.

A valve is a ``vllm serve`` flag, so the arms that need different valves need different vLLM
processes (``arms.group_arms``: one ``VllmGroup`` per valve). ``sweep`` runs the groups one
after the other: start the group's stack (``overload_setup`` with its valve), run every round
of its arms (``compare``: the arms sharing that vLLM rotate per round), stop it, next group.

- ``sweep``: the groups in order; one ``GroupRun`` each (its arms' runs, vLLM's arguments and
  start-up time, its folder).
- ``group_workdir``: the group without a valve works in ``workdir`` itself (where the bench
  kept its logs before valves), any other in ``workdir/vllm-<kind>-<limit>``.
- ``estimate_s``: a rough wall time for a sweep (``PER_VLLM_S`` per group, ``PER_RUN_S`` plus
  the plan's span per run), printed by ``bench/overload.py --dry-run``.

Invariants: one vLLM at a time (a group's processes are all stopped before the next group's
start; they would share the same cores); every group sends the same plan for the same number
of rounds; the prompt seeds of group k are offset by ``SEED_STRIDE × k`` so no two runs of a
sweep share prompt text (group 0's seeds are ``compare``'s own); a failure inside a group
raises ``SweepError`` with the groups finished before it, so their runs can still be printed
(``QueuePolicyError`` and Ctrl-C pass through as they are).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ext_proc.lab.overload.arms import VllmGroup
from ext_proc.lab.overload.burst import TTFT_SLO_S, VLLM_ARGS, Planned
from ext_proc.lab.overload.run import RunResult
from ext_proc.lab.overload.setup import QueuePolicyError, Setup, compare, overload_setup

__all__ = [
    "PER_RUN_S",
    "PER_VLLM_S",
    "SEED_STRIDE",
    "GroupRun",
    "SweepError",
    "estimate_s",
    "group_workdir",
    "sweep",
]

SEED_STRIDE = 10_000_000
# Earlier runs on the 2-core machine: vLLM up in 36-38 s, plus ICE, Envoy, warm-up and the
# stop; a run of the 24-request burst at spacing 0 drained in 7.8-10.8 s straight or
# queued (2.3 s when ICE shed most of it), plus the wait until vLLM is idle.
PER_VLLM_S = 50.0
PER_RUN_S = 12.0

StartFn = Callable[..., contextlib.AbstractContextManager[Setup]]
CompareFn = Callable[..., list[RunResult]]


@dataclass
class GroupRun:
    """One group's share of a sweep: its arms' runs and how its vLLM was started."""

    group: VllmGroup
    vllm_args: tuple[str, ...]
    workdir: Path
    startup_s: float = 0.0
    results: list[RunResult] = field(default_factory=list)

    def record(self) -> dict[str, Any]:
        """JSON-ready: the group's valve, arms, vLLM arguments, start-up time and folder."""
        return {
            "valve": self.group.name,
            "arms": [a.name for a in self.group.arms],
            "vllm_args": list(self.vllm_args),
            "startup_s": round(self.startup_s, 1),
            "workdir": str(self.workdir),
            "runs": len(self.results),
        }


class SweepError(RuntimeError):
    """A group of the sweep failed; ``done`` holds the groups finished before it."""

    def __init__(self, message: str, done: list[GroupRun]) -> None:
        super().__init__(message)
        self.done = done


def group_workdir(workdir: Path, group: VllmGroup) -> Path:
    if group.valve is None:
        return workdir
    return workdir / f"vllm-{group.valve.kind}-{group.valve.limit}"


def estimate_s(
    groups: Sequence[VllmGroup], rounds: int, plan: Sequence[Planned], controls: int = 0
) -> float:
    """A rough wall time: ``PER_VLLM_S`` per group, and per run ``PER_RUN_S`` plus the span
    of the plan's starts; ``controls``: control runs per arm and round."""
    span = max((p.at_s for p in plan), default=0.0)
    runs = rounds * sum(len(g.modes) for g in groups) * (1 + controls)
    return len(groups) * PER_VLLM_S + runs * (PER_RUN_S + span)


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def sweep(
    workdir: Path,
    groups: Sequence[VllmGroup],
    burst: Sequence[Planned],
    *,
    rounds: int,
    sample_s: float = 0.1,
    ttft_slo_s: float = TTFT_SLO_S,
    controls: Mapping[str, Sequence[Planned]] | None = None,
    progress: Callable[[str], None] | None = _to_stderr,
    vllm_args: Sequence[str] = VLLM_ARGS,
    queue: bool = False,
    start: StartFn = overload_setup,
    run: CompareFn = compare,
    **setup_kwargs: Any,
) -> list[GroupRun]:
    """Each group in turn: ``start(group_workdir(...), vllm_args=..., valve=..., queue=...,
    **setup_kwargs)`` (default ``overload_setup``), then ``run`` (default ``compare``) of
    its modes for ``rounds``. ``queue``: every group starts the queue ICE (so each vLLM
    serves the same number of scrapers); ``progress``: a line when each vLLM is up and per
    finished run (None: silent)."""
    done: list[GroupRun] = []
    for k, group in enumerate(groups):
        gdir = group_workdir(workdir, group)
        valve_args = group.valve.vllm_args if group.valve else ()
        entry = GroupRun(group, (*vllm_args, *valve_args), gdir)
        try:
            with start(
                gdir, vllm_args=vllm_args, valve=group.valve, queue=queue, **setup_kwargs
            ) as setup:
                entry.startup_s = setup.vllm.startup_s
                if progress is not None:
                    which = "" if group.valve is None else f" ({group.name})"
                    progress(f"[overload] vLLM{which} up in {entry.startup_s:.1f} s")
                entry.results = run(
                    setup,
                    burst,
                    rounds=rounds,
                    sample_s=sample_s,
                    modes=list(group.modes),
                    progress=progress,
                    ttft_slo_s=ttft_slo_s,
                    controls=controls,
                    seed_offset=SEED_STRIDE * k,
                )
        except QueuePolicyError:
            raise
        except Exception as e:
            raise SweepError(f"vLLM {group.name} ({' '.join(entry.vllm_args)}): {e}", done) from e
        done.append(entry)
    return done
