"""The policy as plain frozen data: profiles, pools and their defaults.

Invariant: instances are validated by ``ext_proc.policy.load`` before anything uses them;
the evaluator trusts them (thresholds ascend, weights are non-negative, levels are known).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import IntEnum
from types import MappingProxyType
from typing import Any, Literal

from ext_proc.kv.hfconfig import ModelShape
from ext_proc.media.spec import MediaSpec
from ext_proc.signals.pool import Pool

__all__ = [
    "CLIENT_PRIORITIES",
    "PRIORITIES",
    "Admission",
    "ClientPriority",
    "CriticalInQueue",
    "EmbeddingSpec",
    "FailMode",
    "ForecastSpec",
    "IdentitySource",
    "IdentitySpec",
    "JwtProviderSpec",
    "KvModelSpec",
    "KvShortfall",
    "Level",
    "Policy",
    "PressureModel",
    "Priority",
    "Profile",
    "QueueSpec",
    "RouteBinding",
    "SloTarget",
    "StoredContext",
    "TruncationSpec",
]

Priority = Literal["critical", "standard", "sheddable"]
PRIORITIES: tuple[Priority, ...] = ("critical", "standard", "sheddable")  # highest first
# What a client's priority header may do (docs/configuration.md "Priority"): ``cap`` lower the
# route's priority, never raise it; ``trust`` set it; ``ignore`` nothing (the route's is fixed).
ClientPriority = Literal["cap", "trust", "ignore"]
CLIENT_PRIORITIES: tuple[ClientPriority, ...] = ("cap", "trust", "ignore")
FailMode = Literal["open", "closed"]
KvShortfall = Literal["downgrade", "shed", "ignore"]
CriticalInQueue = Literal["pass", "wait"]
IdentitySource = Literal["jwt", "mtls", "header", "trust"]


class Level(IntEnum):
    """Pressure levels, ordered; the header value is the lower-case name."""

    LOW = 0
    MEDIUM = 1
    HIGH = 2
    CRITICAL = 3

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, text: str) -> Level:
        return cls[text.upper()]


@dataclass(frozen=True, slots=True)
class PressureModel:
    """Weights and thresholds of ``mem_pressure_score`` (see ``ext_proc.policy.pressure``)."""

    weight_kv_cache: float = 0.40
    weight_pcie: float = 0.35
    weight_queue: float = 0.25
    queue_saturation_requests: float = 8.0
    medium_at: float = 40.0
    high_at: float = 65.0
    critical_at: float = 85.0


@dataclass(frozen=True, slots=True)
class KvModelSpec:
    """The served model's KV geometry inputs (the block size comes from the backend)."""

    shape: ModelShape
    kv_dtype: str = "auto"
    tp: int = 1
    max_num_batched_tokens: int = 8192


@dataclass(frozen=True, slots=True)
class PrefixTrackingSpec:
    """The live prefix_stability_score (``ext_proc.prefix``): sampled, bounded."""

    sample_every: int = 8
    max_tokens: int = 2048
    block_size: int = 16
    capacity_blocks: int = 65536
    window: int = 1000
    tenant_header: str = ""  # "": per route only
    max_tenants: int = 16


Admission = Literal["reserve", "forecast", "slo"]


@dataclass(frozen=True, slots=True)
class ForecastSpec:
    """The forecast's settings (``ext_proc.placement.forecast``; docs/forecast.md)."""

    quantile: float = 0.5  # of the output-length distribution, given what was generated
    margin: float = 0.05  # share of usable blocks the forecast peak leaves free
    recovery_s: float = 10.0  # half-life of the caution a preemption raises
    min_observations: int = 20  # finished requests before the distribution is trusted
    read_floors: bool = True  # min_tokens / ignore_eos bound the prediction from below
    start_within_s: float = 0.0  # admit what will start within this wait (0: fits now)
    refine: bool = True  # lengths per profile and limit bucket (ext_proc.placement.length_kinds)


@dataclass(frozen=True, slots=True)
class SloTarget:
    """A route's latency targets, milliseconds (None: no target); docs/slo.md."""

    ttft_ms: float | None = None  # time to first token
    tpot_ms: float | None = None  # time per output token after the first


@dataclass(frozen=True, slots=True)
class JwtProviderSpec:
    """The tokens an identity with ``source: jwt`` reads (Envoy verifies them; docs/identity.md)."""

    issuer: str = ""
    audiences: tuple[str, ...] = ()
    jwks_file: str = ""  # a JWKS file on Envoy's host (local Envoy)
    jwks_uri: str = ""  # a JWKS's https URL
    metadata_key: str = "payload"  # jwt_authn's payload_in_metadata (else the issuer's)


