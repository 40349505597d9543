"""The protobuf edge: turn plans into Envoy ``ProcessingResponse`` messages.

The only module (with the servicer) that builds ext_proc protobufs. Header values go in
``raw_value`` (Envoy ignores ``value`` for mutations). The verdict headers also travel as
dynamic metadata in namespace ``ice`` so that Envoy echoes them to the client with
``%DYNAMIC_METADATA(ice:<header>)%`` without a response-phase round trip.

``watch``: the request-headers reply also asks Envoy for this request's response headers
(a mode override: response headers SEND, the rest as the shipped configs say), for
``ext_proc.admit.overload_answer``; a mode override restates every mode, because Envoy takes body
modes literally (an unset body mode is NONE).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.type.v3 import http_status_pb2
from google.protobuf import struct_pb2

from ext_proc.admit.outcome import Continue, Outcome, Respond
from ext_proc.placement.endpoints import DESTINATION_HEADER

__all__ = [
    "METADATA_NAMESPACE",
    "body_continue",
    "headers_continue",
    "headers_outcome",
    "render_body_outcome",
    "render_immediate",
    "response_headers_continue",
    "skip_body",
]

METADATA_NAMESPACE = "ice"
LB_NAMESPACE = "envoy.lb"
_OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
_BODY_MODE_NONE = 0  # ProcessingMode.BodySendMode.NONE
_BODY_MODE_BUFFERED = 2  # ProcessingMode.BodySendMode.BUFFERED
_SEND, _SKIP = 1, 2  # ProcessingMode.HeaderSendMode


def _watch(resp: pb.ProcessingResponse, request_body_mode: int) -> None:
    """Override the request's processing mode: the shipped configs' (request headers SEND,
    trailers SKIP, response body NONE) with ``request_body_mode`` and response headers SEND."""
    mode = resp.mode_override
    mode.request_header_mode = _SEND
    mode.request_body_mode = request_body_mode
    mode.request_trailer_mode = _SKIP
    mode.response_header_mode = _SEND
    mode.response_body_mode = _BODY_MODE_NONE
    mode.response_trailer_mode = _SKIP


def _header(key: str, value: str) -> base_pb2.HeaderValueOption:
    return base_pb2.HeaderValueOption(
        header=base_pb2.HeaderValue(key=key, raw_value=value.encode()), append_action=_OVERWRITE
    )


def _metadata(headers: Sequence[tuple[str, str]]) -> struct_pb2.Struct:
    md = struct_pb2.Struct()
    fields = md.fields[METADATA_NAMESPACE].struct_value.fields
    for key, value in headers:
        fields[key].string_value = value
    return md


_HEADERS_CONTINUE = pb.ProcessingResponse(request_headers=pb.HeadersResponse())


_HEADERS_WATCH = pb.ProcessingResponse(request_headers=pb.HeadersResponse())
_watch(_HEADERS_WATCH, _BODY_MODE_BUFFERED)


def headers_continue(remove: Sequence[str] = (), watch: bool = False) -> pb.ProcessingResponse:
    """Answer the request-headers message: continue (the body comes next), removing the named
    headers; ``watch``: and send this request's response headers to ICE."""
    if not remove:
        return _HEADERS_WATCH if watch else _HEADERS_CONTINUE  # prebuilt, never mutated
    resp = pb.ProcessingResponse(request_headers=pb.HeadersResponse())
    resp.request_headers.response.header_mutation.remove_headers.extend(remove)
    if watch:
        _watch(resp, _BODY_MODE_BUFFERED)
    return resp


def skip_body(
    remove: Sequence[str] = (),
    headers: Sequence[tuple[str, str]] = (),
    watch: bool = False,
) -> pb.ProcessingResponse:
    """Continue without sending the body to ICE (mode override: request body NONE), setting
    ``headers`` (a shadow profile's would-be answer) for the backend and the client;
    ``watch``: and send this request's response headers to ICE."""
    resp = pb.ProcessingResponse(request_headers=pb.HeadersResponse())
    if remove:
        resp.request_headers.response.header_mutation.remove_headers.extend(remove)
    if headers:
        sets = resp.request_headers.response.header_mutation.set_headers
        sets.extend(_header(k, v) for k, v in headers)
        resp.dynamic_metadata.CopyFrom(_metadata(headers))
    if watch:
        _watch(resp, _BODY_MODE_NONE)
    else:
        resp.mode_override.request_body_mode = _BODY_MODE_NONE
    return resp


