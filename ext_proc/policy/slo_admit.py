"""Admission by latency target (``admission: slo``): the ladder's rule on one request's
predicted time to first token and time per output token (pure; docs/slo.md, "Decisions").

``SloCase`` is what the rule reads, built once per judgement by the placement layer
(``ext_proc.placement.slo_book.slo_case``) from the pool's snapshot and ICE's own in-flight
book; ``slo_decision`` is the rule. Nothing here reads a clock: ``waited_s`` comes in.

The rule, for a request of any priority but ``critical`` (which keeps its guarantees: the
rule never refuses it nor sends it to wait):

1. **TTFT.** With a target ``T`` and a prediction ``t`` (where the request is placed; the
   pool's least when Envoy places it), its budget is ``T − waited``. When ``t > T − waited``
   it cannot make its target: waiting only adds to ``waited`` while the work ahead of it
   drains no faster for the wait, so it is refused at once, 429 ``slo_unreachable``, with

       Retry-After = clamp(ceil(t − T), retry_after_min_s, retry_after_max_s)

   the seconds after which the same request sent afresh (``waited = 0``) is predicted to
   start in time, the work ahead of it draining at the prefill speed it was predicted with.
2. **TPOT.** With a prediction ``u`` of the endpoint's time per output token with this
   request running too: when even one sequence alone (``u₁ = α + β``) is slower than the
   request's own target ``U``, it never makes it there: 429 ``slo_unreachable`` (Retry-After
   from the pool's drain). When ``u > U``, or ``u`` is above the tightest TPOT target of a
   request ICE admitted there that is still running (``V``), it does not fit now: the
   running count falls as requests finish, so it may later: ``Wait`` with reason
   ``slo_tpot`` (it waits in the queue, judged again each poll; a 429 without a queue). A
   ``sheddable`` request does not wait for it: it is refused at once (429 ``slo_tpot``).
3. Otherwise the rule says nothing: the rest of the ladder (the forecast peak's fit, the
   output cap) decides.

A figure that is unknown (no prefill speed yet, no decode line, no target) judges nothing:
the request is judged as under ``admission: forecast`` (fail-open).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from ext_proc.policy.decision import Decision, Reject, Wait
from ext_proc.policy.kvfit import Shape
from ext_proc.policy.output_limit import backend_output
from ext_proc.policy.pressure import Pressure
from ext_proc.policy.settings import Priority, Profile
from ext_proc.schemas.base import RequestFeatures

__all__ = ["SloCase", "judge_by_slo", "slo_decision", "slo_retry_after_s"]


@dataclass(frozen=True, slots=True)
class SloCase:
    """What the SLO rule reads of one request where it is placed (seconds; None: unknown)."""

    ttft_target_s: float | None  # the target used (the profile's, tightened by the client's)
    tpot_target_s: float | None
    waited_s: float = 0.0  # since the request reached ICE (the admission queue's wait)
    ttft_s: float | None = None  # predicted time to first token, if sent now
    tpot_s: float | None = None  # predicted time per output token with it running too
    alone_tpot_s: float | None = None  # with one sequence running: u₁ = α + β
    tightest_tpot_s: float | None = None  # V: the tightest target of ICE's requests there


def slo_retry_after_s(slo: SloCase, profile: Profile) -> int | None:
    """``clamp(ceil(t − T), min, max)`` (rule 1); None without a target or a prediction."""
    if slo.ttft_target_s is None or slo.ttft_s is None:
        return None
    seconds = math.ceil(slo.ttft_s - slo.ttft_target_s - 1e-9)
    return max(profile.retry_after_min_s, min(profile.retry_after_max_s, seconds))


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


def slo_decision(
    slo: SloCase,
    priority: Priority,
    profile: Profile,
    pressure: Pressure | None,
    drain_retry_s: int,
) -> Decision | None:
    """The rule (module docstring); ``drain_retry_s``: the pool's drain-based Retry-After
    for a refusal the prediction gives no time for."""
    if priority == "critical":
        return None
    target, t = slo.ttft_target_s, slo.ttft_s
    if target is not None and t is not None and t > target - slo.waited_s:
        retry = slo_retry_after_s(slo, profile)
        assert retry is not None
        spent = f" ({_ms(slo.waited_s)} of it spent waiting)" if slo.waited_s > 0.0005 else ""
        return Reject(
            pressure,
            429,
            "slo_unreachable",
            f"The request's time to first token is predicted at {_ms(t)} on this pool; its "
            f"target is {_ms(target)}{spent}. Retry after {retry} s.",
            None,
            retry,
        )
    u, own = slo.tpot_s, slo.tpot_target_s
    if u is None:
        return None
    alone = slo.alone_tpot_s
    if own is not None and alone is not None and alone > own:
        return Reject(
            pressure,
            429,
            "slo_unreachable",
            f"This pool decodes at {_ms(alone)} per output token with one request running; "
            f"the request's target is {_ms(own)} per token. Retry after {drain_retry_s} s.",
            None,
            drain_retry_s,
        )
    tightest = slo.tightest_tpot_s
    over_own = own is not None and u > own
    over_other = tightest is not None and u > tightest
    if not (over_own or over_other):
        return None
    if over_own and own is not None and (tightest is None or own <= tightest):
        bound, whose = own, "its own target"
    else:
        assert tightest is not None
        bound, whose = tightest, "the target of a request already running there"
    message = (
        f"With this request the backend's time per output token is predicted at {_ms(u)}, "
        f"above {whose} ({_ms(bound)}). Retry after {drain_retry_s} s."
    )
    if priority == "sheddable":
        return Reject(pressure, 429, "slo_tpot", message, None, drain_retry_s)
    return Wait(pressure, "slo_tpot", message, drain_retry_s)


class Case(Protocol):
    """What the rule reads of the ladder's case (``ext_proc.policy.evaluate.Case``)."""

    @property
    def slo(self) -> SloCase | None: ...
    @property
    def priority(self) -> Priority: ...
    @property
    def profile(self) -> Profile: ...
    @property
    def pressure(self) -> Pressure | None: ...
    @property
    def features(self) -> RequestFeatures: ...
    @property
    def shape(self) -> Shape: ...
    def retry_after(self, need_tokens: int) -> int: ...


def judge_by_slo(case: Case) -> Decision | None:
    """The ladder's rule (``ext_proc.policy.evaluate``): ``slo_decision`` on the case's
    ``slo`` (None: not ``admission: slo``, or nothing to judge by)."""
    slo = case.slo
    if slo is None or case.priority == "critical":
        return None
    drain = case.retry_after(case.shape.tokens(backend_output(case.features, case.profile)))
    return slo_decision(slo, case.priority, case.profile, case.pressure, drain)
