"""The headers phase: what a request's headers say, and the answers that need no body.

``HeaderRules.read`` reads the request headers once (raw bytes; only the ones ICE uses are
decoded) into ``RequestFacts``: the schema adapter (the route's ``schema`` binding, else the
path's), the priority (``judged_priority``: the route's, which a client's priority header may
lower, or set where the route trusts it), the latency targets (``judged_slo``: the profile's
``slo``, which llm-d's ``x-llm-d-slo-ttft-ms`` / ``x-llm-d-slo-tpot-ms`` may only tighten; the
client's headers are left on the request), the tenant headers, spoofed ICE headers to strip and
the endpoint a trusted picker chose, and who is asking (``ext_proc.admit.identity``: the
route's identity source; any source but ``trust`` ignores and strips the client's tenant
headers). It then says whether the request is answered without its body (``Refusal``): an
unknown path → 404, a required identity that is absent → 401, a judged path with a body
that is not JSON → 415 (unless the profile passes other content types), an empty body → 400,
a declared length over the limit → 413. Read-only paths (GET/HEAD) and the policy's
``passthrough_paths`` pass without a body phase (``skip_body``).

Pure: no metrics, no pool views (``ext_proc.admit.pipeline`` words the answer with the
pool's pressure and counts it).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from ext_proc.admit.identity import (
    IDENTITY_REQUIRED,
    NOTHING_VOUCHED,
    Identity,
    Vouched,
    identify,
    missing_message,
)
from ext_proc.admit.routing import Route
from ext_proc.admit.verdict import RequestFacts
from ext_proc.placement.endpoints import DESTINATION_HEADER
from ext_proc.policy.settings import PRIORITIES, Policy, Priority, SloTarget
from ext_proc.schemas import (
    OPENAI_CHAT_FALLBACK,
    READ_ONLY_PATHS,
    SchemaAdapter,
    normal_path,
    schema_for_path,
)

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "SLO_TPOT_HEADER",
    "SLO_TTFT_HEADER",
    "SPOOF_PREFIXES",
    "HeaderRules",
    "Refusal",
    "judged_priority",
    "judged_slo",
]

DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
# Client-sent headers with these prefixes are removed: only ICE may set them.
SPOOF_PREFIXES = ("x-mem-pressure", "x-ice-", "x-downgraded")
# llm-d's per-request latency targets, milliseconds (docs/slo.md): they may only tighten
SLO_TTFT_HEADER = "x-llm-d-slo-ttft-ms"
SLO_TPOT_HEADER = "x-llm-d-slo-tpot-ms"


@dataclass(frozen=True, slots=True)
class Refusal:
    """A request answered at its headers: a 4xx in the adapter's API format. ``counted``:
    it counts as a bad request (an unknown path always; the others unless in shadow);
    ``shadowed``: a shadow profile lets it go on, saying what it would have got."""

    adapter: SchemaAdapter
    status: int
    code: str
    message: str
    counted: bool = True
    shadowed: bool = False


@dataclass(slots=True)
class _Seen:
    """The headers ICE reads, as read (the loop's accumulator)."""

    path: str = ""
    method: str = ""
    content_type: str = ""
    content_length: str = ""
    tenant: str = ""
    queue_tenant: str = ""
    identity: str = ""  # the identity header's value (``header`` source; ``trust`` with one)
    priority: Priority | None = None  # the client's claim (``judged_priority`` judges it)
    slo_ttft: bytes = b""  # the client's llm-d SLO headers, raw (``judged_slo`` reads them)
    slo_tpot: bytes = b""
    endpoint: str | None = None


def judged_priority(route: Route, claim: Priority | None) -> tuple[Priority, Priority | None]:
    """The request's priority, from the route's and the client's ``claim`` (its priority
    header; None: absent or not a priority), under the route's ``client_priority``: ``trust``
    takes the claim; ``cap`` takes it only at or below the route's priority (a client may ask
    for less, never for more); ``ignore`` keeps the route's. Second: the claim when it was not
    taken (the access log's ``priority_claimed``), else None."""
    own = route.default_priority
    if claim is None or claim == own:
        return own, None
    mode = route.client_priority
    if mode == "trust" or (mode == "cap" and PRIORITIES.index(claim) > PRIORITIES.index(own)):
        return claim, None
    return own, claim


def _tighter(own: float | None, raw: bytes) -> float | None:
    """The smaller of the route's target and the client's header (milliseconds, a finite
    number > 0); a malformed, non-positive or larger claim leaves the route's."""
    if not raw:
        return own
    try:
        claim = float(raw.decode("latin-1").strip())
    except ValueError:
        return own
    if not 0.0 < claim < float("inf"):  # also NaN
        return own
    return claim if own is None or claim < own else own


def judged_slo(own: SloTarget, ttft_raw: bytes, tpot_raw: bytes) -> SloTarget:
    """The request's latency targets: the profile's ``own``, each tightened by the client's
    llm-d header when that asks for less time (an unset target is no limit, so any valid
    header sets it). Nothing sent: ``own`` itself."""
    if not ttft_raw and not tpot_raw:
        return own
    return SloTarget(_tighter(own.ttft_ms, ttft_raw), _tighter(own.tpot_ms, tpot_raw))


def _source(route: Route, seen: _Seen, who: Identity | None) -> str:
    """Where the tenant came from (the access log's ``identity``); "" when none was found."""
    if who is not None:
        return who.source if who.tenant else ""
    return "trust" if seen.queue_tenant or seen.tenant else ""


def _is_json(content_type: str) -> bool:
    if not content_type:
        return True  # many clients omit it; JSON backends parse the body regardless
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


class HeaderRules:
    """What one policy says about request headers (see the module docstring)."""

    def __init__(self, policy: Policy, max_body_bytes: int) -> None:
        self.max_body_bytes = max_body_bytes
        self._priority_header = policy.priority_header
        pt = policy.prefix_tracking
        self._tenant_header = pt.tenant_header if pt is not None and pt.tenant_header else None
        self._pick = {n: p.endpoint_pick for n, p in policy.pools.items()}
        self._passthrough = policy.passthrough_paths

    def read(
        self,
        route: Route,
        headers: Iterable[tuple[str, bytes]],
        end_of_stream: bool,
        subset: frozenset[str] | None = None,
        vouched: Vouched = NOTHING_VOUCHED,
    ) -> tuple[RequestFacts, Refusal | None]:
        """The request's facts, and its answer when it gets one without its body
        (``vouched``: what Envoy vouches for, ``ext_proc.admit.identity``)."""
        seen, strip = self._scan(route, headers)
        who = self._who(route, seen, vouched)
        priority, claimed = judged_priority(route, seen.priority)
        adapter = route.schema or schema_for_path(seen.path)
        facts = RequestFacts(
            adapter=adapter,
            priority=priority,
            priority_claimed=claimed,
            strip=tuple(strip),
            endpoint=seen.endpoint,
            subset=subset,
            content_length=int(seen.content_length) if seen.content_length.isdigit() else None,
            tenant=seen.tenant if who is None else who.tenant,
            queue_tenant=seen.queue_tenant if who is None else who.tenant,
            identity_source=_source(route, seen, who),
            slo=judged_slo(route.profile.slo, seen.slo_ttft, seen.slo_tpot),
        )
        if adapter is None:
            plain = normal_path(seen.path)
            read_only = plain in READ_ONLY_PATHS and seen.method in ("GET", "HEAD")
            if plain in self._passthrough or read_only:
                return replace(facts, skip_body=True), None
            message = (
                f"{seen.method or 'A request'} {plain} is not served by this gateway: it judges "
                f"the inference endpoints only (see docs/endpoints.md)."
            )
            return facts, Refusal(OPENAI_CHAT_FALLBACK, 404, "unknown_endpoint", message)
        if route.identity.required and not facts.identity_source:
            return facts, self._no_identity(route, adapter)
        if not _is_json(seen.content_type):
            if route.profile.content_types == "pass":  # the profile leaves non-JSON alone
                return replace(facts, skip_body=True), None
            # a judged endpoint reads JSON only: a body in another type is not judged, so it
            # does not go on (servers that sniff bodies would read it anyway)
            media = seen.content_type.split(";", 1)[0].strip()
            message = (
                f"This endpoint takes a JSON body (content-type: application/json), not {media!r}."
            )
            return facts, self._refusal(route, adapter, 415, "unsupported_media_type", message)
        if end_of_stream:
            message = "The request body is empty."
            return facts, self._refusal(route, adapter, 400, "empty_body", message)
        length = facts.content_length
        if length is not None and length > self.max_body_bytes:
            message = (
                f"The request body is {seen.content_length} bytes; the limit is "
                f"{self.max_body_bytes} bytes."
            )
            return facts, self._refusal(route, adapter, 413, "request_too_large", message)
        return facts, None

    @staticmethod
    def _who(route: Route, seen: _Seen, vouched: Vouched) -> Identity | None:
        """The identity that names both tenants (a vouched source, or ``trust`` with its own
        header); None: ``trust`` as before (each tenant header names its own)."""
        ident = route.identity
        if not ident.vouched and not ident.header:
            return None
        return identify(ident, vouched, seen.identity)

    def _no_identity(self, route: Route, adapter: SchemaAdapter) -> Refusal:
        """401 ``identity_required``: the route requires an identity the request lacks."""
        own, queue_header, tenant_header = self._tenant_headers(route)
        trust_header = own or queue_header or tenant_header or ""
        message = missing_message(route.identity, trust_header)
        return self._refusal(route, adapter, 401, IDENTITY_REQUIRED, message)

    @staticmethod
    def _refusal(
        route: Route, adapter: SchemaAdapter, status: int, code: str, message: str
    ) -> Refusal:
        shadow = route.profile.mode == "shadow"
        return Refusal(adapter, status, code, message, counted=not shadow, shadowed=shadow)

    def _tenant_headers(self, route: Route) -> tuple[str | None, str | None, str | None]:
        """The headers naming a tenant on ``route``: the identity's own (``header`` source, or
        ``trust`` with ``identity.header``), then the client's queue and prefix tenant
        headers, which a vouched identity ignores (and strips)."""
        ident = route.identity
        queue = route.profile.queue
        queue_header = queue.tenant_header if queue is not None and queue.tenant_header else None
        own = ident.header or None if ident.source in ("header", "trust") else None
        return own, queue_header, self._tenant_header

    def _scan(self, route: Route, headers: Iterable[tuple[str, bytes]]) -> tuple[_Seen, list[str]]:
        seen = _Seen()
        strip: list[str] = []
        own_header, queue_header, tenant_header = self._tenant_headers(route)
        vouched = route.identity.vouched
        for key, raw in headers:
            if key == ":path":
                seen.path = raw.decode("latin-1")
            elif key == ":method":
                seen.method = raw.decode("latin-1")
            elif key == "content-type":
                seen.content_type = raw.decode("latin-1")
            elif key == "content-length":
                seen.content_length = raw.decode("latin-1")
            elif key == own_header:
                seen.identity = raw.decode("latin-1").strip()
            elif key in (tenant_header, queue_header):
                if vouched:  # only what Envoy vouches for names the tenant
                    strip.append(key)
                    continue
                value = raw.decode("latin-1").strip()
                if key == tenant_header:
                    seen.tenant = value
                if key == queue_header:
                    seen.queue_tenant = value
            elif key == self._priority_header:
                wanted = raw.decode("latin-1").strip().lower()
                seen.priority = next((p for p in PRIORITIES if p == wanted), seen.priority)
            elif key == SLO_TTFT_HEADER:
                seen.slo_ttft = raw
            elif key == SLO_TPOT_HEADER:
                seen.slo_tpot = raw
            elif key.startswith(SPOOF_PREFIXES):
                strip.append(key)
            elif key == DESTINATION_HEADER:
                if self._pick.get(route.pool) == "header":  # set by a trusted picker
                    seen.endpoint = raw.decode("latin-1").strip()
                else:  # only ICE may choose the endpoint (or nobody)
                    strip.append(key)
        return seen, strip
