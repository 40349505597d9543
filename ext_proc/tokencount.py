"""Exact prompt-token counts: a model's own tokenizer and chat template, applied as vLLM does.

Job: when the policy names a tokenizer for a model, count a request's prompt tokens exactly
(the number vLLM reports as ``usage.prompt_tokens``) instead of estimating them
(``ext_proc.tokens``). ``ExactCounter`` holds one Hugging Face ``tokenizers`` tokenizer
(``tokenizer.json``) and the model's chat template (jinja2); ``CounterRegistry`` maps served
model names to counters, loaded once from configuration.

What is mirrored (vLLM 0.32 with transformers 5, text content; checked against a real vLLM
server in ``tests/test_tokencount.py``):

- ``/v1/completions``: ``encode(prompt, add_special_tokens=True)``: the tokenizer's
  post-processor adds BOS/EOS as ``tokenizer.json`` says (``add_bos_token`` in
  ``tokenizer_config.json`` is ignored when a ``tokenizer.json`` exists, as in transformers).
- ``/v1/chat/completions``: messages become the template's conversation (string content
  as is; content-part arrays joined with ``"\\n"``, empty texts dropped, unless the template
  loops over ``message.content``, when text parts stay ``{"type": "text", "text": ...}``
  dicts; ``None`` content is ``""``; assistant ``tool_calls`` arguments are parsed into
  objects; ``developer`` becomes ``system`` when the template never names ``developer``);
  the template is rendered in transformers' sandbox (``ImmutableSandboxedEnvironment``,
  ``trim_blocks``, ``lstrip_blocks``, ``loopcontrols``, ``raise_exception``,
  ``strftime_now``, a non-escaping ``tojson``) with the named special tokens of
  ``tokenizer_config.json`` (``bos_token``, ``eos_token``, ...), ``tools`` and
  ``add_generation_prompt=True``; the text is encoded with ``add_special_tokens=False`` (a
  template that writes ``{{ bos_token }}`` is what adds BOS).
- ``/v1/messages`` (Anthropic): converted to chat first as vLLM's Anthropic endpoint does:
  top-level ``system`` text blocks joined with ``""`` into one leading system message; text
  blocks of a message kept as parts (so joined with ``"\\n"``), a single one as a string;
  ``tool_use`` → ``tool_calls``; a user's ``tool_result`` → a ``tool`` message before it;
  inline system messages merged into the leading one when the template rejects a system
  message after the first turn.

Not exact: images, audio and video parts (their tokens come from the model's processor):
``TokenCountError``, so the caller falls back to the estimate. Tokenizer classes whose
transformers code rebuilds the tokenizer instead of reading ``tokenizer.json`` (some
SentencePiece-era ones) may differ by a token or two; templates that print the date
(``strftime_now``) count today's date, as vLLM does.

Invariants:
- An ``ExactCounter`` is immutable after ``load``: every method may run in many threads at
  once (the Rust tokenizer is only read, and ``encode`` releases the GIL; each render gets its
  own jinja context). A ``CounterRegistry`` is immutable too; there is no module state.
- Loading raises only ``TokenizerLoadError``, whose message names the file and the problem.
  Counting raises only ``TokenCountError`` (the template raised, or content it cannot
  count): callers keep their estimate then; no other exception escapes for JSON input.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, NoReturn

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Tokenizer

__all__ = [
    "API_NAMES",
    "ContentFormat",
    "CounterRegistry",
    "ExactCounter",
    "TokenCountError",
    "TokenizerLoadError",
    "TokenizerSpec",
    "anthropic_to_chat",
]

ContentFormat = Literal["auto", "string", "openai"]
# The schema adapters' names (``RequestFeatures.schema``) that ``count_request`` reads.
API_NAMES = ("openai.chat", "openai.completions", "anthropic.messages")

# transformers' named special tokens (``SPECIAL_TOKENS_ATTRIBUTES``); other ``*_token`` keys
# of tokenizer_config.json are model-specific named tokens and reach the template too.
_NAMED_TOKENS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
# Content-part types vLLM reads as text, and the key holding the text.
_TEXT_PARTS = {
    "text": "text",
    "input_text": "text",
    "output_text": "text",
    "refusal": "refusal",
    "thinking": "thinking",
}
# Part fields vLLM knows; others ride along on text parts of "openai"-format templates.
_KNOWN_PART_FIELDS = frozenset(
    {
        "audio_embeds",
        "audio_url",
        "closed",
        "data",
        "file",
        "image_embeds",
        "image_pil",
        "image_url",
        "input_audio",
        "name",
        "prompt_cache_breakpoint",
        "refusal",
        "text",
        "thinking",
        "type",
        "uuid",
        "video_embeds",
        "video_url",
    }
)
# Claude Code's per-request attribution line, dropped from system text by vLLM.
_BILLING_HEADER = "x-anthropic-billing-header"
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "
# Anthropic efforts vLLM compares "none" with (``AnthropicEffort``).
_EFFORTS = ("low", "medium", "high", "xhigh", "max")


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


# --- the jinja environment of transformers' apply_chat_template ------------------------------


class _GenerationTag(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` (assistant masks): renders its body."""

    tags = {"generation"}  # noqa: RUF012 (jinja2's API is a class attribute)

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_render_body")
        return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _render_body(self, caller: Callable[[], str]) -> str:
        return caller()


