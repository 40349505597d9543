"""ICE's exact counts equal vLLM's own on every tokenizer family (issue 31, item 4).

``tests/tokencount/test_token_families.py`` compares ICE with transformers'
``apply_chat_template`` + encode; this module asks the real vLLM 0.32 in ``.venv-vllm``.
The families (``tests/token_families.py``: SentencePiece-style BPE and Unigram with byte fallback
under ``[INST]``, Llama-3 and Gemma templates, Metaspace ``always`` and Llama-2's legacy normalizer,
ByteLevel ChatML, BERT-style WordPiece, the recorded tiny model's tokenizer with its template
and with ChatML's markers as plain text) are written as model folders, and every family's
conversations (generated from a fixed seed, plus the issue's reproductions:
``{"role":"user","content":"</s>was"}``, ``"<s>budget</s>batch, "`` × 1,100, digits, emoji,
CRLF, a literal special token before a word, empty turns) are counted:

- by vLLM, in one subprocess under ``.venv-vllm`` (``vllm_count_families.py``): per family,
  the app state ``vllm launch render`` builds from the serve CLI's arguments (``--model`` a
  weightless Llama config, ``--tokenizer`` the family's folder; the tokenizer loaded by
  ``renderer_from_config`` → ``cached_tokenizer_from_config``, as ``vllm serve`` loads it),
  then ``ServingTokenization.create_tokenize`` (``POST /tokenize``, messages form) and
  ``OnlineRenderer.render_chat`` (what ``/v1/chat/completions`` renders and tokenizes);
- by ICE's ``ExactCounter.count_chat`` on the family's ``TokenizerSpec``.

Each count must be equal; a difference names transformers' count too, so the failure says
which side is wrong. A family vLLM cannot load is skipped with vLLM's own error.

One family (``sp-bpe-inst``, the issue's ``[INST]`` vocabulary) also goes through a real
``vllm serve`` of the tiny model's weights with ``--tokenizer`` that folder (its ids, < 700,
fit the model's 4,096-row embedding): ``POST /tokenize`` must return the very ids the
in-process handler returned, and ICE's count. One server start.

Needs ``.venv-vllm`` (``make vllm-install``) and ``ICE_VLLM=1``; about 110 s on 2 cores: the
subprocess 45–60 s (most of it importing vLLM and inspecting the model class; each family then
takes ~2 s), the server 45–60 s. vLLM logs "Error parsing config for <tokenizer folder>" twice a
family: its tokenizer loader (``vllm.tokenizers.registry.get_tokenizer``) first reads a model
config from the ``--tokenizer`` folder, which has none, retries once after 2 s, and then loads
the tokenizer from ``tokenizer_config.json``, as ``vllm serve --tokenizer DIR`` does.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ext_proc.admit.reload_carry import estimate_request
from ext_proc.lab import vllm_local as vl
from ext_proc.tokencount import ExactCounter, TokenizerSpec
from tests.builders import post_json
from tests.token_families import Family, build, conversation, reference, reference_count

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.timeout(900),
    pytest.mark.skipif(
        os.environ.get("ICE_VLLM") != "1" or not vl.venv_ready(vl.DEFAULT_VENV),
        reason="needs ICE_VLLM=1 and .venv-vllm (make vllm-install)",
    ),
]

HELPER = Path(__file__).with_name("vllm_count_families.py")
NAMES = (
    "tiny",
    "tiny-chatml-plain",
    "sp-bpe-inst",
    "sp-bpe-llama3",
    "sp-unigram-gemma",
    "sp-bpe-always",
    "sp-legacy-normalizer",
    "sp-nosplit-gemma",
    "bytelevel-chatml",
    "bert-wordpiece",
)
SERVED = "sp-bpe-inst"
GENERATED = 30  # conversations a family, beside the fixed ones

# The tiny model's geometry, weightless: the render path reads the config only. A long context
# so that the 1,100-fold reproduction (~9k tokens) fits ``max_model_len`` on the chat path.
LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "hidden_act": "silu",
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-06,
    "vocab_size": 4096,
    "tie_word_embeddings": False,
    "dtype": "bfloat16",
}

# every family's special and marker strings, written literally into content
SPECIALS = [
    "<s>",
    "</s>",
    "<unk>",
    "[INST]",
    "[/INST]",
    "<|begin_of_text|>",
    "<|eot_id|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<bos>",
    "<eos>",
    "<start_of_turn>",
    "<end_of_turn>",
    "<|im_start|>",
    "<|im_end|>",
    "[CLS]",
    "[SEP]",
    "[PAD]",
    "[UNK]",
    "<|user|>",
    "<|assistant|>",
]
# the atoms tests/tokencount/test_token_families.py draws its contents from
ATOMS = [
    *SPECIALS,
    *"ab cde\n\t.,!?'\"{}[]:0123456789émigré内存压力🙂😀<>/|_-▁",
    "\r\n",
    "e\u0301",
    "\u0301",
    "  ",
    "was",
    "budget",
    "<0x41>",
    "12345",
]
# (contents, system): the reproductions and the cases named in it
FIXED: list[tuple[list[str], str | None]] = [
    (["</s>was"], None),
    (["<s>budget</s>batch, " * 1100], None),
    (["12345 + 678 = 13023 at 2026-05-01 12:00:03; 3.14159, 1,000,000 and 007"], None),
    (["🙂😀 ok 👍🏽 🇫🇷 👨‍👩‍👧 ✅"], "emoji 🙂"),
    (["line one\r\nline two\r\n\r\nend", "ok\r\n", "\r\nand then\r\n"], "be brief\r\n"),
    ([" ".join(f"{t}was" for t in SPECIALS)], None),
    ([f"{t}budget" for t in SPECIALS[:5]], f"{SPECIALS[0]}system"),
    (["", "", ""], ""),
    (["  leading and trailing  ", "\ttab\t", "  "], "  "),
    (["<0x41> 内存压力 émigré naïve e\u0301 \u0301 ▁was ▁ ▁▁"], None),
]


@dataclass
class Counted:
    family: Family
    counter: ExactCounter
    hf: Any  # transformers' tokenizer, the tie-breaker when the two disagree
    conversations: list[list[dict[str, Any]]]
    vllm: dict[str, Any]  # the helper's entry: tokenize ids, chat counts, or error


def _generated(family: Family, rng: random.Random) -> list[list[dict[str, Any]]]:
    def content() -> str:
        return "".join(rng.choice(ATOMS) for _ in range(rng.randint(0, 14)))

    out = []
    for _ in range(GENERATED):
        turns = [content() for _ in range(rng.randint(1, 6))]
        system = content() if rng.random() < 0.5 else None
        out.append(conversation(family, turns, system))
    return out


def _conversations(family: Family) -> list[list[dict[str, Any]]]:
    fixed = [conversation(family, contents, system) for contents, system in FIXED]
    return fixed + _generated(family, random.Random(f"vllm-families-{family.name}"))


def _run_helper(workdir: Path, model: Path, counted: dict[str, Counted]) -> dict[str, Any]:
    spec = {
        "model": str(model),
        "families": [
            {"name": name, "tokenizer": str(c.family.folder), "conversations": c.conversations}
            for name, c in counted.items()
        ],
    }
    source, target, log = workdir / "in.json", workdir / "out.json", workdir / "helper.log"
    source.write_text(json.dumps(spec), "utf-8")
    _, env = vl.serve_command(vl.ServeConfig())  # offline, caches under .scratch/vllm/run
    env["VLLM_LOGGING_LEVEL"] = "WARNING"
    vl.DEFAULT_SCRATCH.mkdir(parents=True, exist_ok=True)
    python = vl.venv_python(vl.DEFAULT_VENV)
    with log.open("wb") as out:
        done = subprocess.run(
            [str(python), "-I", str(HELPER), str(source), str(target)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            timeout=600,
            check=False,
        )
    tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-40:])
    assert done.returncode == 0 and target.is_file(), f"helper exited {done.returncode}:\n{tail}"
    result: dict[str, Any] = json.loads(target.read_text("utf-8"))
    return result


@pytest.fixture(scope="module")
def counted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Counted]:
    root = tmp_path_factory.mktemp("vllm-families")
    out: dict[str, Counted] = {}
    for family in build(root / "families"):
        spec = TokenizerSpec.from_model_dir(family.folder)
        counter = ExactCounter.load(spec, estimate=estimate_request)
        out[family.name] = Counted(
            family, counter, reference(family), _conversations(family), vllm={}
        )
    assert tuple(out) == NAMES  # a new family is counted here too, not passed over
    model = root / "llama-config"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(LLAMA_CONFIG))
    for name, entry in _run_helper(root, model, out).items():
        out[name].vllm = entry
    return out


def _loaded(counted: dict[str, Counted], name: str) -> Counted:
    c = counted[name]
    if "error" in c.vllm:
        pytest.skip(f"vLLM 0.32 cannot load {name} ({c.family.folder}): {c.vllm['error']}")
    return c


def _short(messages: list[dict[str, Any]]) -> str:
    text = json.dumps(messages, ensure_ascii=False)
    return text if len(text) <= 300 else text[:300] + f"… ({len(text)} chars)"


@pytest.mark.parametrize("name", NAMES)
def test_vllm_renders_and_tokenizes_every_conversation_to_ices_count(
    counted: dict[str, Counted], name: str
) -> None:
    c = _loaded(counted, name)
    tokenize, chat = c.vllm["tokenize"], c.vllm["chat"]
    assert len(tokenize) == len(chat) == len(c.conversations)
    differences = []
    for i, messages in enumerate(c.conversations):
        ice = c.counter.count_chat(messages)
        by_tokenize = tokenize[i] if isinstance(tokenize[i], str) else len(tokenize[i])
        if not ice == by_tokenize == chat[i]:
            differences.append(
                {
                    "conversation": i,
                    "ice": ice,
                    "vllm /tokenize": by_tokenize,
                    "vllm chat": chat[i],
                    "transformers": reference_count(c.hf, messages),
                    "messages": _short(messages),
                }
            )
    assert not differences, json.dumps(differences, indent=1, ensure_ascii=False)


def test_a_served_vllm_tokenize_endpoint_returns_the_same_ids_and_ices_count(
    counted: dict[str, Counted],
) -> None:
    """``vllm serve`` (tiny weights, ``--tokenizer`` the ``[INST]`` family's folder): its
    ``POST /tokenize`` gives the in-process handler's ids, whose count is ICE's."""
    c = _loaded(counted, SERVED)
    model = vl.ensure_model(vl.DEFAULT_MODEL_DIR)
    cfg = vl.ServeConfig(
        model_dir=model,
        port=vl.free_port(),
        extra_args=("--tokenizer", str(c.family.folder)),
    )
    differences = []
    with vl.start_server(cfg, timeout_s=600) as server:
        for i, messages in enumerate(c.conversations):
            payload = {"model": cfg.served_model_name, "messages": messages}
            status, body = post_json(server.base_url + "/tokenize", payload)
            ice = c.counter.count_chat(messages)
            if status != 200 or body["tokens"] != c.vllm["tokenize"][i] or body["count"] != ice:
                differences.append(
                    {
                        "conversation": i,
                        "status": status,
                        "served count": body.get("count"),
                        "in-process count": len(c.vllm["tokenize"][i]),
                        "ice": ice,
                        "error": None if status == 200 else body,
                        "messages": _short(messages),
                    }
                )
    assert not differences, json.dumps(differences, indent=1, ensure_ascii=False)
