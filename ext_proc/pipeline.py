"""The request's way through ICE, free of gRPC: route → headers → body → outcome.

1. ``Router.resolve`` maps the route's gRPC metadata (``x-ice-route``, ``x-ice-profile``,
   ``x-ice-pool``, ``x-ice-priority``) to a ``Route``.
2. ``on_headers`` reads the request headers once: the schema adapter for the path, whether
   the body is JSON, the priority header, spoofed ICE headers to strip, and the answers that
   need no body (empty body → 400, declared length over the limit → 413).
3. ``on_body`` parses the body once, extracts features, reads the pool's snapshot, runs the
   evaluator and plans the edits.
4. When the evaluator asks to truncate history, ``on_body`` returns the verdict with
   ``pending`` set and ``finish_truncation`` (async: it waits on the embedding worker, under
   the profile's deadline) plans the truncation, edits the body and judges the shorter
   request with the rest of the ladder.

Invariant: ``on_body`` returns ``None`` when the request passes untouched and unannotated
(not an inference request); every other outcome carries the verdict headers.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from ext_proc import rawjson, telemetry
from ext_proc.decision import (
    Decision,
    Downgrade,
    Pass,
    Reject,
    Truncate,
    Truncated,
    verdict_headers,
)
from ext_proc.kv.geometry import KVGeometry, build_geometry
from ext_proc.plan import Continue, Outcome, Respond, plan, reject_outcome
from ext_proc.policy.evaluate import LADDER_AFTER_TRUNCATION, KvFit, evaluate
from ext_proc.policy.model import PRIORITIES, Policy, PressureModel, Priority, Profile
from ext_proc.policy.pressure import Pressure, pressure_of
from ext_proc.policy.scores import DrainInputs, cache_efficiency_ratio, drain_inputs
from ext_proc.schemas import BadRequest, RequestFeatures, SchemaAdapter, adapter_for_path
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


@dataclass(frozen=True, slots=True)
class Route:
    """What a route's gRPC metadata selects. ``key`` rebuilds it: ``Router.route_for(key)``."""

    name: str
    profile: Profile
    pool: str
    default_priority: Priority
    key: tuple[str, str, str, str] = ("", "", "", "")


