"""Turn a Decision into what Envoy must do: continue with edits, or answer at once (pure).

``plan_body`` edits the original bytes through ``rawjson`` so that every field ICE does not
change survives exactly; an untouched body is never re-serialised (``Continue.body is None``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ext_proc import rawjson
from ext_proc.decision import Decision, Downgrade, Reject, Truncated, verdict_headers
from ext_proc.schemas.base import RequestFeatures, SchemaAdapter

__all__ = ["LIMIT_FIELDS", "Continue", "Outcome", "Respond", "plan", "reject_outcome"]

# Output-limit fields per schema, all rewritten when a downgrade lowers the limit (a backend
# may read either; leaving a larger one would undo the downgrade).
LIMIT_FIELDS: dict[str, tuple[str, ...]] = {
    "openai.chat": ("max_completion_tokens", "max_tokens"),
    "openai.completions": ("max_tokens",),
    "anthropic.messages": ("max_tokens",),
}


@dataclass(frozen=True, slots=True)
class Continue:
    """Forward the request with these headers set and, when ``body`` is not None, this body."""

    headers: list[tuple[str, str]]
    body: bytes | None


@dataclass(frozen=True, slots=True)
class Respond:
    """Answer the client at once; ``headers`` include the verdict headers."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes


Outcome = Continue | Respond


def reject_outcome(
    adapter: SchemaAdapter,
    status: int,
    code: str,
    message: str,
    param: str | None = None,
    extra_headers: list[tuple[str, str]] | None = None,
    retry_after_s: int | None = None,
) -> Respond:
    """An immediate error answer in the adapter's API format."""
    headers = [("content-type", "application/json")]
    if retry_after_s is not None:
        headers.append(("retry-after", str(retry_after_s)))
    headers.extend(extra_headers or ())
    return Respond(status, headers, adapter.error_body(status, code, message, param))


def plan(
    decision: Decision, adapter: SchemaAdapter, body: bytes, features: RequestFeatures
) -> Outcome:
    """The edits (or immediate answer) that carry out ``decision`` on this request.

    For ``Truncated``, ``body`` is the already shortened body (always sent), with the
    output limit lowered too when the shorter request was downgraded."""
    headers = verdict_headers(decision)
    if isinstance(decision, Truncated):
        if isinstance(decision.then, Downgrade):
            doc = rawjson.parse_object(body)
            return Continue(
                headers, _rewrite_limit(doc, features, adapter, decision.then.max_tokens)
            )
        return Continue(headers, body)
    if isinstance(decision, Reject):
        return reject_outcome(
            adapter,
            decision.status,
            decision.reason,
            decision.message,
            decision.param,
            extra_headers=headers,
            retry_after_s=decision.retry_after_s,
        )
    if isinstance(decision, Downgrade):
        doc = rawjson.parse_object(body)  # spans are needed only to edit
        return Continue(headers, _rewrite_limit(doc, features, adapter, decision.max_tokens))
    return Continue(headers, None)


def _rewrite_limit(
    doc: rawjson.TopLevel, features: RequestFeatures, adapter: SchemaAdapter, limit: int
) -> bytes:
    present = [
        f
        for f in LIMIT_FIELDS.get(features.schema, (adapter.inject_field,))
        if doc.values.get(f) is not None
    ]
    if not present:
        return rawjson.add_member(doc, adapter.inject_field, limit)
    body: bytes | None = None
    for field in present:
        value = doc.values[field]
        if isinstance(value, int) and value > limit:
            body = rawjson.replace_value(doc, field, limit)
            doc = rawjson.parse_object(body)
    return body if body is not None else rawjson.replace_value(doc, present[0], limit)
