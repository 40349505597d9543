"""A request's KV-cache need and a backend's room for it (pure).

``Shape``: what the arithmetic needs of a request (prompts grouped by tokens, samples per
prompt, the window a stored-context sequence fills, whether the backend reads its prefix
cache for it). ``KvFit``: one endpoint's free and usable blocks, and how many blocks a
sequence needs (``blocks``: the first sample of a prompt; ``sibling``: another sample of it,
its full prompt blocks shared; ``cold``: a sample that reads no cached block). The formulas
are in ``ext_proc.policy.evaluate``'s docstring and docs/decision-ladder.md.

Samples share prompt blocks only where vLLM reads the prefix cache: not when the pool has
caching off (``sibling`` is None), and not for a request that asks for prompt logprobs
(``prompt_logprobs``, or ``echo`` with logprobs: ``Shape.reads_cache`` False), for which vLLM
0.32 sets ``SamplingParams.skip_reading_prefix_cache`` (``vllm/sampling_params.py``) and looks
up no cached block (``KVCacheManager.prefix_cache_lookup_enabled``,
``vllm/v1/core/kv_cache_manager.py``): every sample then prefills its whole prompt, and the
first sample gets no hit from the pool's recent ratio either (``cold``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ext_proc.kv.geometry import KVGeometry, build_geometry
from ext_proc.policy.settings import Profile
from ext_proc.schemas.base import RequestFeatures

__all__ = ["KvFit", "Shape", "blocks_fn"]


@dataclass(frozen=True, slots=True)
class Shape:
    """What the KV arithmetic needs of a request's shape: its prompts grouped by tokens
    ((tokens, count) pairs), the samples each starts, the window a stored-context
    sequence fills (0: none), and whether the backend reads its prefix cache for it."""

    groups: tuple[tuple[int, int], ...]
    samples: int = 1
    window: int = 0
    reads_cache: bool = True
    floor: int = 0  # output tokens per sequence it must generate (min_tokens, ignore_eos)

    @classmethod
    def single(cls, input_tokens: int) -> Shape:
        """One prompt, one sequence."""
        return cls(((input_tokens, 1),))

    @classmethod
    def of(cls, features: RequestFeatures, profile: Profile) -> Shape:
        window = (profile.max_model_len or 0) if features.stored_context else 0
        groups, samples = features.prompt_groups(), features.samples
        return cls(groups, samples, window, features.reads_prefix_cache, features.min_output)

    @property
    def sequences(self) -> int:
        return sum(count for _, count in self.groups) * self.samples

    def tokens(self, output: int) -> int:
        """Prompt and output tokens of all sequences (Retry-After's drain arithmetic)."""
        per = sum(max(p, self.window - output) * c for p, c in self.groups)
        return per * self.samples + output * self.sequences


@dataclass(frozen=True, slots=True)
class KvFit:
    """The pool's KV room and how many blocks a request needs (see the module docstring).

    ``blocks(P, O)``: the first sequence of a prompt; ``sibling(P, O)``: another sample of
    the same prompt, whose full prompt blocks are shared (None: not shared, as ``blocks``);
    ``cold(P, O)``: a sequence of a request that reads no cached block (None: as ``blocks``)."""

    free_blocks: int
    usable_blocks: int
    block_size: int
    blocks: Callable[[int, int], int]
    sibling: Callable[[int, int], int] | None = None
    cold: Callable[[int, int], int] | None = None
    # admission: forecast: the blocks a request of (shape, output limit) adds to its
    # endpoint's forecast peak (ext_proc.placement.forecast); None: its need, held whole
    forecast: Callable[[Shape, int], int] | None = None

    def less(self, held: int, usable_blocks: int | None = None) -> KvFit:
        """This room less ``held`` blocks (never below 0), with ``usable_blocks`` when given; the
        same object when nothing changes (built directly: on the request path)."""
        usable = self.usable_blocks if usable_blocks is None else usable_blocks
        if not held and usable == self.usable_blocks:
            return self
        free = max(0, self.free_blocks - held)
        b, s, c, f = self.blocks, self.sibling, self.cold, self.forecast
        return KvFit(free, usable, self.block_size, b, s, c, f)

    def charge(self, shape: Shape, output: int) -> int:
        """What admitting the request costs against ``free_blocks``: its whole need, or
        (forecast) what it adds to the forecast peak."""
        if self.forecast is not None:
            return self.forecast(shape, output)
        return self.need(shape, output)

    def need(self, shape: Shape, output: int) -> int:
        """KV blocks of the whole request with ``output`` tokens per sequence."""
        total = 0
        for tokens, count in shape.groups:
            p = max(tokens, shape.window - output) if shape.window else tokens
            if not shape.reads_cache:  # no sample reads the cache: none shares a block
                total += count * shape.samples * (self.cold or self.blocks)(p, output)
                continue
            one = self.blocks(p, output)
            if shape.samples > 1:
                other = self.sibling(p, output) if self.sibling is not None else one
                one += (shape.samples - 1) * other
            total += count * one
        return total

    def output_fit(self, shape: Shape, wanted: int) -> int:
        """The largest output ≤ ``wanted`` whose blocks fit ``free_blocks`` (0: none does)."""
        fits = self.free_blocks
        if self.charge(shape, wanted) <= fits:
            return wanted
        if self.charge(shape, 1) > fits:
            return 0
        lo, hi = 1, wanted  # charge() is monotone in output: binary search
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.charge(shape, mid) <= fits:
                lo = mid
            else:
                hi = mid - 1
        return lo


def blocks_fn(
    profile: Profile, block_size: int, geometries: dict[tuple[str, int], KVGeometry]
) -> Callable[[int, int, int], int]:
    """Blocks a request of (input, output) tokens needs with ``cached`` prompt tokens already
    in the prefix cache: ceil((i + o) / block_size) less the cache hit's whole blocks (at most
    i − 1 tokens) on a full-attention model, else the profile's ``kv_model`` geometry
    (``ext_proc.kv``; built once per (profile, block size) into ``geometries``)."""
    spec = profile.kv_model
    if spec is None:

        def full_attention(i: int, o: int, cached: int) -> int:
            hit = min(cached, i - 1) if i > 1 else 0
            return -(-(i + o) // block_size) - hit // block_size

        return full_attention
    key = (profile.name, block_size)
    geometry = geometries.get(key)
    if geometry is None:
        geometry = geometries[key] = build_geometry(
            spec.shape,
            tp=spec.tp,
            kv_dtype=spec.kv_dtype,
            block_size=block_size,
            max_num_batched_tokens=spec.max_num_batched_tokens,
        )
    return geometry.request_blocks