def headers_outcome(
    outcome: Outcome, remove: Sequence[str] = (), watch: bool = False
) -> pb.ProcessingResponse:
    """Answer the request-headers message with a verdict made without the body (the coarse
    verdict): a ``Respond`` at once, or continue with the verdict headers set and the body
    phase turned off (the body goes to the backend as sent; ``outcome.body`` must be None);
    ``watch``: a request that goes on also sends its response headers to ICE."""
    if isinstance(outcome, Respond):
        return render_immediate(outcome)
    resp = skip_body(remove, watch=watch)
    common = resp.request_headers.response
    common.header_mutation.set_headers.extend(_header(k, v) for k, v in outcome.headers)
    _set_metadata(resp, outcome)
    return resp


def body_continue() -> pb.ProcessingResponse:
    """Answer the request-body message: continue with the body untouched, no annotation."""
    return pb.ProcessingResponse(request_body=pb.BodyResponse())


_RESPONSE_HEADERS_CONTINUE = pb.ProcessingResponse(response_headers=pb.HeadersResponse())


def response_headers_continue() -> pb.ProcessingResponse:
    """Answer the response-headers message: the response goes on as it is (prebuilt)."""
    return _RESPONSE_HEADERS_CONTINUE


def render_immediate(respond: Respond, details: str | None = None) -> pb.ProcessingResponse:
    """An ``ImmediateResponse`` (the client gets it; at the request phases the backend never
    sees the request; at the response headers it replaces the backend's answer).
    ``details``: Envoy's %RESPONSE_CODE_DETAILS% (default ``ice_<status>``)."""
    verdict = [h for h in respond.headers if h[0].startswith(("x-ice-", "x-mem-", "x-downgraded"))]
    resp = pb.ProcessingResponse(
        immediate_response=pb.ImmediateResponse(
            status=http_status_pb2.HttpStatus(code=respond.status),
            headers=pb.HeaderMutation(set_headers=[_header(k, v) for k, v in respond.headers]),
            body=respond.body,
            details=details or f"ice_{respond.status}",
        )
    )
    if verdict:
        resp.dynamic_metadata.CopyFrom(_metadata([*verdict, *respond.log]))
    return resp


# Rendered replies for untouched bodies, by their verdict headers. Verdicts repeat (the score
# changes at most once per scrape), so most requests reuse a prebuilt message. The messages
# are never mutated after caching: gRPC only serialises them.
_CONTINUE_CACHE: dict[tuple[tuple[str, str], ...], pb.ProcessingResponse] = {}
_CONTINUE_CACHE_MAX = 512


def render_body_outcome(outcome: Outcome) -> pb.ProcessingResponse:
    """Answer the request-body message with a plan's outcome."""
    if isinstance(outcome, Respond):
        return render_immediate(outcome)
    if outcome.body is None:
        # cached by the verdict headers; the access-log fields differ per request (input
        # tokens), so they go on a copy (2 µs) rather than into the key (16 µs a miss)
        key = tuple(outcome.headers)
        cached = _CONTINUE_CACHE.get(key)
        if cached is None:
            if len(_CONTINUE_CACHE) >= _CONTINUE_CACHE_MAX:
                _CONTINUE_CACHE.clear()
            plain = replace(outcome, log=())
            cached = _CONTINUE_CACHE[key] = _render_continue(plain)
        if not outcome.log:
            return cached
        resp = pb.ProcessingResponse()
        resp.CopyFrom(cached)
        fields = resp.dynamic_metadata.fields[METADATA_NAMESPACE].struct_value.fields
        for k, v in outcome.log:
            fields[k].string_value = v
        return resp
    return _render_continue(outcome)


def _render_continue(outcome: Continue) -> pb.ProcessingResponse:
    # built in place: a message passed to a constructor is copied, and with it a rewritten
    # body (8 MB: ~30 ms on the event loop, twice)
    resp = pb.ProcessingResponse()
    resp.request_body.response.SetInParent()  # the reply is a body reply even with nothing set
    common = resp.request_body.response
    sets = common.header_mutation.set_headers
    sets.extend(_header(k, v) for k, v in outcome.headers)
    if outcome.body is not None:
        common.body_mutation.body = outcome.body
        sets.append(_header("content-length", str(len(outcome.body))))
    _set_metadata(resp, outcome)
    return resp


def _set_metadata(resp: pb.ProcessingResponse, outcome: Continue) -> None:
    """The verdict headers (namespace ``ice``) and ICE's pick (``envoy.lb``) on a reply."""
    resp.dynamic_metadata.CopyFrom(_metadata([*outcome.headers, *outcome.log]))
    if outcome.lb_endpoint is not None:
        # the endpoint-picker protocol: the pick in envoy.lb, where the backend cluster's
        # override_host policy reads it (the route stays; the header is informational)
        lb = resp.dynamic_metadata.fields[LB_NAMESPACE].struct_value.fields
        lb[DESTINATION_HEADER].string_value = outcome.lb_endpoint
