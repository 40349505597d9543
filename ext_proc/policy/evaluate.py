"""The evaluator: a degradation ladder of small rules over one request and one snapshot.

Pure: no I/O, no clock, no protobuf. ``evaluate`` is given everything it judges.

The ladder, first match wins:
0. ``truncate_history`` → ``TruncateHistory(budget)`` for chat requests of a profile with
   ``truncation`` when the input exceeds a budget (the smallest that applies):
   - ``pressure_budget``: truncation.budget_tokens[level] at the pool's current level;
   - ``cache_efficiency``: low_efficiency_budget_tokens while the pool's
     cache_efficiency_ratio < min_cache_efficiency;
   - ``context_budget``: when input > max_model_len − min_output_tokens (no useful output
     is left), the budget is max_model_len − output_buffer_tokens (or − min_output_tokens
     when the buffer is not smaller than max_model_len).
   Not when ``shed_by_priority`` would shed the request: shedding wins. The pipeline then
   runs the truncation plan and judges the shorter request with the rest of the ladder.
0a. ``reject_request_limits`` → 400 when the request's shape breaks the profile's caps:
   ``too_many_sequences`` (prompts × samples > max_sequences), ``too_many_inputs``
   (embeddings inputs > max_embedding_inputs), ``too_many_media_parts`` (media parts >
   max_media_parts), ``stored_context_unsupported`` (``stored_context: reject`` and part of
   the prompt is stored at the backend).
1. ``reject_oversized_input`` → 400 ``context_length_exceeded`` when the estimated input
   alone leaves no room for output: input_tokens ≥ max_model_len (embeddings, which have no
   output: input_tokens > max_model_len). ``input_tokens`` is the longest prompt's.
2. ``reject_beyond_kv_capacity`` → 400 ``kv_capacity_exceeded`` when the whole request (every
   sequence, with one output token each; none for embeddings) needs more KV blocks than the
   endpoint it is placed on has when idle: it can never fit there.
2a. ``judge_by_slo`` (``admission: slo``): 429 ``slo_unreachable`` when the predicted TTFT
   misses the request's target, ``Wait`` ``slo_tpot`` when its predicted TPOT does not fit
   (``ext_proc.policy.slo_admit``).
3. ``shed_by_priority`` → ``Wait`` (429 ``memory_pressure`` without a queue) when the
   pool's level is at or above the profile's shedding level for the request's priority
   (``critical`` is never shed). Retry-After comes from the pool's drain rate
   (``policy/scores.py``), bounded by the profile's retry_after_min_s..retry_after_max_s.
4. ``shed_on_kv_shortfall`` → ``Wait`` (429 ``kv_exhausted`` without a queue) when the input
   plus min_output_tokens needs more blocks than its endpoint has free, or, with
   ``on_kv_shortfall: shed``, when the client's requested output does not fit them. Never
   for ``critical``, unless ``critical_waits`` (a profile whose queue has ``critical:
   wait``): then the request waits in the queue, which never refuses it
   (``ext_proc.admit.queue``).
5. ``cap_output_tokens`` → ``Downgrade`` when the requested output exceeds
       limit = min(safe, cap[level], kv_fit)
   where safe = max(min(min_output_tokens, max_model_len - input),
                    max_model_len - input - output_buffer_tokens),
   cap[level] is the profile's cap for the current level (absent: no cap), and kv_fit is the
   largest output whose blocks, with the input's, fit the free blocks (``on_kv_shortfall:
   downgrade``, only for a limit the client set). When the client set no limit and the level
   has a cap, the cap is injected.
6. ``Pass``.

KV blocks of a request (``KvFit.need``), summed over its prompts (``Shape``: a completions
batch, batch chat and embeddings inputs are one prompt each) and its ``samples`` (n,
best_of) per prompt:
    need = Σ_prompts [ first(P, O) + (samples − 1) × sibling(P, O) ]
- first(P, O) = ceil((P + O) / block_size) for a full-attention model, or the ``ext_proc.kv``
  geometry's ``request_blocks`` (sliding-window and hybrid layer groups) when the profile
  names the model's config; less the whole blocks of the expected prefix-cache hit (P × the
  pool's recent hit ratio, at most P − 1). This errs towards admitting: a hit on blocks no
  running request holds still takes them off vLLM's free list.
- sibling(P, O): the same with the prompt's full blocks shared: ceil((P + O) / block_size) −
  floor((P − 1) / block_size), when every backend of the pool caches prefixes
  (``enable_prefix_caching``): vLLM splits ``n`` into child requests
  (``vllm/v1/engine/parallel_sampling.py``) whose prompt blocks hit the first child's cache
  (``KVCacheManager.get_computed_blocks``, at most P − 1 tokens). Otherwise sibling = first.
- With stored context (Responses ``previous_response_id`` …) each sequence fills the window:
  P is taken as max(P, max_model_len − O).
Free blocks are
floor((num_gpu_blocks − 1) × (1 − kv_cache_usage)) of the endpoint the request is placed on
(``ext_proc.placement.placer``: the one ICE picked, the one another picker named, or, when Envoy
places it, the one with the least room), less the blocks of the requests the worker passed
since the view was taken (``PoolViews.room``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ext_proc.policy.decision import Decision, Downgrade, Pass, Reject, TruncateHistory, Wait
from ext_proc.policy.kvfit import KvFit, Shape
from ext_proc.policy.output_limit import backend_output
from ext_proc.policy.pressure import Pressure
from ext_proc.policy.scores import DrainInputs, retry_after_s
from ext_proc.policy.settings import Priority, Profile
from ext_proc.policy.slo_admit import SloCase, judge_by_slo
from ext_proc.schemas.base import RequestFeatures

__all__ = [
    "LADDER",
    "LADDER_AFTER_TRUNCATION",
    "TRUNCATABLE_SCHEMAS",
    "Case",
    "KvFit",
    "Shape",
    "evaluate",
    "safe_output_tokens",
    "truncation_budget",
    "waits_where_it_can",
]

TRUNCATABLE_SCHEMAS = ("openai.chat", "anthropic.messages")


_NO_SHAPE = Shape.single(0)  # a Case built without a shape (tests)


@dataclass(frozen=True, slots=True)
class Case:
    """Everything a rule may look at."""

    features: RequestFeatures
    pressure: Pressure | None
    profile: Profile
    priority: Priority
    kv: KvFit | None = None
    drain: DrainInputs | None = None
    cache_efficiency: float | None = None
    shape: Shape = _NO_SHAPE
    critical_waits: bool = False  # a critical request that does not fit waits in the queue
    slo: SloCase | None = None  # admission: slo (ext_proc.policy.slo_admit)

    def retry_after(self, need_tokens: int) -> int:
        """Retry-After for this request from the pool's drain rate (see policy/scores.py)."""
        p = self.profile
        return retry_after_s(
            self.drain,
            need_tokens,
            min_s=p.retry_after_min_s,
            max_s=p.retry_after_max_s,
            fallback_s=p.retry_after_s,
        )


