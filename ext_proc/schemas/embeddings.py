"""OpenAI ``/v1/embeddings`` adapter (and vLLM's chat-style embeddings).

``input`` is a string, a list of strings, token ids or a list of token-id lists; each element
is its own sequence (a prompt with no output). vLLM also accepts ``messages`` (one chat-style
prompt, media parts included). The features have ``generates = False``: the evaluator checks
the context, the KV blocks of every input and the priority shedding, and never writes an
output limit. ``inputs`` is the number of inputs, capped per profile
(``max_embedding_inputs``).
Errors use OpenAI's error object.
"""

from __future__ import annotations

from typing import Any

from ext_proc.media import MediaCost
from ext_proc.schemas.base import DEFAULT_MEDIA, BadRequest, RequestFeatures, Tally, check_keys
from ext_proc.schemas.openai import chat_prompt, openai_error_body, prompt_list_tokens

__all__ = ["OPENAI_EMBEDDINGS"]

EMBEDDINGS_KEYS = frozenset(("model", "input", "messages"))


class _OpenAIEmbeddings:
    name = "openai.embeddings"
    inject_field = ""  # no output limit

    def features(self, body: dict[str, Any], media: MediaCost = DEFAULT_MEDIA) -> RequestFeatures:
        check_keys(body, EMBEDDINGS_KEYS)
        if "input" in body and "messages" in body:
            # vLLM's request union serves such a body as chat-style (its messages), not input
            raise BadRequest(
                "give 'input' or 'messages', not both", param="messages", code="ambiguous_input"
            )
        parts = media_tokens = 0
        if "input" not in body and "messages" in body:
            tally = Tally(media)
            count = chat_prompt(body.get("messages"), "messages", tally)
            prompts = [tally.tokens]
            parts, media_tokens = tally.media_parts, tally.media_tokens
        else:
            prompts = prompt_list_tokens(body.get("input"), "input")
            count = len(prompts)
        model = body.get("model")
        return RequestFeatures(
            schema=self.name,
            model=model if isinstance(model, str) else None,
            input_tokens=max(prompts),
            max_tokens=None,
            max_tokens_field=None,
            stream=False,
            message_count=count,
            prompt_tokens=tuple(prompts) if len(prompts) > 1 else (),
            media_parts=parts,
            media_tokens=media_tokens,
            generates=False,
            inputs=len(prompts),
        )

    def error_body(self, status: int, code: str, message: str, param: str | None) -> bytes:
        return openai_error_body(status, code, message, param)


OPENAI_EMBEDDINGS = _OpenAIEmbeddings()
