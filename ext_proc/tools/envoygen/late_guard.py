"""Envoy's own answer to a request ICE did not judge in time: a 429, never an unjudged pass.

Envoy's ext_proc filter waits ``message_timeout`` for each of ICE's answers; with
``failure_mode_allow: true`` it then sends the request on as if ICE had never been there.
Under a flood on a loaded machine up to 398 of 512 requests went so (docs/flood.md, issue 44):
Envoy's timer fired on the *headers* message, before ICE had even received it. The filter
cannot tell a late ICE from a dead one; its record of the stream can. The filter state
``envoy.filters.http.ext_proc`` (PLAIN form: ``rh:<latency_us>:<status>`` for the request
headers' call, ``rb:<calls>:<latency_us>:<status>`` for the body's last call, then bytes and
the destination) holds each call's gRPC status, checked on Envoy 1.40:

- ``4`` DEADLINE_EXCEEDED: Envoy's timer fired; ICE was reachable (the stream was open) and
  did not answer in time: behind (a flood, a starved CPU) or hung;
- ``14`` UNAVAILABLE: no ICE could be reached (down, refused, no healthy host);
- ``0``: answered.

``late_guard_filter`` is an RBAC filter placed after ext_proc (it runs once ext_proc lets the
request go on: after the body's answer in BUFFERED mode, or at once after a timeout). It
denies a request whose request headers' or body's call ended ``4``: Envoy answers it with
``late_reply_mappers``' 429 ``ice_late`` (``Retry-After: 1``, ``x-ice-decision: reject``,
``x-ice-reason: ice_late``; the body in the API's error format), as ICE answers when it cannot
read a body in time (``ice_busy``). Routes with ICE off never have the filter state: the
filter lets them through. A call that failed otherwise (ICE down: ``14``) still fails open:
the request goes on unjudged, as before. Every refusal is counted by Envoy
(``http.<stat_prefix>.rbac.ice_late.denied``) and logged (the access log's ``details``:
``rbac_access_denied_matched_policy[ice_late]``, ``ext_proc_headers_status`` or
``ext_proc_body_status``: ``4``).

The price: a *hung* ICE (stopped, its connections open) is late too. The requests Envoy sends
it get the 429 after the message timeout instead of going on unjudged, until Envoy routes
around it (docs/failure.md, docs/high-availability.md).

Invariants: pure (no I/O); every value is a typed message; the regex is RE2 and matches the
whole PLAIN string (RBAC's string matcher).
"""

from __future__ import annotations

from collections.abc import Mapping

from envoy_data_plane.envoy.config.accesslog.v3 import (
    AccessLogFilter,
    AndFilter,
    ExtensionFilter,
    HeaderFilter,
)
from envoy_data_plane.envoy.config.core.v3 import (
    HeaderValue,
    HeaderValueOption,
    HeaderValueOptionHeaderAppendAction,
    SubstitutionFormatString,
)
from envoy_data_plane.envoy.config.rbac.v3 import Permission, Policy, Principal, Rbac, RbacAction
from envoy_data_plane.envoy.config.route.v3 import HeaderMatcher
from envoy_data_plane.envoy.extensions.access_loggers.filters.cel.v3 import ExpressionFilter
from envoy_data_plane.envoy.extensions.filters.http.rbac.v3 import Rbac as RbacFilter
from envoy_data_plane.envoy.extensions.filters.network.http_connection_manager.v3 import (
    HttpFilter,
    ResponseMapper,
)
from envoy_data_plane.envoy.type.matcher.v3 import FilterStateMatcher, RegexMatcher, StringMatcher
from envoy_data_plane.google.protobuf import Struct

from ext_proc.tools.envoygen.pieces import EXT_PROC, _any

__all__ = [
    "LATE_POLICY",
    "LATE_REASON",
    "LATE_STATUSES",
    "RBAC",
    "late_guard_filter",
    "late_reply_mappers",
]

RBAC = "envoy.filters.http.rbac"
LATE_POLICY = "ice_late"  # the RBAC policy's name: the refusal's details, its stat prefix
LATE_REASON = "ice_late"  # x-ice-reason and the error body's code
LATE_RETRY_AFTER_S = 1  # ICE's retry_after_min_s default: the flood's bodies end within 1 s
# The request headers' call, or the body's last call, ended DEADLINE_EXCEEDED (4).
LATE_STATUSES = "(.*,)?(rh|rb:[0-9]+):[0-9]+:4(,.*)?"
LATE_MESSAGE = (
    "The gateway could not judge this request in time (its admission check was late); "
    "retry after the Retry-After delay."
)


def late_guard_filter(*, disabled: bool = False) -> HttpFilter:
    """The RBAC filter after ext_proc: deny what ICE was too late to judge (module doc).
    ``disabled``: off unless a route turns it on (a shared gateway)."""
    late = Principal(
        filter_state=FilterStateMatcher(
            key=EXT_PROC,
            string_match=StringMatcher(safe_regex=RegexMatcher(regex=LATE_STATUSES)),
        )
    )
    rules = Rbac(
        action=RbacAction.DENY,
        policies={LATE_POLICY: Policy(permissions=[Permission(any=True)], principals=[late])},
    )
    config = RbacFilter(rules=rules, rules_stat_prefix=f"{LATE_POLICY}.")
    return HttpFilter(name=RBAC, typed_config=_any(config), disabled=disabled)


def _is_late_refusal() -> AccessLogFilter:
    expression = f"response.code_details == 'rbac_access_denied_matched_policy[{LATE_POLICY}]'"
    return AccessLogFilter(
        extension_filter=ExtensionFilter(
            name="envoy.access_loggers.extension_filters.cel",
            typed_config=_any(ExpressionFilter(expression=expression)),
        )
    )


def late_reply_mappers() -> list[ResponseMapper]:
    """The guard's denial (Envoy's 403 ``RBAC: access denied``) as a 429 ``ice_late`` with
    ``Retry-After`` and ICE's verdict headers; the body in Anthropic's error format on
    /v1/messages, OpenAI's elsewhere (as ``hcm_settings.too_large_reply``)."""

    def header(key: str, value: str) -> HeaderValueOption:
        return HeaderValueOption(
            header=HeaderValue(key=key, value=value),
            append_action=HeaderValueOptionHeaderAppendAction.OVERWRITE_IF_EXISTS_OR_ADD,
        )

    headers = [
        header("retry-after", str(LATE_RETRY_AFTER_S)),
        header("x-ice-decision", "reject"),
        header("x-ice-reason", LATE_REASON),
    ]
    messages = AccessLogFilter(
        header_filter=HeaderFilter(
            header=HeaderMatcher(name=":path", string_match=StringMatcher(prefix="/v1/messages"))
        )
    )
    anthropic = {
        "type": "error",
        "error": {"type": "rate_limit_error", "message": LATE_MESSAGE, "code": LATE_REASON},
    }
    openai = {
        "error": {
            "message": LATE_MESSAGE,
            "type": "rate_limit_error",
            "param": None,
            "code": LATE_REASON,
        }
    }

    def mapper(where: AccessLogFilter, body: Mapping[str, object]) -> ResponseMapper:
        return ResponseMapper(
            filter=where,
            status_code=429,
            headers_to_add=headers,
            body_format_override=SubstitutionFormatString(json_format=Struct.from_dict(dict(body))),
        )

    both = AccessLogFilter(and_filter=AndFilter(filters=[_is_late_refusal(), messages]))
    return [mapper(both, anthropic), mapper(_is_late_refusal(), openai)]