Rule = Callable[[Case], Decision | None]


def safe_output_tokens(profile: Profile, input_tokens: int) -> int | None:
    """The largest output that fits the context with the profile's buffer (None: no limit)."""
    if profile.max_model_len is None:
        return None
    room = profile.max_model_len - input_tokens
    floor = min(profile.min_output_tokens, room)
    return max(floor, room - profile.output_buffer_tokens)


# The parameter a 400 about a request's input names, by schema.
_INPUT_PARAM = {
    "openai.completions": "prompt",
    "openai.responses": "input",
    "openai.embeddings": "input",
    "vllm.generate": "token_ids",
    "sglang.generate": "text",
}


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _input_param(schema: str) -> str:
    return _INPUT_PARAM.get(schema, "messages")


def reject_request_limits(case: Case) -> Decision | None:
    f, p = case.features, case.profile

    def reject(reason: str, message: str, param: str | None) -> Reject:
        return Reject(case.pressure, 400, reason, message, param)

    if f.stored_context and p.stored_context == "reject":
        return reject(
            "stored_context_unsupported",
            "This gateway cannot judge a request whose prompt is partly stored at the server "
            "(previous_response_id, conversation, a stored prompt or an item_reference): send "
            "the whole conversation in 'input'.",
            "previous_response_id",
        )
    if f.generates and f.sequences > p.max_sequences:
        return reject(
            "too_many_sequences",
            f"The request starts {f.sequences} sequences ({_count(len(f.prompts), 'prompt')} × "
            f"{_count(f.samples, 'sample')}); this route allows at most {p.max_sequences} per "
            f"request.",
            "n" if f.samples > 1 else _input_param(f.schema),
        )
    if not f.generates and f.inputs > p.max_embedding_inputs:
        return reject(
            "too_many_inputs",
            f"The request has {f.inputs} inputs; this route allows at most "
            f"{p.max_embedding_inputs} per request.",
            "input",
        )
    if f.media_parts > p.max_media_parts:
        return reject(
            "too_many_media_parts",
            f"The request has {f.media_parts} image, audio or video parts; this route allows "
            f"at most {p.max_media_parts} per request.",
            _input_param(f.schema),
        )
    return None


