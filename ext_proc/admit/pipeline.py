"""The request's way through ICE, free of gRPC: route → headers → body → outcome.

1. ``Router.resolve`` (``ext_proc.admit.routing``) maps the route's gRPC metadata
   (``x-ice-route``, ``x-ice-profile``, ``x-ice-pool``, ``x-ice-priority``) to a ``Route``.
2. ``on_headers`` reads the request headers once: the schema adapter (the route's
   ``schema`` binding, else the path's), whether the body is JSON, the priority header,
   spoofed ICE headers to strip, and the answers that need no body (an unknown path → 404,
   a judged path with a body that is not JSON → 415, empty body → 400, declared length over
   the limit → 413). Read-only paths (GET/HEAD) and the policy's ``passthrough_paths`` pass
   without a body phase.
3. ``on_body`` parses the body once, extracts features, reads the pool's snapshot, places
   the request on an endpoint (``ext_proc.placement.placer``: the pool's ``endpoint_pick``), runs
   the evaluator against that endpoint's room and plans the edits (``verdict.make_verdict``).
4. When the evaluator asks to truncate history, ``on_body`` returns the verdict with
   ``pending`` set and the shell calls ``ext_proc.admit.truncation.finish_truncation``
   (async: it waits on the embedding worker, under the profile's deadline), which plans the
   truncation, edits the body and judges the shorter request with the rest of the ladder.
5. ``record`` counts a verdict and holds the blocks of a request that goes on in the
   in-flight ledger of its endpoint (or of the whole pool, when Envoy places it).

Invariants: nothing reaches the backend on a path ICE does not judge unless the policy or
the read-only list opens it; ``on_body`` returns ``None`` when the request passes untouched
and unannotated (not an inference request); every other outcome carries the verdict
headers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from ext_proc import telemetry
from ext_proc.admit.counting import H_TOKENS, bounds, same_verdict
from ext_proc.admit.headeronly import COARSE_LADDER, H_JUDGED, coarse_features
from ext_proc.admit.outcome import Continue, Respond, reject_outcome
from ext_proc.admit.routing import Route, Router
from ext_proc.admit.verdict import (
    BodyVerdict,
    HeaderFacts,
    PendingTruncation,
    make_verdict,
    shadow_answer_headers,
    shadowed,
    with_compacted_body,
    with_header,
)
from ext_proc.media import media_cost
from ext_proc.placement.endpoints import DESTINATION_HEADER, prefix_key
from ext_proc.placement.ledger_shm import LedgerHandle
from ext_proc.placement.placer import Placement, Placer, asleep_answer
from ext_proc.placement.poolview import Hold, PoolViews
from ext_proc.policy.decision import (
    Decision,
    Downgrade,
    Pass,
    Reject,
    Truncate,
    Truncated,
    verdict_headers,
)
from ext_proc.policy.evaluate import LADDER, LADDER_AFTER_TRUNCATION, Rule, Shape, evaluate
from ext_proc.policy.model import PRIORITIES, Policy
from ext_proc.schemas import (
    OPENAI_CHAT_FALLBACK,
    READ_ONLY_PATHS,
    BadRequest,
    RequestFeatures,
    SchemaAdapter,
    normal_path,
    rawjson,
    schema_for_path,
)
from ext_proc.signals.snapshot import PoolSnapshot

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "SPOOF_PREFIXES",
    "BodyVerdict",
    "HeaderFacts",
    "PendingTruncation",
    "Pipeline",
    "Route",
    "Router",
]

log = logging.getLogger("ice.pipeline")

DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
# Client-sent headers with these prefixes are removed: only ICE may set them.
SPOOF_PREFIXES = ("x-mem-pressure", "x-ice-", "x-downgraded")

SnapshotLookup = Callable[[str], PoolSnapshot | None]


def _upstream(verdict: BodyVerdict) -> bool:
    """The verdict sends the request on (pass, downgrade, or truncated)."""
    return verdict.features is not None and isinstance(
        verdict.decision, Pass | Downgrade | Truncated
    )


def _is_json(content_type: str) -> bool:
    if not content_type:
        return True  # many clients omit it; JSON backends parse the body regardless
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


class Pipeline:
    """Judges requests for one policy against snapshots from ``lookup``."""

    def __init__(
        self,
        policy: Policy,
        lookup: SnapshotLookup,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        carry: Pipeline | None = None,
        ledger: LedgerHandle | None = None,
    ) -> None:
        """``ledger``: this worker's handle on the host's shared ledger (``--workers N``).
        ``carry``: the pipeline this one replaces after a policy reload; its embedding
        client, its shared ledger handle, its in-flight KV ledger (when the pools' endpoints
        are unchanged) and its tokenizers (when their files and cache size are unchanged)
        are taken over."""
        self.router = Router(policy)
        self.lookup = lookup
        self.max_body_bytes = max_body_bytes
        self._priority_header = policy.priority_header
        pt = policy.prefix_tracking
        self._tenant_header = pt.tenant_header if pt is not None and pt.tenant_header else None
        self.policy = policy
        self.counters: Any = None
        # The embedding worker's client (ext_proc.truncate.client.EmbeddingClient), set by
        # the server when a profile truncates; None: truncation falls back to recency.
        self.similarity: Any = None
        # what each pool's snapshot says, once per snapshot; where requests are placed
        endpoints = {n: p.backend_endpoints for n, p in policy.pools.items()}
        old = carry.policy if carry is not None else None
        kept = old is not None and endpoints == {
            n: p.backend_endpoints for n, p in old.pools.items()
        }
        if carry is not None:
            ledger = carry.views.shared
        until_seen = frozenset(n for n, p in policy.pools.items() if p.kv_hold == "seen")
        if carry is not None and kept:
            self.views: PoolViews = carry.views
            self.views.until_seen = until_seen
        else:  # live reservations carry over: their holds release into the same totals
            live = carry.views.live if carry is not None else None
            self.views = PoolViews(endpoints, ledger, until_seen, live)
            if carry is not None:  # the replicas' shared ledger (--ledger) too
                self.views.remote = carry.views.remote
        self.placer = Placer(self.views)
        self._pick = {n: p.endpoint_pick for n, p in policy.pools.items()}
        if carry is not None:
            self.similarity = carry.similarity
        same_tokenizers = old is not None and (
            old.tokenizers == policy.tokenizers
            and old.token_count_cache_bytes == policy.token_count_cache_bytes
        )
        # the live prefix_stability_score: sampled requests' prompts (ext_proc/prefix/live.py)
        self.prefix: Any = None
        if policy.prefix_tracking is not None:
            from ext_proc.prefix.live import LivePrefix

            kept_prefix = carry.prefix if carry is not None and old is not None else None
            same = old is not None and old.prefix_tracking == policy.prefix_tracking
            self.prefix = LivePrefix.for_spec(policy.prefix_tracking, kept_prefix if same else None)
        if carry is not None and same_tokenizers:
            self.counters = carry.counters
        elif policy.tokenizers:  # loads every tokenizer now: a bad file stops start-up
            from ext_proc.tokencount import CounterRegistry

            self.counters = CounterRegistry(dict(policy.tokenizers), policy.token_count_cache_bytes)

    def on_headers(
        self, route: Route, headers: Iterable[tuple[str, bytes]], end_of_stream: bool
    ) -> HeaderFacts:
        """Read the request headers (raw bytes values; only the ones ICE uses are decoded)."""
        facts = HeaderFacts(priority=route.default_priority)
        path = content_type = content_length = method = ""
        queue = route.profile.queue
        queue_header = queue.tenant_header if queue is not None and queue.tenant_header else None
        for key, raw in headers:
            if key == ":path":
                path = raw.decode("latin-1")
            elif key == ":method":
                method = raw.decode("latin-1")
            elif key == "content-type":
                content_type = raw.decode("latin-1")
            elif key == "content-length":
                content_length = raw.decode("latin-1")
                if content_length.isdigit():
                    facts.content_length = int(content_length)
            elif key in (self._tenant_header, queue_header):
                value = raw.decode("latin-1").strip()
                if key == self._tenant_header:
                    facts.tenant = value
                if key == queue_header:
                    facts.queue_tenant = value
            elif key == self._priority_header:
                wanted = raw.decode("latin-1").strip().lower()
                for candidate in PRIORITIES:
                    if candidate == wanted:
                        facts.priority = candidate
            elif key.startswith(SPOOF_PREFIXES):
                facts.strip.append(key)
            elif key == DESTINATION_HEADER:
                if self._pick.get(route.pool) == "header":  # set by a trusted picker
                    facts.endpoint = raw.decode("latin-1").strip()
                else:  # only ICE may choose the endpoint (or nobody)
                    facts.strip.append(key)
        adapter = route.schema or schema_for_path(path)
        if adapter is None:
            plain = normal_path(path)
            opened = plain in self.policy.passthrough_paths
            if opened or (plain in READ_ONLY_PATHS and method in ("GET", "HEAD")):
                facts.skip_body = True
                telemetry.PASSTHROUGH.labels(route=route.name, reason="path").inc()
                return facts
            facts.answer = self._bad(
                route,
                OPENAI_CHAT_FALLBACK,
                404,
                "unknown_endpoint",
                f"{method or 'A request'} {plain} is not served by this gateway: it judges the "
                f"inference endpoints only (see docs/endpoints.md).",
                count=True,
            )
            return facts
        facts.adapter = adapter
        if not _is_json(content_type) and route.profile.content_types == "pass":
            facts.skip_body = True  # the profile leaves non-JSON to the backend
            telemetry.PASSTHROUGH.labels(route=route.name, reason="content_type").inc()
            return facts
        if not _is_json(content_type):
            # a judged endpoint reads JSON only: a body in another type is not judged, so it
            # does not go on (servers that sniff bodies would read it anyway)
            facts.answer = self._bad(
                route,
                adapter,
                415,
                "unsupported_media_type",
                f"This endpoint takes a JSON body (content-type: application/json), not "
                f"{content_type.split(';', 1)[0].strip()!r}.",
                count=route.profile.mode != "shadow",
            )
            return self._shadow_headers_phase(route, facts, "unsupported_media_type")
        shadow = route.profile.mode == "shadow"
        if end_of_stream:
            facts.answer = self._bad(
                route, adapter, 400, "empty_body", "The request body is empty.", count=not shadow
            )
            code = "empty_body"
        elif content_length.isdigit() and int(content_length) > self.max_body_bytes:
            facts.answer = self._bad(
                route,
                adapter,
                413,
                "request_too_large",
                f"The request body is {content_length} bytes; the limit is "
                f"{self.max_body_bytes} bytes.",
                count=not shadow,
            )
            code = "request_too_large"
        else:
            code = ""
        return self._shadow_headers_phase(route, facts, code)

    def _shadow_headers_phase(self, route: Route, facts: HeaderFacts, code: str) -> HeaderFacts:
        """A shadow profile gives no answer at the headers: the request goes on, unjudged by
        its body, saying what the answer would have been."""
        if facts.answer is None or route.profile.mode != "shadow":
            return facts
        pressure = self.views.pressure(route.profile, self.lookup(route.pool))
        facts.shadow_headers = shadow_answer_headers(code, pressure)
        telemetry.count_decision(route.name, "reject", code, mode="shadow")
        facts.answer, facts.skip_body = None, True
        return facts

    def needs_helper(self, body: bytes) -> bool:
        """Exact counting of a body this large belongs in the helper process."""
        return self.needs_helper_size(len(body))

    def needs_helper_size(self, nbytes: int) -> bool:
        return self.counters is not None and nbytes > self.policy.exact_count_inline_bytes

    def on_size(self, route: Route, facts: HeaderFacts, nbytes: int) -> BodyVerdict:
        """The coarse verdict (``ext_proc.admit.headeronly``) on a request of ``nbytes`` body bytes,
        judged without its body: pass, or a 429 in the API's format; ``x-ice-judged:
        headers``. ``facts.adapter`` must be set."""
        adapter = facts.adapter or OPENAI_CHAT_FALLBACK
        features = coarse_features(adapter, nbytes, route.profile.max_model_len)
        decision, placement = self.judge(route, facts, features, COARSE_LADDER)
        if route.profile.mode == "shadow":
            would = (decision.decision, decision.reason)
            verdict = shadowed(would, features, adapter, b"", placement, decision.pressure)
        else:
            verdict = make_verdict(decision, features, adapter, b"", placement)
        judged = [*verdict.outcome.headers, (H_JUDGED, "headers")]
        return replace(verdict, outcome=replace(verdict.outcome, headers=judged))

    def _exact_count(
        self, adapter: SchemaAdapter, features: RequestFeatures, values: dict[str, Any], size: int
    ) -> RequestFeatures:
        """Replace the estimate with the model tokenizer's exact count, when one is set."""
        from ext_proc.tokencount import TokenCountError

        counter = self.counters.counter_for(features.model)
        if counter is None:
            return features
        try:
            exact = counter.prompt_counts(features.schema, values)
        except TokenCountError:  # judged at the estimate's upper bound (ext_proc.admit.counting)
            return replace(bounds(features, size)[1], input_tokens_source="fallback")
        media = features.media_tokens  # the tokenizer sees placeholders, not the media
        counts = tuple(c + media for c in exact)
        return replace(
            features,
            input_tokens=max(counts),
            prompt_tokens=counts if len(counts) > 1 else (),
            input_tokens_source="exact",
            count_mode=counter.count_mode,
        )

    def recount(
        self, adapter: SchemaAdapter, shorter: RequestFeatures, body: bytes
    ) -> RequestFeatures:
        """The truncated body's exact count, when the original was counted exactly and the
        new body is small enough to count on the event loop (``exact_count_inline_bytes``);
        otherwise ``shorter`` as it is: the planner's figure, input − saved, where saved is
        the dropped turns' share of the exact count."""
        if len(body) <= self.policy.exact_count_inline_bytes:
            recounted = self._exact_count(adapter, shorter, rawjson.decode_object(body), len(body))
            if recounted.input_tokens_source == "exact":
                return recounted
        return shorter

    def _bad(
        self,
        route: Route,
        adapter: SchemaAdapter,
        status: int,
        code: str,
        message: str,
        param: str | None = None,
        *,
        count: bool = False,
    ) -> Respond:
        """A 4xx for a request that broke its API's contract, with the verdict headers;
        ``count``: counted in ``ice_bad_requests_total`` here (the headers phase; a body
        verdict is counted by ``record``)."""
        if count:
            telemetry.BAD_REQUESTS.labels(route=route.name, reason=code).inc()
        verdict = Reject(
            self.views.pressure(route.profile, self.lookup(route.pool)),
            status,
            code,
            message,
            param,
        )
        return reject_outcome(
            adapter, status, code, message, param, extra_headers=verdict_headers(verdict)
        )

    def _bad_body(
        self,
        route: Route,
        adapter: SchemaAdapter,
        status: int,
        code: str,
        message: str,
        param: str | None = None,
    ) -> BodyVerdict:
        """A body that breaks the API: the 400 in its format (a shadow profile: the request
        goes on, saying so)."""
        if route.profile.mode == "shadow":
            pressure = self.views.pressure(route.profile, self.lookup(route.pool))
            return shadowed(("reject", code), None, adapter, b"", None, pressure)
        outcome = self._bad(route, adapter, status, code, message, param)
        return BodyVerdict(None, None, outcome, bad=code)

    def record(self, route: Route, verdict: BodyVerdict) -> Hold | None:
        """Count a body verdict in ICE's metrics (kept apart from ``on_body``, which may run
        in the offload process); a request that goes upstream holds its KV blocks in the
        ledger: its reservation, for ``views.release`` when its stream ends."""
        self.count(route, verdict)
        return self.hold_of(route, verdict)

    def count(self, route: Route, verdict: BodyVerdict) -> None:
        """``record``'s counting: the verdict's metrics, and the endpoint ICE picked."""
        if verdict.shadow is not None:
            telemetry.count_decision(route.name, *verdict.shadow, mode="shadow")
        elif verdict.bad is not None:
            telemetry.BAD_REQUESTS.labels(route=route.name, reason=verdict.bad).inc()
        elif verdict.decision is not None:
            telemetry.count_decision(route.name, verdict.decision.decision, verdict.decision.reason)
        f = verdict.features
        if f is not None:
            telemetry.count_input_tokens(f.input_tokens_source)
            if f.count_mode:
                telemetry.TOKEN_COUNTS.labels(mode=f.count_mode).inc()
            telemetry.count_shape(route.name, f.sequences, f.media_parts)
        placed = verdict.placement
        if _upstream(verdict) and placed is not None and placed.picked:
            self.placer.sent(route.pool, placed)
            telemetry.count_pick(route.pool, placed.endpoint or "")

    def hold_of(self, route: Route, verdict: BodyVerdict) -> Hold | None:
        """``record``'s holding: a request that goes upstream holds its blocks (all its
        sequences) at its endpoint ("" when Envoy places it) in the in-flight ledger."""
        d, f = verdict.decision, verdict.features
        if f is None or not _upstream(verdict):
            return None
        then = d.then if isinstance(d, Truncated) else d
        output = then.max_tokens if isinstance(then, Downgrade) else f.max_tokens
        output = (output or route.profile.min_output_tokens) if f.generates else 0
        shape = Shape.of(f, route.profile)
        placed = verdict.placement
        endpoint = placed.endpoint if placed is not None and placed.endpoint else ""
        return self.views.hold(route.profile, self.lookup(route.pool), shape, output, endpoint)

    def on_body(self, route: Route, facts: HeaderFacts, body: bytes) -> BodyVerdict | None:
        """The body's verdict (None: not an inference body); a profile with
        ``compact_system_json`` judges and forwards the compacted body."""
        adapter = facts.adapter
        if adapter is None:
            return None
        compacted: list[tuple[str, str]] = []
        if route.profile.compact_system_json and route.profile.mode != "shadow":
            from ext_proc.sysprompt.complexity import maybe_compact

            got = maybe_compact(True, body, adapter.name)
            if got is not None:  # judged, and sent on, as compacted
                body, compacted = got
        verdict = self._judge_body(route, facts, adapter, body)
        if compacted and verdict is not None:
            verdict = with_compacted_body(verdict, body, compacted)
        return verdict

    def _judge_body(
        self, route: Route, facts: HeaderFacts, adapter: SchemaAdapter, body: bytes
    ) -> BodyVerdict | None:
        try:
            values = rawjson.decode_object(body)
            features = adapter.features(values, media_cost(route.profile.media))
        except rawjson.InvalidJSON as e:
            message = f"The request body is not valid JSON: {e}."
            return self._bad_body(route, adapter, 400, "invalid_json", message)
        except BadRequest as e:
            return self._bad_body(route, adapter, 400, e.code, e.message, e.param)
        except RecursionError:
            message = "The request body is not valid JSON: the JSON is nested too deeply."
            return self._bad_body(route, adapter, 400, "invalid_json", message)
        if self.prefix is not None:
            self.prefix.observe_request(
                route.name, values, features, len(body), facts.tenant, self.counters
            )
        picks = self._pick.get(route.pool) == "ice"
        prefix = prefix_key(features.schema, values) if picks else None
        counted = self.counters is not None and self.counters.counter_for(features.model)
        decided: tuple[Decision, Placement] | None = None
        if counted and self.policy.exact_count == "needed":  # the estimate may decide
            lo, hi = bounds(features, len(body))
            low, _ = self.judge(route, facts, lo, LADDER, prefix)
            high = self.judge(route, facts, hi, LADDER, prefix)
            if same_verdict(low, high[0]):
                features, decided = hi, high
        if decided is None and self.counters is not None:
            features = self._exact_count(adapter, features, values, len(body))
        decision, placement = decided or self.judge(route, facts, features, LADDER, prefix)
        if route.profile.mode == "shadow":
            would = (decision.decision, decision.reason)
            return shadowed(would, features, adapter, body, placement, decision.pressure)
        spec = route.profile.truncation
        if isinstance(decision, Truncate) and spec is not None:
            from ext_proc.truncate.runner import conversation_for

            conv = conversation_for(features.schema, values, spec, media_cost(route.profile.media))
            waiting = Continue(verdict_headers(Pass(decision.pressure)), None)
            pending = PendingTruncation(conv, body)
            return BodyVerdict(decision, features, waiting, pending=pending, placement=placement)
        verdict = make_verdict(decision, features, adapter, body, placement)
        if counted:
            used = "exact" if features.input_tokens_source == "exact" else "estimate"
            verdict = with_header(verdict, H_TOKENS, used)
        return verdict

    def judge(
        self,
        route: Route,
        facts: HeaderFacts,
        features: RequestFeatures,
        ladder: tuple[Rule, ...],
        prefix: str | None = None,
    ) -> tuple[Decision, Placement]:
        """Place the request (``ext_proc.placement.placer``) and run ``ladder`` against one read of
        the pool's snapshot (``PoolViews`` figures) and the placement's KV room; a pool whose
        every endpoint sleeps answers 503 ``backend_asleep`` (``placement.asleep_answer``)."""
        snapshot = self.lookup(route.pool)
        views = self.views
        if snapshot is not None and snapshot.asleep:  # every endpoint sleeps: nowhere to go
            pressure = views.pressure(route.profile, snapshot)
            return asleep_answer(route.profile, pressure), Placement()
        mode = self._pick.get(route.pool, "none")
        kv, placement = self.placer.place(
            mode, route.profile, snapshot, features, facts.endpoint, prefix, facts.subset
        )
        decision = evaluate(
            features,
            views.pressure(route.profile, snapshot),
            route.profile,
            facts.priority,
            kv,
            views.drain(snapshot),
            ladder=ladder,
            cache_efficiency=views.efficiency(snapshot) if route.profile.truncation else None,
        )
        return decision, placement

    def rejudge(
        self, route: Route, facts: HeaderFacts, first: BodyVerdict, body: bytes
    ) -> BodyVerdict:
        """A queued request judged again (``ext_proc.admit.queue``): its features as first
        judged, against the pool's view now, with the ladder less history truncation."""
        features, adapter = first.features, facts.adapter
        assert features is not None and adapter is not None
        compacted: list[tuple[str, str]] = []
        if route.profile.compact_system_json:
            from ext_proc.sysprompt.complexity import maybe_compact

            got = maybe_compact(True, body, adapter.name)
            if got is not None:
                body, compacted = got
        prefix = None
        if self._pick.get(route.pool) == "ice":
            prefix = prefix_key(features.schema, rawjson.decode_object(body))
        decision, placement = self.judge(route, facts, features, LADDER_AFTER_TRUNCATION, prefix)
        verdict = make_verdict(decision, features, adapter, body, placement)
        for key, value in first.outcome.headers:
            if key == H_TOKENS:
                verdict = with_header(verdict, key, value)
        return with_compacted_body(verdict, body, compacted) if compacted else verdict
