"""The response phase: a backend's own overload answer, given as ICE's.

vLLM 0.32's admission valve (``--max-num-queued-reqs``, ``--max-num-queued-tokens``) refuses
a request with a 503 of its own: ``{"error": {"message": ..., "type": "Service Unavailable",
"param": null, "code": 503}}`` (on ``/v1/messages``: ``{"type": "error", "error": {"type":
"Service Unavailable", ...}}``), JSON, no Retry-After. To a client that is the answer ICE's
429 gives (the pool is full: come back later), in another shape. So ICE asks Envoy for the
response headers of the requests it sends on, and answers a backend's overload 503 itself:

- the status: the profile's ``backend_overload_status`` (503, or 429 to look like ICE's own
  shedding);
- ``Retry-After``: the pool's drain-rate estimate for what the request needs
  (``policy.scores.retry_after_s``, the arithmetic of ICE's own 429s, bounded by the
  profile's ``retry_after_min_s``..``retry_after_max_s``);
- the verdict headers: the pool's pressure now, ``x-ice-decision: reject``, ``x-ice-reason:
  backend_overloaded``;
- the API's error body (``SchemaAdapter.error_body``: OpenAI's, or Anthropic's for
  ``/v1/messages``), code ``backend_overloaded``.

Asking (``watches`` and ``strained``): a profile with ``backend_overload_status`` set (not
0) and not in ``mode: shadow``, while its pool is strained (pressure medium or above, or
unknown, or a backend's valve refused a request within the pool's window): at the request
headers of a request whose body ICE judges (or whose coarse verdict is a pass) the reply
overrides the request's processing mode with response headers SEND (``render``'s
``watch``). It must be the headers reply: Envoy ignores a mode override in a body reply, so
ICE asks before it knows the verdict. Cost: one more ext_proc message (the response headers,
answered at once) for each request ICE sends on while the pool is strained (measured on 2
Dec: −18 % requests/s and +0.33 ms p50 at one connection when every request is asked; not
measurable at 8 connections); none at low pressure; requests ICE answers itself never reach
it (Envoy closes the stream at an immediate response), and the response body is never sent.
A valve that refuses while ICE reads the pool as low passes its first 503s as it sent them,
until the next scrape shows the rejection (then the window keeps ICE watching).

Rewritten only when the backend itself said 503 (``from_backend``), all three of:
- ``:status`` is 503;
- the response came from the upstream: Envoy's ``response.code_details`` attribute (the
  ext_proc filter's ``response_attributes``) is ``via_upstream``; a configuration that does
  not send it: the router's ``x-envoy-upstream-service-time``, which Envoy adds to upstream
  responses only. Envoy's own 503s (no healthy upstream, a connection that failed after its
  retry, the overload manager) say otherwise (``upstream_reset_before_response_started{…}``,
  ``no_healthy_upstream``) and carry no such header;
- its body is JSON (``content-type`` application/json or ``+json``): an API server's refusal,
  not the plain-text local reply of a proxy one hop further (a backend pod's sidecar saying
  ``upstream connect error``), which Envoy also sees as ``via_upstream``.

Invariants: ``answer`` and ``from_backend`` are pure; ``respond`` reads only the pipeline's
views of the pool; None means "continue, the response untouched" (every response that does
not meet the rule, and every request without a recorded need). A fault here is the servicer's
to catch: the response phase always fails open, whatever the profile's ``fail_mode``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from ext_proc import telemetry
from ext_proc.admit.outcome import Respond, reject_outcome
from ext_proc.policy.decision import Reject, verdict_headers
from ext_proc.policy.kvfit import Shape
from ext_proc.policy.output_limit import backend_output
from ext_proc.policy.pressure import Pressure
from ext_proc.policy.scores import DrainInputs, retry_after_s
from ext_proc.policy.settings import Level, Profile
from ext_proc.schemas import SchemaAdapter

if TYPE_CHECKING:
    from ext_proc.admit.pipeline import Pipeline
    from ext_proc.admit.routing import Route
    from ext_proc.admit.verdict import BodyVerdict, RequestFacts

__all__ = [
    "CODE_DETAILS",
    "DETAILS",
    "REASON",
    "answer",
    "from_backend",
    "need_tokens",
    "respond",
    "strained",
    "watches",
]

REASON = "backend_overloaded"  # x-ice-reason and the error body's code
DETAILS = "ice_backend_overloaded"  # Envoy's %RESPONSE_CODE_DETAILS% for the answer
# The ext_proc filter's response attribute naming where the response came from
# (ext_proc.tools.envoygen.pieces asks for it), and its value for an upstream's response.
CODE_DETAILS = "response.code_details"
VIA_UPSTREAM = "via_upstream"
UPSTREAM_TIME = "x-envoy-upstream-service-time"


def watches(profile: Profile) -> bool:
    """Whether this profile's requests may have their response headers asked for."""
    return profile.backend_overload_status != 0 and profile.mode != "shadow"


