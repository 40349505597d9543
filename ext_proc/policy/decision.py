"""Decisions the evaluator returns, and the verdict headers each one shows the mesh.

Four kinds, each a frozen dataclass: ``Pass`` (annotate only), ``Downgrade`` (lower the
output-token limit), ``Reject`` (answer at once with an error status) and ``Wait`` (wait in
the admission queue for room; its 429 where there is no queue). ``TruncateHistory`` is
the evaluator's request to drop history to a budget (the pipeline carries it out and
judges the shorter request again); ``Truncated`` is the result: the decision on the
shorter request, with what was dropped. The header names
are ICE's public contract (see docs/headers.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ext_proc.policy.pressure import Pressure

__all__ = [
    "H_DECISION",
    "H_DOWNGRADED",
    "H_ORIGINAL_MAX_TOKENS",
    "H_PRESSURE",
    "H_PRESSURE_SCORE",
    "H_REASON",
    "H_SEQUENCES",
    "H_STALE",
    "H_TRUNCATED",
    "VERDICT_HEADERS",
    "Decision",
    "Downgrade",
    "Pass",
    "Reject",
    "TruncateHistory",
    "Truncated",
    "Wait",
    "verdict_headers",
]

H_PRESSURE = "x-mem-pressure"
H_PRESSURE_SCORE = "x-mem-pressure-score"
H_DECISION = "x-ice-decision"
H_DOWNGRADED = "x-downgraded"
H_ORIGINAL_MAX_TOKENS = "x-ice-original-max-tokens"
H_REASON = "x-ice-reason"
H_STALE = "x-ice-stale"
H_TRUNCATED = "x-ice-truncated"
H_SEQUENCES = "x-ice-sequences"
H_SHADOW_DECISION = "x-ice-shadow-decision"  # mode: shadow — what enforce would have done
H_SHADOW_REASON = "x-ice-shadow-reason"
VERDICT_HEADERS = (
    H_SEQUENCES,
    H_TRUNCATED,
    H_STALE,
    H_PRESSURE,
    H_PRESSURE_SCORE,
    H_DECISION,
    H_DOWNGRADED,
    H_ORIGINAL_MAX_TOKENS,
    H_REASON,
)


@dataclass(frozen=True, slots=True)
class Pass:
    """Let the request through unchanged, annotated with the pool's pressure."""

    pressure: Pressure | None

    decision = "pass"
    reason = "ok"
    goes_upstream: ClassVar[bool] = True

    @property
    def applied(self) -> Pass:
        """The decision the backend's request carries out: this one."""
        return self

    @property
    def granted_max_tokens(self) -> int | None:
        """The output limit ICE sets; None: the client's own limit stands."""
        return None


@dataclass(frozen=True, slots=True)
class Downgrade:
    """Lower the output-token limit to ``max_tokens`` (inject it when the client set none).

    ``original`` is the limit the client asked for, None when ICE injects one.
    ``reason``: ``context_budget`` (max_model_len - input - buffer) or ``pressure_cap``.
    """

    pressure: Pressure | None
    max_tokens: int
    original: int | None
    reason: str

    decision = "downgrade"
    goes_upstream: ClassVar[bool] = True

    @property
    def applied(self) -> Downgrade:
        """The decision the backend's request carries out: this one."""
        return self

    @property
    def granted_max_tokens(self) -> int | None:
        """The output limit ICE sets: ``max_tokens``."""
        return self.max_tokens


@dataclass(frozen=True, slots=True)
class Reject:
    """Answer at once with ``status`` (429 or 400) in the API's own error format."""

    pressure: Pressure | None
    status: int
    reason: str
    message: str
    param: str | None = None
    retry_after_s: int | None = None

    decision = "reject"
    goes_upstream: ClassVar[bool] = False

    @property
    def granted_max_tokens(self) -> int | None:
        """None: nothing goes upstream."""
        return None