def _raise_exception(message: str) -> NoReturn:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


# --- template analysis, as vLLM does it -------------------------------------------------------


def _is_name(node: jinja2.nodes.Node, name: str) -> bool:
    return isinstance(node, jinja2.nodes.Name) and node.ctx == "load" and node.name == name


def _is_item(node: jinja2.nodes.Node, name: str, key: str | None) -> bool:
    """``name``, ``name[key]`` or ``name.key``, through filters, tests and slices."""
    if isinstance(node, jinja2.nodes.Filter | jinja2.nodes.Test):
        return node.node is not None and _is_item(node.node, name, key)
    if isinstance(node, jinja2.nodes.Getitem) and isinstance(node.arg, jinja2.nodes.Slice):
        return _is_item(node.node, name, key)
    if key is None:
        return _is_name(node, name)
    if isinstance(node, jinja2.nodes.Getitem):
        arg = node.arg
        return (
            _is_name(node.node, name) and isinstance(arg, jinja2.nodes.Const) and arg.value == key
        )
    if isinstance(node, jinja2.nodes.Getattr):
        return _is_name(node.node, name) and node.attr == key
    return False


def _aliases(root: jinja2.nodes.Template, name: str) -> list[str]:
    """``name`` and the variables assigned from it (``{% set msgs = messages[1:] %}``)."""
    found = [name]
    queue = [name]
    while queue:
        current = queue.pop(0)
        for assign in root.find_all(jinja2.nodes.Assign):
            target = assign.target
            if (
                isinstance(target, jinja2.nodes.Name)
                and _is_item(assign.node, current, None)
                and target.name not in found
            ):
                found.append(target.name)
                queue.append(target.name)
    return found


def _loops_over_content(root: jinja2.nodes.Template) -> bool:
    """vLLM's content-format test: does the template loop over a message's ``content``?"""
    message_vars = []
    for alias in _aliases(root, "messages"):
        for loop in root.find_all(jinja2.nodes.For):
            if _is_item(loop.iter, alias, None) and isinstance(loop.target, jinja2.nodes.Name):
                message_vars.append(loop.target.name)
    macro_loops: dict[int, set[str]] = {}
    in_macros: set[int] = set()
    for macro in root.find_all(jinja2.nodes.Macro):
        params = {arg.name for arg in macro.args}
        content_params: set[str] = set()
        for call in root.find_all(jinja2.nodes.Call):
            if not (isinstance(call.node, jinja2.nodes.Name) and call.node.name == macro.name):
                continue
            for i, arg in enumerate(call.args):
                if i < len(macro.args) and any(_is_item(arg, v, "content") for v in message_vars):
                    content_params.add(macro.args[i].name)
            for kw in call.kwargs:
                if kw.key in params and any(_is_item(kw.value, v, "content") for v in message_vars):
                    content_params.add(kw.key)
        for loop in macro.find_all(jinja2.nodes.For):
            in_macros.add(id(loop))
            if content_params:
                macro_loops[id(loop)] = content_params
    for loop in root.find_all(jinja2.nodes.For):
        it = loop.iter
        if any(_is_item(it, v, "content") for v in message_vars):
            return True
        if isinstance(it, jinja2.nodes.Name):
            if it.name in macro_loops.get(id(loop), ()):
                return True
            if id(loop) not in in_macros and it.name == "content":
                return True
    return False


