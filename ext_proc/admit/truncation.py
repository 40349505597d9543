"""Finishing a truncation: the plan the embedding worker's similarities allow, the shorter
body, and the verdict on it (the shell calls it for a verdict with ``pending`` set).

Overflow under the context budget judges the request as it is (as without truncation);
overflow under a pressure or efficiency budget is a 400 ``truncation_budget_exceeded``
(``on_overflow: reject``); otherwise the shorter request goes down the rest of the ladder
(``LADDER_AFTER_TRUNCATION``) on the placement it was judged against, recounted exactly when
the original was counted exactly and the new body is small enough.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from ext_proc import telemetry
from ext_proc.admit.routing import Route
from ext_proc.admit.verdict import BodyVerdict, JudgedBody, RequestFacts, make_verdict
from ext_proc.placement.placer import Placement
from ext_proc.policy.decision import Reject, Truncated, TruncateHistory, Wait
from ext_proc.policy.evaluate import LADDER_AFTER_TRUNCATION
from ext_proc.schemas import RequestFeatures
from ext_proc.truncate.planner import Overflow, Plan, apply_plan_doc
from ext_proc.truncate.runner import truncate

if TYPE_CHECKING:
    from ext_proc.admit.pipeline import Pipeline

__all__ = ["finish_truncation"]


async def finish_truncation(
    pipeline: Pipeline, route: Route, facts: RequestFacts, verdict: BodyVerdict
) -> BodyVerdict:
    """Carry out a pending ``TruncateHistory`` (see ext_proc/truncate/runner.py), then judge the
    shorter request with the ladder's other rules."""
    pending, decision, features = verdict.pending, verdict.decision, verdict.features
    adapter, body = facts.adapter, verdict.body
    spec = route.profile.truncation
    if pending is None or not isinstance(decision, TruncateHistory) or features is None:
        return verdict
    if adapter is None or spec is None or body is None:
        return verdict
    result = await truncate(
        pending.conversation,
        features.input_tokens,
        decision.budget_tokens,
        spec,
        pipeline.similarity,
    )
    tplan = result.plan
    if isinstance(tplan, Overflow):
        return _overflowed(pipeline, route, facts, verdict, tplan)
    body, shorter, saved = _shorter(pipeline, features, body, tplan, result.saved_tokens)
    prefix = body.prefix
    # truncated and still no room: answered now, not queued (``can_wait``)
    then, placed = pipeline.judge(
        route, facts, shorter, LADDER_AFTER_TRUNCATION, prefix=prefix, can_wait=False
    )
    if isinstance(then, Reject) or not tplan.changed:
        return make_verdict(then, shorter, adapter, body, placed)
    assert not isinstance(then, TruncateHistory | Truncated | Wait)  # can_wait=False: no Wait
    done = Truncated(
        then=then,
        reason=decision.reason,
        dropped_messages=tplan.dropped_messages,
        saved_tokens=saved,
        mode=tplan.mode,
        fallback=result.fallback,
    )
    telemetry.count_truncation(route.name, done.mode, done.fallback, done.saved_tokens)
    return make_verdict(done, shorter, adapter, body, placed)


def _overflowed(
    pipeline: Pipeline, route: Route, facts: RequestFacts, verdict: BodyVerdict, tplan: Overflow
) -> BodyVerdict:
    """The messages ICE must keep do not fit the budget: under the context budget, the
    request judged as it is; under a pressure or efficiency budget, a 400."""
    decision, features, body = verdict.decision, verdict.features, verdict.body
    adapter, spec = facts.adapter, route.profile.truncation
    assert isinstance(decision, TruncateHistory) and features is not None and adapter is not None
    assert spec is not None
    if decision.reason == "context_budget":
        # the context, not pressure, asked: judge the request as it is (a downgrade to the
        # room left, or 400 context_length_exceeded), as without truncation
        prefix = body.prefix if body is not None else None
        as_is, placed = pipeline.judge(
            route, facts, features, LADDER_AFTER_TRUNCATION, prefix=prefix, can_wait=False
        )
        return make_verdict(as_is, features, adapter, body, placed)
    k = spec.keep_last_turns
    message = (
        f"The conversation cannot be shortened enough: the messages ICE must keep "
        f"(system messages, the current question and the last {k} turns) need about "
        f"{tplan.must_keep_tokens} tokens; the budget is {tplan.budget_tokens} tokens "
        f"({decision.reason.replace('_', ' ')})."
    )
    reject = Reject(decision.pressure, 400, "truncation_budget_exceeded", message, "messages")
    return make_verdict(reject, features, adapter, body, verdict.placement or Placement())


def _shorter(
    pipeline: Pipeline, features: RequestFeatures, body: JudgedBody, tplan: Plan, saved: int
) -> tuple[JudgedBody, RequestFeatures, int]:
    """The shorter body (edited on the decode: no parse), its features (recounted exactly
    when the original was counted exactly) and the tokens saved."""
    if tplan.changed:
        doc = apply_plan_doc(body.doc, tplan)
        body = replace(body, raw=doc.text.encode("utf-8"), doc=doc)
    placeholders = len(tplan.runs) if tplan.placeholder else 0
    shorter = replace(
        features,
        input_tokens=max(0, features.input_tokens - saved),
        message_count=len(tplan.kept_messages) + placeholders,
    )
    if tplan.changed and features.input_tokens_source == "exact":
        shorter = pipeline.recount(shorter, body)
        if shorter.input_tokens_source == "exact":
            saved = features.input_tokens - shorter.input_tokens
    return body, shorter, saved
