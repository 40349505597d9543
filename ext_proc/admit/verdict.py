"""What ICE knows of one request between its ext_proc messages, and its verdict: plain data.

- ``RequestFacts``: what the request's headers said (immutable, built once by the headers
  phase). The stream's bookkeeping (its backlog ticket, KV hold, queue slot) is not a
  request fact: it lives in ``ext_proc.admit.stream.Stream``.
- ``JudgedBody``: the body as ICE judged it, decoded once (``rawjson.parse_object``): a later
  judgement of the same request (the admission queue, the shared ledger) and the body edit
  reuse that decode instead of making another.
- ``PendingTruncation`` and ``BodyVerdict``: the body phase's result (decision, features,
  outcome, placement); a ``BodyVerdict`` travels back from the helper process, its body's
  decode slimmed (``JudgedBody.detached``).

``make_verdict`` plans a decision's outcome and names its placement on it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from ext_proc.admit.outcome import Continue, Outcome, Respond, plan
from ext_proc.placement.placer import H_ENDPOINT, Placement
from ext_proc.policy.decision import (
    H_SHADOW_DECISION,
    H_SHADOW_REASON,
    Decision,
    Pass,
    verdict_headers,
)
from ext_proc.policy.pressure import Pressure
from ext_proc.policy.settings import Priority, SloTarget
from ext_proc.schemas import RequestFeatures, SchemaAdapter
from ext_proc.schemas.rawjson import TopLevel

if TYPE_CHECKING:
    from ext_proc.tokencount.newtext import Lesson
    from ext_proc.truncate.units import Conversation

__all__ = [
    "BodyVerdict",
    "JudgedBody",
    "PendingTruncation",
    "RequestFacts",
    "make_verdict",
    "with_header",
]

Header = tuple[str, str]


@dataclass(frozen=True, slots=True)
class RequestFacts:
    """What the request headers said, kept for the body phase (and the response phase)."""

    adapter: SchemaAdapter | None = None
    priority: Priority = "standard"  # as judged (``ext_proc.admit.headers.judged_priority``)
    # the client's priority header when ICE did not take it (capped, or ignored): the log's
    priority_claimed: Priority | None = None
    strip: tuple[str, ...] = ()  # client-sent headers only ICE may set: removed
    answer: Respond | None = None  # set when the request is answered without its body
    skip_body: bool = False  # not an inference request: do not send the body to ICE
    endpoint: str | None = None  # x-gateway-destination-endpoint (endpoint_pick: header)
    subset: frozenset[str] | None = None  # the picker protocol's subset hint (envoy.lb)
    content_length: int | None = None  # the request's content-length, when it declares one
    tenant: str = ""  # prefix_tracking.tenant_header's value
    queue_tenant: str = ""  # the profile's queue.tenant_header's value (ext_proc.admit.queue)
    # where the tenant came from (ext_proc.admit.identity: jwt, mtls, header, trust); "":
    # none found. With any source but trust, tenant and queue_tenant are the identity.
    identity_source: str = ""
    # mode: shadow — an answer at the headers that was not given: its headers for the request
    shadow_headers: tuple[Header, ...] = ()
    # the latency targets used: the profile's, tightened by the client's llm-d SLO headers
    # (``ext_proc.admit.headers.judged_slo``; docs/slo.md)
    slo: SloTarget = field(default_factory=SloTarget)
    # time.monotonic() when its headers were read: the wait admission: slo counts against
    # the request's TTFT target (ext_proc.policy.slo_admit)
    arrived_s: float = field(default_factory=time.monotonic)


@dataclass(frozen=True, slots=True)
class JudgedBody:
    """The body as judged: its bytes as they go on (compacted when the profile compacts),
    its one decode, the prefix-affinity key (``endpoint_pick: ice``) and the compaction's
    headers (``x-ice-compacted``)."""

    raw: bytes
    doc: TopLevel = field(compare=False)  # a decode of ``raw``: equal bodies, equal decodes
    prefix: str | None = None
    compacted: tuple[Header, ...] = ()
    slim: bool = field(default=False, compare=False)  # decoded in another process: no arrays
    # ICE removed a field the route does not let the client set (``ext_proc.admit.
    # body_priority``): ``raw`` goes on, also on a pass
    edited: bool = False

    def detached(self, sent: bytes) -> JudgedBody:
        """What crosses to another process: no text or array values (``attach`` restores the
        text from the bytes); the bytes only when they are not ``sent`` (the original)."""
        doc = self.doc.slim()
        slim = TopLevel("", doc.values, doc.spans, doc.close_index, doc.items)
        return replace(self, raw=b"" if self.raw is sent else self.raw, doc=slim, slim=True)

    def attach(self, sent: bytes) -> JudgedBody:
        """The inverse of ``detached`` on the receiving side (``sent``: the original bytes)."""
        if self.doc.text:
            return self
        raw = self.raw or sent
        doc = replace(self.doc, text=raw.decode("utf-8"))
        return replace(self, raw=raw, doc=doc)


@dataclass(frozen=True, slots=True)
class PendingTruncation:
    """What ``finish_truncation`` needs: the request's units (built where the body was
    decoded, possibly the helper process)."""

    conversation: Conversation


@dataclass(frozen=True, slots=True)
class BodyVerdict:
    """A body-phase result: the decision (None when the body broke the API and ``bad`` holds
    the reason code) and its outcome. With ``pending`` set the decision is a ``TruncateHistory``
    and ``outcome`` a placeholder: ``ext_proc.admit.truncation.finish_truncation`` makes the
    real verdict."""

    decision: Decision | None
    features: RequestFeatures | None
    outcome: Outcome
    bad: str | None = None
    pending: PendingTruncation | None = None
    placement: Placement | None = None  # where it was judged (and, when ICE picks, sent)
    # mode: shadow — (decision, reason) enforce would have given; ``decision`` is then the
    # pass the request went on with
    shadow: tuple[str, str] | None = None
    body: JudgedBody | None = field(default=None, repr=False)  # None: judged without it
    # piece counts the helper process made judging it, for its worker's cache (``serve.offload``)
    lessons: tuple[Lesson, ...] = field(default=(), repr=False, compare=False)

    @property
    def goes_upstream(self) -> bool:
        """The request goes on to the backend (a pass, a downgrade or a truncation)."""
        return self.decision is not None and self.decision.goes_upstream

    @property
    def granted_max_tokens(self) -> int | None:
        """The output limit ICE set on the request; None: the client's own stands."""
        return self.decision.granted_max_tokens if self.decision is not None else None


