"""The ext_proc messages' small parts, read and written: a timeout extension, the picker's
subset hint, what Envoy vouches for about the request (``vouched``: jwt_authn's verified
payloads, the peer certificate's SANs), the request id, Envoy's response code details, and
the do-nothing answer of any phase (the servicer's vocabulary; protobuf only, no verdicts).
"""

from __future__ import annotations

from typing import Any

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from ext_proc.admit import overload_answer
from ext_proc.admit.identity import (
    JWT_NAMESPACE,
    NOTHING_VOUCHED,
    PEER_DNS_SAN,
    PEER_URI_SAN,
    Vouched,
)

__all__ = [
    "SUBSET_KEY",
    "SUBSET_NAMESPACE",
    "TIMEOUT_MARGIN_MS",
    "code_details",
    "continue_phase",
    "extend_timeout",
    "request_id",
    "subset_hint",
    "vouched",
]


# What ICE asks of Envoy's message timeout beyond the time it holds a message for: the
# truncation deadline (then the planning and the body edit) or a queued request's longest
# wait. Envoy's max_message_timeout must allow it (ext_proc.tools.envoygen.pieces).
TIMEOUT_MARGIN_MS = 1000


def extend_timeout(hold_ms: int) -> pb.ProcessingResponse:
    """A reply that only extends Envoy's message timeout for this message (it is not the
    answer): ``hold_ms`` plus the margin."""
    response = pb.ProcessingResponse()
    response.override_message_timeout.FromMilliseconds(hold_ms + TIMEOUT_MARGIN_MS)
    return response


SUBSET_NAMESPACE = "envoy.lb.subset_hint"
SUBSET_KEY = "x-gateway-destination-endpoint-subset"


def subset_hint(metadata: Any) -> frozenset[str] | None:
    """The endpoint-picker protocol's subset hint (filter metadata ``envoy.lb.subset_hint`` /
    ``x-gateway-destination-endpoint-subset``: a list of ip:port, or one comma-separated
    string), forwarded by Envoy's ``metadata_options.forwarding_namespaces``; None: no hint."""
    namespaces = metadata.filter_metadata
    if SUBSET_NAMESPACE not in namespaces:
        return None
    fields = namespaces[SUBSET_NAMESPACE].fields
    if SUBSET_KEY not in fields:
        return None
    value = fields[SUBSET_KEY]
    kind = value.WhichOneof("kind")
    if kind == "list_value":
        items = [v.string_value for v in value.list_value.values]
    elif kind == "string_value":
        items = value.string_value.split(",")
    else:
        return None
    hint = frozenset(i.strip() for i in items if i.strip())
    return hint or None


def _plain(value: Any) -> object:
    """A ``google.protobuf.Value`` as plain Python (a walk: 5× faster than json_format)."""
    kind = value.WhichOneof("kind")
    if kind == "struct_value":
        return _plain_struct(value.struct_value)
    if kind == "list_value":
        return [_plain(v) for v in value.list_value.values]
    if kind == "null_value" or kind is None:
        return None
    return getattr(value, kind)


def _plain_struct(struct: Any) -> dict[str, object]:
    return {k: _plain(v) for k, v in struct.fields.items()}


def vouched(request: pb.ProcessingRequest) -> Vouched:
    """What Envoy vouches for (``ext_proc.admit.identity``), from the first message of the
    stream: jwt_authn's payloads (its dynamic metadata, forwarded by the ext_proc filter's
    ``forwarding_namespaces``) and the peer certificate's first URI / DNS SAN (its
    ``request_attributes``; "" or absent: none). Nothing sent: ``NOTHING_VOUCHED``."""
    jwt: dict[str, object] = {}
    namespaces = request.metadata_context.filter_metadata
    if JWT_NAMESPACE in namespaces:
        jwt = _plain_struct(namespaces[JWT_NAMESPACE])
    uri = dns = ""
    for attributes in request.attributes.values():
        fields = attributes.fields
        if PEER_URI_SAN in fields:
            uri = str(fields[PEER_URI_SAN].string_value)
        if PEER_DNS_SAN in fields:
            dns = str(fields[PEER_DNS_SAN].string_value)
    if not jwt and not uri and not dns:
        return NOTHING_VOUCHED
    return Vouched(jwt=jwt, uri_san=uri, dns_san=dns)


def request_id(headers: pb.HttpHeaders) -> str:
    """The request's ``x-request-id`` (Envoy sets one), for the fault log; "" when none."""
    for h in headers.headers.headers:
        if h.key == "x-request-id":
            raw: bytes = h.raw_value or h.value.encode()
            return raw.decode("utf-8", "replace")[:128]
    return ""


def code_details(request: pb.ProcessingRequest) -> str | None:
    """Envoy's ``response.code_details`` among the message's attributes (the ext_proc
    filter's ``response_attributes``); None: not sent."""
    for attributes in request.attributes.values():
        fields = attributes.fields
        if overload_answer.CODE_DETAILS in fields:
            return str(fields[overload_answer.CODE_DETAILS].string_value)
    return None


def continue_phase(phase: str | None) -> pb.ProcessingResponse:
    """The do-nothing answer for any phase."""
    if phase == "request_headers":
        return pb.ProcessingResponse(request_headers=pb.HeadersResponse())
    if phase == "request_body":
        return pb.ProcessingResponse(request_body=pb.BodyResponse())
    if phase == "response_headers":
        return pb.ProcessingResponse(response_headers=pb.HeadersResponse())
    if phase == "response_body":
        return pb.ProcessingResponse(response_body=pb.BodyResponse())
    if phase == "request_trailers":
        return pb.ProcessingResponse(request_trailers=pb.TrailersResponse())
    if phase == "response_trailers":
        return pb.ProcessingResponse(response_trailers=pb.TrailersResponse())
    return pb.ProcessingResponse()
