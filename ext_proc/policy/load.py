"""Load a policy file: YAML → protobuf schema check → value checks → frozen ``Policy``.

Every problem raises ``PolicyError`` whose message names the field (a dotted path such as
``profiles.chat.pressure.thresholds.high``) and says what is wrong, so a bad file stops
start-up with a message an operator can act on.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Literal

import yaml
from google.protobuf import json_format

from ext_proc._pb import policy_pb2
from ext_proc.policy.errors import PolicyError
from ext_proc.policy.load_fields import opt
from ext_proc.policy.load_forecast import admission_settings
from ext_proc.policy.load_identity import identity_spec
from ext_proc.policy.load_models import kv_model_spec, media_spec, tokenizer_specs
from ext_proc.policy.load_pool import pool_spec, positive
from ext_proc.policy.load_queue import queue_spec
from ext_proc.policy.load_tenant_share import tenant_shares_specs
from ext_proc.policy.load_truncation import embedding_spec, truncation_spec
from ext_proc.policy.settings import (
    CLIENT_PRIORITIES,
    PRIORITIES,
    ClientPriority,
    Level,
    Policy,
    PrefixTrackingSpec,
    PressureModel,
    Priority,
    Profile,
    RouteBinding,
)
from ext_proc.schemas import SCHEMAS, schema_for_path
from ext_proc.signals.pool import Pool

__all__ = ["PolicyError", "default_policy_text", "load_policy", "parse_policy"]

# What a backend's own overload 503 may become for the client (ext_proc.admit.overload_answer): the
# status as it is, ICE's shedding status, or 0: the response phase off.
BACKEND_OVERLOAD_STATUSES = (503, 429, 0)


def default_policy_text() -> str:
    """The built-in default policy (``ext_proc/default_policy.yaml``)."""
    return resources.files("ext_proc").joinpath("default_policy.yaml").read_text("utf-8")


def load_policy(path: str | Path | None) -> Policy:
    """Load the policy at ``path``, or the built-in default when ``path`` is None."""
    if path is None:
        return parse_policy(default_policy_text(), source="<built-in default>")
    p = Path(path)
    try:
        text = p.read_text("utf-8")
    except OSError as e:
        raise PolicyError(f"{p}: cannot read: {e.strerror}") from None
    return parse_policy(text, source=str(p), base_dir=p.resolve().parent)


def parse_policy(text: str, *, source: str = "<policy>", base_dir: Path | None = None) -> Policy:
    """Parse policy YAML text; raise ``PolicyError`` naming the first bad field."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise PolicyError(f"{source}: not valid YAML: {e}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise PolicyError(f"{source}: the top level must be a mapping")
    msg = policy_pb2.Policy()
    try:
        json_format.ParseDict(data, msg)
    except json_format.ParseError as e:
        raise PolicyError(f"{source}: {_schema_message(str(e))}") from None
    try:
        return _build(msg, base_dir or Path.cwd())
    except PolicyError as e:
        raise PolicyError(f"{source}: {e}") from None


def _schema_message(text: str) -> str:
    # ParseDict says e.g. 'Message type "ice.policy.v1.Profile" has no field named "x" at
    # "Policy.profiles[chat]".  Available Fields(except extensions): [...]'; keep it short.
    cut = text.find(" Available Fields")
    return (text[:cut] if cut >= 0 else text).replace("ice.policy.v1.", "").strip()


def _level(text: str, where: str, *, allow_never: bool = False) -> Level | None:
    if allow_never and text == "never":
        return None
    try:
        return Level.parse(text)
    except KeyError:
        choices = "low, medium, high, critical" + (", never" if allow_never else "")
        raise PolicyError(f"{where}: unknown level {text!r} (one of {choices})") from None


