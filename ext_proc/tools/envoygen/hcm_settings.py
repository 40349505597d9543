"""What ICE sets on Envoy's HTTP connection manager besides its filters, as typed messages.

- ``too_large_reply``: the HCM's ``local_reply_config``: Envoy's own 413 (a body over the
  buffer limit) in the API's error format, Anthropic's for /v1/messages, OpenAI's elsewhere.
- ``access_log``: the HCM's access log: one JSON line per request, Envoy's view of it then
  ICE's verdict from its dynamic metadata and the ext_proc filter's record of its calls
  (``ACCESS_LOG_FIELDS``, each field in docs/configuration.md "Envoy's access log").
- ``route_scope``: both of them only for ICE's routes (by route name), where the connection
  manager also serves other services' routes (Istio's shared ingress gateway).

Used by the local bootstraps (``local``) and Istio's HCM merge (``istio``); Envoy Gateway
carries neither (``gateway``'s "Not carried").

Invariants: pure (no I/O); every value is a typed message, rendered only by ``emit.as_dict``;
the metadata namespace and filter name are ``pieces``' constants.
"""

from __future__ import annotations

from envoy_data_plane.envoy.config.accesslog.v3 import (
    AccessLog,
    AccessLogFilter,
    AndFilter,
    ComparisonFilter,
    ComparisonFilterOp,
    ExtensionFilter,
    HeaderFilter,
    StatusCodeFilter,
)
from envoy_data_plane.envoy.config.core.v3 import RuntimeUInt32, SubstitutionFormatString
from envoy_data_plane.envoy.config.route.v3 import HeaderMatcher
from envoy_data_plane.envoy.extensions.access_loggers.file.v3 import FileAccessLog
from envoy_data_plane.envoy.extensions.access_loggers.filters.cel.v3 import ExpressionFilter
from envoy_data_plane.envoy.extensions.filters.network.http_connection_manager.v3 import (
    LocalReplyConfig,
    ResponseMapper,
)
from envoy_data_plane.envoy.type.matcher.v3 import StringMatcher
from envoy_data_plane.google.protobuf import Struct

from ext_proc.tools.envoygen.pieces import EXT_PROC, VERDICT_NAMESPACE, _any

__all__ = ["ACCESS_LOG_FIELDS", "TOO_LARGE", "access_log", "route_scope", "too_large_reply"]

CEL_FILTER = "envoy.access_loggers.extension_filters.cel"
TOO_LARGE = "The request body exceeds the gateway's limit."


def route_scope(prefix: str) -> AccessLogFilter:
    """Only requests whose route's name starts with ``prefix`` (a CEL filter on
    ``xds.route_name``): ICE's routes on a shared gateway, where the connection manager's
    access log and local replies serve other services' routes too."""
    expression = f"xds.route_name.startsWith('{prefix}')"
    return AccessLogFilter(
        extension_filter=ExtensionFilter(
            name=CEL_FILTER, typed_config=_any(ExpressionFilter(expression=expression))
        )
    )


def too_large_reply(scope: AccessLogFilter | None = None) -> LocalReplyConfig:
    """Envoy's own 413 (a body over the buffer limit, e.g. chunked uploads) in the API's error
    format: Anthropic's for /v1/messages, OpenAI's elsewhere. ``scope``: only for the requests
    it passes (``route_scope``); other 413s keep Envoy's own body."""

    def is_413() -> AccessLogFilter:
        value = RuntimeUInt32(default_value=413, runtime_key="ice.unused_413")
        return AccessLogFilter(
            status_code_filter=StatusCodeFilter(
                comparison=ComparisonFilter(op=ComparisonFilterOp.EQ, value=value)
            )
        )

    messages = AccessLogFilter(
        header_filter=HeaderFilter(
            header=HeaderMatcher(name=":path", string_match=StringMatcher(prefix="/v1/messages"))
        )
    )
    scoped = [scope] if scope is not None else []
    anthropic = {
        "type": "error",
        "error": {"type": "request_too_large", "message": TOO_LARGE, "code": "request_too_large"},
    }
    openai = {
        "error": {
            "message": TOO_LARGE,
            "type": "invalid_request_error",
            "param": None,
            "code": "request_too_large",
        }
    }
    return LocalReplyConfig(
        mappers=[
            ResponseMapper(
                filter=AccessLogFilter(and_filter=AndFilter(filters=[is_413(), messages, *scoped])),
                body_format_override=SubstitutionFormatString(
                    json_format=Struct.from_dict(anthropic)
                ),
            ),
            ResponseMapper(
                filter=AccessLogFilter(and_filter=AndFilter(filters=[is_413(), *scoped]))
                if scoped
                else is_413(),
                body_format_override=SubstitutionFormatString(json_format=Struct.from_dict(openai)),
            ),
        ]
    )