def _needs_system_first(source: str) -> bool:
    """vLLM's probe for ``/v1/messages``: a template that fails on [system, user, system,
    user] (e.g. Qwen's ``loop.first`` guard) gets inline system messages merged."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    probe = [
        {"role": "system", "content": "t"},
        {"role": "user", "content": "t"},
        {"role": "system", "content": "t"},
        {"role": "user", "content": "t"},
    ]
    try:
        env.from_string(source).render(messages=probe, add_generation_prompt=False)
    except Exception:  # vLLM catches TemplateError; anything else is no better a sign
        return True
    return False


@dataclass(frozen=True, slots=True)
class _Template:
    source: str
    compiled: jinja2.Template
    content_format: Literal["string", "openai"]
    knows_developer: bool
    system_first: bool


# --- loading ----------------------------------------------------------------------------------


def _read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        text = path.read_text("utf-8")
    except OSError as e:
        raise TokenizerLoadError(f"{what} {path}: cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise TokenizerLoadError(f"{what} {path}: not UTF-8 text: {e}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise TokenizerLoadError(f"{what} {path}: not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise TokenizerLoadError(f"{what} {path}: the top level must be a JSON object")
    return data


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken object."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _special_tokens(config: Mapping[str, Any]) -> dict[str, str]:
    """The named tokens the template sees: the standard seven and model-specific ``*_token``."""
    out: dict[str, str] = {}
    for key, value in config.items():
        if key in _NAMED_TOKENS or (key.endswith("_token") and not key.startswith("add_")):
            text = _token_text(value)
            if text is not None:
                out[key] = text
    return out


def _extra_tokens(config: Mapping[str, Any]) -> list[str]:
    """The config's other special tokens: extra/additional ones, ``added_tokens_decoder``."""
    values: list[Any] = []
    for key in ("extra_special_tokens", "additional_special_tokens", "added_tokens_decoder"):
        value = config.get(key)
        if isinstance(value, dict):
            values.extend(value.values())
        elif isinstance(value, list):
            values.extend(value)
    return [t for t in (_token_text(v) for v in values) if t is not None]


def _templates(
    config: Mapping[str, Any], config_path: Path | None, template_path: Path | None
) -> dict[str, str]:
    if template_path is not None:
        try:
            return {"default": template_path.read_text("utf-8")}
        except (OSError, UnicodeDecodeError) as e:
            reason = e.strerror if isinstance(e, OSError) else str(e)
            raise TokenizerLoadError(
                f"chat template {template_path}: cannot read: {reason}"
            ) from None
    value = config.get("chat_template")
    if value is None:
        return {}
    if isinstance(value, str):
        return {"default": value}
    if isinstance(value, list):  # [{"name": ..., "template": ...}, ...]
        out: dict[str, str] = {}
        for i, item in enumerate(value):
            if not (
                isinstance(item, dict)
                and isinstance(item.get("name"), str)
                and isinstance(item.get("template"), str)
            ):
                raise TokenizerLoadError(
                    f"tokenizer config {config_path}: chat_template[{i}] must be an object "
                    "with string 'name' and 'template'"
                )
            out[item["name"]] = item["template"]
        return out
    raise TokenizerLoadError(
        f"tokenizer config {config_path}: chat_template must be a string or a list of "
        f"{{name, template}} objects, got {type(value).__name__}"
    )


# --- conversation shaping (vLLM's parse_chat_messages, text only) ---------------------------


def _strip_billing(text: str) -> str | None:
    if not text.startswith(_BILLING_HEADER):
        return text
    rest = text.partition("\n")[2]
    return rest or None


