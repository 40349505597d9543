"""Turn a Decision into what Envoy must do: continue with edits, or answer at once (pure).

``plan_body`` edits the original bytes through ``rawjson`` so that every field ICE does not
change survives exactly; an untouched body is never re-serialised (``Continue.body is None``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ext_proc.policy.decision import (
    H_SEQUENCES,
    Decision,
    Downgrade,
    Reject,
    Truncated,
    Wait,
    verdict_headers,
)
from ext_proc.policy.settings import SloTarget
from ext_proc.schemas import rawjson
from ext_proc.schemas.base import RequestFeatures, SchemaAdapter

__all__ = [
    "H_SLO_TPOT_MS",
    "H_SLO_TTFT_MS",
    "LIMIT_FIELDS",
    "Continue",
    "Outcome",
    "Respond",
    "plan",
    "priority_fields",
    "reject_outcome",
    "slo_headers",
]

# Output-limit fields per schema (paths: a top-level key, or a key inside the object(s) of a
# top-level key). A downgrade lowers every one present that is above the new limit, so no
# backend's precedence rule can undo it; with none present it injects the first.
LIMIT_FIELDS: dict[str, tuple[tuple[str, ...], ...]] = {
    "openai.chat": (("max_tokens",), ("max_completion_tokens",)),
    "openai.chat_batch": (("max_tokens",), ("max_completion_tokens",)),
    "openai.completions": (("max_tokens",),),
    "anthropic.messages": (("max_tokens",),),
    "openai.responses": (("max_output_tokens",),),
    "vllm.generate": (("sampling_params", "max_tokens"),),
    "sglang.generate": (("sampling_params", "max_new_tokens"),),
}


@dataclass(frozen=True, slots=True)
class Continue:
    """Forward the request with these headers set and, when ``body`` is not None, this body."""

    headers: list[tuple[str, str]]
    body: bytes | None
    # ICE picked this endpoint (ip:port): Envoy routes there (envoy.lb dynamic metadata and
    # the endpoint-picker header, with the route cache cleared)
    lb_endpoint: str | None = None
    # for Envoy's access log only (dynamic metadata ``ice``, never a header): ``log_fields``
    log: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Respond:
    """Answer the client at once; ``headers`` include the verdict headers."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes
    log: tuple[tuple[str, str], ...] = ()


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


def log_fields(decision: Decision, features: RequestFeatures) -> tuple[tuple[str, str], ...]:
    """What the access log gets beside the verdict headers: the input tokens judged, the
    output limit the client asked for (absent: none) and the one the request goes on with."""
    fields = [("input_tokens", str(features.input_tokens))]
    requested = features.max_tokens
    if requested is not None:
        fields.append(("max_tokens_requested", str(requested)))
    if not isinstance(decision, Reject | Wait):
        granted = decision.granted_max_tokens
        if granted is None:
            granted = requested
        if granted is not None:
            fields.append(("max_tokens_granted", str(granted)))
    return tuple(fields)


def priority_fields(priority: str, claimed: str | None) -> tuple[tuple[str, str], ...]:
    """The access log's priority fields: the priority the request was judged at and, when the
    client's priority header claimed another that ICE did not take (``client_priority: cap``
    or ``ignore``, ``ext_proc.admit.headers.judged_priority``), that claim."""
    if claimed is None:
        return (("priority", priority),)
    return (("priority", priority), ("priority_claimed", claimed))


# the latency targets a request was judged with (docs/slo.md), milliseconds
H_SLO_TTFT_MS = "x-ice-slo-ttft-ms"
H_SLO_TPOT_MS = "x-ice-slo-tpot-ms"


def _ms_text(value_ms: float) -> str:
    """A target as a header value: whole milliseconds without a decimal point, else to 3
    decimals with trailing zeros cut (``500``, ``12.5``)."""
    if value_ms.is_integer():
        return str(int(value_ms))
    return f"{value_ms:.3f}".rstrip("0").rstrip(".")