def reject_oversized_input(case: Case) -> Decision | None:
    limit = case.profile.max_model_len
    f = case.features
    if limit is None:
        return None
    if f.generates and f.input_tokens < limit:
        return None
    if not f.generates and f.input_tokens <= limit:
        return None
    tail = "which leaves no room for output" if f.generates else "which is more than it reads"
    return Reject(
        pressure=case.pressure,
        status=400,
        reason="context_length_exceeded",
        message=(
            f"This model's maximum context length is {limit} tokens; the input is about "
            f"{f.input_tokens} tokens, {tail}."
        ),
        param=_input_param(f.schema),
    )


def reject_beyond_kv_capacity(case: Case) -> Decision | None:
    kv = case.kv
    if kv is None:
        return None
    f = case.features
    need = kv.need(case.shape, 1 if f.generates else 0)
    if need <= kv.usable_blocks:
        return None
    what = (
        f"The input (about {f.input_tokens} tokens)"
        if f.sequences == 1
        else f"The request ({f.sequences} sequences, the longest prompt about "
        f"{f.input_tokens} tokens)"
    )
    return Reject(
        pressure=case.pressure,
        status=400,
        reason="kv_capacity_exceeded",
        message=(
            f"{what} needs {need} KV-cache blocks of {kv.block_size} tokens; its "
            f"backend holds {kv.usable_blocks} blocks even when idle."
        ),
        param=_input_param(f.schema),
    )


def shed_on_kv_shortfall(case: Case) -> Decision | None:
    kv = case.kv
    mode = case.profile.on_kv_shortfall
    if kv is None or mode == "ignore" or (case.priority == "critical" and not case.critical_waits):
        return None
    f = case.features
    min_out = case.profile.min_output_tokens if f.generates else 0
    safe = safe_output_tokens(case.profile, f.input_tokens)
    if safe is not None:
        min_out = min(min_out, safe)
    need = kv.charge(case.shape, min_out)
    if need <= kv.free_blocks:
        if mode != "shed":
            return None
        # the output the request can really get: never more than the context budget (a
        # request without a limit: what the backend runs, policy/output_limit.py)
        asked = backend_output(f, case.profile)
        wanted = asked if safe is None or f.max_tokens is None else min(asked, safe)
        need = kv.charge(case.shape, wanted)
        if need <= kv.free_blocks:
            return None
    retry = case.retry_after(need * kv.block_size)
    return Wait(
        pressure=case.pressure,
        reason="kv_exhausted",
        message=(
            f"The request needs {need} KV-cache blocks; its backend has "
            f"{kv.free_blocks} free. Retry after {retry} s."
        ),
        retry_after_s=retry,
    )


def shed_by_priority(case: Case) -> Decision | None:
    p = case.pressure
    if p is None or case.priority == "critical":
        return None
    shed_level = case.profile.shed_at.get(case.priority)
    if shed_level is None or p.level < shed_level:
        return None
    f = case.features
    retry = case.retry_after(case.shape.tokens(backend_output(f, case.profile)))
    return Wait(
        pressure=p,
        reason="memory_pressure",
        message=(
            f"The inference backend is under {p.level.label} memory pressure "
            f"(score {p.score:.0f}/100); {case.priority}-priority requests are shed. "
            f"Retry after {retry} s."
        ),
        retry_after_s=retry,
    )


def cap_output_tokens(case: Case) -> Decision | None:
    f = case.features
    if not f.generates:
        return None
    safe = safe_output_tokens(case.profile, f.input_tokens)
    cap = case.profile.max_tokens_cap.get(case.pressure.level) if case.pressure else None
    if f.max_tokens is None:
        return _inject_limit(case, cap, safe)
    candidates = [
        (v, why) for v, why in ((safe, "context_budget"), (cap, "pressure_cap")) if v is not None
    ]
    limit, reason = min(candidates, key=lambda c: c[0]) if candidates else (f.max_tokens, "")
    kv = case.kv
    if kv is not None and case.profile.on_kv_shortfall == "downgrade":
        wanted = min(limit, f.max_tokens)
        fit = kv.output_fit(case.shape, wanted)
        if 0 < fit < wanted:
            limit, reason = fit, "kv_free_blocks"
    if f.max_tokens <= limit:
        return None
    return Downgrade(pressure=case.pressure, max_tokens=limit, original=f.max_tokens, reason=reason)