def _pressure(msg: policy_pb2.Pressure, where: str) -> PressureModel:
    d = PressureModel()
    t = msg.thresholds
    model = PressureModel(
        weight_kv_cache=opt(msg, "weight_kv_cache", d.weight_kv_cache),
        weight_queue=opt(msg, "weight_queue", d.weight_queue),
        weight_pcie=opt(msg, "weight_pcie", d.weight_pcie),
        queue_saturation_requests=opt(
            msg, "queue_saturation_requests", d.queue_saturation_requests
        ),
        medium_at=opt(t, "medium", d.medium_at),
        high_at=opt(t, "high", d.high_at),
        critical_at=opt(t, "critical", d.critical_at),
    )
    for name in ("weight_kv_cache", "weight_queue", "weight_pcie"):
        value = getattr(model, name)
        if not math.isfinite(value) or value < 0:
            raise PolicyError(f"{where}.{name}: must be a finite number ≥ 0, got {value}")
    if model.weight_kv_cache + model.weight_queue + model.weight_pcie <= 0:
        raise PolicyError(f"{where}: at least one weight must be > 0")
    if not model.queue_saturation_requests > 0:
        raise PolicyError(
            f"{where}.queue_saturation_requests: must be > 0, got {model.queue_saturation_requests}"
        )
    levels = [("medium", model.medium_at), ("high", model.high_at), ("critical", model.critical_at)]
    previous = 0.0
    for name, value in levels:
        if not 0 < value <= 100:
            raise PolicyError(f"{where}.thresholds.{name}: must be in (0, 100], got {value}")
        if value <= previous:
            raise PolicyError(
                f"{where}.thresholds.{name}: must be greater than the level below ({previous})"
            )
        previous = value
    return model


def _profile(name: str, msg: policy_pb2.Profile, base_dir: Path) -> Profile:
    where = f"profiles.{name}"
    d = Profile(name=name)
    priority = _default_priority(msg.default_priority or d.default_priority, where)
    fail_mode = _one_of(msg, d, where, "fail_mode", ("open", "closed"))
    caps, shed = _caps(msg, d), _shed(msg, d, where)
    shortfall = _one_of(msg, d, where, "on_kv_shortfall", ("downgrade", "shed", "ignore"))
    kv_model = (
        kv_model_spec(msg.kv_model, f"{where}.kv_model") if msg.HasField("kv_model") else None
    )
    limits = _limits(msg, d, where)
    stored = _one_of(msg, d, where, "stored_context", ("full_window", "reject"))
    content_types = _one_of(msg, d, where, "content_types", ("strict", "pass"))
    mode = _one_of(msg, d, where, "mode", ("enforce", "shadow"))
    overload_status = _backend_overload_status(msg, d, where)
    per_request = _per_request_caps(msg, d, where)
    admission = admission_settings(msg, where)
    return Profile(
        name=name,
        max_model_len=limits.max_model_len,
        output_buffer_tokens=opt(msg, "output_buffer_tokens", d.output_buffer_tokens),
        min_output_tokens=max(1, opt(msg, "min_output_tokens", d.min_output_tokens)),
        default_priority=priority,
        client_priority=_client_priority(msg.client_priority, where) or d.client_priority,
        pressure=_pressure(msg.pressure, f"{where}.pressure"),
        max_tokens_cap=MappingProxyType(caps),
        shed_at=MappingProxyType(shed),
        retry_after_s=limits.retry_after_s,
        fail_mode="open" if fail_mode == "open" else "closed",
        kv_model=kv_model,
        ttft_target_s=positive(msg, "ttft_target_s", d.ttft_target_s, where),
        retry_after_min_s=limits.retry_after_min_s,
        retry_after_max_s=limits.retry_after_max_s,
        on_kv_shortfall=(
            "downgrade" if shortfall == "downgrade" else "shed" if shortfall == "shed" else "ignore"
        ),
        truncation=truncation_spec(msg.truncation, f"{where}.truncation"),
        max_sequences=per_request["max_sequences"],
        max_media_parts=per_request["max_media_parts"],
        max_embedding_inputs=per_request["max_embedding_inputs"],
        media=media_spec(msg.media, f"{where}.media", base_dir),
        stored_context="reject" if stored == "reject" else "full_window",
        content_types="pass" if content_types == "pass" else "strict",
        mode="shadow" if mode == "shadow" else "enforce",
        compact_system_json=msg.compact_system_json,
        queue=queue_spec(msg.queue, f"{where}.queue"),
        backend_overload_status=overload_status,
        admission=admission.admission,
        forecast=admission.forecast,
        default_output_tokens=admission.default_output_tokens,
        slo=admission.slo,
        identity=identity_spec(msg.identity, f"{where}.identity"),
    )


def _one_of(
    msg: policy_pb2.Profile, d: Profile, where: str, field: str, choices: tuple[str, ...]
) -> str:
    """The profile's ``field`` (the default's when empty) when it is one of ``choices``; else
    a ``PolicyError`` naming them."""
    value: str = getattr(msg, field) or getattr(d, field)
    if value not in choices:
        quoted = [f"'{c}'" for c in choices]
        allowed = f"{', '.join(quoted[:-1])} or {quoted[-1]}"
        raise PolicyError(f"{where}.{field}: must be {allowed}, got {value!r}")
    return value