@dataclass(frozen=True, slots=True)
class Wait:
    """Wait in the profile's admission queue until the pool has room (or the deadline).

    The ladder's answer for a request refused only for memory, now: ``reason``
    ``memory_pressure`` (its priority is shed at the pool's level) or ``kv_exhausted`` (its
    blocks do not fit), ``slo_tpot`` (``admission: slo``: its predicted time per output token
    does not fit, ``ext_proc.policy.slo_admit``), or ``behind_critical`` (a critical request
    of its pool waits for the room it would take;
    ``ext_proc.admit.queue_answers.behind_critical``). Where the profile
    has no queue (or is in ``mode: shadow``), ``evaluate`` turns it into its ``refusal``, the
    429 it would be without a queue: one mapping, so no ``Reject`` is ever built to mean
    "wait"."""

    pressure: Pressure | None
    reason: str
    message: str
    retry_after_s: int | None = None

    decision = "wait"
    goes_upstream: ClassVar[bool] = False

    @property
    def granted_max_tokens(self) -> int | None:
        """None: nothing goes upstream while it waits."""
        return None

    def refusal(self) -> Reject:
        """The 429 this wait is where there is nothing to wait in."""
        return Reject(self.pressure, 429, self.reason, self.message, None, self.retry_after_s)


@dataclass(frozen=True, slots=True)
class TruncateHistory:
    """Drop history until the input fits ``budget_tokens`` (then judge the request again).

    ``reason``: ``pressure_budget`` (the level's budget), ``context_budget`` (the model's
    context) or ``cache_efficiency`` (the pool's cache_efficiency_ratio is low).
    """

    pressure: Pressure | None
    budget_tokens: int
    reason: str

    decision = "truncate"
    goes_upstream: ClassVar[bool] = False  # a request to truncate; the result is Truncated

    @property
    def granted_max_tokens(self) -> int | None:
        """None: a request to truncate sets no limit (the shorter request's decision may)."""
        return None


@dataclass(frozen=True, slots=True)
class Truncated:
    """History was dropped; ``then`` is the decision on the shorter request.

    ``mode``: ``semantic`` or ``recency``; ``fallback`` says why recency was used
    (``deadline``, ``unavailable``, ``no_query``), "" when it was not.
    """

    then: Pass | Downgrade
    reason: str
    dropped_messages: int
    saved_tokens: int
    mode: str
    fallback: str = ""

    decision = "truncate"
    goes_upstream: ClassVar[bool] = True

    @property
    def pressure(self) -> Pressure | None:
        return self.then.pressure

    @property
    def applied(self) -> Pass | Downgrade:
        """The decision the shorter request carries out: ``then``."""
        return self.then

    @property
    def granted_max_tokens(self) -> int | None:
        """The output limit ICE sets on the shorter request (``then``'s)."""
        return self.then.granted_max_tokens


Decision = Pass | Downgrade | Reject | Wait | TruncateHistory | Truncated


def verdict_headers(decision: Decision) -> list[tuple[str, str]]:
    """The headers that show a decision to the backend and to the client, in a fixed order
    (a ``Wait``'s: its refusal's, the answer it becomes if it cannot wait)."""
    if isinstance(decision, Wait):
        decision = decision.refusal()
    p = decision.pressure
    headers = [(H_PRESSURE, p.level.label if p is not None else "unknown")]
    if p is not None:
        headers.append((H_PRESSURE_SCORE, f"{p.score:.0f}"))
    headers.append((H_DECISION, decision.decision))
    if isinstance(decision, Truncated):
        value = f"messages={decision.dropped_messages};tokens={decision.saved_tokens}"
        value += f";mode={decision.mode}"
        if decision.fallback:
            value += f";fallback={decision.fallback}"
        headers.append((H_TRUNCATED, value))
        if isinstance(decision.then, Downgrade):
            headers.append((H_DOWNGRADED, "true"))
            if decision.then.original is not None:
                headers.append((H_ORIGINAL_MAX_TOKENS, str(decision.then.original)))
    if isinstance(decision, Downgrade):
        headers.append((H_DOWNGRADED, "true"))
        if decision.original is not None:
            headers.append((H_ORIGINAL_MAX_TOKENS, str(decision.original)))
    if not isinstance(decision, Pass):
        headers.append((H_REASON, decision.reason))
    if p is not None and p.stale:
        headers.append((H_STALE, "true"))
    return headers