@dataclass(frozen=True, slots=True)
class IdentitySpec:
    """Who is asking (``ext_proc.admit.identity``; docs/identity.md): where the tenant comes
    from. ``trust`` (the default) reads the client's tenant headers as before."""

    source: IdentitySource = "trust"
    claim: str = "sub"  # jwt: the claim (a dotted path reads a nested one)
    header: str = ""  # header: the ext_authz service's; trust: the client's ("": the queue's)
    required: bool = False  # a request without it gets 401
    san: Literal["uri", "dns"] = "uri"  # mtls: the SAN that names the tenant
    jwt: JwtProviderSpec | None = None  # source: jwt only

    @property
    def vouched(self) -> bool:
        """The tenant comes from what Envoy vouches for: client tenant headers are ignored."""
        return self.source != "trust"


@dataclass(frozen=True, slots=True)
class Profile:
    """What one class of routes allows. Token figures are in tokens; times in seconds."""

    name: str
    max_model_len: int | None = None
    output_buffer_tokens: int = 2048
    min_output_tokens: int = 16
    default_priority: Priority = "standard"
    client_priority: ClientPriority = "cap"  # a route's binding overrides it
    pressure: PressureModel = field(default_factory=PressureModel)
    # Output-token cap per level; a level absent here has no cap.
    max_tokens_cap: MappingProxyType[Level, int] = field(
        default_factory=lambda: MappingProxyType({Level.HIGH: 1024, Level.CRITICAL: 256})
    )
    # The lowest level at which each priority is shed; absent means never.
    shed_at: MappingProxyType[Priority, Level] = field(
        default_factory=lambda: MappingProxyType(
            {"sheddable": Level.HIGH, "standard": Level.CRITICAL}
        )
    )
    retry_after_s: int = 2
    fail_mode: FailMode = "open"
    kv_model: KvModelSpec | None = None
    on_kv_shortfall: KvShortfall = "downgrade"
    ttft_target_s: float = 2.0
    retry_after_min_s: int = 1
    retry_after_max_s: int = 60
    truncation: TruncationSpec | None = None  # None: never truncate
    max_sequences: int = 16  # n (best_of) samples × prompts per request; above: 400
    max_media_parts: int = 16  # image/audio/video parts per request; above: 400
    media: MediaSpec = field(default_factory=MediaSpec)
    stored_context: StoredContext = "full_window"
    max_embedding_inputs: int = 2048
    content_types: Literal["strict", "pass"] = "strict"
    mode: Literal["enforce", "shadow"] = "enforce"  # shadow: judge and record, change nothing
    compact_system_json: bool = False  # lossless whitespace compaction of system-prompt JSON
    queue: QueueSpec | None = None  # None: requests shed for memory are refused at once
    # the status a backend's own overload 503 reaches the client with (503 or 429;
    # ext_proc.admit.overload_answer); 0: off, ICE never asks for the response headers
    backend_overload_status: int = 503
    # how a passed request's blocks are held (ext_proc.placement.forecast): its whole limit
    # for its whole life ("reserve") or its forecast trajectory ("forecast"); "slo": as
    # forecast, and a request with a latency target is judged by it (ext_proc.policy.slo_admit)
    admission: Admission = "reserve"
    forecast: ForecastSpec = field(default_factory=ForecastSpec)
    # output per sequence the backend runs without a client limit (None: the API's default,
    # ext_proc.policy.output_limit)
    default_output_tokens: int | None = None
    # latency targets (docs/slo.md): shown; judged by under admission: slo
    slo: SloTarget = field(default_factory=SloTarget)
    identity: IdentitySpec = field(default_factory=IdentitySpec)  # who is asking

    @property
    def forecasts(self) -> bool:
        """Passed requests are held at their forecast trajectory (``forecast``, ``slo``)."""
        return self.admission != "reserve"

    @property
    def critical_waits(self) -> bool:
        """A critical request whose blocks do not fit waits in the queue (``critical:
        wait``; never in shadow mode, which changes nothing)."""
        return self.queue is not None and self.queue.critical == "wait" and self.mode != "shadow"


@dataclass(frozen=True, slots=True)
class QueueSpec:
    """The admission queue of a profile (``ext_proc.admit.queue``). Times in milliseconds."""

    max_queue_wait_ms: int = 3000
    max_queue_length: int = 64  # per worker and pool
    tenant_header: str = ""  # "" → the route's name is the tenant
    max_tenants: int = 16  # per pool and priority; the rest share OTHER_TENANT
    poll_ms: int = 20
    # "wait": a critical request whose blocks do not fit waits (never refused); "pass": it
    # goes upstream at once, over the room
    critical: CriticalInQueue = "pass"


StoredContext = Literal["full_window", "reject"]


