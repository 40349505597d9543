"""Policy loading for what the policy reads from model files: a profile's ``media`` block (a
processor's settings) and ``kv_model`` block (a config.json), and the policy's ``tokenizers``
block (see load.py for the file as a whole). Every problem raises ``PolicyError`` naming the
field."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import MappingProxyType
from typing import Any

from google.protobuf import json_format

from ext_proc._pb import policy_pb2
from ext_proc.kv.geometry import build_geometry
from ext_proc.kv.hfconfig import shape_from_config
from ext_proc.media import MediaModelError, media_cost
from ext_proc.media.spec import MediaSpec
from ext_proc.policy.errors import PolicyError
from ext_proc.policy.load_fields import opt
from ext_proc.policy.settings import KvModelSpec
from ext_proc.tokencount import TokenizerSpec

__all__ = ["kv_model_spec", "media_spec", "tokenizer_specs"]


def media_spec(msg: policy_pb2.Media, where: str, base_dir: Path) -> MediaSpec:
    """Media costs; a model folder is checked now (its processor settings are read)."""
    d = MediaSpec()
    model_dir = ""
    if msg.model_dir:
        p = Path(msg.model_dir)
        model_dir = str(p if p.is_absolute() else base_dir / p)
    spec = MediaSpec(
        model_dir=model_dir,
        tokens_per_image=opt(msg, "tokens_per_image", d.tokens_per_image),
        tokens_per_audio_second=opt(msg, "tokens_per_audio_second", d.tokens_per_audio_second),
        tokens_per_audio=opt(msg, "tokens_per_audio", d.tokens_per_audio),
        tokens_per_video=opt(msg, "tokens_per_video", d.tokens_per_video),
    )
    for name in ("tokens_per_image", "tokens_per_audio", "tokens_per_video"):
        if getattr(spec, name) < 1:
            raise PolicyError(f"{where}.{name}: must be ≥ 1 (media is never free)")
    rate = spec.tokens_per_audio_second
    if not (math.isfinite(rate) and rate > 0):
        raise PolicyError(f"{where}.tokens_per_audio_second: must be > 0, got {rate}")
    if model_dir:
        try:
            media_cost(spec)
        except MediaModelError as e:
            raise PolicyError(f"{where}.model_dir: {e}") from None
    return spec


def kv_model_spec(msg: policy_pb2.KvModel, where: str) -> KvModelSpec:
    if not msg.config:
        raise PolicyError(f"{where}.config: the path of the model's config.json is required")
    try:
        config = json.loads(Path(msg.config).read_text("utf-8"))
        shape = shape_from_config(config)
        spec = KvModelSpec(
            shape=shape,
            kv_dtype=msg.kv_dtype or "auto",
            tp=opt(msg, "tp", 1),
            max_num_batched_tokens=opt(msg, "max_num_batched_tokens", 8192),
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


def tokenizer_specs(msg: policy_pb2.Policy, base_dir: Path) -> dict[str, Any]:
    """Tokenizer specs by model; paths relative to the policy file's folder."""
    if not msg.tokenizers:
        return {}
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