def _default_priority(priority: str, where: str) -> Priority:
    if priority not in PRIORITIES:
        raise PolicyError(
            f"{where}.default_priority: unknown priority {priority!r} (one of "
            f"{', '.join(PRIORITIES)})"
        )
    return priority


def _caps(msg: policy_pb2.Profile, d: Profile) -> dict[Level, int]:
    """``max_tokens_cap``: the output-token cap per level (the default's when absent)."""
    if not msg.HasField("max_tokens_cap"):
        return dict(d.max_tokens_cap)
    caps: dict[Level, int] = {}
    for level in Level:
        value = opt(msg.max_tokens_cap, level.label, 0)
        if value:
            caps[level] = value
    return caps


def _shed(msg: policy_pb2.Profile, d: Profile, where: str) -> dict[Priority, Level]:
    """``shed``: the lowest level at which each priority is shed (the default's when absent)."""
    if not msg.HasField("shed"):
        return dict(d.shed_at)
    shed: dict[Priority, Level] = {}
    for prio in ("standard", "sheddable"):
        text = getattr(msg.shed, prio)
        shed_level = _level(text, f"{where}.shed.{prio}", allow_never=True) if text else None
        if shed_level is not None:
            shed[prio] = shed_level
    return shed


@dataclass(frozen=True, slots=True)
class _Limits:
    """A profile's checked Retry-After bounds and context length."""

    retry_after_min_s: int
    retry_after_max_s: int
    max_model_len: int | None
    retry_after_s: int


def _limits(msg: policy_pb2.Profile, d: Profile, where: str) -> _Limits:
    ra_min = opt(msg, "retry_after_min_s", d.retry_after_min_s)
    ra_max = opt(msg, "retry_after_max_s", d.retry_after_max_s)
    if not 1 <= ra_min <= ra_max:
        raise PolicyError(
            f"{where}.retry_after_max_s: must be ≥ retry_after_min_s ≥ 1, got {ra_min}..{ra_max}"
        )
    max_model_len = opt(msg, "max_model_len", None)
    if max_model_len == 0:
        raise PolicyError(f"{where}.max_model_len: must be > 0 (omit it for no context checks)")
    retry_after_s = opt(msg, "retry_after_s", d.retry_after_s)
    if retry_after_s < 1:
        raise PolicyError(f"{where}.retry_after_s: must be ≥ 1, got {retry_after_s}")
    return _Limits(ra_min, ra_max, max_model_len, retry_after_s)


def _backend_overload_status(msg: policy_pb2.Profile, d: Profile, where: str) -> int:
    overload_status: int = opt(msg, "backend_overload_status", d.backend_overload_status)
    if overload_status not in BACKEND_OVERLOAD_STATUSES:
        raise PolicyError(
            f"{where}.backend_overload_status: must be 503, 429 or 0 (off), got {overload_status}"
        )
    return overload_status


def _per_request_caps(msg: policy_pb2.Profile, d: Profile, where: str) -> dict[str, int]:
    """``max_sequences``, ``max_media_parts`` and ``max_embedding_inputs``, each ≥ 1."""
    caps_per_request = {}
    for cap in ("max_sequences", "max_media_parts", "max_embedding_inputs"):
        caps_per_request[cap] = opt(msg, cap, getattr(d, cap))
        if caps_per_request[cap] < 1:
            raise PolicyError(f"{where}.{cap}: must be ≥ 1, got {caps_per_request[cap]}")
    return caps_per_request


def _build(msg: policy_pb2.Policy, base_dir: Path) -> Policy:
    profiles: Mapping[str, Profile] = {n: _profile(n, p, base_dir) for n, p in msg.profiles.items()}
    pools: Mapping[str, Pool] = {n: pool_spec(n, p) for n, p in msg.pools.items()}
    default_profile = msg.default_profile or "default"
    if default_profile not in profiles:
        if msg.default_profile:
            raise PolicyError(f"default_profile: no profile named {default_profile!r}")
        profiles = {**profiles, "default": Profile(name="default")}
    default_pool = msg.default_pool or "default"
    if default_pool not in pools:
        if msg.default_pool:
            raise PolicyError(f"default_pool: no pool named {default_pool!r}")
        pools = {**pools, "default": Pool(name="default", metrics_urls=())}
    routes = {n: _route(n, b, profiles, pools) for n, b in msg.routes.items()}
    passthrough = _passthrough_paths(msg)
    header = (msg.priority_header or "x-priority").lower()
    if header.startswith(("x-ice-", "x-mem-pressure", ":")):
        raise PolicyError(f"priority_header: {header!r} is reserved (ICE strips it)")
    return Policy(
        profiles=MappingProxyType(dict(profiles)),
        pools=MappingProxyType(dict(pools)),
        default_profile=default_profile,
        default_pool=default_pool,
        priority_header=header,
        routes=MappingProxyType(routes),
        tokenizers=MappingProxyType(tokenizer_specs(msg, base_dir)),
        exact_count_inline_bytes=opt(msg, "exact_count_inline_bytes", 32768),
        exact_count_budget_ms=opt(msg, "exact_count_budget_ms", 600),
        token_count_cache_bytes=opt(msg, "token_count_cache_bytes", 32 * 1024 * 1024),
        exact_count=_exact_count_mode(msg.exact_count),
        embedding=embedding_spec(msg.embedding, base_dir),
        passthrough_paths=passthrough,
        prefix_tracking=_prefix_tracking(msg),
        tenant_shares=tenant_shares_specs(msg.pools),
    )


