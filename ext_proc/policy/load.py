"""Load a policy file: YAML → protobuf schema check → value checks → frozen ``Policy``.

Every problem raises ``PolicyError`` whose message names the field (a dotted path such as
``profiles.chat.pressure.thresholds.high``) and says what is wrong, so a bad file stops
start-up with a message an operator can act on.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

import yaml
from google.protobuf import json_format

from ext_proc._pb import policy_pb2
from ext_proc.kv.geometry import build_geometry
from ext_proc.kv.hfconfig import shape_from_config
from ext_proc.media.spec import MediaSpec
from ext_proc.policy.errors import PolicyError
from ext_proc.policy.load_pool import pool_spec, positive
from ext_proc.policy.load_queue import queue_spec
from ext_proc.policy.load_truncation import embedding_spec, truncation_spec
from ext_proc.policy.model import (
    PRIORITIES,
    KvModelSpec,
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


def _opt(msg: Any, name: str, default: Any) -> Any:
    return getattr(msg, name) if msg.HasField(name) else default


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
        weight_kv_cache=_opt(msg, "weight_kv_cache", d.weight_kv_cache),
        weight_queue=_opt(msg, "weight_queue", d.weight_queue),
        weight_pcie=_opt(msg, "weight_pcie", d.weight_pcie),
        queue_saturation_requests=_opt(
            msg, "queue_saturation_requests", d.queue_saturation_requests
        ),
        medium_at=_opt(t, "medium", d.medium_at),
        high_at=_opt(t, "high", d.high_at),
        critical_at=_opt(t, "critical", d.critical_at),
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
    priority: str = msg.default_priority or d.default_priority
    if priority not in PRIORITIES:
        raise PolicyError(
            f"{where}.default_priority: unknown priority {priority!r} (one of "
            f"{', '.join(PRIORITIES)})"
        )
    fail_mode = msg.fail_mode or d.fail_mode
    if fail_mode not in ("open", "closed"):
        raise PolicyError(f"{where}.fail_mode: must be 'open' or 'closed', got {fail_mode!r}")
    caps: dict[Level, int] = dict(d.max_tokens_cap) if not msg.HasField("max_tokens_cap") else {}
    if msg.HasField("max_tokens_cap"):
        for level in Level:
            value = _opt(msg.max_tokens_cap, level.label, 0)
            if value:
                caps[level] = value
    shed: dict[Priority, Level] = dict(d.shed_at) if not msg.HasField("shed") else {}
    if msg.HasField("shed"):
        for prio in ("standard", "sheddable"):
            text = getattr(msg.shed, prio)
            shed_level = _level(text, f"{where}.shed.{prio}", allow_never=True) if text else None
            if shed_level is not None:
                shed[prio] = shed_level
    shortfall = msg.on_kv_shortfall or d.on_kv_shortfall
    if shortfall not in ("downgrade", "shed", "ignore"):
        raise PolicyError(
            f"{where}.on_kv_shortfall: must be 'downgrade', 'shed' or 'ignore', got {shortfall!r}"
        )
    kv_model = _kv_model(msg.kv_model, f"{where}.kv_model") if msg.HasField("kv_model") else None
    ra_min = _opt(msg, "retry_after_min_s", d.retry_after_min_s)
    ra_max = _opt(msg, "retry_after_max_s", d.retry_after_max_s)
    if not 1 <= ra_min <= ra_max:
        raise PolicyError(
            f"{where}.retry_after_max_s: must be ≥ retry_after_min_s ≥ 1, got {ra_min}..{ra_max}"
        )
    max_model_len = _opt(msg, "max_model_len", None)
    if max_model_len == 0:
        raise PolicyError(f"{where}.max_model_len: must be > 0 (omit it for no context checks)")
    retry_after_s = _opt(msg, "retry_after_s", d.retry_after_s)
    if retry_after_s < 1:
        raise PolicyError(f"{where}.retry_after_s: must be ≥ 1, got {retry_after_s}")
    stored = msg.stored_context or d.stored_context
    if stored not in ("full_window", "reject"):
        raise PolicyError(
            f"{where}.stored_context: must be 'full_window' or 'reject', got {stored!r}"
        )
    content_types = msg.content_types or d.content_types
    if content_types not in ("strict", "pass"):
        raise PolicyError(
            f"{where}.content_types: must be 'strict' or 'pass', got {content_types!r}"
        )
    mode = msg.mode or d.mode
    if mode not in ("enforce", "shadow"):
        raise PolicyError(f"{where}.mode: must be 'enforce' or 'shadow', got {mode!r}")
    overload_status = _opt(msg, "backend_overload_status", d.backend_overload_status)
    if overload_status not in BACKEND_OVERLOAD_STATUSES:
        raise PolicyError(
            f"{where}.backend_overload_status: must be 503, 429 or 0 (off), got {overload_status}"
        )
    caps_per_request = {}
    for cap in ("max_sequences", "max_media_parts", "max_embedding_inputs"):
        caps_per_request[cap] = _opt(msg, cap, getattr(d, cap))
        if caps_per_request[cap] < 1:
            raise PolicyError(f"{where}.{cap}: must be ≥ 1, got {caps_per_request[cap]}")
    return Profile(
        name=name,
        max_model_len=max_model_len,
        output_buffer_tokens=_opt(msg, "output_buffer_tokens", d.output_buffer_tokens),
        min_output_tokens=max(1, _opt(msg, "min_output_tokens", d.min_output_tokens)),
        default_priority=priority,
        pressure=_pressure(msg.pressure, f"{where}.pressure"),
        max_tokens_cap=MappingProxyType(caps),
        shed_at=MappingProxyType(shed),
        retry_after_s=retry_after_s,
        fail_mode="open" if fail_mode == "open" else "closed",
        kv_model=kv_model,
        ttft_target_s=positive(msg, "ttft_target_s", d.ttft_target_s, where),
        retry_after_min_s=ra_min,
        retry_after_max_s=ra_max,
        on_kv_shortfall=(
            "downgrade" if shortfall == "downgrade" else "shed" if shortfall == "shed" else "ignore"
        ),
        truncation=truncation_spec(msg.truncation, f"{where}.truncation"),
        max_sequences=caps_per_request["max_sequences"],
        max_media_parts=caps_per_request["max_media_parts"],
        max_embedding_inputs=caps_per_request["max_embedding_inputs"],
        media=_media(msg.media, f"{where}.media", base_dir),
        stored_context="reject" if stored == "reject" else "full_window",
        content_types="pass" if content_types == "pass" else "strict",
        mode="shadow" if mode == "shadow" else "enforce",
        compact_system_json=msg.compact_system_json,
        queue=queue_spec(msg.queue, f"{where}.queue"),
        backend_overload_status=overload_status,
    )


def _media(msg: policy_pb2.Media, where: str, base_dir: Path) -> MediaSpec:
    """Media costs; a model folder is checked now (its processor settings are read)."""
    d = MediaSpec()
    model_dir = ""
    if msg.model_dir:
        p = Path(msg.model_dir)
        model_dir = str(p if p.is_absolute() else base_dir / p)
    spec = MediaSpec(
        model_dir=model_dir,
        tokens_per_image=_opt(msg, "tokens_per_image", d.tokens_per_image),
        tokens_per_audio_second=_opt(msg, "tokens_per_audio_second", d.tokens_per_audio_second),
        tokens_per_audio=_opt(msg, "tokens_per_audio", d.tokens_per_audio),
        tokens_per_video=_opt(msg, "tokens_per_video", d.tokens_per_video),
    )
    for name in ("tokens_per_image", "tokens_per_audio", "tokens_per_video"):
        if getattr(spec, name) < 1:
            raise PolicyError(f"{where}.{name}: must be ≥ 1 (media is never free)")
    rate = spec.tokens_per_audio_second
    if not (math.isfinite(rate) and rate > 0):
        raise PolicyError(f"{where}.tokens_per_audio_second: must be > 0, got {rate}")
    if model_dir:
        from ext_proc.media import MediaModelError, media_cost

        try:
            media_cost(spec)
        except MediaModelError as e:
            raise PolicyError(f"{where}.model_dir: {e}") from None
    return spec


def _kv_model(msg: policy_pb2.KvModel, where: str) -> KvModelSpec:
    if not msg.config:
        raise PolicyError(f"{where}.config: the path of the model's config.json is required")
    try:
        config = json.loads(Path(msg.config).read_text("utf-8"))
        shape = shape_from_config(config)
        spec = KvModelSpec(
            shape=shape,
            kv_dtype=msg.kv_dtype or "auto",
            tp=_opt(msg, "tp", 1),
            max_num_batched_tokens=_opt(msg, "max_num_batched_tokens", 8192),
        )
        build_geometry(
            shape,
            tp=spec.tp,
            kv_dtype=spec.kv_dtype,
            block_size=16,
            max_num_batched_tokens=spec.max_num_batched_tokens,
        )
    except OSError as e:
        raise PolicyError(f"{where}.config: cannot read {msg.config}: {e.strerror}") from None
    except ValueError as e:  # JSON errors, KVInputError, NotModelledError
        raise PolicyError(f"{where}: {e}") from None
    return spec


def _tokenizers(msg: policy_pb2.Policy, base_dir: Path) -> dict[str, Any]:
    """Tokenizer specs by model; paths relative to the policy file's folder."""
    if not msg.tokenizers:
        return {}
    from ext_proc.tokencount import TokenizerSpec

    specs: dict[str, Any] = {}
    for model, t in msg.tokenizers.items():
        where = f"tokenizers.{model}"

        def path(text: str) -> Path:
            p = Path(text)
            return p if p.is_absolute() else base_dir / p

        overrides: dict[str, Any] = {}
        for field in ("tokenizer_json", "tokenizer_config", "chat_template"):
            value = getattr(t, field)
            if value:
                overrides[field] = path(value)
        if t.content_format:
            if t.content_format not in ("auto", "string", "openai"):
                raise PolicyError(
                    f"{where}.content_format: must be auto, string or openai, got "
                    f"{t.content_format!r}"
                )
            overrides["content_format"] = t.content_format
        if t.HasField("template_kwargs"):
            overrides["template_kwargs"] = MappingProxyType(
                json_format.MessageToDict(t.template_kwargs)
            )
        if t.model_dir:
            spec = TokenizerSpec.from_model_dir(path(t.model_dir), **overrides)
        elif "tokenizer_json" in overrides:
            spec = TokenizerSpec(**overrides)
        else:
            raise PolicyError(f"{where}: give model_dir or tokenizer_json")
        for field in ("tokenizer_json", "tokenizer_config", "chat_template"):
            value = getattr(spec, field)
            if value is not None and not Path(value).is_file():
                raise PolicyError(f"{where}.{field}: no such file: {value}")
        specs[model] = spec
    return specs


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
    routes: dict[str, RouteBinding] = {}
    for name, binding in msg.routes.items():
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
        routes[name] = RouteBinding(
            profile=binding.profile,
            pool=binding.pool,
            priority=_priority_or_none(binding.priority),
            schema=binding.schema,
        )
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
        tokenizers=MappingProxyType(_tokenizers(msg, base_dir)),
        exact_count_inline_bytes=_opt(msg, "exact_count_inline_bytes", 32768),
        exact_count_budget_ms=_opt(msg, "exact_count_budget_ms", 600),
        token_count_cache_bytes=_opt(msg, "token_count_cache_bytes", 32 * 1024 * 1024),
        exact_count=_exact_count_mode(msg.exact_count),
        embedding=embedding_spec(msg.embedding, base_dir),
        passthrough_paths=frozenset(passthrough),
        prefix_tracking=_prefix_tracking(msg),
    )


def _prefix_tracking(msg: policy_pb2.Policy) -> PrefixTrackingSpec | None:
    if not msg.HasField("prefix_tracking") or not msg.prefix_tracking.enabled:
        return None
    pt, d = msg.prefix_tracking, PrefixTrackingSpec()
    values = {
        name: _opt(pt, name, getattr(d, name))
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


def _priority_or_none(text: str) -> Priority | None:
    for candidate in PRIORITIES:
        if candidate == text:
            return candidate
    return None
