"""The quality set (tests/data/truncation/conversations.json: 42 conversations in English,
Chinese and both, 15 with tool calls): at 50 % of the tokens, semantic truncation keeps the
turn the last question depends on far more often than recency. Measured with
bench/truncation_quality.py (the same code): semantic 42/42, recency 10/42; the model's
cosine alone 33/42 (Chinese is lexical overlap's work). The thresholds below leave room for
two misses."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from ext_proc.policy.settings import EmbeddingSpec
from ext_proc.truncate.runner import LocalSimilarity

BENCH = Path(__file__).resolve().parents[2] / "bench" / "truncation_quality.py"


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("truncation_quality", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def results() -> dict[str, Any]:
    bench = _bench()
    convos = bench.load()
    emb = EmbeddingSpec()
    source = LocalSimilarity(None, emb.max_seq_length, emb.quantize)
    return {
        "bench": bench,
        "convos": convos,
        "semantic": bench.measure(convos, source),
        "recency": bench.measure(convos, None),
    }


def test_the_quality_set_is_big_and_varied_enough(results: dict[str, Any]) -> None:
    convos = results["convos"]
    assert len(convos) >= 30
    langs = {c["lang"] for c in convos}
    assert {"en", "zh", "mixed"} <= langs
    with_tools = [
        c
        for c in convos
        if any(
            "tool_calls" in m or isinstance(m.get("content"), list) for m in c["body"]["messages"]
        )
    ]
    assert len(with_tools) >= 10


def test_semantic_truncation_keeps_the_needed_turn_at_half_the_tokens(
    results: dict[str, Any],
) -> None:
    bench = results["bench"]
    semantic, recency = results["semantic"], results["recency"]
    assert all(r["mode"] == "semantic" for r in semantic if "mode" in r)
    assert bench.share(semantic) >= 0.95, [r["id"] for r in semantic if not r["kept"]]
    for lang in ("en", "zh", "mixed"):
        assert bench.share(semantic, lang) >= 0.9, lang
    assert bench.share(recency) <= 0.5  # the set is not one recency already solves
    assert bench.share(semantic) - bench.share(recency) >= 0.5
