"""A Hugging Face ``config.json`` (as a dict) → the model facts the KV cache depends on.

Job: read the handful of keys vLLM reads to size its KV cache, the way vLLM 0.32 reads them
(``vllm/transformers_utils/model_arch_config_convertor.py``, ``vllm/config/model.py``,
``vllm/engine/arg_utils.py``), and recognise the architectures whose cache is not a plain
per-layer K/V store so they are refused (``NotModelledError``), never mis-sized.

Rules (``cfg`` = the text config: ``cfg["text_config"]`` over the root for multimodal models):

- layers: ``num_hidden_layers`` (aliases ``n_layer``, ``n_layers``, ``num_layers``).
- attention heads: ``num_attention_heads`` (aliases ``n_head``, ``n_heads``, ``num_heads``).
- KV heads: the first present of ``n_head_kv``, ``num_kv_heads``, ``num_key_value_heads``,
  ``multi_query_group_num``, ``num_attention_groups``; default = attention heads. Falcon
  with ``multi_query`` and no ``new_decoder_architecture``: 1.
- head_dim: ``head_dim`` when > 0, else ``hidden_size_per_head``, else
  ``hidden_size // num_attention_heads``.
- MLA (DeepSeek V2/V3, Kimi K2, …: ``kv_lora_rank`` set): one latent of
  ``kv_lora_rank + qk_rope_head_dim`` elements per token per layer, reported as 1 KV head of
  that width and flagged ``mla`` (no K/V factor 2, no tensor-parallel split).
- model dtype: ``dtype`` (transformers ≥ 5) or ``torch_dtype``; root first, then text config.
- sliding window per layer (``None`` = full attention), as vLLM builds its attention layers:
  ``sliding_window`` of 0 or null means none; ``use_sliding_window: false`` (Qwen2/Qwen3
  configs) means none; with ``layer_types``, a layer slides iff its type is
  ``sliding_attention``; without it, Gemma-2 and gpt-oss slide on even layers, Gemma-3 and
  Cohere-2 (and any config with ``sliding_window_pattern`` P) slide where ``(i + 1) % P ≠ 0``
  (P defaults 6 and 4); otherwise every layer slides (Mistral-7B-v0.1, Phi-3-mini-4k).
- max_model_len: the smallest of ``max_position_embeddings``, ``n_positions``,
  ``max_seq_len``, ``seq_length``, ``model_max_length``, ``max_target_positions``,
  ``max_sequence_length``, ``max_seq_length``, ``seq_len`` (``model_max_length`` wins when
  set), times the RoPE ``factor`` unless the RoPE type is su/longrope/llama3/yarn/
  deepseek_yarn/deepseek_llama_scaling or the model is Gemma-3; LongRoPE uses
  ``original_max_position_embeddings``; no key at all: 2048. (vLLM also caps it by the
  tokenizer's ``model_max_length``, which a config.json does not carry.)

Not modelled (``NotModelledError``): Mamba/SSM/linear-attention hybrids (model types such as
jamba, mamba, falcon_h1, nemotron_h, granitemoehybrid, qwen3_next, kimi_linear, or keys such as
``layers_block_type``, ``hybrid_override_pattern``, ``attn_layer_period``, ``mamba_*``,
``ssm_*``, ``linear_attn_config``, non-attention ``layer_types``); chunked local attention
(``attention_chunk_size``, Llama-4); sparse-attention indexers (``index_topk``, DeepSeek-V3.2)
and compressed caches (``compress_ratios``, DeepSeek-V4); per-layer head counts
(``block_configs``, list-valued heads); cross-layer KV sharing (``num_kv_shared_layers``);
encoder-decoder models; ``use_sliding_window: true`` (Qwen's partial sliding window).

Invariant: pure function of the dict; no I/O; stdlib only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ext_proc.kv.errors import KVInputError, NotModelledError

__all__ = ["ModelShape", "shape_from_config", "shape_from_numbers"]

_HYBRID_MODEL_TYPES = frozenset(
    {
        "bailing_hybrid",
        "bamba",
        "falcon_h1",
        "falcon_mamba",
        "granitemoehybrid",
        "hymba",
        "jamba",
        "kimi_linear",
        "lfm2",
        "lfm2_moe",
        "mamba",
        "mamba2",
        "minimax",
        "minimax_m1",
        "minimax_text_01",
        "nemotron_h",
        "plamo2",
        "qwen3_5",
        "qwen3_5_moe",
        "qwen3_next",
        "recurrent_gemma",
        "rwkv",
        "rwkv5",
        "rwkv6",
        "rwkv7",
        "xlstm",
        "zamba",
        "zamba2",
    }
)
_HYBRID_KEYS = (
    "layers_block_type",
    "hybrid_override_pattern",
    "attn_layer_period",
    "attn_layer_offset",
    "attn_layer_indices",
    "linear_attn_config",
    "full_attn_idxs",
    "linear_conv_kernel_dim",
    "ssm_cfg",
    "mamba_d_state",
    "mamba_d_conv",
    "mamba_expand",
    "ssm_state_size",
)
_ATTENTION_LAYER_TYPES = frozenset({"attention", "full_attention"})
_ROPE_NO_FACTOR = frozenset(
    {"su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling"}
)
_MAX_LEN_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_target_positions",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
_DEFAULT_MAX_MODEL_LEN = 2048


@dataclass(frozen=True, slots=True)
class ModelShape:
    """What the KV cache depends on, for the whole model (before tensor parallelism)."""

    model_type: str
    num_layers: int
    num_attention_heads: int | None  # None: not given (numbers without --attention-heads)
    num_kv_heads: int  # total; 1 for MLA
    head_dim: int  # elements per head; the latent width for MLA
    mla: bool
    model_dtype: str | None  # as written in config.json ("bfloat16", "float32", …) or None
    layer_windows: tuple[int | None, ...]  # per layer: sliding window in tokens, None = full
    max_model_len: int | None
    max_model_len_source: str


def _int(cfg: Mapping[str, Any], field: str, *aliases: str) -> int | None:
    for key in (field, *aliases):
        value = cfg.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise NotModelledError(
                key, f"{value!r} is not one integer (per-layer values are not modelled)"
            )
        return value
    return None


def _text_config(cfg: Mapping[str, Any]) -> Mapping[str, Any]:
    text = cfg.get("text_config")
    if isinstance(text, Mapping):
        merged = dict(cfg)
        merged.pop("text_config")
        merged.update(text)
        return merged
    return cfg


def _refuse_unmodelled(root: Mapping[str, Any], cfg: Mapping[str, Any]) -> None:
    types = {str(root.get("model_type", "")), str(cfg.get("model_type", ""))}
    hybrid = sorted(types & _HYBRID_MODEL_TYPES)
    if hybrid:
        raise NotModelledError(
            "model_type",
            f"{hybrid[0]} is a hybrid (Mamba/SSM or linear-attention) model: its state cache is "
            "not modelled",
        )
    for key in _HYBRID_KEYS:
        if cfg.get(key) is not None:
            values = cfg[key]
            if isinstance(values, list) and all(v in _ATTENTION_LAYER_TYPES for v in values):
                continue  # e.g. granite-4.0-micro: a "hybrid" config of attention layers only
            raise NotModelledError(
                key, "hybrid (Mamba/SSM or linear-attention) layers are not modelled"
            )
    checks = (
        ("attention_chunk_size", "chunked local attention (Llama-4 style) is not modelled"),
        ("index_topk", "the sparse-attention indexer cache (DeepSeek-V3.2) is not modelled"),
        ("compress_ratios", "compressed KV caches (DeepSeek-V4) are not modelled"),
        ("block_configs", "per-layer attention shapes are not modelled"),
        ("num_kv_shared_layers", "cross-layer KV sharing is not modelled"),
    )
    for key, why in checks:
        if cfg.get(key) is not None:
            raise NotModelledError(key, why)
    if cfg.get("is_encoder_decoder") is True:
        raise NotModelledError("is_encoder_decoder", "encoder-decoder caches are not modelled")


def _layer_windows(cfg: Mapping[str, Any], num_layers: int) -> tuple[int | None, ...]:
    window = _int(cfg, "sliding_window")
    if window == 0:
        window = None
    use_sw = cfg.get("use_sliding_window")
    if use_sw is False:
        window = None
    elif use_sw is True and window is not None:
        raise NotModelledError(
            "use_sliding_window",
            "Qwen-style use_sliding_window=true (sliding on some layers) is not modelled",
        )
    layer_types = cfg.get("layer_types")
    if layer_types is not None:
        if not isinstance(layer_types, list) or len(layer_types) != num_layers:
            raise KVInputError(
                "layer_types", f"must list one type for each of the {num_layers} layers"
            )
        odd = sorted({str(t) for t in layer_types} - {"full_attention", "sliding_attention"})
        if odd:
            raise NotModelledError(
                "layer_types", f"layer type {odd[0]!r} is not modelled (only full/sliding)"
            )
        if "sliding_attention" in layer_types and window is None:
            raise KVInputError("sliding_window", "layer_types has sliding layers but no window")
        return tuple(window if t == "sliding_attention" else None for t in layer_types)
    if window is None:
        return (None,) * num_layers
    model_type = str(cfg.get("model_type", ""))
    pattern = _int(cfg, "sliding_window_pattern")
    if pattern is None and model_type in ("gemma2", "gpt_oss"):
        pattern = 2
    elif pattern is None and model_type in ("gemma3", "gemma3_text"):
        pattern = 6
    elif pattern is None and model_type == "cohere2":
        pattern = 4
    if pattern is None:
        return (window,) * num_layers
    if pattern < 1:
        raise KVInputError("sliding_window_pattern", f"must be ≥ 1, got {pattern}")
    return tuple(window if (i + 1) % pattern else None for i in range(num_layers))


def _rope_entries(cfg: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    entries: list[Mapping[str, Any]] = []
    for key in ("rope_scaling", "rope_parameters"):
        rp = cfg.get(key)
        if not isinstance(rp, Mapping):
            continue
        if any(isinstance(v, Mapping) for v in rp.values()):  # per layer type
            entries.extend(v for v in rp.values() if isinstance(v, Mapping))
        else:
            entries.append(rp)
    return entries


def _max_model_len(cfg: Mapping[str, Any], model_type: str) -> tuple[int, str]:
    derived: float | None = None
    source = ""
    for key in _MAX_LEN_KEYS:
        value = cfg.get(key)
        if not isinstance(value, int | float) or isinstance(value, bool):
            continue
        if derived is None or value < derived:
            derived, source = value, key
    mml = cfg.get("model_max_length")
    if isinstance(mml, int | float) and not isinstance(mml, bool) and mml:
        derived, source = mml, "model_max_length"
    if derived is None:
        return _DEFAULT_MAX_MODEL_LEN, "vLLM's default (no length key in config.json)"
    entries = _rope_entries(cfg)
    rope_types = [str(e.get("rope_type", e.get("type", "default"))) for e in entries]
    if "longrope" in rope_types:
        original = cfg.get("original_max_position_embeddings")
        if isinstance(original, int):
            return original, "original_max_position_embeddings (LongRoPE)"
    if entries and "gemma3" not in model_type:
        factor: float | None = 1.0
        for entry, rope_type in zip(entries, rope_types, strict=True):
            if rope_type not in _ROPE_NO_FACTOR:
                factor = entry.get("factor", factor)
        if factor is None:
            factor = 1.0
        if factor != 1.0:
            derived *= factor
            source += f" × rope factor {factor:g}"
    return int(derived), source


def shape_from_config(config: Mapping[str, Any]) -> ModelShape:
    """The ``ModelShape`` of a parsed ``config.json`` (rules in the module docstring)."""
    if not isinstance(config, Mapping):
        raise KVInputError("config", "config.json must hold a JSON object")
    cfg = _text_config(config)
    _refuse_unmodelled(config, cfg)
    model_type = str(cfg.get("model_type", ""))
    layers = _int(cfg, "num_hidden_layers", "n_layer", "n_layers", "num_layers")
    if layers is None or layers < 1:
        raise KVInputError("num_hidden_layers", "missing or < 1 in config.json")
    heads = _int(cfg, "num_attention_heads", "n_head", "n_heads", "num_heads")
    if heads is None or heads < 1:
        raise KVInputError("num_attention_heads", "missing or < 1 in config.json")
    dtype = config.get("dtype") or config.get("torch_dtype")
    dtype = dtype or cfg.get("dtype") or cfg.get("torch_dtype")
    max_len, max_len_source = _max_model_len(cfg, model_type)

    if cfg.get("kv_lora_rank") is not None:
        rank = _int(cfg, "kv_lora_rank")
        rope = _int(cfg, "qk_rope_head_dim")
        if rank is None or rank < 1 or rope is None or rope < 0:
            raise KVInputError("qk_rope_head_dim", "MLA needs kv_lora_rank and qk_rope_head_dim")
        windows = _layer_windows(cfg, layers)
        if any(w is not None for w in windows):
            raise NotModelledError("sliding_window", "MLA with a sliding window is not modelled")
        return ModelShape(
            model_type=model_type,
            num_layers=layers,
            num_attention_heads=heads,
            num_kv_heads=1,
            head_dim=rank + rope,
            mla=True,
            model_dtype=str(dtype) if dtype else None,
            layer_windows=windows,
            max_model_len=max_len,
            max_model_len_source=max_len_source,
        )

    kv_heads = _int(
        cfg,
        "n_head_kv",
        "num_kv_heads",
        "num_key_value_heads",
        "multi_query_group_num",
        "num_attention_groups",
    )
    if (
        model_type == "falcon"
        and cfg.get("multi_query")
        and not cfg.get("new_decoder_architecture")
    ):
        kv_heads = 1
    if kv_heads is None:
        kv_heads = heads
    if kv_heads < 1:
        raise KVInputError("num_key_value_heads", f"must be ≥ 1, got {kv_heads}")
    head_dim = _int(cfg, "head_dim")
    if head_dim is None or head_dim <= 0:
        head_dim = _int(cfg, "hidden_size_per_head")
    if head_dim is None:
        hidden = _int(cfg, "hidden_size", "n_embd", "d_model")
        if hidden is None:
            raise KVInputError("hidden_size", "config.json has neither head_dim nor hidden_size")
        head_dim = hidden // heads
    if head_dim < 1:
        raise KVInputError("head_dim", f"must be ≥ 1, got {head_dim}")
    return ModelShape(
        model_type=model_type,
        num_layers=layers,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        mla=False,
        model_dtype=str(dtype) if dtype else None,
        layer_windows=_layer_windows(cfg, layers),
        max_model_len=max_len,
        max_model_len_source=max_len_source,
    )


def shape_from_numbers(
    *,
    layers: int,
    kv_heads: int,
    head_dim: int,
    attention_heads: int | None = None,
    dtype: str | None = None,
    sliding_window: int | None = None,
) -> ModelShape:
    """A plain full-attention (or, with ``sliding_window``, all-sliding) model from numbers.

    Without ``attention_heads`` only the KV heads constrain ``tp``.
    """
    for field, value in (("layers", layers), ("kv_heads", kv_heads), ("head_dim", head_dim)):
        if value < 1:
            raise KVInputError(field, f"must be ≥ 1, got {value}")
    heads = attention_heads
    if heads is not None and (heads < kv_heads or heads % kv_heads):
        raise KVInputError(
            "attention_heads", f"{heads} is not a multiple of the {kv_heads} KV heads"
        )
    if sliding_window is not None and sliding_window < 1:
        raise KVInputError("sliding_window", f"must be ≥ 1, got {sliding_window}")
    return ModelShape(
        model_type="",
        num_layers=layers,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        mla=False,
        model_dtype=dtype,
        layer_windows=(sliding_window,) * layers,
        max_model_len=None,
        max_model_len_source="",
    )