def _part_text(part: Any, where: str) -> tuple[str, dict[str, Any]] | None:
    """The text of one content part and its extra fields, or None for a part vLLM skips."""
    if isinstance(part, str):
        return part, {}
    if not isinstance(part, dict):
        raise TokenCountError(f"{where}: a content part must be a string or an object")
    kind = part.get("type")
    key = _TEXT_PARTS.get(kind) if isinstance(kind, str) else None
    if key is None:
        raise TokenCountError(f"{where}: content part of type {kind!r} is not text")
    text = part.get(key)
    if text is None:
        return None
    if not isinstance(text, str):
        raise TokenCountError(f"{where}.{key}: must be a string")
    return text, {k: v for k, v in part.items() if k not in _KNOWN_PART_FIELDS}


def _conversation_message(
    msg: Any, where: str, content_format: Literal["string", "openai"]
) -> dict[str, Any]:
    if not isinstance(msg, dict):
        raise TokenCountError(f"{where}: a message must be an object")
    role = msg.get("role")
    if not isinstance(role, str):
        raise TokenCountError(f"{where}.role: must be a string")
    content = msg.get("content")
    parts: list[Any]
    if content is None:
        parts = []
    elif isinstance(content, str):
        parts = [content]
    elif isinstance(content, list):
        parts = content
    else:
        raise TokenCountError(f"{where}.content: must be a string, an array or null")
    texts: list[tuple[str, dict[str, Any]]] = []
    for i, part in enumerate(parts):
        got = _part_text(part, f"{where}.content[{i}]")
        if got is None:
            continue
        text, extra = got
        if role == "system":
            stripped = _strip_billing(text)
            if stripped is None:
                continue
            text = stripped
        texts.append((text, extra))
    out: dict[str, Any] = {"role": role}
    if content_format == "openai":
        out["content"] = [{"type": "text", "text": t, **extra} for t, extra in texts]
    else:
        out["content"] = "\n".join(t for t, _ in texts if t)
    if role == "assistant":
        calls = msg.get("tool_calls")
        if calls is not None:
            out["tool_calls"] = list(calls) if isinstance(calls, list) else calls
        reasoning = msg.get("reasoning")
        if reasoning is not None:
            out["reasoning"] = reasoning
            out["reasoning_content"] = reasoning
    elif role == "tool":
        if "tool_call_id" in msg:
            out["tool_call_id"] = msg["tool_call_id"]
        if content_format == "openai" and isinstance(out["content"], list):
            out["content"] = "\n".join(p["text"] for p in out["content"])
    for key in ("name", "task"):
        if isinstance(msg.get(key), str):
            out[key] = msg[key]
    if role == "developer":
        out["tools"] = msg.get("tools")
    return out


def _parse_arguments(fn: dict[str, Any]) -> None:
    raw = fn.get("arguments")
    if not raw:
        fn["arguments"] = {}
        return
    if isinstance(raw, dict):
        return
    parsed: Any = raw
    if isinstance(raw, str):
        try:
            parsed = json.loads(raw)
        except ValueError:  # vLLM coerces malformed arguments to {}
            parsed = None
    fn["arguments"] = parsed if isinstance(parsed, dict) else {}


def _postprocess(conversation: list[dict[str, Any]]) -> None:
    """Assistant tool calls as templates expect them: arguments parsed into objects."""
    for i, msg in enumerate(conversation):
        if msg["role"] != "assistant" or "tool_calls" not in msg:
            continue
        calls = msg["tool_calls"]
        if not isinstance(calls, list):
            continue
        if not calls:
            del msg["tool_calls"]
            continue
        copied = []
        for call in calls:
            fn = call.get("function") if isinstance(call, dict) else None
            if not isinstance(fn, dict) or call.get("type", "function") != "function":
                raise TokenCountError(f"messages[{i}].tool_calls: only function calls are counted")
            fn = dict(fn)
            _parse_arguments(fn)
            copied.append({**call, "function": fn})
        msg["tool_calls"] = copied


