"""``ExactCounter``: one model's tokenizer and chat template, counting prompts as vLLM does.

Job: load a ``TokenizerSpec`` (``tokenizer.json`` through ``tokenizers``, plus the config's
special tokens the JSON lacks, as transformers adds them; the templates through
``templates``) and count a decoded request body's prompt tokens for each API in
``API_NAMES``: a completions prompt is encoded with special tokens; chat messages are shaped
(``shaping``), rendered with the named special tokens, ``tools`` and the request's template
keywords, and encoded without them; Anthropic messages are converted first (``anthropic``).
The body fields that change the prompt are read here (``add_generation_prompt``,
``continue_final_message``, ``add_special_tokens``, ``chat_template_kwargs``,
``reasoning_effort``, ``documents``, ``output_config.effort``, ``thinking``).

At load the counter also picks how to split a rendered prompt (``pieces``, ``splits``) and,
given the schema adapters' estimate, measures the estimate's bounds for this tokenizer
(``bounds``, ``calibration``), and derives the bounds that hold for any text (``derived``).

Inside ``pieces.new_text_bound`` counting encodes at most that many new characters, else
raises ``NewTextOverBound`` first; ``learn`` takes piece counts (``pieces.Lesson``) made by a
counter ``load`` built from the same tokenizer (``pieces.tokenizer_identity``).

Invariants: an ``ExactCounter`` is immutable after ``load`` (but for its piece cache), so
every method may run in many threads at once (the Rust tokenizer is only read; each render
gets its own jinja context). ``load`` raises only ``TokenizerLoadError``; counting raises
only ``TokenCountError``, and ``NewTextOverBound`` inside a bound.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from types import MappingProxyType
from typing import Any, Literal

from tokenizers import AddedToken, Tokenizer

from ext_proc.tokencount.anthropic import _anthropic_tools, anthropic_to_chat
from ext_proc.tokencount.calibration import (
    DEFAULT_BOUNDS,
    EstimateBounds,
    Estimator,
    measure_bounds,
)
from ext_proc.tokencount.derived import derived_for, framing
from ext_proc.tokencount.newtext import Lesson, NewTextOverBound, spend_new_text, tokenizer_identity
from ext_proc.tokencount.pieces import DEFAULT_CACHE_BYTES, PieceCounter
from ext_proc.tokencount.samples import SAMPLE_CONVERSATIONS, SAMPLE_TOOLS
from ext_proc.tokencount.shaping import (
    _conversation_message,
    _cut_at_tag,
    _developer_to_system,
    _flag,
    _is_int,
    _postprocess,
    _tag_final_message,
    _template_kwargs,
    _tool_dicts,
)
from ext_proc.tokencount.spec import TokenCountError, TokenizerLoadError, TokenizerSpec
from ext_proc.tokencount.splits import adversarial_conversations, turn_marker
from ext_proc.tokencount.templates import (
    _compile,
    _extra_tokens,
    _read_json,
    _special_tokens,
    _Template,
)

# The schema adapters' names (``RequestFeatures.schema``) that ``count_request`` reads.
API_NAMES = ("openai.chat", "openai.completions", "anthropic.messages")
# Anthropic efforts vLLM compares "none" with (``AnthropicEffort``).
_EFFORTS = ("low", "medium", "high", "xhigh", "max")


class ExactCounter:
    """One model's tokenizer and chat template; counts prompts as vLLM does (see module doc)."""

    __slots__ = (
        "_pieces",
        "_special",
        "_template_kwargs",
        "_templates",
        "_tokenizer",
        "bounds",
        "source",
    )

    def __init__(
        self,
        tokenizer: Tokenizer,
        templates: Mapping[str, _Template],
        special_tokens: Mapping[str, str],
        template_kwargs: Mapping[str, Any],
        source: str,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        estimate: Estimator | None = None,
        identity: bytes = b"",
    ) -> None:
        # a tokenizer.json may truncate or pad; transformers turns both off when it encodes
        # without truncation or padding, as vLLM does
        tokenizer.no_truncation()
        tokenizer.no_padding()
        self._tokenizer = tokenizer
        self._templates = MappingProxyType(dict(templates))
        self._special = MappingProxyType(dict(special_tokens))
        self._template_kwargs = MappingProxyType(dict(template_kwargs))
        self.source = source
        self._pieces = PieceCounter(tokenizer, cache_bytes, identity)
        marker = None
        if self._templates:  # the text between every two turns: a place to cut without tokens
            marker = turn_marker(lambda m: self._render(m, None, False, False, None))
        renders = self._renders(SAMPLE_CONVERSATIONS)
        cuts = self._pieces.template_cuts(renders)
        more = self._renders(adversarial_conversations(cuts + ([marker] if marker else [])))
        self._pieces.verify(renders + more, marker, cuts)
        bounds = (
            DEFAULT_BOUNDS if estimate is None else measure_bounds(self.count_request, estimate)
        )
        frame = framing(self.count_chat) if self._templates else (0, 0, False)
        post = self.count_text("a") - self.count_text("a", add_special_tokens=False)
        derived = derived_for(identity or tokenizer.to_str().encode(), tokenizer, frame, post)
        self.bounds: EstimateBounds = replace(bounds, derived=derived)

    @classmethod
    def load(
        cls,
        spec: TokenizerSpec,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        estimate: Estimator | None = None,
    ) -> ExactCounter:
        """Load ``spec``'s files; raise ``TokenizerLoadError`` naming the file and problem.
        ``cache_bytes`` bounds the remembered piece counts (``pieces``); with ``estimate``
        (the schema adapters' figure for a request) the estimate's bounds are measured
        (``calibration``), else ``bounds`` is the assumed 0.5–2.0."""
        path = spec.tokenizer_json
        if not path.is_file():
            raise TokenizerLoadError(f"tokenizer {path}: no such file")
        try:
            tokenizer = Tokenizer.from_file(str(path))
        except Exception as e:  # the Rust loader's errors are plain Exceptions
            raise TokenizerLoadError(f"tokenizer {path}: not a tokenizers JSON file: {e}") from None
        config: dict[str, Any] = {}
        if spec.tokenizer_config is not None:
            config = _read_json(spec.tokenizer_config, "tokenizer config")
            legacy = spec.tokenizer_config.parent / "special_tokens_map.json"
            if "added_tokens_decoder" not in config and legacy.is_file():
                config.update(_read_json(legacy, "special tokens map"))
        special = _special_tokens(config)
        known = {t.content for t in tokenizer.get_added_tokens_decoder().values()}
        missing = []
        for text in [*special.values(), *_extra_tokens(config)]:
            if text not in known:
                known.add(text)
                missing.append(AddedToken(text, special=True, normalized=False))
        if missing:  # transformers adds the config's special tokens the JSON lacks
            tokenizer.add_special_tokens(missing)
        templates = _compile(config, spec)
        kwargs = dict(spec.template_kwargs)
        identity = tokenizer_identity(path.read_bytes(), tokenizer)
        return cls(
            tokenizer, templates, special, kwargs, str(path), cache_bytes, estimate, identity
        )

    def _renders(self, conversations: Sequence[Sequence[Mapping[str, Any]]]) -> list[str]:
        """Each conversation rendered by each template (with and without tools, with and
        without the generation prompt): the texts ``pieces.PieceCounter.verify`` checks
        (the shipped samples, then conversations whose contents put the template's cut
        tokens and turn marker next to adversarial text, ``splits``)."""
        texts = []
        for tools in (None, SAMPLE_TOOLS):
            for conversation in conversations:
                for prompt in (True, False):
                    try:
                        messages = [dict(m) for m in conversation]
                        texts.append(self._render(messages, tools, prompt, False, None))
                    except TokenCountError:
                        continue
        return texts

    # -- properties

    @property
    def count_mode(self) -> str:
        """``pieces`` (turns counted apart and cached) or ``whole`` (see ``pieces``)."""
        return self._pieces.mode

    @property
    def split(self) -> str:
        """How pieces are encoded (``same``, ``first``; see ``splits``), or why whole texts
        are counted (``whole: <reason>``)."""
        pieces = self._pieces
        if pieces.mode == "whole":
            return f"whole: {pieces.reason}"
        return (
            pieces.split
            if pieces.boundary == "cut tokens"
            else f"{pieces.split} at {pieces.boundary}"
        )

    def learn(self, lesson: Lesson) -> int:
        """Merge piece counts another process's counter of this tokenizer made (``pieces``)."""
        return self._pieces.learn(lesson)

    @property
    def has_chat_template(self) -> bool:
        return bool(self._templates)

    def content_format(self, *, tools: bool = False) -> Literal["string", "openai"]:
        """The content format vLLM would detect for the template in use."""
        return self._template(tools).content_format

    # -- counting

    def count_text(self, text: str, *, add_special_tokens: bool = True) -> int:
        """Tokens of a ``/v1/completions`` prompt (the post-processor adds BOS as vLLM does);
        without special tokens (a rendered chat prompt) piece by piece (``pieces``)."""
        try:
            if not add_special_tokens:
                return self._pieces.count(text)
            spend_new_text(len(text))
            encoded = self._tokenizer.encode_batch_fast([text], add_special_tokens=True)
            return len(encoded[0])
        except NewTextOverBound:
            raise
        except Exception as e:  # e.g. a lone surrogate ("\ud800" in JSON) is no valid str
            raise TokenCountError(f"cannot tokenize the text: {e}") from None

    def token_ids(self, text: str) -> list[int]:
        """The ids of a rendered prompt (``render_chat``'s text: no special tokens added)."""
        spend_new_text(len(text))
        try:
            return list(self._tokenizer.encode(text, add_special_tokens=False).ids)
        except Exception as e:
            raise TokenCountError(f"cannot tokenize the text: {e}") from None

    def count_chat(
        self,
        messages: Sequence[Any],
        *,
        tools: Any = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        add_special_tokens: bool = False,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> int:
        """Tokens of an OpenAI chat request's prompt: ``messages`` and ``tools`` as in the
        request body; the keywords are the request's fields of the same names
        (``template_kwargs`` is ``chat_template_kwargs``)."""
        text = self.render_chat(
            messages,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            template_kwargs=template_kwargs,
        )
        return self.count_text(text, add_special_tokens=add_special_tokens)

    def count_anthropic(
        self,
        messages: Sequence[Any],
        *,
        system: Any = None,
        tools: Any = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> int:
        """Tokens of an Anthropic ``/v1/messages`` request's prompt, as vLLM renders it."""
        tool_dicts = _anthropic_tools(tools)
        chat = anthropic_to_chat(
            messages, system, system_first=self._system_first(tool_dicts is not None)
        )
        text = self._render(chat, tool_dicts, True, False, template_kwargs)
        return self.count_text(text, add_special_tokens=False)

    def count_request(self, api: str, body: Mapping[str, Any]) -> int:
        """Prompt tokens of a decoded request body for ``api`` (one of ``API_NAMES``, the
        schema adapters' names), reading the body's fields that change the prompt. A
        completions batch counts its longest prompt (vLLM's ``usage`` sums them)."""
        try:
            return self._count_request(api, body)
        except RecursionError:
            raise TokenCountError("the request is nested too deeply to count") from None

    def prompt_counts(self, api: str, body: Mapping[str, Any]) -> list[int]:
        """Prompt tokens of each prompt a request carries, for ``api`` (a schema adapter's
        name): one count for chat and messages; one per prompt for a completions batch; one
        per conversation for vLLM's batch chat; one per input for embeddings. Raises
        ``TokenCountError`` for a shape it cannot count (the caller keeps its estimate)."""
        try:
            if api == "openai.completions":
                return self._completion_counts(body.get("prompt"), body)
            if api == "openai.embeddings" and "input" in body:
                return self._completion_counts(body.get("input"), body)
            if api == "openai.chat_batch":
                conversations = body.get("messages")
                if not isinstance(conversations, list):
                    raise TokenCountError("messages: must be an array of conversations")
                return [
                    self._count_request("openai.chat", {**body, "messages": c})
                    for c in conversations
                ]
            return [self._count_request(api, body)]
        except RecursionError:
            raise TokenCountError("the request is nested too deeply to count") from None

    def _completion_counts(self, prompt: Any, body: Mapping[str, Any]) -> list[int]:
        special = _flag(body, "add_special_tokens", True)
        if isinstance(prompt, str):
            return [self.count_text(prompt, add_special_tokens=special)]
        if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
            return [self.count_text(p, add_special_tokens=special) for p in prompt]
        if isinstance(prompt, list) and all(_is_int(p) for p in prompt):
            return [len(prompt)]  # token ids go to the model as they are
        if isinstance(prompt, list) and all(
            isinstance(p, list) and all(_is_int(i) for i in p) for p in prompt
        ):
            return [len(p) for p in prompt]
        raise TokenCountError("prompt: must be text or token ids")

    def _count_request(self, api: str, body: Mapping[str, Any]) -> int:
        if api == "openai.chat":
            messages = body.get("messages")
            if not isinstance(messages, list):
                raise TokenCountError("messages: must be an array")
            return self.count_chat(
                messages,
                tools=body.get("tools"),  # kept with tool_choice "none", as vLLM does
                add_generation_prompt=_flag(body, "add_generation_prompt", True),
                continue_final_message=_flag(body, "continue_final_message", False),
                add_special_tokens=_flag(body, "add_special_tokens", False),
                template_kwargs=_template_kwargs(body, body.get("reasoning_effort")),
            )
        if api == "anthropic.messages":
            messages = body.get("messages")
            if not isinstance(messages, list):
                raise TokenCountError("messages: must be an array")
            effort = None
            config = body.get("output_config")
            if isinstance(config, dict):
                effort = config.get("effort")
            thinking = body.get("thinking")
            if isinstance(thinking, dict) and thinking.get("type") == "disabled":
                effort = self._disabled_effort()
            return self.count_anthropic(
                messages,
                system=body.get("system"),
                tools=body.get("tools"),
                template_kwargs=_template_kwargs(body, effort),
            )
        if api == "openai.completions":
            # a batch counts its longest prompt (vLLM's ``usage`` sums them)
            return max(self._completion_counts(body.get("prompt"), body), default=0)
        raise TokenCountError(f"unknown API {api!r}; expected one of {', '.join(API_NAMES)}")

    def _disabled_effort(self) -> str:
        """vLLM's ``reasoning_effort`` for Anthropic ``thinking: disabled``: "none", unless
        the template rejects it or renders it like a real effort (then "low")."""
        probe = [{"role": "user", "content": "Hi"}]

        def render(effort: str) -> str | None:
            kwargs = {"reasoning_effort": effort, "enable_thinking": effort != "none"}
            try:
                return self._render(probe, None, True, False, kwargs)
            except TokenCountError:
                return None

        none = render("none")
        if none is None or any(render(e) == none for e in _EFFORTS):
            return "low"
        return "none"

    # -- rendering

    def render_chat(
        self,
        messages: Sequence[Any],
        *,
        tools: Any = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        """The prompt text vLLM renders for an OpenAI chat request (before tokenizing)."""
        tool_dicts = _tool_dicts(tools)
        return self._render(
            list(messages),
            tool_dicts,
            add_generation_prompt,
            continue_final_message,
            template_kwargs,
        )

    def _template(self, tools: bool) -> _Template:
        if not self._templates:
            raise TokenCountError(f"{self.source}: no chat template configured")
        if tools and "tool_use" in self._templates:
            return self._templates["tool_use"]
        if "default" in self._templates:
            return self._templates["default"]
        if len(self._templates) == 1:
            return next(iter(self._templates.values()))
        raise TokenCountError(f"{self.source}: several chat templates and none is 'default'")

    def _system_first(self, tools: bool) -> bool:
        # vLLM probes both the tool and the plain template; either one asks for the merge.
        if not self._templates:
            return True
        return self._template(False).system_first or self._template(True).system_first

    def _render(
        self,
        messages: list[Any],
        tools: list[dict[str, Any]] | None,
        add_generation_prompt: bool,
        continue_final_message: bool,
        template_kwargs: Mapping[str, Any] | None,
    ) -> str:
        template = self._template(tools is not None)
        conversation = [
            _conversation_message(m, f"messages[{i}]", template.content_format)
            for i, m in enumerate(messages)
        ]
        _postprocess(conversation)
        if not template.knows_developer and any(m["role"] == "developer" for m in conversation):
            conversation = _developer_to_system(conversation)
        if continue_final_message and add_generation_prompt:
            raise TokenCountError("continue_final_message and add_generation_prompt both set")
        final: str | None = None
        if continue_final_message:
            final = _tag_final_message(conversation)
        kwargs: dict[str, Any] = {**self._template_kwargs, **(template_kwargs or {})}
        kwargs = {**self._special, **kwargs}
        for key in ("messages", "tools", "documents", "add_generation_prompt"):
            kwargs.pop(key, None)
        documents = (template_kwargs or {}).get("documents")
        try:
            text = template.compiled.render(
                messages=conversation,
                tools=tools,
                documents=documents,
                add_generation_prompt=add_generation_prompt,
                **kwargs,
            )
        except RecursionError:
            raise TokenCountError("chat template: recursion too deep") from None
        except Exception as e:  # a template may raise anything on odd input
            raise TokenCountError(f"chat template: {type(e).__name__}: {e}") from None
        if final is not None:
            text = _cut_at_tag(text, final)
        return text