def make_verdict(
    decision: Decision,
    features: RequestFeatures,
    adapter: SchemaAdapter,
    body: JudgedBody | None,
    placement: Placement,
) -> BodyVerdict:
    """The verdict with its planned outcome (edits on the body's one decode; a compacted body
    goes on compacted, also on a pass, with its ``x-ice-compacted`` header, and so does one ICE
    edited at its decode), which names the
    placement (and, when ICE picked the endpoint of a request that goes on, tells Envoy where
    to send it). ``body`` None: judged without it (an answer or a pass that edits nothing)."""
    outcome = plan(decision, adapter, body.doc if body is not None else b"", features)
    if isinstance(outcome, Continue):
        extra = placement.headers()
        if extra:
            lb = placement.endpoint if placement.picked else None
            outcome = replace(outcome, headers=outcome.headers + extra, lb_endpoint=lb)
        if body is not None and (body.compacted or body.edited):
            sent = outcome.body if outcome.body is not None else body.raw
            outcome = replace(outcome, body=sent, headers=[*outcome.headers, *body.compacted])
    else:
        extra = [h for h in placement.headers() if h[0] == H_ENDPOINT]
        if extra:
            outcome = replace(outcome, headers=outcome.headers + extra)
    return BodyVerdict(decision, features, outcome, placement=placement, body=body)


def shadowed(
    would: tuple[str, str],
    features: RequestFeatures | None,
    adapter: SchemaAdapter,
    body: JudgedBody | None,
    placement: Placement | None,
    pressure: Pressure | None,
) -> BodyVerdict:
    """A shadow profile's verdict: the request goes on unchanged (a pass: the body as the
    client sent it, whatever edits its decode planned), carrying what the enforcing verdict
    ``would`` have been (``x-ice-shadow-decision``, ``-reason``)."""
    passed = Pass(pressure)
    if features is None or placement is None:
        headers = [*verdict_headers(passed), *_shadow_headers(would)]
        return BodyVerdict(passed, None, Continue(headers, None), shadow=would)
    verdict = make_verdict(passed, features, adapter, None, placement)
    outcome = verdict.outcome
    assert isinstance(outcome, Continue) and outcome.body is None
    headers = [*outcome.headers, *_shadow_headers(would)]
    outcome = replace(outcome, headers=headers)
    return replace(verdict, outcome=outcome, shadow=would, body=body)


def _shadow_headers(would: tuple[str, str]) -> list[Header]:
    return [(H_SHADOW_DECISION, would[0]), (H_SHADOW_REASON, would[1])]


def shadow_answer_headers(code: str, pressure: Pressure | None) -> tuple[Header, ...]:
    """The headers a shadow profile's request carries instead of an answer at its headers
    (a 415, 413 or empty-body 400 with reason ``code``)."""
    return (*verdict_headers(Pass(pressure)), *_shadow_headers(("reject", code)))


def with_header(verdict: BodyVerdict, key: str, value: str) -> BodyVerdict:
    """The verdict with one more header on its outcome (to the backend and the client)."""
    headers = [*verdict.outcome.headers, (key, value)]
    return replace(verdict, outcome=replace(verdict.outcome, headers=headers))
