"""ICE's own Prometheus metrics (exposed by ``ice serve --metrics-address``).

All metric objects live here so their names and labels are defined once (see
docs/configuration.md for the list). With ``--workers N`` the parent process serves the
workers' metrics through prometheus_client's multiprocess mode. Every name here is public:
the metric objects and the request path's counting helpers (their label lookups cached).
"""

from __future__ import annotations

import functools
import time

from prometheus_client import Counter, Gauge, Histogram

DECISIONS = Counter(
    "ice_decisions",
    "Evaluated requests by route, decision and reason; mode shadow: the verdict a shadow "
    "profile would have given (the request went on unchanged).",
    ["route", "decision", "reason", "mode"],
)
BAD_REQUESTS = Counter(
    "ice_bad_requests",
    "Requests ICE answered with a 4xx because their body broke the API contract.",
    ["route", "reason"],
)
IDENTITIES = Counter(
    "ice_identities",
    "Judged requests by where their tenant came from (docs/identity.md): source jwt, mtls, "
    "header or trust; found: yes, or no (then refused when the route requires it). Never "
    "labelled by the identity's value.",
    ["route", "source", "found"],
)
PASSTHROUGH = Counter(
    "ice_passthrough",
    "Requests ICE let through without evaluating them, by reason.",
    ["route", "reason"],
)
ERRORS = Counter(
    "ice_internal_errors",
    "Faults inside ICE while handling a request (the request failed open or closed).",
    ["phase", "fail_mode"],
)
JUDGE_ERRORS = Counter(
    "ice_judge_errors",
    "ICE's own faults in the body phase, by route and stage (decode, features, count, judge, "
    "plan; admit: after the verdict); the profile's fail_mode answered them.",
    ["route", "stage"],
)
# From the message's arrival in ICE's servicer to its answer being ready, per ext_proc phase;
# the body phase includes the offload helper and the truncation wait. Not seen here: gRPC's
# own time before the message reaches the servicer, and Envoy's.
PROCESSING_SECONDS = Histogram(
    "ice_processing_seconds",
    "Time ICE spent answering one ext_proc message, by phase.",
    ["phase"],
    buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
)
TOKEN_COUNTS = Counter(
    "ice_token_counts",
    "Exact prompt counts by how they were made: pieces (turns between the template's special "
    "tokens counted apart, from a cache when seen before) or whole (the tokenizer or template "
    "does not allow the split).",
    ["mode"],
)
# The flood guard (ext_proc/admit/backlog.py, ext_proc/policy/coarse.py).
COARSE_VERDICTS = Counter(
    "ice_coarse_verdicts",
    "Requests judged without their body because the worker was busy, by route and why: "
    "bytes (max_inflight_bytes), time (not judged before Envoy's message timeout), late (the "
    "body arrived too late to read), budget (exact counting ran past exact_count_budget_ms).",
    ["route", "why"],
)
BACKEND_OVERLOADS = Counter(
    "ice_backend_overloads",
    "A backend's own overload 503 (e.g. vLLM's admission valve) for a request ICE sent on, "
    "answered as ICE's refusal, by route and the status the client got.",
    ["route", "status"],
)
BODIES_DROPPED = Counter(
    "ice_bodies_dropped",
    "Bodies ICE did not judge (or whose verdict it did not count) because Envoy had given "
    "up on them: stream_closed (Envoy closed the stream), deadline (past message_timeout).",
    ["reason"],
)
BACKLOG_BYTES = Gauge(
    "ice_backlog_bytes",
    "Body bytes the workers have asked Envoy for and not yet answered (promised or arrived).",
    multiprocess_mode="livesum",
)
BACKLOG_WINDOW = Gauge(
    "ice_backlog_window_bytes",
    "Body bytes the workers admit at once now: max_inflight_bytes, halved when Envoy gave up "
    "on an admitted body and grown back by bodies answered in time.",
    multiprocess_mode="livesum",
)
# The admission queue (ext_proc/admit/queue.py).
QUEUE_DEPTH = Gauge(
    "ice_queue_depth",
    "Requests waiting in the admission queue, by pool and priority.",
    ["pool", "priority"],
    multiprocess_mode="livesum",
)
QUEUE_WAIT_SECONDS = Histogram(
    "ice_queue_wait_seconds",
    "Time requests spent in the admission queue, by pool and how they left it: admitted "
    "(re-judged with room), timeout (429 queue_timeout), gone (the client or Envoy left).",
    ["pool", "outcome"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
)
QUEUE_OUTCOMES = Counter(
    "ice_queue_outcomes",
    "Requests the admission queue took or refused, by pool, tenant (the first max_tenants "
    "names a worker sees; the rest are 'other') and outcome: admitted, timeout, full "
    "(refused at once: 429 queue_full), gone, shutdown (429 queue_shutdown as ICE stopped).",
    ["pool", "tenant", "outcome"],
)
SLO_WAITED_LATE = Counter(
    "ice_slo_waited_late",
    "Requests with a time-to-first-token target that waited in the admission queue and went "
    "upstream after their target had passed in the wait: sure misses (docs/slo.md).",
    ["pool"],
)
SCRAPE_ERRORS = Counter("ice_scrape_errors", "Failed scrapes of backend /metrics pages.", ["pool"])
TENANT_BLOCKS_HELD = Gauge(
    "ice_tenant_blocks_held",
    "KV blocks held by a tenant's requests in flight in a pool with tenant_shares (the blocks "
    "its share counts), by pool and tenant: the tenants the pool's tenant_shares names, every "
    "other tenant summed as other.",
    ["pool", "tenant"],
    multiprocess_mode="livesum",
)
TENANT_SHARE_REFUSALS = Counter(
    "ice_tenant_share_refusals",
    "Requests answered 429 for their tenant's share of a pool (after any wait in the queue), "
    "by pool and reason: tenant_share_exceeded (over its cap) | tenant_share_reserved (the "
    "room left is guaranteed to other tenants).",
    ["pool", "reason"],
)
KV_USAGE = Gauge(
    "ice_pool_kv_cache_usage",
    "KV-cache used fraction of the pool at the last successful scrape.",
    ["pool"],
    multiprocess_mode="mostrecent",
)
SNAPSHOT_AGE = Gauge(
    "ice_pool_snapshot_timestamp_seconds",
    "Unix time of the pool's last successful scrape.",
    ["pool"],
    multiprocess_mode="max",
)
FORECAST_PEAK = Gauge(
    "ice_forecast_peak_blocks",
    "admission: forecast: the forecast peak of an endpoint's KV blocks (this worker's "
    "requests and the others' holds) at the last request judged against it.",
    ["pool", "endpoint"],
    multiprocess_mode="livesum",
)
LOOP_LAG = Gauge(
    "ice_event_loop_lag_seconds",
    "The most the worker's event loop ran late over the last second: how long ready work "
    "(a request's headers) waited behind other work; long bodies are judged from their "
    "size while it is over the backlog's lag limit.",
    multiprocess_mode="max",
)

HOLD_RECOUNTS = Counter(
    "ice_hold_recounts",
    "Holds taken at the estimate's upper bound (exact_count: needed) counted exactly after "
    "the answer, by outcome: shrunk, unchanged, ended (the stream ended first), skipped "
    "(a long body with no helper process), failed.",
    ["outcome"],
)

FORECAST_WAITS = Counter(
    "ice_forecast_waits",
    "admission: forecast with start_within_s: requests passed to wait in the backend's "
    "queue, planned to start at a running request's predicted end.",
    ["pool"],
)

FORECAST_CAUTION = Gauge(
    "ice_forecast_caution",
    "admission: forecast: how far an endpoint's output quantile is raised towards 1 after a "
    "preemption, q' = q + c(1 - q) (1 at the preemption, halving every recovery_s).",
    ["pool", "endpoint"],
    multiprocess_mode="max",
)
FORECAST_LENGTH_FACTOR = Gauge(
    "ice_forecast_length_factor",
    "admission: forecast, forecast.refine: the factor f_k the backend's output lengths are "
    "stretched by for a kind of request (profile, limit bucket: its upper bound in tokens), "
    "from the requests ICE saw finish (1: not enough seen, or the pool's average).",
    ["pool", "profile", "limit"],
    multiprocess_mode="max",
)
PRESSURE = Gauge(
    "ice_mem_pressure_score",
    "mem_pressure_score (0-100) of the pool under the default profile at the last scrape.",
    ["pool"],
    multiprocess_mode="mostrecent",
)


INPUT_TOKENS = Counter(
    "ice_input_tokens_counted",
    "Evaluated requests by how their input tokens were counted: exact (tokenizer + chat "
    "template), estimate (no tokenizer for the model), fallback (the tokenizer failed), "
    "bound (a coarse verdict: the body was not read).",
    ["source"],
)


SEQUENCES = Counter(
    "ice_sequences_judged",
    "Sequences of the evaluated requests (prompts × n/best_of samples; embeddings inputs).",
    ["route"],
)
MEDIA_PARTS = Counter(
    "ice_media_parts_judged",
    "Image, audio and video parts of the evaluated requests.",
    ["route"],
)


LEDGER_BACKEND = Gauge(
    "ice_ledger_backend",
    "Which in-flight ledger the worker judges with: 1 for the one in use (redis: the "
    "replicas' shared ledger, --ledger; local: its own and the host's shared memory).",
    ["backend"],
)
LEDGER_ERRORS = Counter(
    "ice_ledger_errors",
    "Calls to the shared ledger (Redis) that failed or ran past their deadline, by operation "
    "(reserve, sync, release, heartbeat).",
    ["op"],
)
LEDGER_CONFLICTS = Counter(
    "ice_ledger_conflicts",
    "Reservations the shared ledger refused because other replicas took the room since the "
    "request was judged (the request was judged again).",
    ["pool"],
)


PICKS = Counter(
    "ice_endpoint_picks",
    "Requests ICE sent to an endpoint it picked (endpoint_pick: ice), by pool and endpoint.",
    ["pool", "endpoint"],
)


@functools.lru_cache(maxsize=16)
def processing(phase: str) -> Histogram:
    """``PROCESSING_SECONDS`` of ``phase`` (on the request path: the label lookup cached)."""
    return PROCESSING_SECONDS.labels(phase=phase)


@functools.lru_cache(maxsize=1024)
def _pick_child(pool: str, endpoint: str) -> Counter:
    return PICKS.labels(pool=pool, endpoint=endpoint)


def count_pick(pool: str, endpoint: str) -> None:
    _pick_child(pool, endpoint).inc()


@functools.lru_cache(maxsize=1024)
def _shape_children(route: str) -> tuple[Counter, Counter]:
    return SEQUENCES.labels(route=route), MEDIA_PARTS.labels(route=route)


def count_shape(route: str, sequences: int, media_parts: int) -> None:
    """Count an evaluated request's sequences and media parts."""
    seq, media = _shape_children(route)
    seq.inc(sequences)
    if media_parts:
        media.inc(media_parts)


@functools.lru_cache(maxsize=8)
def _input_child(source: str) -> Counter:
    return INPUT_TOKENS.labels(source=source)


def count_input_tokens(source: str) -> None:
    _input_child(source).inc()


@functools.lru_cache(maxsize=1024)
def _decision_child(route: str, decision: str, reason: str, mode: str) -> Counter:
    return DECISIONS.labels(route=route, decision=decision, reason=reason, mode=mode)


def count_decision(route: str, decision: str, reason: str, mode: str = "enforce") -> None:
    """Count one evaluated request (label lookups cached: this is on the request path)."""
    _decision_child(route, decision, reason, mode).inc()


TRUNCATIONS = Counter(
    "ice_truncations",
    "Requests whose history ICE truncated, by route and mode (semantic | recency).",
    ["route", "mode"],
)
TRUNCATION_FALLBACKS = Counter(
    "ice_truncation_fallbacks",
    "Truncations that fell back to recency, by reason: deadline (the embedding worker was "
    "late), unavailable (down or failing), no_query (the question has no text).",
    ["route", "reason"],
)
TRUNCATION_SAVED_TOKENS = Counter(
    "ice_truncation_saved_tokens",
    "Input tokens (estimated) that truncation removed, by route.",
    ["route"],
)


def count_truncation(route: str, mode: str, fallback: str, saved_tokens: int) -> None:
    """Count one truncated request (and its fallback to recency, if any)."""
    TRUNCATIONS.labels(route=route, mode=mode).inc()
    if fallback:
        TRUNCATION_FALLBACKS.labels(route=route, reason=fallback).inc()
    TRUNCATION_SAVED_TOKENS.labels(route=route).inc(saved_tokens)


PREFIX_STABILITY = Gauge(
    "ice_prefix_stability_score",
    "Prefix stability of the route's prompts (0-1): shared leading KV blocks / prompt blocks "
    "over the route's last window of sampled requests, per worker and tenant (ext_proc/prefix).",
    ["route", "tenant"],
    multiprocess_mode="mostrecent",
)
PREFIX_DIVERGENCE = Gauge(
    "ice_prefix_divergence_character",
    "Where the route's recent sampled prompts first differ: the character offset in the "
    "section (-1: that place no longer seen); kinds as ice prefix-report's.",
    ["route", "section", "kind"],
    multiprocess_mode="mostrecent",
)
SYSTEM_PROMPT_COMPLEXITY = Gauge(
    "ice_system_prompt_complexity_score",
    "system_prompt_complexity_score (0-1) of the route's last sampled request: system share "
    "of the input x (0.5 + 0.5 x its structured share); with prefix_tracking (ext_proc/sysprompt).",
    ["route"],
    multiprocess_mode="mostrecent",
)
POLICY_RELOADS = Counter(
    "ice_policy_reloads",
    "Policy reloads (SIGHUP or the file changed) by result: ok, refused (the last good policy "
    "keeps serving).",
    ["result"],
)
POLICY_INFO = Gauge(
    "ice_policy_info",
    "1 for the policy in force (sha256 of its file), 0 for one it replaced.",
    ["sha256"],
    multiprocess_mode="mostrecent",
)
POOL_STALE = Gauge(
    "ice_pool_stale",
    "1 while the pool's view holds or lacks stale sources (see the pool's `stale` policy).",
    ["pool"],
    multiprocess_mode="mostrecent",
)
CACHE_EFFICIENCY = Gauge(
    "ice_cache_efficiency_ratio",
    "cache_efficiency_ratio (0-1) of the pool: prefix-cache hit ratio over the window.",
    ["pool"],
    multiprocess_mode="mostrecent",
)
TOKENIZE_RISK = Gauge(
    "ice_tokenize_latency_risk",
    "tokenize_latency_risk (0-1): share of the window's TTFTs above the default profile's target.",
    ["pool"],
    multiprocess_mode="mostrecent",
)

# Latency predictions per backend (docs/slo.md): shown and measured; admission: slo judges each
# request by its own (ext_proc.policy.slo_admit).
SLO_PREDICTED_TTFT = Gauge(
    "ice_slo_predicted_ttft_seconds",
    "Predicted time to first token of a mean request sent to the backend now: the waiting "
    "requests' prefill and its own batched into engine steps by the step line (else at the "
    "per-request prefill speed), the rest of a first token's time, and the wait for room "
    "behind waiting requests (docs/slo.md).",
    ["pool", "backend"],
    multiprocess_mode="mostrecent",
)
SLO_PREDICTED_TPOT = Gauge(
    "ice_slo_predicted_tpot_seconds",
    "Predicted time per output token on the backend with one more sequence running: the "
    "decode step line fitted over the window (docs/slo.md).",
    ["pool", "backend"],
    multiprocess_mode="mostrecent",
)
SLO_TTFT_ERROR = Gauge(
    "ice_slo_ttft_prediction_error_ratio",
    "Mean |predicted - observed| / observed of the backend's TTFT predictions over the "
    "window, each against the mean TTFT the backend reported over the next scrape interval.",
    ["pool", "backend"],
    multiprocess_mode="mostrecent",
)


# What the collector and its observer set: with several workers the supervisor collects, and
# its own (in-process) values of these join the workers' on its /metrics page.
COLLECTOR_METRICS: tuple[Counter | Gauge, ...] = (
    SCRAPE_ERRORS,
    KV_USAGE,
    SNAPSHOT_AGE,
    PRESSURE,
    POOL_STALE,
    CACHE_EFFICIENCY,
    TOKENIZE_RISK,
    SLO_PREDICTED_TTFT,
    SLO_PREDICTED_TPOT,
    SLO_TTFT_ERROR,
)


def observe_pool(pool: str, kv_cache_usage: float | None) -> None:
    """Record a fresh view of ``pool`` in the gauges (its KV-cache usage, 0–1, when known)."""
    if kv_cache_usage is not None:
        KV_USAGE.labels(pool=pool).set(kv_cache_usage)
    SNAPSHOT_AGE.labels(pool=pool).set(time.time())
