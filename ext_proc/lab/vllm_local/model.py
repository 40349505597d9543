"""``build-model``: the tiny random-weight Llama that the tests serve, and its tokenizer.

A 2-layer Llama (``ModelGeometry``) with a ByteLevel BPE tokenizer trained on Python's own
standard-library sources, saved with ``save_pretrained``. ``build_model`` runs inside the vLLM
venv (it needs torch, transformers and tokenizers); ``ensure_model`` runs it there from any
other interpreter (``python -m ext_proc.lab.vllm_local build-model --here``).

Invariants: torch, transformers and tokenizers are imported by name inside ``build_model`` only,
so ICE's venv can import this module; ``MODEL_STAMP`` is written last, so ``model_ready`` is
true only for a complete model; the same seed gives the same weights.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sysconfig
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ext_proc.lab.vllm_local.common import (
    DEFAULT_MODEL_DIR,
    DEFAULT_VENV,
    REPO_ROOT,
    VllmError,
    venv_python,
)
from ext_proc.lab.vllm_local.install import venv_ready

__all__ = [
    "MODEL_STAMP",
    "ModelGeometry",
    "build_model",
    "ensure_model",
    "model_ready",
]


@dataclass(frozen=True)
class ModelGeometry:
    """Shape of the random-weight Llama served for tests; KV arithmetic follows from it."""

    layers: int = 2
    hidden_size: int = 256
    attention_heads: int = 4
    kv_heads: int = 2
    intermediate_size: int = 512
    max_position_embeddings: int = 4096
    vocab_size: int = 4096
    dtype: str = "bfloat16"

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.attention_heads

    @property
    def kv_bytes_per_token(self) -> int:
        """2 (K and V) × layers × KV heads × head_dim × bytes per element."""
        dtype_bytes = {"bfloat16": 2, "float16": 2, "float32": 4}[self.dtype]
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes


SPECIAL_TOKENS = ("<s>", "</s>", "<unk>", "<pad>")
# Role markers and </s> after each turn; the generation prompt opens the assistant's turn.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
MODEL_STAMP = "ice-model.json"
CORPUS_BYTES = 3_000_000


def _corpus_files(limit_bytes: int = CORPUS_BYTES) -> list[Path]:
    """Python's own standard-library sources, in name order, up to ``limit_bytes``."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    out: list[Path] = []
    total = 0
    for path in sorted(stdlib.glob("*.py")):
        out.append(path)
        total += path.stat().st_size
        if total >= limit_bytes:
            break
    if not out:
        raise VllmError(f"no Python sources under {stdlib} to train a tokenizer on")
    return out


def build_model(
    out: Path, *, seed: int = 0, geometry: ModelGeometry | None = None
) -> ModelGeometry:
    """Write a random-weight Llama and its tokenizer to ``out`` (needs the vLLM venv).

    The tokenizer is a ByteLevel BPE trained on the standard library's sources; the model's
    vocabulary is the tokenizer's. Weights come from ``torch.manual_seed(seed)``.
    """
    geometry = geometry or ModelGeometry()
    torch: Any = importlib.import_module("torch")
    tokenizers: Any = importlib.import_module("tokenizers")
    transformers: Any = importlib.import_module("transformers")
    out.mkdir(parents=True, exist_ok=True)
    (out / MODEL_STAMP).unlink(missing_ok=True)

    byte_level = tokenizers.pre_tokenizers.ByteLevel
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = byte_level(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=geometry.vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=byte_level.alphabet(),
        show_progress=False,
    )
    tok.train([str(p) for p in _corpus_files()], trainer)
    bos_id = tok.token_to_id("<s>")
    tok.post_processor = tokenizers.processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos_id)]
    )
    tok.save(str(out / "tokenizer.json"))
    vocab_size = tok.get_vocab_size()
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": "<pad>",
        "model_max_length": geometry.max_position_embeddings,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")
    special_map = {
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": "<pad>",
    }
    (out / "special_tokens_map.json").write_text(json.dumps(special_map, indent=2) + "\n")

    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=geometry.hidden_size,
        intermediate_size=geometry.intermediate_size,
        num_hidden_layers=geometry.layers,
        num_attention_heads=geometry.attention_heads,
        num_key_value_heads=geometry.kv_heads,
        max_position_embeddings=geometry.max_position_embeddings,
        bos_token_id=ids["<s>"],
        eos_token_id=ids["</s>"],
        pad_token_id=ids["<pad>"],
        tie_word_embeddings=False,
    )
    model = transformers.LlamaForCausalLM(config)
    model = model.to(getattr(torch, geometry.dtype))
    model.config.dtype = geometry.dtype
    model.save_pretrained(str(out))
    built = replace(geometry, vocab_size=vocab_size)
    stamp = {"seed": seed, **built.__dict__, "head_dim": built.head_dim}
    (out / MODEL_STAMP).write_text(json.dumps(stamp, indent=2) + "\n")
    return built


def model_ready(model_dir: Path) -> bool:
    """True when ``build_model`` finished writing ``model_dir`` (its stamp is there)."""
    return (model_dir / MODEL_STAMP).is_file()


def ensure_model(
    model_dir: Path = DEFAULT_MODEL_DIR, *, venv: Path = DEFAULT_VENV, seed: int = 0
) -> Path:
    """Build the tiny model into ``model_dir`` with the vLLM venv's Python, unless it is there."""
    if model_ready(model_dir):
        return model_dir
    if not venv_ready(venv):
        raise VllmError(f"{venv} is not installed: python -m ext_proc.lab.vllm_local install")
    env = {**os.environ, "PYTHONPATH": _pythonpath(os.environ.get("PYTHONPATH"))}
    argv = [str(venv_python(venv)), "-m", "ext_proc.lab.vllm_local", "build-model"]
    argv += ["--out", str(model_dir), "--seed", str(seed), "--here"]
    subprocess.run(argv, check=True, env=env)
    return model_dir


def _pythonpath(existing: str | None) -> str:
    return os.pathsep.join([str(REPO_ROOT), *([existing] if existing else [])])
