"""Configuration and errors of exact token counting: ``TokenizerSpec`` and its two errors.

Job: say where one model's tokenizer files live (the policy's ``tokenizers`` section becomes
``TokenizerSpec`` values, like ``vllm serve``'s tokenizer flags) and define the only
exceptions this package raises: ``TokenizerLoadError`` while loading, ``TokenCountError``
while counting (callers keep their estimate then).

Invariants: a spec is a frozen value; specs with equal ``key()`` load the same counter (the
registry shares one). Both errors are ``ValueError``s whose message says what went wrong.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

ContentFormat = Literal["auto", "string", "openai"]


class TokenizerLoadError(ValueError):
    """A tokenizer or chat template could not be loaded; the message names file and cause."""


class TokenCountError(ValueError):
    """A request cannot be counted exactly (template error, non-text content)."""


# --- configuration --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TokenizerSpec:
    """Where one model's tokenizer lives.

    ``tokenizer_json``: the model's ``tokenizer.json``. ``tokenizer_config``: its
    ``tokenizer_config.json`` (special tokens, ``chat_template``). ``chat_template``: a
    ``.jinja`` file that replaces the config's template (like ``vllm serve --chat-template``).
    ``content_format``: like ``--chat-template-content-format`` (``auto`` detects it from the
    template). ``template_kwargs``: like ``--default-chat-template-kwargs``.
    """

    tokenizer_json: Path
    tokenizer_config: Path | None = None
    chat_template: Path | None = None
    content_format: ContentFormat = "auto"
    template_kwargs: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    @classmethod
    def from_model_dir(cls, model_dir: str | Path, **overrides: Any) -> TokenizerSpec:
        """The spec of a Hugging Face model folder: its ``tokenizer.json``, its
        ``tokenizer_config.json`` and ``chat_template.jinja`` when present."""
        root = Path(model_dir)
        config = root / "tokenizer_config.json"
        template = root / "chat_template.jinja"
        values: dict[str, Any] = {
            "tokenizer_json": root / "tokenizer.json",
            "tokenizer_config": config if config.is_file() else None,
            "chat_template": template if template.is_file() else None,
        }
        values.update(overrides)
        return cls(**values)

    def key(self) -> tuple[Any, ...]:
        """Identity of what gets loaded (specs with equal keys share one counter)."""
        kwargs = json.dumps(dict(self.template_kwargs), sort_keys=True, default=str)
        return (
            str(self.tokenizer_json),
            str(self.tokenizer_config),
            str(self.chat_template),
            self.content_format,
            kwargs,
        )