def _inject_limit(case: Case, cap: int | None, safe: int | None) -> Decision | None:
    """A request without a limit runs what the backend gives it (``backend_output``): a
    limit is injected when the level's cap, or (``on_kv_shortfall: downgrade``) what fits
    the free blocks, is less. The context budget (``safe``) only bounds an injected cap: the
    backend itself stops at the end of the context."""
    runs = backend_output(case.features, case.profile)
    limit, reason = runs, ""
    if cap is not None and cap < limit:
        limit, reason = (cap if safe is None else min(cap, safe)), "pressure_cap"
    kv = case.kv
    if kv is not None and case.profile.on_kv_shortfall == "downgrade":
        fit = kv.output_fit(case.shape, limit)
        if 0 < fit < limit:
            limit, reason = fit, "kv_free_blocks"
    if limit >= runs:
        return None
    return Downgrade(pressure=case.pressure, max_tokens=limit, original=None, reason=reason)


def truncation_budget(case: Case) -> tuple[int, str] | None:
    """The budget the input exceeds, and why (None: no truncation); see the ladder above."""
    spec = case.profile.truncation
    f = case.features
    if spec is None or f.schema not in TRUNCATABLE_SCHEMAS:
        return None
    found: list[tuple[int, str]] = []
    if case.pressure is not None:
        budget = spec.budget_tokens.get(case.pressure.level)
        if budget is not None and f.input_tokens > budget:
            found.append((budget, "pressure_budget"))
    low = spec.low_efficiency_budget_tokens
    eff = case.cache_efficiency
    low_eff = eff is not None and eff < spec.min_cache_efficiency
    if low is not None and low_eff and f.input_tokens > low:
        found.append((low, "cache_efficiency"))
    p = case.profile
    if p.max_model_len is not None and f.input_tokens > p.max_model_len - p.min_output_tokens:
        reserve = (
            p.output_buffer_tokens
            if p.output_buffer_tokens < p.max_model_len
            else p.min_output_tokens
        )
        found.append((max(1, p.max_model_len - reserve), "context_budget"))
    return min(found) if found else None


def truncate_history(case: Case) -> Decision | None:
    picked = truncation_budget(case)
    if picked is None or shed_by_priority(case) is not None:
        return None
    return TruncateHistory(pressure=case.pressure, budget_tokens=picked[0], reason=picked[1])


LADDER_AFTER_TRUNCATION: tuple[Rule, ...] = (
    reject_request_limits,
    reject_oversized_input,
    reject_beyond_kv_capacity,
    judge_by_slo,
    shed_by_priority,
    shed_on_kv_shortfall,
    cap_output_tokens,
)

LADDER: tuple[Rule, ...] = (
    reject_request_limits,
    truncate_history,
    reject_oversized_input,
    reject_beyond_kv_capacity,
    judge_by_slo,
    shed_by_priority,
    shed_on_kv_shortfall,
    cap_output_tokens,
)


def evaluate(
    features: RequestFeatures,
    pressure: Pressure | None,
    profile: Profile,
    priority: Priority,
    kv: KvFit | None = None,
    drain: DrainInputs | None = None,
    ladder: tuple[Rule, ...] = LADDER,
    cache_efficiency: float | None = None,
    critical_waits: bool = False,
    can_wait: bool = True,
    slo: SloCase | None = None,
) -> Decision:
    """Judge one request; the first rule of the ladder that decides wins, else ``Pass``.
    ``can_wait``: the caller can queue a ``Wait`` (``waits_where_it_can``)."""
    shape = Shape.of(features, profile)
    case = Case(
        features,
        pressure,
        profile,
        priority,
        kv,
        drain,
        cache_efficiency,
        shape,
        critical_waits,
        slo,
    )
    for rule in ladder:
        decision = rule(case)
        if decision is not None:
            return waits_where_it_can(decision, profile, can_wait=can_wait)
    return Pass(pressure=pressure)


def waits_where_it_can(decision: Decision, profile: Profile, *, can_wait: bool = True) -> Decision:
    """The one mapping of a ``Wait``: it stays where the profile has an admission queue to
    wait in (and enforces) and the caller can queue it; elsewhere it is its 429
    (``Wait.refusal``): no queue, ``mode: shadow``, a request already truncated (its
    embeddings took its time), a conflict in the replicas' shared ledger (judged again
    after the queue)."""
    queued = profile.queue is not None and profile.mode != "shadow" and can_wait
    if isinstance(decision, Wait) and not queued:
        return decision.refusal()
    return decision