def slo_headers(slo: SloTarget) -> tuple[tuple[str, str], ...]:
    """``x-ice-slo-ttft-ms`` / ``x-ice-slo-tpot-ms`` for each target that is set."""
    found: list[tuple[str, str]] = []
    if slo.ttft_ms is not None:
        found.append((H_SLO_TTFT_MS, _ms_text(slo.ttft_ms)))
    if slo.tpot_ms is not None:
        found.append((H_SLO_TPOT_MS, _ms_text(slo.tpot_ms)))
    return tuple(found)


def plan(
    decision: Decision,
    adapter: SchemaAdapter,
    body: bytes | rawjson.TopLevel,
    features: RequestFeatures,
) -> Outcome:
    """The edits (or immediate answer) that carry out ``decision`` on this request.

    For ``Truncated``, ``body`` is the already shortened body (always sent), with the
    output limit lowered too when the shorter request was downgraded. A request of more
    than one sequence says how many ICE judged (``x-ice-sequences``)."""
    outcome = _plan(decision, adapter, body, features)
    return replace(outcome, log=log_fields(decision, features))


def _doc(body: bytes | rawjson.TopLevel) -> rawjson.TopLevel:
    """The body's decode: the one the judge made, or (bytes, from a test or a tool) a parse."""
    return body if isinstance(body, rawjson.TopLevel) else rawjson.parse_object(body)


def _plan(
    decision: Decision,
    adapter: SchemaAdapter,
    body: bytes | rawjson.TopLevel,
    features: RequestFeatures,
) -> Outcome:
    if isinstance(decision, Wait):  # the answer it becomes if it cannot wait
        decision = decision.refusal()
    headers = verdict_headers(decision)
    if features.sequences > 1:
        headers.append((H_SEQUENCES, str(features.sequences)))
    if isinstance(decision, Truncated):
        doc = _doc(body)
        if isinstance(decision.then, Downgrade):
            limit = decision.then.max_tokens
            return Continue(headers, _rewrite_limit(doc, features, adapter, limit))
        return Continue(headers, doc.text.encode("utf-8"))
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
        doc = _doc(body)  # spans are needed only to edit
        return Continue(headers, _rewrite_limit(doc, features, adapter, decision.max_tokens))
    return Continue(headers, None)


def _lowered(doc: rawjson.TopLevel, key: str, limit: int) -> Any:
    """The value ``key`` must get (present, null, or above ``limit``); None: leave it."""
    value = doc.values.get(key)
    if value is None or (isinstance(value, int) and value > limit):
        return limit
    return None


def _lower(doc: rawjson.TopLevel, key: str, limit: int) -> bytes | None:
    """``doc`` with ``key`` lowered to ``limit`` (added when absent); None: already ≤."""
    if key not in doc.values:
        return rawjson.add_member(doc, key, limit)
    if _lowered(doc, key, limit) is None:
        return None
    return rawjson.replace_value(doc, key, limit)


def _rewrite_limit(
    doc: rawjson.TopLevel, features: RequestFeatures, adapter: SchemaAdapter, limit: int
) -> bytes:
    paths = LIMIT_FIELDS.get(features.schema, ((adapter.inject_field,),))
    # every limit field present, null ones too: a null is replaced, never shadowed by a second
    # copy of the key (a first-copy-wins parser would read the null: no limit)
    top = [p[0] for p in paths if len(p) == 1 and p[0] in doc.values]
    nested = [p for p in paths if len(p) == 2]
    if nested:
        outer, inner = nested[0]
        if doc.values.get(outer) is None:  # absent or null: a fresh object with the limit
            if outer in doc.values:
                return rawjson.replace_value(doc, outer, {inner: limit})
            return rawjson.add_member(doc, outer, {inner: limit})

        def edit(obj: rawjson.TopLevel) -> bytes:
            lowered = _lower(obj, inner, limit)
            return lowered if lowered is not None else obj.text.encode("utf-8")

        return rawjson.edit_member(doc, outer, edit)
    if not top:
        return rawjson.add_member(doc, paths[0][0], limit)
    changes = {k: limit for k in top if _lowered(doc, k, limit) is not None}
    return rawjson.replace_values(doc, changes)
