"""``ice prefix-report FILE.jsonl``: what breaks prefix caching in recorded requests.

Job: read one JSON request body a line (OpenAI chat, Anthropic messages, or a completions
``prompt``), each optionally with a ``"route"`` field (removed before rendering; else
``--route``, default ``default``), and print the report of ``report.build_report``: per route
the prefix stability score and, earliest first, where consecutive prompts of a template
differ, of which kind, on how many requests, and how many blocks a prefix cache could still
reuse. ``--json`` prints the same as one JSON object.

Tokens: pseudo-tokens of the rendered text (``blocks.pseudo_tokens``) unless ``--tokenizer
DIR`` names a Hugging Face model folder (``tokenizer.json``, ``tokenizer_config.json``): then
OpenAI chat bodies are rendered with the model's chat template (``ExactCounter.render_chat``)
and encoded without special tokens, and completions prompts are encoded with them; other
bodies, or a template that fails, fall back to pseudo-tokens (counted in the output).

Exit status: 0 with a report; 2 for bad arguments, an unreadable file, or a file without one
valid line (bad lines are skipped with a message on stderr, at most 10 shown).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ext_proc.prefix.blocks import DEFAULT_BLOCK_SIZE, pseudo_tokens
from ext_proc.prefix.render import Rendered
from ext_proc.prefix.report import build_report, format_text

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="ice prefix-report",
        description="where recorded requests' prompts diverge and break prefix caching",
    )
    ap.add_argument("file", help="JSON lines: one request body a line ('-' for stdin)")
    ap.add_argument("--block-size", type=int, default=DEFAULT_BLOCK_SIZE, help="tokens a block")
    ap.add_argument("--route", default="default", help="route of lines without a 'route' field")
    ap.add_argument("--window", type=int, help="score window in requests (default: all)")
    ap.add_argument("--tokenizer", help="a model folder: exact token ids and chat template")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    return ap


def _records(lines: list[str], default_route: str) -> tuple[list[tuple[str, Any]], int]:
    out: list[tuple[str, Any]] = []
    bad = 0
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as e:
            obj, why = None, f"not JSON ({e})"
        else:
            why = "not a JSON object"
        if not isinstance(obj, dict):
            bad += 1
            if bad <= 10:
                print(f"ice prefix-report: line {n}: {why}; skipped", file=sys.stderr)
            continue
        route = obj.pop("route", None)
        out.append((route if isinstance(route, str) and route else default_route, obj))
    return out, bad


def _tokenizer_fn(folder: str, fallbacks: list[int]) -> Callable[[Any, Rendered], list[int]]:
    from tokenizers import Tokenizer

    from ext_proc.tokencount import ExactCounter, TokenCountError, TokenizerSpec

    spec = TokenizerSpec.from_model_dir(folder)
    counter = ExactCounter.load(spec)
    tok = Tokenizer.from_file(str(spec.tokenizer_json))

    def tokens_of(body: Any, rendered: Rendered) -> list[int]:
        try:
            if isinstance(body.get("prompt"), str) and "messages" not in body:
                return list(tok.encode(body["prompt"], add_special_tokens=True).ids)
            anthropic = "system" in body or "anthropic_version" in body
            if isinstance(body.get("messages"), list) and not anthropic:
                text = counter.render_chat(body["messages"], tools=body.get("tools"))
                return list(tok.encode(text, add_special_tokens=False).ids)
        except (TokenCountError, TypeError, ValueError, AttributeError):
            pass
        fallbacks[0] += 1
        return pseudo_tokens(rendered.text)

    return tokens_of


def main(argv: list[str] | None = None) -> int:
    """Run ``ice prefix-report`` with ``argv`` (the arguments after the subcommand)."""
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.block_size < 1:
        print("ice prefix-report: --block-size must be at least 1", file=sys.stderr)
        return 2
    try:
        raw = sys.stdin.read() if args.file == "-" else Path(args.file).read_text("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        print(f"ice prefix-report: {args.file}: {e}", file=sys.stderr)
        return 2
    records, bad = _records(raw.splitlines(), args.route)
    if not records:
        print(f"ice prefix-report: {args.file}: no request bodies", file=sys.stderr)
        return 2
    fallbacks = [0]
    tokens_of = None
    source = "pseudo-tokens"
    if args.tokenizer:
        from ext_proc.tokencount import TokenizerLoadError

        try:
            tokens_of = _tokenizer_fn(args.tokenizer, fallbacks)
        except TokenizerLoadError as e:
            print(f"ice prefix-report: --tokenizer: {e}", file=sys.stderr)
            return 2
        source = "tokenizer"
    reports = build_report(
        records, block_size=args.block_size, tokens_of=tokens_of, window=args.window
    )
    if source == "tokenizer" and fallbacks[0]:
        source = f"tokenizer ({fallbacks[0]:,} requests in pseudo-tokens)"
    if args.json:
        out = {
            "block_size": args.block_size,
            "tokens": source,
            "skipped_lines": bad,
            "routes": [r.to_json() for r in reports],
        }
        print(json.dumps(out, ensure_ascii=False, indent=2))
    else:
        print(format_text(reports, args.block_size, source))
    return 0
