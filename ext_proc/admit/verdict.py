"""What the pipeline knows of one request between its ext_proc messages, and its verdict.

``HeaderFacts`` (the headers phase, kept for the body phase), ``PendingTruncation`` and
``BodyVerdict`` (the body phase's result: decision, features, outcome, placement) are plain
data: a ``BodyVerdict`` travels back from the offload helper. ``make_verdict`` plans a
decision's outcome and names its placement (``ext_proc.placement.placer``) on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from ext_proc.admit.backlog import Ticket
from ext_proc.admit.outcome import Continue, Outcome, Respond, plan
from ext_proc.placement.placer import H_ENDPOINT, Placement
from ext_proc.policy.decision import (
    H_SHADOW_DECISION,
    H_SHADOW_REASON,
    Decision,
    Pass,
    verdict_headers,
)
from ext_proc.policy.model import Priority
from ext_proc.policy.pressure import Pressure
from ext_proc.schemas import RequestFeatures, SchemaAdapter

if TYPE_CHECKING:
    from ext_proc.placement.poolview import Hold
    from ext_proc.truncate.units import Conversation

__all__ = ["BodyVerdict", "HeaderFacts", "PendingTruncation", "make_verdict", "with_header"]


@dataclass(slots=True)
class HeaderFacts:
    """What the request headers said, kept for the body phase (and what the response phase
    needs of the verdict)."""

    adapter: SchemaAdapter | None = None
    priority: Priority = "standard"
    strip: list[str] = field(default_factory=list)
    answer: Respond | None = None  # set when the request is answered without its body
    skip_body: bool = False  # not an inference request: do not send the body to ICE
    endpoint: str | None = None  # x-gateway-destination-endpoint (endpoint_pick: header)
    subset: frozenset[str] | None = None  # the picker protocol's subset hint (envoy.lb)
    content_length: int | None = None  # the request's content-length, when it declares one
    ticket: Ticket | None = None  # its place in the worker's body backlog (ext_proc.admit.backlog)
    tenant: str = ""  # prefix_tracking.tenant_header's value
    queue_tenant: str = ""  # the profile's queue.tenant_header's value (ext_proc.admit.queue)
    hold: Hold | None = None  # its KV reservation once passed, released when its stream ends
    inflight: tuple[str, str] | None = None  # (pool, tenant) the admission queue counts it in
    # sent on with its response headers asked for: the tokens it needs of its pool (the
    # Retry-After of a backend's overload 503, ext_proc.admit.overload_answer); None: not watched
    need_tokens: int | None = None
    # mode: shadow — an answer at the headers that was not given: its headers for the request
    shadow_headers: list[tuple[str, str]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class PendingTruncation:
    """What ``finish_truncation`` needs: the request's units (built where the body was
    decoded, possibly the offload helper) and the original bytes."""

    conversation: Conversation
    body: bytes


@dataclass(frozen=True, slots=True)
class BodyVerdict:
    """A body-phase result: the decision (None when the body broke the API and ``bad`` holds
    the reason code) and its outcome. With ``pending`` set the decision is a ``Truncate``
    and ``outcome`` a placeholder: ``ext_proc.admit.truncation.finish_truncation`` makes the real
    verdict."""

    decision: Decision | None
    features: RequestFeatures | None
    outcome: Outcome
    bad: str | None = None
    pending: PendingTruncation | None = None
    placement: Placement | None = None  # where it was judged (and, when ICE picks, sent)
    # mode: shadow — (decision, reason) enforce would have given; ``decision`` is then the
    # pass the request went on with
    shadow: tuple[str, str] | None = None


def make_verdict(
    decision: Decision,
    features: RequestFeatures,
    adapter: SchemaAdapter,
    body: bytes,
    placement: Placement,
) -> BodyVerdict:
    """The verdict with its planned outcome, which names the placement (and, when ICE picked
    the endpoint of a request that goes on, tells Envoy where to send it)."""
    outcome = plan(decision, adapter, body, features)
    if isinstance(outcome, Continue):
        extra = placement.headers()
        if extra:
            lb = placement.endpoint if placement.picked else None
            outcome = replace(outcome, headers=outcome.headers + extra, lb_endpoint=lb)
    else:
        extra = [h for h in placement.headers() if h[0] == H_ENDPOINT]
        if extra:
            outcome = replace(outcome, headers=outcome.headers + extra)
    return BodyVerdict(decision, features, outcome, placement=placement)


def shadowed(
    would: tuple[str, str],
    features: RequestFeatures | None,
    adapter: SchemaAdapter,
    body: bytes,
    placement: Placement | None,
    pressure: Pressure | None,
) -> BodyVerdict:
    """A shadow profile's verdict: the request goes on unchanged (a pass), carrying what the
    enforcing verdict ``would`` have been (``x-ice-shadow-decision``, ``-reason``)."""
    passed = Pass(pressure)
    if features is None or placement is None:
        headers = [*verdict_headers(passed), *_shadow_headers(would)]
        return BodyVerdict(passed, None, Continue(headers, None), shadow=would)
    verdict = make_verdict(passed, features, adapter, body, placement)
    outcome = verdict.outcome
    assert isinstance(outcome, Continue)
    headers = [*outcome.headers, *_shadow_headers(would)]
    return replace(verdict, outcome=replace(outcome, headers=headers), shadow=would)


def _shadow_headers(would: tuple[str, str]) -> list[tuple[str, str]]:
    return [(H_SHADOW_DECISION, would[0]), (H_SHADOW_REASON, would[1])]


def shadow_answer_headers(code: str, pressure: Pressure | None) -> list[tuple[str, str]]:
    """The headers a shadow profile's request carries instead of an answer at its headers
    (a 415, 413 or empty-body 400 with reason ``code``)."""
    return [*verdict_headers(Pass(pressure)), *_shadow_headers(("reject", code))]


def with_compacted_body(
    verdict: BodyVerdict, body: bytes, headers: list[tuple[str, str]]
) -> BodyVerdict:
    """A verdict on a compacted body (``compact_system_json``): the body goes on (also on a
    pass), with the headers (``x-ice-compacted``)."""
    outcome = verdict.outcome
    if isinstance(outcome, Continue):
        sent = outcome.body if outcome.body is not None else body
        outcome = replace(outcome, body=sent, headers=[*outcome.headers, *headers])
    return replace(verdict, outcome=outcome)


def with_header(verdict: BodyVerdict, key: str, value: str) -> BodyVerdict:
    """The verdict with one more header on its outcome (to the backend and the client)."""
    headers = [*verdict.outcome.headers, (key, value)]
    return replace(verdict, outcome=replace(verdict.outcome, headers=headers))