@dataclass(frozen=True, slots=True)
class TruncationSpec:
    """Semantic history truncation for a profile's chat requests (see ext_proc/truncate)."""

    # Input-token budget per pressure level; a level absent here has none.
    budget_tokens: MappingProxyType[Level, int] = field(
        default_factory=lambda: MappingProxyType({Level.HIGH: 8192, Level.CRITICAL: 4096})
    )
    min_cache_efficiency: float = 0.45  # below it, low_efficiency_budget_tokens applies
    low_efficiency_budget_tokens: int | None = None  # None: the high level's budget
    keep_last_turns: int = 2
    pin_first_turns: int = 0
    pin_roles: tuple[str, ...] = ()
    pin_names: tuple[str, ...] = ()
    similarity_threshold: float = 0.35
    fill: Literal["similarity", "recency"] = "similarity"
    placeholder: str = ""
    placeholder_role: str = ""
    deadline_ms: int = 250
    on_overflow: Literal["reject", "best_effort"] = "reject"
    lexical_weight: float | None = None  # None: the question's share of CJK characters


@dataclass(frozen=True, slots=True)
class EmbeddingSpec:
    """The host's one embedding worker (used when any profile enables truncation)."""

    model: str = ""  # a local sentence-transformers folder; "" = the packaged all-MiniLM-L6-v2
    cache_bytes: int = 64 * 1024 * 1024
    threads: int | None = None  # torch threads in the worker; None: torch's default
    max_seq_length: int = 64  # word pieces embedded per turn text (cost grows with it)
    quantize: bool = True  # int8 Linear layers: about 2x faster embeddings on CPU
    socket: str = ""  # Unix socket path; "" = a private path chosen by `ice serve`


@dataclass(frozen=True, slots=True)
class RouteBinding:
    """What a named route uses; empty strings / None mean the policy's defaults."""

    profile: str = ""
    pool: str = ""
    priority: Priority | None = None
    schema: str = ""  # an adapter name (ext_proc.schemas.SCHEMAS); "" = chosen by path
    client_priority: ClientPriority | None = None  # None: the profile's
    identity: IdentitySpec | None = None  # None: the profile's


def _no_shares() -> MappingProxyType[str, float]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class TenantShares:
    """A pool's per-tenant limits, fractions of its usable blocks
    (``ext_proc.policy.tenant_share``: the formulas and the check)."""

    cap: float = 1.0
    caps: MappingProxyType[str, float] = field(default_factory=_no_shares)
    guaranteed: MappingProxyType[str, float] = field(default_factory=_no_shares)

    def cap_of(self, tenant: str) -> float:
        return self.caps.get(tenant, self.cap)

    def cap_blocks(self, tenant: str, usable_blocks: int) -> int:
        """floor(cap(t) × U) (with a 1e-9 tolerance: 0.29 × 100 is 29, not 28)."""
        return math.floor(self.cap_of(tenant) * usable_blocks + 1e-9)

    def guaranteed_blocks(self, tenant: str, usable_blocks: int) -> int:
        """floor(guaranteed(t) × U) (the same tolerance); 0 without a guarantee."""
        return math.floor(self.guaranteed.get(tenant, 0.0) * usable_blocks + 1e-9)

    @property
    def named(self) -> frozenset[str]:
        """The tenants the limits name (their metrics get their own label)."""
        return frozenset(self.caps) | frozenset(self.guaranteed)


@dataclass(frozen=True, slots=True)
class Policy:
    """A whole policy file."""

    profiles: MappingProxyType[str, Profile]
    pools: MappingProxyType[str, Pool]
    default_profile: str
    default_pool: str
    priority_header: str = "x-priority"
    routes: MappingProxyType[str, RouteBinding] = field(
        default_factory=lambda: MappingProxyType({})
    )
    # model name → ext_proc.tokencount.TokenizerSpec (typed loosely: that module is imported
    # only when a policy names tokenizers).
    tokenizers: MappingProxyType[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    exact_count_inline_bytes: int = 32768
    exact_count_budget_ms: int = 600
    token_count_cache_bytes: int = 32 * 1024 * 1024
    exact_count: Literal["needed", "always"] = "needed"
    embedding: EmbeddingSpec = field(default_factory=EmbeddingSpec)
    # exact paths forwarded unjudged (Envoy renders them; ICE passes them without a body)
    passthrough_paths: frozenset[str] = frozenset()
    prefix_tracking: PrefixTrackingSpec | None = None  # None: no live prefix score
    # pool → its tenants' shares (ext_proc.policy.tenant_share); a pool absent: no limit
    tenant_shares: MappingProxyType[str, TenantShares] = field(
        default_factory=lambda: MappingProxyType({})
    )

    @property
    def truncation_enabled(self) -> bool:
        """Whether any profile truncates (then ``ice serve`` starts the embedding worker)."""
        return any(p.truncation is not None for p in self.profiles.values())