class Router:
    """Resolves route metadata against the policy; unknown names fall back to defaults."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self._cache: dict[tuple[str, str, str, str], Route] = {}
        self._warned: set[str] = set()

    def resolve(self, metadata: Iterable[tuple[str, str | bytes]]) -> Route:
        name = profile = pool = priority = ""
        for key, value in metadata:
            if not key.startswith("x-ice-") or not isinstance(value, str):
                continue
            if key == "x-ice-route":
                name = value
            elif key == "x-ice-profile":
                profile = value
            elif key == "x-ice-pool":
                pool = value
            elif key == "x-ice-priority":
                priority = value
        return self.route_for((name, profile, pool, priority))

    def route_for(self, key: tuple[str, str, str, str]) -> Route:
        """The route for metadata values (route, profile, pool, priority)."""
        route = self._cache.get(key)
        if route is None:
            route = self._build(*key)
            if len(self._cache) < 1024:
                self._cache[key] = route
        return route

    def _warn_once(self, what: str) -> None:
        if what not in self._warned:
            self._warned.add(what)
            log.warning("%s; using the default", what)

    def _build(self, name: str, profile: str, pool: str, priority: str) -> Route:
        p = self.policy
        binding = p.routes.get(name)
        if binding is not None:
            profile = profile or binding.profile
            pool = pool or binding.pool
            priority = priority or (binding.priority or "")
        if profile and profile not in p.profiles:
            self._warn_once(f"route {name or '?'} names unknown profile {profile!r}")
            profile = ""
        if pool and pool not in p.pools:
            self._warn_once(f"route {name or '?'} names unknown pool {pool!r}")
            pool = ""
        prof = p.profiles[profile or p.default_profile]
        prio: Priority = prof.default_priority
        for candidate in PRIORITIES:
            if candidate == priority:
                prio = candidate
        return Route(
            name=name or "default",
            profile=prof,
            pool=pool or p.default_pool,
            default_priority=prio,
            key=(name, profile, pool, priority),
        )


@dataclass(slots=True)
class HeaderFacts:
    """What the request headers said, kept for the body phase."""

    adapter: SchemaAdapter | None = None
    priority: Priority = "standard"
    strip: list[str] = field(default_factory=list)
    answer: Respond | None = None  # set when the request is answered without its body
    skip_body: bool = False  # not an inference request: do not send the body to ICE


@dataclass(frozen=True, slots=True)
class PendingTruncation:
    """What ``finish_truncation`` needs: the decoded body and the original bytes."""

    values: dict[str, Any]
    body: bytes


@dataclass(frozen=True, slots=True)
class BodyVerdict:
    """A body-phase result: the decision (None when the body broke the API and ``bad`` holds
    the reason code) and its outcome. With ``pending`` set the decision is a ``Truncate``
    and ``outcome`` a placeholder: ``Pipeline.finish_truncation`` makes the real verdict."""

    decision: Decision | None
    features: RequestFeatures | None
    outcome: Outcome
    bad: str | None = None
    pending: PendingTruncation | None = None


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
    ) -> None:
        self.router = Router(policy)
        self.lookup = lookup
        self.max_body_bytes = max_body_bytes
        self._priority_header = policy.priority_header
        self.policy = policy
        self.counters: Any = None
        # The embedding worker's client (ext_proc.truncate.client.EmbeddingClient), set by
        # the server when a profile truncates; None: truncation falls back to recency.
        self.similarity: Any = None
        self._efficiency_cache: dict[str, tuple[PoolSnapshot, float | None]] = {}
        # pool → (time.monotonic() it was passed, KV blocks) of requests sent upstream
        self._inflight: dict[str, deque[tuple[float, int]]] = {}
        if policy.tokenizers:  # loads every tokenizer now: a bad file stops start-up
            from ext_proc.tokencount import CounterRegistry

            self.counters = CounterRegistry(dict(policy.tokenizers))
        self._drain_cache: dict[str, tuple[PoolSnapshot, DrainInputs | None]] = {}
        self._kv_cache: dict[tuple[str, str], tuple[PoolSnapshot, KvFit | None]] = {}
        self._geometries: dict[tuple[str, int], KVGeometry] = {}
        self._pressure_cache: dict[
            tuple[str, PressureModel], tuple[PoolSnapshot, Pressure | None]
        ] = {}

    def on_headers(
        self, route: Route, headers: Iterable[tuple[str, bytes]], end_of_stream: bool
    ) -> HeaderFacts:
        """Read the request headers (raw bytes values; only the ones ICE uses are decoded)."""
        facts = HeaderFacts(priority=route.default_priority)
        path = content_type = content_length = ""
        for key, raw in headers:
            if key == ":path":
                path = raw.decode("latin-1")
            elif key == "content-type":
                content_type = raw.decode("latin-1")
            elif key == "content-length":
                content_length = raw.decode("latin-1")
            elif key == self._priority_header:
                wanted = raw.decode("latin-1").strip().lower()
                for candidate in PRIORITIES:
                    if candidate == wanted:
                        facts.priority = candidate
            elif key.startswith(SPOOF_PREFIXES):
                facts.strip.append(key)
        adapter = adapter_for_path(path)
        if adapter is None or not _is_json(content_type):
            facts.skip_body = True
            reason = "path" if adapter is None else "content_type"
            telemetry.PASSTHROUGH.labels(route=route.name, reason=reason).inc()
            return facts
        facts.adapter = adapter
        if end_of_stream:
            telemetry.BAD_REQUESTS.labels(route=route.name, reason="empty_body").inc()
            facts.answer = self._bad(
                route, adapter, 400, "empty_body", "The request body is empty."
            )
        elif content_length.isdigit() and int(content_length) > self.max_body_bytes:
            telemetry.BAD_REQUESTS.labels(route=route.name, reason="request_too_large").inc()
            facts.answer = self._bad(
                route,
                adapter,
                413,
                "request_too_large",
                f"The request body is {content_length} bytes; the limit is "
                f"{self.max_body_bytes} bytes.",
            )
        return facts

    def _pressure(self, route: Route, snapshot: PoolSnapshot | None) -> Pressure | None:
        """The pool's pressure under the route's model, computed once per snapshot."""
        if snapshot is None:
            return None
        model = route.profile.pressure
        key = (route.pool, model)
        cached = self._pressure_cache.get(key)
        if cached is not None and cached[0] is snapshot:
            return cached[1]
        pressure = pressure_of(snapshot, model)
        self._pressure_cache[key] = (snapshot, pressure)
        return pressure

    def needs_helper(self, body: bytes) -> bool:
        """Exact counting of a body this large belongs in the helper process."""
        return self.counters is not None and len(body) > self.policy.exact_count_inline_bytes

    def _exact_count(
        self, adapter: SchemaAdapter, features: RequestFeatures, values: dict[str, Any], size: int
    ) -> RequestFeatures:
        """Replace the estimate with the model tokenizer's exact count, when one is set."""
        from ext_proc.tokencount import TokenCountError

        counter = self.counters.counter_for(features.model)
        if counter is None:
            return features
        try:
            exact = counter.count_request(adapter.name, values)
        except TokenCountError:
            return replace(features, input_tokens_source="fallback")
        return replace(features, input_tokens=exact, input_tokens_source="exact")

    def _drain(self, snapshot: PoolSnapshot) -> DrainInputs | None:
        cached = self._drain_cache.get(snapshot.pool)
        if cached is not None and cached[0] is snapshot:
            return cached[1]
        drain = drain_inputs(snapshot)
        self._drain_cache[snapshot.pool] = (snapshot, drain)
        return drain

    def _room(self, route: Route, snapshot: PoolSnapshot | None) -> KvFit | None:
        """The pool's KV room less the blocks of the requests this worker passed since the
        snapshot was taken: the view cannot show them yet, and a burst that arrives between
        two scrapes would otherwise be judged against the same free blocks, request after
        request. A request counts until a view taken after it arrives (then the backend's own
        gauges hold it, or its queue does); per worker, never twice."""
        fit = self._kv_fit(route, snapshot)
        if fit is None or snapshot is None:
            return fit
        entries = self._inflight.get(route.pool)
        if not entries:
            return fit
        taken = snapshot.taken_at_s
        while entries and entries[0][0] <= taken:  # oldest first: what the view now shows
            entries.popleft()
        held = sum(blocks for _, blocks in entries)
        return replace(fit, free_blocks=max(0, fit.free_blocks - held)) if held else fit

    def _hold(self, route: Route, verdict: BodyVerdict) -> None:
        """Remember the blocks of a request that goes upstream (see ``_room``)."""
        d, f = verdict.decision, verdict.features
        if f is None or not isinstance(d, Pass | Downgrade | Truncated):
            return
        fit = self._kv_fit(route, self.lookup(route.pool))
        if fit is None:
            return
        then = d.then if isinstance(d, Truncated) else d
        output = then.max_tokens if isinstance(then, Downgrade) else f.max_tokens
        blocks = fit.blocks(f.input_tokens, output or route.profile.min_output_tokens)
        entries = self._inflight.setdefault(route.pool, deque())
        entries.append((time.monotonic(), blocks))
        if len(entries) > 4096:  # no view for a long while: keep the newest
            entries.popleft()

    def _kv_fit(self, route: Route, snapshot: PoolSnapshot | None) -> KvFit | None:
        """The pool's KV room for the route's model, built once per snapshot."""
        if snapshot is None:
            return None
        key = (route.pool, route.profile.name)
        cached = self._kv_cache.get(key)
        if cached is not None and cached[0] is snapshot:
            return cached[1]
        fit: KvFit | None = None
        free, usable, bs = (
            snapshot.max_free_blocks,
            snapshot.max_usable_blocks,
            snapshot.block_size,
        )
        if free is not None and usable is not None and bs is not None:
            reuse = self._efficiency(snapshot)
            fit = KvFit(free, usable, bs, self._blocks_fn(route.profile, bs, reuse or 0.0))
        self._kv_cache[key] = (snapshot, fit)
        return fit

    def _blocks_fn(
        self, profile: Profile, block_size: int, reuse: float
    ) -> Callable[[int, int], int]:
        """Blocks a request of (input, output) tokens needs, less the whole blocks of its
        expected prefix-cache hit: cached = floor(input × reuse), where reuse is the pool's
        recent hit ratio (``cache_efficiency_ratio``); vLLM always recomputes the last prompt
        token, so at most input − 1 tokens are reused."""
        spec = profile.kv_model
        if spec is None:

            def full_attention(i: int, o: int) -> int:
                hit = min(int(i * reuse), i - 1) if i > 1 else 0
                return -(-(i + o) // block_size) - hit // block_size

            return full_attention
        key = (profile.name, block_size)
        geometry = self._geometries.get(key)
        if geometry is None:
            geometry = self._geometries[key] = build_geometry(
                spec.shape,
                tp=spec.tp,
                kv_dtype=spec.kv_dtype,
                block_size=block_size,
                max_num_batched_tokens=spec.max_num_batched_tokens,
            )
        if reuse <= 0:
            return geometry.request_blocks
        request_blocks = geometry.request_blocks
        return lambda i, o: request_blocks(i, o, int(i * reuse))

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
        verdict = Reject(
            self._pressure(route, self.lookup(route.pool)), status, code, message, param
        )
        return reject_outcome(
            adapter, status, code, message, param, extra_headers=verdict_headers(verdict)
        )

    def record(self, route: Route, verdict: BodyVerdict) -> None:
        """Count a body verdict in ICE's metrics (kept apart from ``on_body``, which may run
        in the offload process)."""
        if verdict.bad is not None:
            telemetry.BAD_REQUESTS.labels(route=route.name, reason=verdict.bad).inc()
        elif verdict.decision is not None:
            d = verdict.decision
            telemetry.count_decision(route.name, d.decision, d.reason)
        if verdict.features is not None:
            telemetry.count_input_tokens(verdict.features.input_tokens_source)
        self._hold(route, verdict)

    def on_body(self, route: Route, facts: HeaderFacts, body: bytes) -> BodyVerdict | None:
        adapter = facts.adapter
        if adapter is None:
            return None
        try:
            values = rawjson.decode_object(body)
        except rawjson.InvalidJSON as e:
            message = f"The request body is not valid JSON: {e}."
            outcome = self._bad(route, adapter, 400, "invalid_json", message)
            return BodyVerdict(None, None, outcome, bad="invalid_json")
        try:
            features = adapter.features(values)
        except BadRequest as e:
            outcome = self._bad(route, adapter, 400, e.code, e.message, e.param)
            return BodyVerdict(None, None, outcome, bad=e.code)
        except RecursionError:
            message = "The request body is not valid JSON: the JSON is nested too deeply."
            outcome = self._bad(route, adapter, 400, "invalid_json", message)
            return BodyVerdict(None, None, outcome, bad="invalid_json")
        if self.counters is not None:
            features = self._exact_count(adapter, features, values, len(body))
        snapshot = self.lookup(route.pool)  # one read of the store per request
        pressure = self._pressure(route, snapshot)
        kv = self._room(route, snapshot)
        drain = self._drain(snapshot) if snapshot is not None else None
        efficiency = None
        if route.profile.truncation is not None and snapshot is not None:
            efficiency = self._efficiency(snapshot)
        decision = evaluate(
            features,
            pressure,
            route.profile,
            facts.priority,
            kv,
            drain,
            cache_efficiency=efficiency,
        )
        if isinstance(decision, Truncate):
            waiting = Continue(verdict_headers(Pass(pressure)), None)
            return BodyVerdict(decision, features, waiting, pending=PendingTruncation(values, body))
        return BodyVerdict(decision, features, plan(decision, adapter, body, features))

    def _efficiency(self, snapshot: PoolSnapshot) -> float | None:
        """The pool's cache_efficiency_ratio, computed once per snapshot."""
        cached = self._efficiency_cache.get(snapshot.pool)
        if cached is not None and cached[0] is snapshot:
            return cached[1]
        ratio = cache_efficiency_ratio(
            (b.derived, b.derived.prompt_tokens_per_s if b.derived else None, b.cache_hit_rate)
            for b in snapshot.backends
        )
        self._efficiency_cache[snapshot.pool] = (snapshot, ratio)
        return ratio

    async def finish_truncation(
        self, route: Route, facts: HeaderFacts, verdict: BodyVerdict
    ) -> BodyVerdict:
        """Carry out a pending ``Truncate`` (see ext_proc/truncate/runner.py), then judge the
        shorter request with the ladder's other rules."""
        from ext_proc.truncate.planner import Overflow, apply_plan
        from ext_proc.truncate.runner import truncate

        pending, decision, features = verdict.pending, verdict.decision, verdict.features
        adapter = facts.adapter
        spec = route.profile.truncation
        if pending is None or not isinstance(decision, Truncate) or features is None:
            return verdict
        if adapter is None or spec is None:
            return verdict
        result = await truncate(
            adapter.name,
            pending.values,
            features.input_tokens,
            decision.budget_tokens,
            spec,
            self.similarity,
        )
        tplan = result.plan
        if isinstance(tplan, Overflow) and decision.reason == "context_budget":
            # the context, not pressure, asked: judge the request as it is (a downgrade to the
            # room left, or 400 context_length_exceeded), as without truncation
            snapshot = self.lookup(route.pool)
            as_is = evaluate(
                features,
                self._pressure(route, snapshot),
                route.profile,
                facts.priority,
                self._room(route, snapshot),
                self._drain(snapshot) if snapshot is not None else None,
                ladder=LADDER_AFTER_TRUNCATION,
            )
            return BodyVerdict(as_is, features, plan(as_is, adapter, pending.body, features))
        if isinstance(tplan, Overflow):
            k = spec.keep_last_turns
            message = (
                f"The conversation cannot be shortened enough: the messages ICE must keep "
                f"(system messages, the current question and the last {k} turns) need about "
                f"{tplan.must_keep_tokens} tokens; the budget is {tplan.budget_tokens} tokens "
                f"({decision.reason.replace('_', ' ')})."
            )
            reject = Reject(
                decision.pressure, 400, "truncation_budget_exceeded", message, "messages"
            )
            return BodyVerdict(reject, features, plan(reject, adapter, pending.body, features))
        body = apply_plan(pending.body, tplan) if tplan.changed else pending.body
        placeholders = len(tplan.runs) if tplan.placeholder else 0
        shorter = replace(
            features,
            input_tokens=max(0, features.input_tokens - result.saved_tokens),
            message_count=len(tplan.kept_messages) + placeholders,
        )
        snapshot = self.lookup(route.pool)
        pressure = self._pressure(route, snapshot)
        kv = self._room(route, snapshot)
        drain = self._drain(snapshot) if snapshot is not None else None
        then = evaluate(
            shorter,
            pressure,
            route.profile,
            facts.priority,
            kv,
            drain,
            ladder=LADDER_AFTER_TRUNCATION,
        )
        if isinstance(then, Reject) or not tplan.changed:
            return BodyVerdict(then, shorter, plan(then, adapter, body, shorter))
        assert not isinstance(then, Truncate | Truncated)
        done = Truncated(
            then=then,
            reason=decision.reason,
            dropped_messages=tplan.dropped_messages,
            saved_tokens=result.saved_tokens,
            mode=tplan.mode,
            fallback=result.fallback,
        )
        telemetry.count_truncation(route.name, done.mode, done.fallback, done.saved_tokens)
        return BodyVerdict(done, shorter, plan(done, adapter, body, shorter))
