"""Count chat prompts with vLLM's own code, one tokenizer folder after another (run it under
``.venv-vllm``'s interpreter: ``python vllm_count_families.py IN.json OUT.json``).

For each family it builds what ``vllm launch render`` (vLLM's GPU-less render server,
``vllm/entrypoints/launchers/render/entry.py``) builds before it listens: the serve CLI's
arguments (``make_arg_parser``: ``--model`` a weightless Llama config, ``--tokenizer`` the
family's folder), ``AsyncEngineArgs.create_model_config``, ``VllmConfig``, and the app state of
``init_render_app_state``: ``renderer_from_config`` (the tokenizer loaded by
``cached_tokenizer_from_config``, as ``AsyncLLM`` loads it in ``vllm serve``), the
``OnlineRenderer`` and ``ServingTokenization``. Each conversation is then counted twice, by
the request handlers' own bodies, without HTTP:

- ``tokenize``: ``ServingTokenization.create_tokenize`` on a ``TokenizeChatRequest`` (the
  ``POST /tokenize`` messages form): the prompt's token ids;
- ``chat``: ``OnlineRenderer.render_chat`` on a ``ChatCompletionRequest`` (what
  ``/v1/chat/completions`` calls before the engine): the engine input's ``prompt_token_ids``
  length.

IN.json: ``{"model": DIR, "families": [{"name", "tokenizer", "conversations": [[msg, ...]]}]}``.
OUT.json: ``{name: {"tokenize": [[id, ...] | "error: ..."], "chat": [int | "error: ..."]}}``,
or ``{name: {"error": "..."}}`` where vLLM could not load the family at all. Nothing here
counts or renders by itself: every figure is vLLM's.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import traceback
from typing import Any


def _reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


async def _state(model: str, tokenizer: str) -> Any:
    """The render server's app state for ``model`` with ``tokenizer`` (its entry, minus the
    socket and HTTP)."""
    from starlette.datastructures import State
    from vllm import AsyncEngineArgs, envs
    from vllm.config import VllmConfig
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.entrypoints.launchers.render.app_state import init_render_app_state
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser())
    args = parser.parse_args(
        ["--model", model, "--tokenizer", tokenizer, "--served-model-name", "tiny"]
    )
    validate_parsed_serve_args(args)
    engine_args = AsyncEngineArgs.from_cli_args(args)
    model_config = engine_args.create_model_config()
    model_config.quantization = None
    envs.VLLM_CPU_KVCACHE_SPACE = 0
    vllm_config = VllmConfig(
        model_config=model_config,
        logging_config=engine_args.create_logging_config(),
        structured_outputs_config=engine_args.create_structured_outputs_config(),
    )
    state = State()
    await init_render_app_state(vllm_config, state, args)
    return state


async def _count(state: Any, messages: list[dict[str, Any]]) -> tuple[Any, Any]:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.serve.engine.protocol import ErrorResponse
    from vllm.entrypoints.serve.tokenize.protocol import TokenizeChatRequest

    tokenize: Any
    try:
        request = TokenizeChatRequest.model_validate({"model": "tiny", "messages": messages})
        reply = await state.serving_tokenization.create_tokenize(request, None)
        if isinstance(reply, ErrorResponse):
            tokenize = f"error: {reply.error.message}"
        else:
            assert reply.count == len(reply.tokens)
            tokenize = list(reply.tokens)
    except Exception as e:  # a template's raise_exception, a validation error: recorded
        tokenize = f"error: {_reason(e)}"
    chat: Any
    try:
        body = {"model": "tiny", "messages": messages, "max_completion_tokens": 1}
        rendered = await state.online_renderer.render_chat(
            ChatCompletionRequest.model_validate(body)
        )
        if isinstance(rendered, ErrorResponse):
            chat = f"error: {rendered.error.message}"
        else:
            _, (engine_input,) = rendered
            chat = len(engine_input["prompt_token_ids"])
    except Exception as e:
        chat = f"error: {_reason(e)}"
    return tokenize, chat


async def main(spec: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for family in spec["families"]:
        t0 = time.monotonic()
        try:
            state = await _state(spec["model"], family["tokenizer"])
        except Exception as e:
            out[family["name"]] = {"error": _reason(e), "traceback": traceback.format_exc()}
            continue
        tokenize, chat = [], []
        for messages in family["conversations"]:
            ids, n = await _count(state, messages)
            tokenize.append(ids)
            chat.append(n)
        out[family["name"]] = {
            "tokenize": tokenize,
            "chat": chat,
            "tokenizer_class": type(state.online_renderer.renderer.tokenizer).__name__,
            "seconds": round(time.monotonic() - t0, 2),
        }
        state.online_renderer.renderer.shutdown()
    return out


if __name__ == "__main__":
    source, target = sys.argv[1], sys.argv[2]
    with open(source, encoding="utf-8") as f:
        spec = json.load(f)
    result = asyncio.run(main(spec))
    with open(target, "w", encoding="utf-8") as f:
        json.dump(result, f)