def strained(pipeline: Pipeline, route: Route) -> bool:
    """Whether a backend of the route's pool may answer with its own overload 503 now: the
    pool's pressure is not low (or unknown), or a backend's valve refused a request within
    the pool's window (``admission_rejections_per_s`` > 0). Only then does ICE ask for the
    response headers (``watches``): an idle pool pays no third message."""
    snapshot = pipeline.lookup(route.pool)
    if snapshot is None:
        return True
    pressure = pipeline.views.pressure(route.profile, snapshot)
    if pressure is None or pressure.level >= Level.MEDIUM:
        return True
    for b in snapshot.backends:
        d = b.derived
        if d is not None and (d.admission_rejections_per_s or 0.0) > 0.0:
            return True
    return False


def need_tokens(profile: Profile, verdict: BodyVerdict | None) -> int | None:
    """The tokens a request ICE sends on needs of its pool (every sequence's prompt and the
    output it goes on with, as ICE's own 429s count them); None: it does not go on."""
    if verdict is None or verdict.shadow is not None or verdict.features is None:
        return None
    if not verdict.goes_upstream:
        return None
    f = verdict.features
    granted = verdict.granted_max_tokens
    output = granted if granted is not None else backend_output(f, profile)
    return Shape.of(f, profile).tokens(output)


def _is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


def from_backend(headers: Iterable[tuple[str, bytes]], code_details: str | None) -> bool:
    """Whether response headers are the backend's own overload 503 (the module's rule);
    ``code_details``: Envoy's ``response.code_details`` (None: not sent)."""
    status = content_type = ""
    timed = False
    for key, raw in headers:
        if key == ":status":
            status = raw.decode("latin-1")
        elif key == "content-type":
            content_type = raw.decode("latin-1")
        elif key == UPSTREAM_TIME:
            timed = True
    if status != "503" or not _is_json(content_type):
        return False
    return code_details == VIA_UPSTREAM if code_details is not None else timed


def answer(
    profile: Profile,
    adapter: SchemaAdapter,
    pressure: Pressure | None,
    drain: DrainInputs | None,
    need: int,
) -> Respond:
    """ICE's answer to a backend's overload 503 for a request that needs ``need`` tokens."""
    status = profile.backend_overload_status
    retry = retry_after_s(
        drain,
        need,
        min_s=profile.retry_after_min_s,
        max_s=profile.retry_after_max_s,
        fallback_s=profile.retry_after_s,
    )
    message = (
        f"The inference backend is at its admission limit and refused the request. "
        f"Retry after {retry} s."
    )
    refused = Reject(pressure, status, REASON, message, retry_after_s=retry)
    outcome = reject_outcome(
        adapter,
        status,
        REASON,
        message,
        extra_headers=verdict_headers(refused),
        retry_after_s=retry,
    )
    return Respond(outcome.status, outcome.headers, outcome.body, log=(("profile", profile.name),))


def respond(
    pipeline: Pipeline,
    route: Route,
    facts: RequestFacts,
    need: int | None,
    headers: Iterable[tuple[str, bytes]],
    code_details: str | None,
) -> Respond | None:
    """The response-headers phase: ICE's answer to a backend's overload 503 for a request it
    sent on (counted in ``ice_backend_overloads_total``), else None (continue untouched).
    ``need``: the tokens the request needs of its pool (its stream's ``need_tokens``)."""
    adapter = facts.adapter
    if need is None or adapter is None or not from_backend(headers, code_details):
        return None
    profile = route.profile
    snapshot = pipeline.lookup(route.pool)
    views = pipeline.views
    got = answer(profile, adapter, views.pressure(profile, snapshot), views.drain(snapshot), need)
    telemetry.BACKEND_OVERLOADS.labels(route=route.name, status=str(got.status)).inc()
    return got