def _developer_to_system(conversation: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """vLLM's fallback for templates that never mention ``developer``: developer → system,
    and all system messages merged into one leading message when they are not already one."""
    converted = []
    for msg in conversation:
        if msg["role"] == "developer":
            converted.append({**{k: v for k, v in msg.items() if k != "tools"}, "role": "system"})
        else:
            converted.append(msg)
    system_texts: list[str] = []
    rest: list[dict[str, Any]] = []
    merge = False
    for i, msg in enumerate(converted):
        if msg["role"] != "system":
            rest.append(msg)
            continue
        if i > 0 or system_texts:
            merge = True
        content = msg.get("content", "")
        if isinstance(content, list):
            content = "\n".join(
                p["text"] if isinstance(p, dict) else str(p)
                for p in content
                if isinstance(p, str) or (isinstance(p, dict) and "text" in p)
            )
        if content:
            system_texts.append(content)
    if not merge:
        return converted
    return [{"role": "system", "content": "\n\n".join(system_texts)}, *rest]


def _tool_dicts(tools: Any) -> list[dict[str, Any]] | None:
    """OpenAI ``tools`` as vLLM hands them to the template (its pydantic dump)."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise TokenCountError("tools: must be an array")
    out = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise TokenCountError(f"tools[{i}]: must be a function tool with a name")
        dumped: dict[str, Any] = {
            "name": fn["name"],
            "description": fn.get("description"),
            "parameters": fn.get("parameters"),
        }
        for key in ("strict", "defer_loading"):
            if fn.get(key) is not None:
                dumped[key] = fn[key]
        if tool.get("defer_loading") is not None and "defer_loading" not in dumped:
            dumped["defer_loading"] = tool["defer_loading"]
        entry: dict[str, Any] = {"type": "function", "function": dumped}
        if tool.get("defer_loading") is not None:
            entry["defer_loading"] = tool["defer_loading"]
        out.append(entry)
    return out


# --- Anthropic /v1/messages → chat ------------------------------------------------------------


def _anthropic_text(value: Any, *, inline: bool) -> str | None:
    """System text: a string, or text blocks joined with "" (billing-header blocks dropped).
    An inline system message that is a billing-header string is dropped whole; a top-level
    one is kept here and loses its first line in the chat parse, as in vLLM."""
    if isinstance(value, str):
        return None if inline and value.startswith(_BILLING_HEADER) else value
    if not isinstance(value, list):
        return None
    parts = []
    for block in value:
        if isinstance(block, dict) and block.get("type") == "text":
            text = block.get("text")
            if isinstance(text, str) and text and not text.startswith(_BILLING_HEADER):
                parts.append(text)
    return "".join(parts) if parts else None


def _anthropic_tool_result(block: dict[str, Any], out: list[dict[str, Any]]) -> None:
    content = block.get("content")
    text = ""
    images: list[dict[str, Any]] = []
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        texts = []
        for item in content:
            if not isinstance(item, dict):
                continue
            if item.get("type") == "text":
                texts.append(str(item.get("text", "")))
            elif item.get("type") == "image":
                images.append({"type": "image_url", "image_url": {"url": "<image>"}})
        text = "\n".join(texts)
    out.append({"role": "tool", "tool_call_id": block.get("tool_use_id") or "", "content": text})
    if images:
        out.append({"role": "user", "content": images})


def anthropic_to_chat(
    messages: Sequence[Any], system: Any = None, *, system_first: bool = False
) -> list[dict[str, Any]]:
    """Anthropic ``system`` + ``messages`` as the OpenAI chat messages vLLM's ``/v1/messages``
    builds from them (``system_first``: merge inline system messages into the leading one)."""
    out: list[dict[str, Any]] = []
    system_parts = []
    leading = _anthropic_text(system, inline=False) if system else None
    if leading:
        system_parts.append(leading)
    if system_first:
        for msg in messages:
            if isinstance(msg, dict) and msg.get("role") == "system":
                text = _anthropic_text(msg.get("content"), inline=True)
                if text:
                    system_parts.append(text)
    if system_parts:
        out.append({"role": "system", "content": "".join(system_parts)})
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise TokenCountError(f"messages[{i}]: must be an object with a role")
        role = msg["role"]
        content = msg.get("content")
        if role == "system":
            text = _anthropic_text(content, inline=True)
            if text and not system_first:
                out.append({"role": "system", "content": text})
            continue
        chat: dict[str, Any] = {"role": role}
        if isinstance(content, str):
            chat["content"] = content
        elif isinstance(content, list):
            parts: list[dict[str, Any]] = []
            calls: list[dict[str, Any]] = []
            reasoning: list[str] = []
            for block in content:
                if not isinstance(block, dict):
                    raise TokenCountError(f"messages[{i}].content: blocks must be objects")
                kind = block.get("type")
                if kind == "text" and block.get("text"):
                    parts.append({"type": "text", "text": block["text"]})
                elif kind == "image" and block.get("source"):
                    parts.append({"type": "image_url", "image_url": {"url": "<image>"}})
                elif kind == "thinking" and block.get("thinking") is not None:
                    reasoning.append(str(block["thinking"]))
                elif kind == "tool_use":
                    arguments = json.dumps(block.get("input") or {})
                    calls.append(
                        {
                            "id": block.get("id") or "call",
                            "type": "function",
                            "function": {"name": block.get("name") or "", "arguments": arguments},
                        }
                    )
                elif kind == "tool_result":
                    if role == "user":
                        _anthropic_tool_result(block, out)
                    else:
                        result = str(block.get("content")) if block.get("content") else ""
                        parts.append({"type": "text", "text": f"Tool result: {result}"})
            if reasoning:
                chat["reasoning"] = "".join(reasoning)
            if calls:
                chat["tool_calls"] = calls
            if parts:
                only_text = len(parts) == 1 and parts[0]["type"] == "text"
                chat["content"] = parts[0]["text"] if only_text else parts
        if not (role == "user" and "content" not in chat):
            out.append(chat)
    return out


def _anthropic_tools(tools: Any) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise TokenCountError("tools: must be an array")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            raise TokenCountError(f"tools[{i}]: must be an object with a name")
        fn = {
            "name": tool["name"],
            "description": tool.get("description"),
            "parameters": tool.get("input_schema"),
            "strict": tool.get("strict"),
            "defer_loading": tool.get("defer_loading"),
        }
        out.append({"type": "function", "function": fn})
    return _tool_dicts(out)


# --- the counter ------------------------------------------------------------------------------


class ExactCounter:
    """One model's tokenizer and chat template; counts prompts as vLLM does (see module doc)."""

    __slots__ = ("_special", "_template_kwargs", "_templates", "_tokenizer", "source")

    def __init__(
        self,
        tokenizer: Tokenizer,
        templates: Mapping[str, _Template],
        special_tokens: Mapping[str, str],
        template_kwargs: Mapping[str, Any],
        source: str,
    ) -> None:
        self._tokenizer = tokenizer
        self._templates = MappingProxyType(dict(templates))
        self._special = MappingProxyType(dict(special_tokens))
        self._template_kwargs = MappingProxyType(dict(template_kwargs))
        self.source = source

    @classmethod
    def load(cls, spec: TokenizerSpec) -> ExactCounter:
        """Load ``spec``'s files; raise ``TokenizerLoadError`` naming the file and problem."""
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
        env = _environment()
        templates: dict[str, _Template] = {}
        where = spec.chat_template or spec.tokenizer_config
        for name, source in _templates(config, spec.tokenizer_config, spec.chat_template).items():
            try:
                compiled = env.from_string(source)
                tree = env.parse(source)
            except jinja2.TemplateSyntaxError as e:
                raise TokenizerLoadError(
                    f"chat template {name!r} of {where}: line {e.lineno}: {e.message}"
                ) from None
            fmt = spec.content_format
            if fmt == "auto":
                fmt = "openai" if _loops_over_content(tree) else "string"
            templates[name] = _Template(
                source=source,
                compiled=compiled,
                content_format=fmt,
                knows_developer="'developer'" in source or '"developer"' in source,
                system_first=_needs_system_first(source),
            )
        kwargs = dict(spec.template_kwargs)
        return cls(tokenizer, templates, special, kwargs, source=str(path))

    # -- properties

    @property
    def has_chat_template(self) -> bool:
        return bool(self._templates)

    def content_format(self, *, tools: bool = False) -> Literal["string", "openai"]:
        """The content format vLLM would detect for the template in use."""
        return self._template(tools).content_format

    # -- counting

    def count_text(self, text: str, *, add_special_tokens: bool = True) -> int:
        """Tokens of a ``/v1/completions`` prompt (the post-processor adds BOS as vLLM does)."""
        try:
            return len(self._tokenizer.encode(text, add_special_tokens=add_special_tokens))
        except Exception as e:  # e.g. a lone surrogate ("\ud800" in JSON) is no valid str
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
            prompt = body.get("prompt")
            special = _flag(body, "add_special_tokens", True)
            if isinstance(prompt, str):
                return self.count_text(prompt, add_special_tokens=special)
            if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
                counts = [self.count_text(p, add_special_tokens=special) for p in prompt]
                return max(counts, default=0)
            if isinstance(prompt, list) and all(_is_int(p) for p in prompt):
                return len(prompt)  # token ids go to the model as they are
            if isinstance(prompt, list) and all(
                isinstance(p, list) and all(_is_int(i) for i in p) for p in prompt
            ):
                return max((len(p) for p in prompt), default=0)
            raise TokenCountError("prompt: must be text or token ids")
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


def _tag_final_message(conversation: list[dict[str, Any]]) -> str:
    """Mark the final message's text for ``continue_final_message`` (as transformers does)."""
    if not conversation:
        raise TokenCountError("continue_final_message: there is no final message")
    last = conversation[-1]
    content = last.get("content")
    if isinstance(content, list):
        for part in reversed(content):
            if isinstance(part, dict) and "text" in part:
                final = str(part["text"])
                part["text"] = final + _CONTINUE_TAG
                return final
        raise TokenCountError("continue_final_message: the final message has no text")
    if not isinstance(content, str):
        raise TokenCountError("continue_final_message: the final message has no content")
    last["content"] = content + _CONTINUE_TAG
    return content


def _cut_at_tag(text: str, final: str) -> str:
    tag = _CONTINUE_TAG.strip()
    if final.strip() not in text or tag not in text:
        raise TokenCountError("continue_final_message: the template dropped the final message")
    at = text.rindex(tag)
    if text[at : at + len(_CONTINUE_TAG)] == _CONTINUE_TAG:
        return text[:at]
    return text[:at].rstrip()


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _flag(body: Mapping[str, Any], key: str, default: bool) -> bool:
    value = body.get(key)
    return value if isinstance(value, bool) else default


def _template_kwargs(body: Mapping[str, Any], effort: Any) -> dict[str, Any]:
    """``chat_template_kwargs`` with what vLLM adds from the request (unset when None)."""
    given = body.get("chat_template_kwargs")
    kwargs: dict[str, Any] = dict(given) if isinstance(given, dict) else {}
    if effort is not None and effort != "auto":
        kwargs.setdefault("enable_thinking", effort != "none")
        kwargs["reasoning_effort"] = effort
    documents = body.get("documents")
    if documents is not None:
        kwargs["documents"] = documents
    return kwargs


# --- the registry ------------------------------------------------------------------------------


class CounterRegistry:
    """Served model name → ``ExactCounter``, loaded once (eagerly, so a bad file stops
    start-up with ``TokenizerLoadError``). Models whose specs are equal share a counter."""

    __slots__ = ("_counters",)

    def __init__(self, specs: Mapping[str, TokenizerSpec] | None = None) -> None:
        loaded: dict[tuple[Any, ...], ExactCounter] = {}
        counters: dict[str, ExactCounter] = {}
        for model, spec in (specs or {}).items():
            key = spec.key()
            if key not in loaded:
                try:
                    loaded[key] = ExactCounter.load(spec)
                except TokenizerLoadError as e:
                    raise TokenizerLoadError(f"tokenizers.{model}: {e}") from None
            counters[model] = loaded[key]
        self._counters = MappingProxyType(counters)

    def counter_for(self, model: str | None) -> ExactCounter | None:
        """The counter for a request's ``model``, or None (then estimate)."""
        if model is None:
            return None
        return self._counters.get(model)

    def __len__(self) -> int:
        return len(self._counters)

    def __iter__(self) -> Iterator[str]:
        return iter(self._counters)
