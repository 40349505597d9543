"""Does truncation keep the turn the last question depends on? Semantic vs recency.

    .venv/bin/python bench/truncation_quality.py [--data tests/data/truncation/conversations.json]
        [--ratio 0.5] [--keep-last-turns 2] [--threshold 0.35] [--model PATH] [--json]

For every conversation of the quality set (``tests/data/truncation/conversations.json``: the
request body and ``depends_on``, the index of the user message that opens the turn the last
question needs), the budget is ``ratio`` × the request's input tokens (the estimator's, as
the server counts without a tokenizer). Both modes run the server's code
(``ext_proc.truncate.runner.truncate``): *semantic* with the model in this process,
*recency* with no similarity source. A conversation counts as kept when ``depends_on`` is
among the kept messages. Prints the shares overall and by language, the similarity of the
dependency turn's rank, and the threshold calibration (the dependency turns' similarities
vs the other droppable turns').
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from ext_proc.policy.settings import EmbeddingSpec, TruncationSpec
from ext_proc.schemas import schema_for_path
from ext_proc.truncate.planner import Plan
from ext_proc.truncate.runner import (
    LocalSimilarity,
    SimilaritySource,
    conversation_for,
    truncate,
)

DATA = (
    Path(__file__).resolve().parent.parent / "tests" / "data" / "truncation" / "conversations.json"
)
PATHS = {"openai.chat": "/v1/chat/completions", "anthropic.messages": "/v1/messages"}


def load(path: Path = DATA) -> list[dict[str, Any]]:
    conversations: list[dict[str, Any]] = json.loads(path.read_text("utf-8"))["conversations"]
    return conversations


async def _one(
    convo: dict[str, Any], ratio: float, spec: TruncationSpec, source: SimilaritySource | None
) -> dict[str, Any]:
    adapter = schema_for_path(PATHS[convo["schema"]])
    assert adapter is not None
    body = convo["body"]
    tokens = adapter.features(body).input_tokens
    budget = int(tokens * ratio)
    conv = conversation_for(adapter.name, body, spec)
    result = await truncate(conv, tokens, budget, spec, source)
    plan = result.plan
    if not isinstance(plan, Plan):
        return {"id": convo["id"], "kept": False, "overflow": True}
    units = result.conversation.units
    dep_unit = next(k for k, u in enumerate(units) if convo["depends_on"] in u.indexes)
    out: dict[str, Any] = {
        "id": convo["id"],
        "lang": convo["lang"],
        "kept": convo["depends_on"] in plan.kept_messages,
        "must_keep": units[dep_unit].keep is not None,
        "mode": plan.mode,
        "fallback": result.fallback,
    }
    sims = result.similarities
    if sims is not None and units[dep_unit].keep is None:
        others = [sims[k] for k, u in enumerate(units) if u.keep is None and k != dep_unit]
        out["dep_similarity"] = sims[dep_unit]
        out["best_other"] = max(others, default=0.0)
        out["others"] = others
        out["rank"] = 1 + sum(1 for s in others if s > sims[dep_unit])
    return out


def measure(
    conversations: list[dict[str, Any]],
    source: SimilaritySource | None,
    *,
    ratio: float = 0.5,
    spec: TruncationSpec | None = None,
) -> list[dict[str, Any]]:
    """One result per conversation (see the module docstring)."""
    spec = spec or TruncationSpec()

    async def run() -> list[dict[str, Any]]:
        return [await _one(c, ratio, spec, source) for c in conversations]

    return asyncio.run(run())


def share(results: list[dict[str, Any]], lang: str | None = None) -> float:
    picked = [r for r in results if lang is None or r.get("lang") == lang]
    return sum(r["kept"] for r in picked) / len(picked) if picked else float("nan")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--ratio", type=float, default=0.5)
    ap.add_argument("--keep-last-turns", type=int, default=2)
    ap.add_argument("--threshold", type=float, default=TruncationSpec().similarity_threshold)
    ap.add_argument("--model", default=None)
    ap.add_argument("--max-seq-length", type=int, default=EmbeddingSpec().max_seq_length)
    ap.add_argument("--no-quantize", action="store_true")
    ap.add_argument("--lexical-weight", type=float, default=None, help="default: CJK share")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    convos = load(args.data)
    spec = replace(
        TruncationSpec(),
        keep_last_turns=args.keep_last_turns,
        similarity_threshold=args.threshold,
        lexical_weight=args.lexical_weight,
    )
    t0 = time.perf_counter()
    source = LocalSimilarity(args.model, args.max_seq_length, not args.no_quantize)
    semantic = measure(convos, source, ratio=args.ratio, spec=spec)
    took = time.perf_counter() - t0
    recency = measure(convos, None, ratio=args.ratio, spec=spec)
    langs = sorted({c["lang"] for c in convos})
    summary: dict[str, Any] = {
        "conversations": len(convos),
        "ratio": args.ratio,
        "keep_last_turns": args.keep_last_turns,
        "semantic": {"all": share(semantic), **{lang: share(semantic, lang) for lang in langs}},
        "recency": {"all": share(recency), **{lang: share(recency, lang) for lang in langs}},
        "semantic_seconds": round(took, 2),
    }
    dep = [r["dep_similarity"] for r in semantic if "dep_similarity" in r]
    best = [r["best_other"] for r in semantic if "best_other" in r]
    if dep:
        summary["dependency_similarity"] = {
            "min": round(min(dep), 3),
            "median": round(statistics.median(dep), 3),
            "max": round(max(dep), 3),
        }
        summary["best_other_similarity_median"] = round(statistics.median(best), 3)
        summary["dependency_ranked_first"] = sum(r.get("rank") == 1 for r in semantic)
        others = [s for r in semantic for s in r.get("others", [])]
        summary["threshold_calibration"] = {
            f"{t:.2f}": {
                "dependency_at_or_above": round(sum(d >= t for d in dep) / len(dep), 3),
                "other_turns_at_or_above": round(sum(o >= t for o in others) / len(others), 3),
            }
            for t in (0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.5, 0.65)
        }
    summary["missed_semantic"] = [r["id"] for r in semantic if not r["kept"]]
    if args.json:
        print(json.dumps(summary, ensure_ascii=False, indent=2))
    else:
        for key, value in summary.items():
            print(f"{key}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
