"""Tokenizer families trained at test time (no download), with their chat templates.

Each family is a small vocabulary trained in milliseconds with ``tokenizers`` on a tiny
corpus, written as a model folder (``tokenizer.json``, ``tokenizer_config.json`` with the
template and named special tokens) that ``TokenizerSpec.from_model_dir`` reads, and wrapped
by transformers' ``PreTrainedTokenizerFast`` as the reference (``apply_chat_template`` +
encode: what vLLM does):

- ``sp-bpe-inst``: SentencePiece-style BPE (Metaspace ``prepend_scheme: first``, digits split
  one by one, byte fallback), Mistral's ``[INST]`` template;
- ``sp-bpe-llama3``: the same vocabulary with Llama-3's header template (text straight after
  a special token);
- ``sp-unigram-gemma``: Unigram with byte fallback, Metaspace ``first``, digits split,
  Gemma's ``<start_of_turn>`` template;
- ``sp-bpe-always``: Metaspace ``always`` (Llama-2's older files), ``[INST]``;
- ``sp-legacy-normalizer``: no pre-tokenizer; the normalizer prepends "▁" and replaces
  spaces (Llama-2's legacy files), ``[INST]``;
- ``sp-nosplit-gemma``: Metaspace ``first`` with ``split`` off, Gemma's template;
- ``bytelevel-chatml``: ByteLevel BPE with ``add_prefix_space``, ChatML markers as special
  tokens;
- ``bert-wordpiece``: BERT's normalizer and pre-tokenizer, WordPiece, ``[SEP]`` turns.

``tiny``, the recorded vLLM model's ByteLevel tokenizer and template, stands beside them, and
``tiny-chatml-plain``: the same tokenizer with ChatML's markers as plain text (no special token
between turns: cut inside the turn marker).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from ext_proc.tokencount import ExactCounter

TINY_DIR = Path(__file__).parent / "data" / "vllm_cpu" / "tokenizer"

CORPUS = [
    "the memory cache block token prefix request server queue model gateway was new old",
    "budget batch admit refuse count exact estimate window context length policy tenant",
    "[INST] what is 12345 + 678? [/INST] 13023. 2026-05-01 12:00:03 INFO worker took 183ms",
    "内存压力 émigré naïve café, tabs\tand spaces; 'quoted' \"double\" {json: [1, 2]} <tag>",
    "id,timestamp,host,latency_ms,status 1042,2026-05-01T12:00:03Z,web-07,183.25,200",
] * 20

INST = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}"
    "{% endif %}{% endfor %}"
)
LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    " + message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}"
)
GEMMA = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}"
    "{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}"
    "{% else %}{% set role = message['role'] %}{% endif %}"
    "{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}"
)
CHATML = (
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
BERT = (
    "{{ cls_token }}{% for message in messages %}"
    "{{ message['role'] + ': ' + message['content'] + sep_token }}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'assistant:' }}{% endif %}"
)

INST_SPECIAL = {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>"}
INST_EXTRA = ["[INST]", "[/INST]"]
LLAMA3_SPECIAL = {
    "unk_token": "<unk>",
    "bos_token": "<|begin_of_text|>",
    "eos_token": "<|eot_id|>",
}
LLAMA3_EXTRA = ["<|start_header_id|>", "<|end_header_id|>"]
GEMMA_SPECIAL = {"unk_token": "<unk>", "bos_token": "<bos>", "eos_token": "<eos>"}
GEMMA_EXTRA = ["<start_of_turn>", "<end_of_turn>"]
CHATML_SPECIAL = {"unk_token": "<unk>", "eos_token": "<|im_end|>"}
CHATML_EXTRA = ["<|im_start|>"]
BERT_SPECIAL = {
    "unk_token": "[UNK]",
    "cls_token": "[CLS]",
    "sep_token": "[SEP]",
    "pad_token": "[PAD]",
}


@dataclass(frozen=True)
class Family:
    name: str
    folder: Path
    system: bool  # whether the template takes a system turn
    alternate: bool  # whether it demands user/assistant turns alternating, user first


def _byte_pieces(config: dict[str, Any]) -> None:
    """Give a trained model the 256 ``<0xNN>`` byte pieces byte fallback needs."""
    model = config["model"]
    if model["type"] == "BPE":
        vocab = model["vocab"]
        for b in range(256):
            vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    else:  # Unigram: [piece, log-probability] pairs
        have = {p for p, _ in model["vocab"]}
        model["vocab"] += [
            [f"<0x{b:02X}>", -20.0] for b in range(256) if f"<0x{b:02X}>" not in have
        ]
    model["byte_fallback"] = True


def _metaspace(scheme: str, split: bool = True, digits: bool = True) -> Any:
    meta = pre_tokenizers.Metaspace(prepend_scheme=scheme, split=split)
    if not digits:
        return meta
    return pre_tokenizers.Sequence([meta, pre_tokenizers.Digits(individual_digits=True)])


def _train(
    model: str,
    specials: list[str],
    setup: Callable[[Tokenizer], None],
    byte_fallback: bool = True,
    vocab_size: int = 400,
) -> Tokenizer:
    if model == "BPE":
        tok = Tokenizer(models.BPE(unk_token=specials[0]))
        trainer: Any = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials)
    elif model == "Unigram":
        tok = Tokenizer(models.Unigram())
        trainer = trainers.UnigramTrainer(
            vocab_size=vocab_size, special_tokens=specials, unk_token=specials[0]
        )
    else:
        tok = Tokenizer(models.WordPiece(unk_token=specials[0]))
        trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=specials)
    setup(tok)
    tok.train_from_iterator(CORPUS, trainer)
    config = json.loads(tok.to_str())
    if byte_fallback:
        _byte_pieces(config)
    return Tokenizer.from_str(json.dumps(config))


def _write(
    folder: Path, tok: Tokenizer, named: dict[str, str], extra: list[str], template: str
) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    config = {
        **named,
        "additional_special_tokens": extra,
        "chat_template": template,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def _sp(pre: Any = None, norm: Any = None) -> Callable[[Tokenizer], None]:
    def setup(tok: Tokenizer) -> None:
        if pre is not None:
            tok.pre_tokenizer = pre
        if norm is not None:
            tok.normalizer = norm
        tok.decoder = decoders.Sequence(
            [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
        )

    return setup


def build(root: Path) -> list[Family]:
    """Train every family into ``root``; milliseconds each."""
    inst = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]"]
    l3 = ["<unk>", "<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>"]
    gem = ["<unk>", "<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"]
    sp_first = _train("BPE", inst, _sp(_metaspace("first")))
    sp_l3 = _train("BPE", l3, _sp(_metaspace("first")))
    uni = _train("Unigram", gem, _sp(_metaspace("first")))
    always = _train("BPE", inst, _sp(_metaspace("always")))
    legacy_norm = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    legacy = _train("BPE", inst, _sp(pre_tokenizers.Digits(individual_digits=True), legacy_norm))
    nosplit = _train("BPE", gem, _sp(_metaspace("first", split=False, digits=False)))

    def bytelevel(tok: Tokenizer) -> None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
        tok.decoder = decoders.ByteLevel()

    chatml_tok = _train(
        "BPE", ["<unk>", "<|im_start|>", "<|im_end|>"], bytelevel, byte_fallback=False
    )

    def bert(tok: Tokenizer) -> None:
        tok.normalizer = normalizers.BertNormalizer(lowercase=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()

    bert_tok = _train("WordPiece", ["[UNK]", "[CLS]", "[SEP]", "[PAD]"], bert, byte_fallback=False)
    made = [
        ("sp-bpe-inst", sp_first, INST_SPECIAL, INST_EXTRA, INST, False, True),
        ("sp-bpe-llama3", sp_l3, LLAMA3_SPECIAL, LLAMA3_EXTRA, LLAMA3, True, False),
        ("sp-unigram-gemma", uni, GEMMA_SPECIAL, GEMMA_EXTRA, GEMMA, False, True),
        ("sp-bpe-always", always, INST_SPECIAL, INST_EXTRA, INST, False, True),
        ("sp-legacy-normalizer", legacy, INST_SPECIAL, INST_EXTRA, INST, False, True),
        ("sp-nosplit-gemma", nosplit, GEMMA_SPECIAL, GEMMA_EXTRA, GEMMA, False, True),
        ("bytelevel-chatml", chatml_tok, CHATML_SPECIAL, CHATML_EXTRA, CHATML, True, False),
        ("bert-wordpiece", bert_tok, BERT_SPECIAL, [], BERT, True, False),
    ]
    out = [Family("tiny", TINY_DIR, True, False)]
    # the tiny model with ChatML's markers as plain text: no special token between turns
    plain = root / "tiny-chatml-plain"
    plain.mkdir(parents=True, exist_ok=True)
    (plain / "tokenizer.json").write_bytes((TINY_DIR / "tokenizer.json").read_bytes())
    config = json.loads((TINY_DIR / "tokenizer_config.json").read_text())
    (plain / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": CHATML}))
    out.append(Family("tiny-chatml-plain", plain, True, False))
    for name, tok, named, extra, template, system, alternate in made:
        out.append(
            Family(name, _write(root / name, tok, named, extra, template), system, alternate)
        )
    return out


def reference(family: Family) -> Any:
    """transformers' tokenizer for the family's folder (what vLLM loads)."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(str(family.folder))


def reference_count(hf: Any, messages: list[dict[str, Any]]) -> int:
    """``apply_chat_template`` + encode, as vLLM does (``add_generation_prompt``)."""
    text = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return len(hf.encode(text, add_special_tokens=False))


# --- from tests/tokencount/test_token_families.py ----------------------------------------

Loaded = dict[str, tuple[Family, ExactCounter, Any]]


def conversation(family: Family, contents: list[str], system: str | None) -> list[dict[str, Any]]:
    """Alternating user/assistant turns, user first and last; a system turn first where the
    template takes one."""
    if len(contents) % 2 == 0:
        contents = contents[:-1]
    out = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": c}
        for i, c in enumerate(contents)
    ]
    if family.system and system is not None:
        out.insert(0, {"role": "system", "content": system})
    return out
