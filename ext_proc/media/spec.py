"""What non-text parts cost in prompt tokens: the profile's ``media`` settings (plain data)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MediaSpec"]


@dataclass(frozen=True, slots=True)
class MediaSpec:
    """What non-text parts cost in prompt tokens (see ``ext_proc.media``)."""

    model_dir: str = ""  # a local model folder: the model's own image processor settings
    tokens_per_image: int = 576  # when the processor or the image's size is unknown
    tokens_per_audio_second: float = 25.0
    tokens_per_audio: int = 750  # an audio part whose duration cannot be read
    tokens_per_video: int = 4096
