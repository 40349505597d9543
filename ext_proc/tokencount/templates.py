"""Chat templates: transformers' jinja sandbox, vLLM's template analysis, and loading them.

Job: compile a model's chat template(s) in the environment of transformers'
``apply_chat_template`` (``ImmutableSandboxedEnvironment``, ``trim_blocks``,
``lstrip_blocks``, ``loopcontrols``, ``{% generation %}``, ``raise_exception``,
``strftime_now``, a non-escaping ``tojson``); analyse each as vLLM does (``_Template``:
does it loop over ``message.content`` (content format "openai"), does it fail on a system
message after the first turn (``system_first``), does it name ``developer``); and read
``tokenizer_config.json``: its named special tokens, its other special tokens and its
template or named templates.

Invariants: a ``_Template`` is frozen and its compiled template is only rendered (each render
gets its own jinja context), so it is shared by threads; reading files here raises only
``TokenizerLoadError``, whose message names the file and the problem.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, NoReturn

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ext_proc.tokencount.spec import TokenizerLoadError, TokenizerSpec

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


def _compile(config: Mapping[str, Any], spec: TokenizerSpec) -> dict[str, _Template]:
    """The spec's chat template(s), compiled and analysed; ``TokenizerLoadError`` on bad
    syntax, naming the template and the line."""
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
    return templates