# The access log's fields (docs/operations.md "Access log"): Envoy's view of the request, then
# ICE's verdict from its dynamic metadata (empty: ICE did not judge it), then the ext_proc
# filter's own record of its calls (a failed call is a fail-open).
ACCESS_LOG_FIELDS: tuple[tuple[str, str], ...] = (
    ("time", "%START_TIME%"),
    ("method", "%REQ(:METHOD)%"),
    ("path", "%REQ(:PATH)%"),
    ("route", "%ROUTE_NAME%"),
    ("status", "%RESPONSE_CODE%"),
    ("flags", "%RESPONSE_FLAGS%"),
    ("details", "%RESPONSE_CODE_DETAILS%"),
    ("duration_ms", "%DURATION%"),
    ("upstream", "%UPSTREAM_HOST%"),
    ("decision", f"%DYNAMIC_METADATA({VERDICT_NAMESPACE}:x-ice-decision)%"),
    ("reason", f"%DYNAMIC_METADATA({VERDICT_NAMESPACE}:x-ice-reason)%"),
    ("pressure", f"%DYNAMIC_METADATA({VERDICT_NAMESPACE}:x-mem-pressure)%"),
    ("score", f"%DYNAMIC_METADATA({VERDICT_NAMESPACE}:x-mem-pressure-score)%"),
    ("profile", f"%DYNAMIC_METADATA({VERDICT_NAMESPACE}:profile)%"),
    ("priority", f"%DYNAMIC_METADATA({VERDICT_NAMESPACE}:priority)%"),
    ("priority_claimed", f"%DYNAMIC_METADATA({VERDICT_NAMESPACE}:priority_claimed)%"),
    ("tenant", f"%DYNAMIC_METADATA({VERDICT_NAMESPACE}:tenant)%"),
    ("identity", f"%DYNAMIC_METADATA({VERDICT_NAMESPACE}:identity)%"),
    ("input_tokens", f"%DYNAMIC_METADATA({VERDICT_NAMESPACE}:input_tokens)%"),
    ("max_tokens_requested", f"%DYNAMIC_METADATA({VERDICT_NAMESPACE}:max_tokens_requested)%"),
    ("max_tokens_granted", f"%DYNAMIC_METADATA({VERDICT_NAMESPACE}:max_tokens_granted)%"),
    ("truncated", f"%DYNAMIC_METADATA({VERDICT_NAMESPACE}:x-ice-truncated)%"),
    ("judged", f"%DYNAMIC_METADATA({VERDICT_NAMESPACE}:x-ice-judged)%"),
    ("endpoint", f"%DYNAMIC_METADATA({VERDICT_NAMESPACE}:x-ice-endpoint)%"),
    ("ext_proc_headers_status", f"%FILTER_STATE({EXT_PROC}:FIELD:request_header_call_status)%"),
    ("ext_proc_body_status", f"%FILTER_STATE({EXT_PROC}:FIELD:request_body_last_call_status)%"),
    # 1: the filter gave up on ICE (unreachable, or late: then the late guard refused it)
    ("ext_proc_failed_open", f"%FILTER_STATE({EXT_PROC}:FIELD:failed_open)%"),
)


def access_log(path: str = "/dev/stdout", scope: AccessLogFilter | None = None) -> AccessLog:
    """One JSON line per request with ICE's verdict (``ACCESS_LOG_FIELDS``); ``scope``: only
    the requests it passes (``route_scope``)."""
    fields = Struct.from_dict(dict(ACCESS_LOG_FIELDS))
    config = FileAccessLog(path=path, log_format=SubstitutionFormatString(json_format=fields))
    return AccessLog(name="envoy.access_loggers.file", filter=scope, typed_config=_any(config))
