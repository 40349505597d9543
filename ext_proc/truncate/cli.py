"""``ice truncate``: what semantic truncation would send upstream for one request.

    ice truncate --budget-tokens N [--model PATH] [--policy P] [--profile NAME]
                 [--path /v1/chat/completions|/v1/messages] [--keep-last-turns K]
                 [--threshold T] [--recency] [--body-only] REQUEST.json

Prints one JSON object: ``body`` (the request ICE would send), ``dropped`` (each dropped
message: index, role, tokens, its turn's similarity, a preview), ``kept`` (message indexes),
token figures and the mode. With ``--body-only`` only the body, exactly as sent. Uses the
server's code (``runner.truncate``, ``planner.apply_plan``) with the model in this process
(no deadline). The turn rules come from the profile's ``truncation`` block (defaults when it
has none); the flags override them. Exit status 2 when the request cannot be shortened to
the budget (the server answers 400 then), 1 on bad input.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from ext_proc.policy.errors import PolicyError
from ext_proc.policy.load import load_policy
from ext_proc.policy.settings import EmbeddingSpec, TruncationSpec
from ext_proc.schemas import BadRequest, rawjson, schema_for_path
from ext_proc.truncate.planner import Overflow, apply_plan
from ext_proc.truncate.runner import (
    LocalSimilarity,
    SimilaritySource,
    conversation_for,
    truncate,
)
from ext_proc.truncate.units import message_text

__all__ = ["main", "run"]

_PREVIEW = 80


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ice truncate", description=__doc__.split("\n\n")[0])
    p.add_argument("request", help="request body (JSON file, or - for stdin)")
    p.add_argument("--budget-tokens", type=int, required=True, help="input-token budget")
    p.add_argument("--model", help="local sentence-transformers folder (default: the policy's)")
    p.add_argument("--policy", help="policy file (default: the built-in policy)")
    p.add_argument("--profile", default="", help="profile whose truncation block applies")
    p.add_argument("--path", default="", help="API path (default: guessed from the body)")
    p.add_argument("--keep-last-turns", type=int, help="turns kept before the current one")
    p.add_argument("--threshold", type=float, help="similarity taken first")
    p.add_argument("--recency", action="store_true", help="no embeddings: newest turns first")
    p.add_argument("--body-only", action="store_true", help="print only the body")
    return p


def _spec(args: argparse.Namespace) -> tuple[TruncationSpec, EmbeddingSpec]:
    policy = load_policy(args.policy)
    profile = policy.profiles.get(args.profile or policy.default_profile)
    if profile is None:
        raise PolicyError(f"no profile named {args.profile!r}")
    spec = profile.truncation or TruncationSpec()
    if args.keep_last_turns is not None:
        spec = replace(spec, keep_last_turns=args.keep_last_turns)
    if args.threshold is not None:
        spec = replace(spec, similarity_threshold=args.threshold)
    embedding = policy.embedding
    if args.model:
        embedding = replace(embedding, model=args.model)
    return spec, embedding


async def run(
    body: bytes,
    path: str,
    budget_tokens: int,
    spec: TruncationSpec,
    source: SimilaritySource | None,
) -> tuple[int, dict[str, Any]]:
    """(exit status, report) for one request body."""
    adapter = schema_for_path(path)
    if adapter is None or adapter.name not in ("openai.chat", "anthropic.messages"):
        return 1, {"error": f"{path}: not a chat path (/v1/chat/completions, /v1/messages)"}
    values = rawjson.decode_object(body)
    features = adapter.features(values)
    conv = conversation_for(adapter.name, values, spec)
    result = await truncate(conv, features.input_tokens, budget_tokens, spec, source)
    plan = result.plan
    report: dict[str, Any] = {"input_tokens": features.input_tokens, "budget": budget_tokens}
    if isinstance(plan, Overflow):
        report["error"] = (
            f"the messages that must stay need about {plan.must_keep_tokens} tokens; "
            f"the budget is {plan.budget_tokens} (the server answers 400)"
        )
        return 2, report
    messages = values["messages"]
    sims = result.similarities
    dropped = []
    for k, unit in enumerate(result.conversation.units):
        if k in plan.kept_units:
            continue
        for i in unit.indexes:
            text = message_text(messages[i]).replace("\n", " ")
            dropped.append(
                {
                    "index": i,
                    "role": messages[i].get("role"),
                    "turn_similarity": round(sims[k], 4) if sims else None,
                    "preview": text[:_PREVIEW] + ("…" if len(text) > _PREVIEW else ""),
                }
            )
    new_body = apply_plan(body, plan) if plan.changed else body
    report.update(
        {
            "mode": plan.mode,
            "fallback": result.fallback or None,
            "saved_tokens": result.saved_tokens,
            "tokens_after": features.input_tokens - result.saved_tokens,
            "kept": list(plan.kept_messages),
            "dropped": dropped,
            "body": json.loads(new_body),
        }
    )
    return 0, report


def _guess_path(values: Any) -> str:
    return (
        "/v1/messages"
        if isinstance(values, dict) and "system" in values
        else ("/v1/chat/completions")
    )


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        body = sys.stdin.buffer.read() if args.request == "-" else Path(args.request).read_bytes()
        spec, emb = _spec(args)
        path = args.path or _guess_path(json.loads(body))
        source = None
        if not args.recency:
            source = LocalSimilarity(emb.model or None, emb.max_seq_length, emb.quantize)
        status, report = asyncio.run(run(body, path, args.budget_tokens, spec, source))
    except (OSError, ValueError, PolicyError, BadRequest) as e:
        print(f"ice truncate: {e}", file=sys.stderr)
        return 1
    if args.body_only and status == 0:
        print(json.dumps(report["body"], ensure_ascii=False))
    else:
        print(json.dumps(report, ensure_ascii=False, indent=2))
    return status
