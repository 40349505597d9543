"""What a non-text part of a prompt (image, audio, video) costs in prompt (KV) tokens.

Job: turn one content part, block or input item of a request into a ``MediaPart`` (its kind
and, when the data says, its pixel size or duration), and price a ``MediaPart`` in tokens
for one profile's ``MediaSpec``. Pure: no network, no pixel decoding; the only files read are
the model folder's ``preprocessor_config.json`` / ``config.json``, once per spec.

Invariants:
- ``MediaCost.tokens`` is always ≥ 1: media is never free.
- ``part_of``, ``image_size`` and ``audio_seconds`` never raise. Input they cannot read gives
  "unknown size" (``None``), and an unknown size is priced at its worst case (or the profile's
  default), never at less than a known size of the same model could cost.
- Bounded work per part: sizes come from header bytes only, of a bounded prefix (the first
  4 KiB of base64 text is decoded, then 64 KiB, then 1 MiB at most; a percent-encoded URL's
  first 64 KiB), walked in at most ``walks.MAX_STEPS`` (1,024) steps, as Pillow's format
  classes read them (``ext_proc.media.walks``: a PNG's ``IHDR``, a JPEG's last SOF before
  its scan, a GIF's screen and first frame, a WebP's first chunk). A header past those
  bounds gives "unknown size": the image's byte bound, never less; a WAV chunk past them:
  every byte from there counts as audio.
- ``exact`` names the rule that priced images: "qwen2_vl", "llava", or "" (the defaults).

Cost rules (tokens; sizes in pixels; durations in seconds):

Defaults — no ``model_dir``, or a model whose processor is not modelled here:
  image  → ``spec.tokens_per_image`` (576)
  audio  → ``ceil(seconds × spec.tokens_per_audio_second)`` (25.0 tokens/s) when the duration
           is known, else ``spec.tokens_per_audio`` (750). Known: a WAV of fixed-width
           samples, its seconds from the bytes present whatever its header claims
           (``ext_proc.media.headers``: a ``data`` size of 0 plays to the end)
  video  → ``spec.tokens_per_video`` (4096)
  Audio and video always use these rules, whatever the model.

"qwen2_vl" — Qwen2-VL, Qwen2.5-VL and every model whose ``preprocessor_config.json`` names
  the ``Qwen2VLImageProcessor`` (also ``…Fast`` / ``…Pil``; Qwen3-VL ships it), or whose
  ``config.json`` has ``model_type`` ``qwen2_vl`` / ``qwen2_5_vl``. Inputs from
  ``preprocessor_config.json``: ``patch_size`` p (14), ``merge_size`` m (2), ``min_pixels``
  (3136 = 56²), ``max_pixels`` (12845056 for ``qwen2_vl``, else 1003520 = 28²·1280, the
  transformers default); ``size: {"shortest_edge": min, "longest_edge": max}`` is read too,
  top-level ``min_pixels`` / ``max_pixels`` win over it as in transformers. With f = p·m,
  the image is resized as transformers' ``smart_resize(h, w, f, min_pixels, max_pixels)``:
      h̄ = round(h / f)·f,  w̄ = round(w / f)·f          (Python's round: half to even)
      if h̄·w̄ > max_pixels: β = √(h·w / max_pixels), h̄ = max(f, ⌊h / β / f⌋·f), same for w̄
      elif h̄·w̄ < min_pixels: β = √(min_pixels / (h·w)), h̄ = ⌈h·β / f⌉·f, same for w̄
  tokens = (h̄/p)·(w̄/p) / m² + 2  (the 2 are <|vision_start|> and <|vision_end|>).
  Unknown size, or an aspect ratio over 200 (which the server rejects): the worst case,
  ⌊max_pixels / f²⌋ + 2 (1282 for the 1003520 default, 16386 for 12845056), which is also
  the byte bound of an image whose header cannot be trusted (``ext_proc.media.cost``).

"llava" — LLaVA-1.5 style: ``config.json`` ``model_type`` ``llava`` with a CLIP vision tower
  (``vision_config.model_type`` ``clip_vision_model`` or absent) that states ``image_size`` s
  and ``patch_size`` p: every image costs (s // p)², whatever its size (576 for 336/14), plus
  one for the CLS token when ``vision_feature_select_strategy`` is ``full``.

Not exact (the defaults, ``exact == ""``): llava_next / llava_onevision (anyres tiling),
  LLaVA with another vision tower (Pixtral, SigLIP), a LLaVA config without ``image_size`` /
  ``patch_size``, and every other model type. Server-side overrides (vLLM's
  ``--mm-processor-kwargs``, per-request ``mm_processor_kwargs``) are not seen.
"""

from __future__ import annotations

from ext_proc.media.cost import MediaCost, MediaModelError, media_cost
from ext_proc.media.headers import audio_seconds, image_size
from ext_proc.media.parts import MediaKind, MediaPart, part_of

__all__ = [
    "MediaCost",
    "MediaKind",
    "MediaModelError",
    "MediaPart",
    "audio_seconds",
    "image_size",
    "media_cost",
    "part_of",
]
