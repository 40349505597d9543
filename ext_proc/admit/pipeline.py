"""The request's way through ICE, free of gRPC: route → headers → body → verdict.

1. ``Router.resolve`` (``ext_proc.admit.routing``) maps the route's gRPC metadata
   (``x-ice-route``, ``x-ice-profile``, ``x-ice-pool``, ``x-ice-priority``) to a ``Route``.
2. ``on_headers`` reads the request headers once (``ext_proc.admit.headers``) into
   ``RequestFacts``, and words the answers that need no body in the API's format.
3. ``on_body`` decodes the body once (``rawjson.parse_object``; the profile's
   ``compact_system_json`` edits that decode, ``ext_proc.sysprompt.compact``), extracts
   features, reads the pool's snapshot, places the request on an endpoint
   (``ext_proc.placement.placer``: the pool's ``endpoint_pick``), runs the evaluator against
   that endpoint's room and plans the edits on the same decode
   (``ext_proc.admit.verdict.make_verdict``). The verdict carries the decode
   (``JudgedBody``): ``rejudge`` (the admission queue, the shared ledger) and truncation's
   finish reuse it.
4. When the evaluator asks to truncate history, ``on_body`` returns the verdict with
   ``pending`` set and the shell calls ``ext_proc.admit.truncation.finish_truncation``
   (async: it waits on the embedding worker, under the profile's deadline), which plans the
   truncation, edits the body and judges the shorter request with the rest of the ladder.
5. ``recorder.record`` (``ext_proc.admit.recorder``) counts a verdict and holds the blocks of a
   request that goes on in the in-flight ledger of its endpoint (or of the whole pool, when
   Envoy places it).

Invariants: nothing reaches the backend on a path ICE does not judge unless the policy or
the read-only list opens it; ``on_body`` returns ``None`` when the request passes untouched
and unannotated (not an inference request); every other outcome carries the verdict
headers; a request's body is decoded once, whatever way it takes; an exception while judging
a body is its API's 400 or a ``JudgeFault`` naming the stage (the shell's ``_fault``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import replace

from ext_proc import telemetry
from ext_proc.admit.body_priority import strip_priority
from ext_proc.admit.counting import H_TOKENS, bounds, exact_count, same_verdict
from ext_proc.admit.faults import judging
from ext_proc.admit.headers import DEFAULT_MAX_BODY_BYTES, SPOOF_PREFIXES, HeaderRules
from ext_proc.admit.identity import NOTHING_VOUCHED, Vouched
from ext_proc.admit.outcome import Continue, Respond, reject_outcome
from ext_proc.admit.recorder import Recorder, SnapshotLookup
from ext_proc.admit.reload_carry import carried_counters, carried_prefix, carried_views
from ext_proc.admit.routing import Route, Router
from ext_proc.admit.tenant_shares import check as share_check
from ext_proc.admit.verdict import (
    BodyVerdict,
    JudgedBody,
    PendingTruncation,
    RequestFacts,
    make_verdict,
    shadow_answer_headers,
    shadowed,
    with_header,
)
from ext_proc.media import media_cost
from ext_proc.placement.endpoints import prefix_key
from ext_proc.placement.ledger_shm import LedgerHandle
from ext_proc.placement.placer import Placement, Placer, asleep_answer
from ext_proc.placement.poolview import PoolViews
from ext_proc.placement.slo_book import slo_case
from ext_proc.policy.coarse import COARSE_LADDER, H_JUDGED, coarse_features, coarse_ladder
from ext_proc.policy.decision import (
    Decision,
    Pass,
    Reject,
    TruncateHistory,
    verdict_headers,
)
from ext_proc.policy.evaluate import LADDER, LADDER_AFTER_TRUNCATION, Rule, evaluate
from ext_proc.policy.settings import Policy
from ext_proc.prefix.live import LivePrefix
from ext_proc.schemas import (
    OPENAI_CHAT_FALLBACK,
    BadRequest,
    RequestFeatures,
    SchemaAdapter,
    rawjson,
)
from ext_proc.sysprompt.compact import maybe_compact
from ext_proc.tokencount import CounterRegistry
from ext_proc.tokencount.calibration import EstimateBounds
from ext_proc.truncate.runner import SimilaritySource, conversation_for

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "SPOOF_PREFIXES",
    "BodyVerdict",
    "Pipeline",
    "RequestFacts",
    "Route",
    "Router",
]

log = logging.getLogger("ice.pipeline")

_MESSAGES = frozenset({"messages"})  # walked element by element when a profile truncates


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
        self.policy = policy
        self.headers = HeaderRules(policy, max_body_bytes)
        # The embedding worker's client (ext_proc.truncate.client.EmbeddingClient), set by
        # the server when a profile truncates; None: truncation falls back to recency.
        self.similarity: SimilaritySource | None = carry.similarity if carry is not None else None
        # what each pool's snapshot says, once per snapshot; where requests are placed
        self.views: PoolViews = carried_views(policy, carry, ledger)
        self.placer = Placer(self.views)
        self.recorder = Recorder(self.views, self.placer, lookup, policy)
        self._pick = {n: p.endpoint_pick for n, p in policy.pools.items()}
        self.prefix: LivePrefix | None = carried_prefix(policy, carry)
        self.counters: CounterRegistry | None = carried_counters(policy, carry)

    # --- the headers phase -------------------------------------------------------------

    def on_headers(
        self,
        route: Route,
        headers: Iterable[tuple[str, bytes]],
        end_of_stream: bool,
        subset: frozenset[str] | None = None,
        vouched: Vouched = NOTHING_VOUCHED,
    ) -> RequestFacts:
        """Read the request headers (raw bytes values; only the ones ICE uses are decoded)
        and what Envoy vouches for (``vouched``: the identity's sources); ``answer`` set: the
        request is answered now; ``skip_body``: it passes unjudged."""
        facts, refusal = self.headers.read(route, headers, end_of_stream, subset, vouched)
        if facts.adapter is not None:
            found = "yes" if facts.identity_source else "no"
            telemetry.IDENTITIES.labels(route.name, route.identity.source, found).inc()
        if facts.skip_body:
            reason = "path" if facts.adapter is None else "content_type"
            telemetry.PASSTHROUGH.labels(route=route.name, reason=reason).inc()
        if refusal is None:
            return facts
        if refusal.counted:
            telemetry.BAD_REQUESTS.labels(route=route.name, reason=refusal.code).inc()
        if not refusal.shadowed:
            return replace(
                facts,
                answer=self._bad(
                    route, refusal.adapter, refusal.status, refusal.code, refusal.message
                ),
            )
        # a shadow profile gives no answer at the headers: the request goes on, unjudged by
        # its body, saying what the answer would have been
        pressure = self.views.pressure(route.profile, self.lookup(route.pool))
        telemetry.count_decision(route.name, "reject", refusal.code, mode="shadow")
        headers_ = shadow_answer_headers(refusal.code, pressure)
        return replace(facts, skip_body=True, shadow_headers=headers_)

    def _bad(
        self,
        route: Route,
        adapter: SchemaAdapter,
        status: int,
        code: str,
        message: str,
        param: str | None = None,
    ) -> Respond:
        """A 4xx for a request that broke its API's contract, with the verdict headers."""
        pressure = self.views.pressure(route.profile, self.lookup(route.pool))
        verdict = Reject(pressure, status, code, message, param)
        return reject_outcome(
            adapter, status, code, message, param, extra_headers=verdict_headers(verdict)
        )

    def needs_helper(self, body: bytes) -> bool:
        """Exact counting of a body this large belongs in the helper process."""
        return self.needs_helper_size(len(body))

    def needs_helper_size(self, nbytes: int) -> bool:
        return self.counters is not None and nbytes > self.policy.exact_count_inline_bytes

    def on_size(self, route: Route, facts: RequestFacts, nbytes: int) -> BodyVerdict:
        """The coarse verdict (``ext_proc.policy.coarse``) on a request of ``nbytes`` body
        bytes, judged without its body: pass, or a 429 in the API's format; ``x-ice-judged:
        headers``. ``facts.adapter`` must be set."""
        adapter = facts.adapter or OPENAI_CHAT_FALLBACK
        per_byte = self.counters.tokens_per_byte if self.counters is not None else 1.0
        features = coarse_features(adapter, nbytes, route.profile, per_byte)
        ladder = coarse_ladder(adapter.name, nbytes, route.profile, per_byte)
        decision, placement = self.judge(route, facts, features, ladder)
        verdict = make_verdict(decision, features, adapter, None, placement)
        return with_header(self._as_shadow(route, adapter, verdict), H_JUDGED, "headers")

    # --- the body phase ----------------------------------------------------------------

    def on_body(self, route: Route, facts: RequestFacts, raw: bytes) -> BodyVerdict | None:
        """The body's verdict (None: not an inference body); a profile with
        ``compact_system_json`` judges and forwards the compacted body."""
        adapter = facts.adapter
        if adapter is None:
            return None
        try:
            with judging("decode", client=True):
                body = self._decode(route, adapter, raw)
            with judging("features", client=True):
                features = adapter.features(body.doc.values, media_cost(route.profile.media))
        except rawjson.InvalidJSON as e:
            message = f"The request body is not valid JSON: {e}."
            return self._as_shadow(route, adapter, self._bad_body(route, adapter, message))
        except BadRequest as e:
            verdict = self._bad_body(route, adapter, e.message, e.code, e.param)
            return self._as_shadow(route, adapter, verdict)
        except RecursionError:
            message = "The request body is not valid JSON: the JSON is nested too deeply."
            return self._as_shadow(route, adapter, self._bad_body(route, adapter, message))
        values = body.doc.values
        with judging("judge"):  # the prefix's tracking and key: placement's inputs
            if self.prefix is not None:
                self.prefix.observe_request(
                    route.name, values, features, len(raw), facts.tenant, self.counters
                )
            if self._pick.get(route.pool) == "ice":
                body = replace(body, prefix=prefix_key(features.schema, values))
        with judging("plan"):  # what _judge_body does outside its count and judge stages
            verdict = self._judge_body(route, facts, adapter, body, features)
            return self._as_shadow(route, adapter, verdict)

    def _decode(self, route: Route, adapter: SchemaAdapter, raw: bytes) -> JudgedBody:
        """The body's one decode (its ``messages`` elements' spans too when the profile
        truncates), without a ``priority`` field the route's ``client_priority`` removes
        (``ext_proc.admit.body_priority``), compacted when the profile says so."""
        profile = route.profile
        doc = rawjson.parse_object(raw, _MESSAGES if profile.truncation else frozenset())
        pool = self.policy.pools.get(route.pool)
        stripped = strip_priority(
            doc, adapter.name, route.client_priority, pool.kind if pool else "vllm"
        )
        doc = stripped or doc
        got = maybe_compact(doc, adapter.name, enabled=profile.compact_system_json)
        if got is not None:  # judged, and sent on, as compacted
            compacted, headers = got
            return JudgedBody(compacted.text.encode("utf-8"), compacted, None, headers)
        if stripped is not None:  # judged, and sent on, without it
            return JudgedBody(stripped.text.encode("utf-8"), stripped, edited=True)
        return JudgedBody(raw, doc)

    def _bad_body(
        self,
        route: Route,
        adapter: SchemaAdapter,
        message: str,
        code: str = "invalid_json",
        param: str | None = None,
    ) -> BodyVerdict:
        """A body that breaks the API: the 400 in its format."""
        outcome = self._bad(route, adapter, 400, code, message, param)
        return BodyVerdict(None, None, outcome, bad=code)

    def _as_shadow(self, route: Route, adapter: SchemaAdapter, verdict: BodyVerdict) -> BodyVerdict:
        """``mode: shadow``, applied once, as the last step of every body verdict (the full
        one, the coarse one, a 400): the request goes on as it came, carrying the verdict
        enforce gives (``x-ice-shadow-decision``, ``-reason``), judged exactly as enforce
        judges it (the same decode, edits and ladder; a truncation is not carried out). An
        enforcing profile's verdict is returned as it is."""
        if route.profile.mode != "shadow":
            return verdict
        decision = verdict.decision
        if decision is None:  # a body that broke its API
            pressure = self.views.pressure(route.profile, self.lookup(route.pool))
            return shadowed(("reject", verdict.bad or ""), None, adapter, None, None, pressure)
        would = (decision.decision, decision.reason)
        f, body, placed = verdict.features, verdict.body, verdict.placement
        return shadowed(would, f, adapter, body, placed, decision.pressure)

    def _judge_body(
        self,
        route: Route,
        facts: RequestFacts,
        adapter: SchemaAdapter,
        body: JudgedBody,
        features: RequestFeatures,
    ) -> BodyVerdict:
        counter = self.counters.counter_for(features.model) if self.counters else None
        counted = counter is not None
        decided = None
        if counter is not None and self.policy.exact_count == "needed":  # the estimate may decide
            with judging("judge"):
                decided = self._by_estimate(route, facts, features, body, counter.bounds)
        if decided is not None:
            features, (decision, placement) = decided
        else:
            if self.counters is not None:
                with judging("count"):
                    values = body.doc.values
                    features = exact_count(self.counters, features, values, len(body.raw))
            with judging("judge"):
                decision, placement = self.judge(
                    route, facts, features, LADDER, prefix=body.prefix, waits=True
                )
        spec = route.profile.truncation
        if isinstance(decision, TruncateHistory) and spec is not None:
            media = media_cost(route.profile.media)
            conv = conversation_for(features.schema, body.doc.values, spec, media)
            waiting = Continue(verdict_headers(Pass(decision.pressure)), None)
            pending = PendingTruncation(conv)
            return BodyVerdict(
                decision, features, waiting, pending=pending, placement=placement, body=body
            )
        verdict = make_verdict(decision, features, adapter, body, placement)
        if counted:
            used = "exact" if features.input_tokens_source == "exact" else "estimate"
            verdict = with_header(verdict, H_TOKENS, used)
        return verdict

    def _by_estimate(
        self,
        route: Route,
        facts: RequestFacts,
        features: RequestFeatures,
        body: JudgedBody,
        estimate_bounds: EstimateBounds,
    ) -> tuple[RequestFeatures, tuple[Decision, Placement]] | None:
        """``exact_count: needed``: the verdict at the estimate's upper bound when both
        bounds give the same one (``ext_proc.admit.counting``); None: count exactly."""
        lo, hi = bounds(features, len(body.raw), estimate_bounds, body.doc.values)
        low, _ = self.judge(route, facts, lo, LADDER, prefix=body.prefix, waits=True)
        high = self.judge(route, facts, hi, LADDER, prefix=body.prefix, waits=True)
        return (hi, high) if same_verdict(low, high[0]) else None

    def judge(
        self,
        route: Route,
        facts: RequestFacts,
        features: RequestFeatures,
        ladder: tuple[Rule, ...],
        *,
        prefix: str | None = None,
        waits: bool = False,
        can_wait: bool = True,
    ) -> tuple[Decision, Placement]:
        """Place the request (``ext_proc.placement.placer``) and run ``ladder`` against one
        read of the pool's snapshot (``PoolViews`` figures) and the placement's KV room; a
        pool whose every endpoint sleeps answers 503 ``backend_asleep``. ``waits``: a critical
        request that does not fit may be sent to wait (``Profile.critical_waits``);
        ``can_wait``: the caller can queue a ``Wait`` (else it gets the 429 instead,
        ``policy.evaluate.waits_where_it_can``)."""
        snapshot = self.lookup(route.pool)
        views = self.views
        if snapshot is not None and snapshot.asleep:  # every endpoint sleeps: nowhere to go
            pressure = views.pressure(route.profile, snapshot)
            return asleep_answer(route.profile, pressure), Placement()
        mode = self._pick.get(route.pool, "none")
        # no live view: the last one's blocks, less what ICE itself holds (PoolViews.ledger_view)
        seen = views.judged_view(route.profile, route.pool, snapshot)
        # admission: slo (ext_proc.policy.slo_admit), on a live view only (fail-open)
        live = seen if seen is snapshot and route.profile.admission == "slo" else None
        slo_on = live is not None
        waited = time.monotonic() - facts.arrived_s
        budget = facts.slo.ttft_ms / 1000 - waited if slo_on and facts.slo.ttft_ms else None
        kv, placement = self.placer.place(
            mode, route.profile, seen, features, facts.endpoint, prefix, facts.subset, budget
        )
        if seen is not snapshot and kv is not None:
            placement = replace(placement, ledger_only=True)
        slo = None
        if live is not None:
            where, at = views.addresses(live), placement.endpoint
            slo = slo_case(views.slo, live, where, at, facts.slo, waited, features.input_tokens)
        decision = evaluate(
            features,
            views.pressure(route.profile, snapshot),
            route.profile,
            facts.priority,
            kv,
            views.drain(snapshot),
            ladder=ladder,
            cache_efficiency=views.efficiency(snapshot) if route.profile.truncation else None,
            critical_waits=waits and route.profile.critical_waits,
            can_wait=can_wait,
            slo=slo,
        )
        # the tenant's share of the pool (ext_proc.admit.tenant_shares)
        decision = share_check(
            self.policy, views, route, facts, features, decision, seen, can_wait=can_wait
        )
        return decision, placement

    def rejudge(
        self,
        route: Route,
        facts: RequestFacts,
        first: BodyVerdict,
        *,
        waits: bool = False,
        can_wait: bool = True,
    ) -> BodyVerdict:
        """A request judged again (the admission queue, the shared ledger): its features as
        first judged, on its body's one decode, against the pool's view now, with the ladder
        less history truncation (a verdict judged without its body: the coarse ladder);
        ``waits``: a critical one may still wait; ``can_wait``: a ``Wait`` can be queued
        (``judge``)."""
        features, adapter, body = first.features, facts.adapter, first.body
        assert features is not None and adapter is not None
        ladder = COARSE_LADDER if body is None else LADDER_AFTER_TRUNCATION
        prefix = body.prefix if body is not None else None
        decision, placement = self.judge(
            route, facts, features, ladder, prefix=prefix, waits=waits, can_wait=can_wait
        )
        verdict = make_verdict(decision, features, adapter, body, placement)
        for key, value in first.outcome.headers:
            if key in (H_TOKENS, H_JUDGED):
                verdict = with_header(verdict, key, value)
        return verdict

    def recount(self, shorter: RequestFeatures, body: JudgedBody) -> RequestFeatures:
        """A truncated body's exact count, when the original was counted exactly and the
        new body is small enough to count on the event loop (``exact_count_inline_bytes``);
        otherwise ``shorter`` as it is: the planner's figure, input − saved, where saved is
        the dropped turns' share of the exact count."""
        values = body.doc.values
        small = len(body.raw) <= self.policy.exact_count_inline_bytes
        if self.counters is not None and small and values.get("messages") is not rawjson.DROPPED:
            recounted = exact_count(self.counters, shorter, values, len(body.raw))
            if recounted.input_tokens_source == "exact":
                return recounted
        return shorter

    def exact_features(self, route: Route, facts: RequestFacts, raw: bytes) -> RequestFeatures:
        """The body's features with its exact count (a hold's recount in the helper process,
        ``ext_proc.serve.recount``): decoded as ``on_body`` decodes it."""
        assert facts.adapter is not None and self.counters is not None
        body = self._decode(route, facts.adapter, raw)
        features = facts.adapter.features(body.doc.values, media_cost(route.profile.media))
        return exact_count(self.counters, features, body.doc.values, len(body.raw))