def _route(
    name: str,
    binding: policy_pb2.RouteBinding,
    profiles: Mapping[str, Profile],
    pools: Mapping[str, Pool],
) -> RouteBinding:
    """``routes.<name>``: each name it gives must be a profile, pool, priority or schema."""
    where = f"routes.{name}"
    if binding.profile and binding.profile not in profiles:
        raise PolicyError(f"{where}.profile: no profile named {binding.profile!r}")
    if binding.pool and binding.pool not in pools:
        raise PolicyError(f"{where}.pool: no pool named {binding.pool!r}")
    if binding.priority and binding.priority not in PRIORITIES:
        raise PolicyError(
            f"{where}.priority: unknown priority {binding.priority!r} (one of "
            f"{', '.join(PRIORITIES)})"
        )
    if binding.schema and binding.schema not in SCHEMAS:
        raise PolicyError(
            f"{where}.schema: unknown schema {binding.schema!r} (one of "
            f"{', '.join(sorted(SCHEMAS))})"
        )
    return RouteBinding(
        profile=binding.profile,
        pool=binding.pool,
        priority=_priority_or_none(binding.priority),
        schema=binding.schema,
        client_priority=_client_priority(binding.client_priority, where),
        identity=identity_spec(binding.identity, f"{where}.identity")
        if binding.HasField("identity")
        else None,
    )


def _passthrough_paths(msg: policy_pb2.Policy) -> frozenset[str]:
    """``passthrough_paths``: exact paths, none of them a judged endpoint."""
    passthrough = set()
    for i, path in enumerate(msg.passthrough_paths):
        if not path.startswith("/") or "?" in path or "#" in path:
            raise PolicyError(
                f"passthrough_paths[{i}]: must be an exact path starting with '/' (no query), "
                f"got {path!r}"
            )
        if schema_for_path(path) is not None:
            raise PolicyError(
                f"passthrough_paths[{i}]: {path} is a judged endpoint; it cannot pass unjudged"
            )
        passthrough.add(path)
    return frozenset(passthrough)


def _prefix_tracking(msg: policy_pb2.Policy) -> PrefixTrackingSpec | None:
    if not msg.HasField("prefix_tracking") or not msg.prefix_tracking.enabled:
        return None
    pt, d = msg.prefix_tracking, PrefixTrackingSpec()
    values = {
        name: opt(pt, name, getattr(d, name))
        for name in (
            "sample_every",
            "max_tokens",
            "block_size",
            "capacity_blocks",
            "window",
            "max_tenants",
        )
    }
    for name, value in values.items():
        if value < 1:
            raise PolicyError(f"prefix_tracking.{name}: must be ≥ 1, got {value}")
    tenant = pt.tenant_header.strip().lower()
    if tenant.startswith(("x-ice-", "x-mem-pressure", ":")):
        raise PolicyError(f"prefix_tracking.tenant_header: {tenant!r} is reserved")
    return PrefixTrackingSpec(**values, tenant_header=tenant)


def _exact_count_mode(text: str) -> Literal["needed", "always"]:
    if text in ("", "needed"):
        return "needed"
    if text == "always":
        return "always"
    raise PolicyError(f"exact_count: {text!r} is not one of needed, always")


def _client_priority(text: str, where: str) -> ClientPriority | None:
    """``client_priority`` (a profile's or a route's); None when not given."""
    for candidate in CLIENT_PRIORITIES:
        if candidate == text:
            return candidate
    if text:
        raise PolicyError(
            f"{where}.client_priority: must be 'cap', 'trust' or 'ignore', got {text!r}"
        )
    return None


def _priority_or_none(text: str) -> Priority | None:
    for candidate in PRIORITIES:
        if candidate == text:
            return candidate
    return None
