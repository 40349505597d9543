"""Which of a wheel's declared requirements to install into another interpreter's venv.

``packaging`` parses the ``Requires-Dist`` lines and evaluates their PEP 508 markers; this
module only chooses the environment they are evaluated in and what to leave out.

Invariants:

- Markers are evaluated against the *target* interpreter, never the one running this code:
  ``marker_environment`` runs ``packaging``'s own ``default_environment()`` in that
  interpreter, and ``requirements_from_metadata`` refuses an environment missing a marker
  variable (``Marker.evaluate`` would silently fill the gap from this process).
- No extra is requested: lines under ``extra == "..."`` never apply.
- Names in ``exclude`` never come back, compared in PEP 503 form (``TorchVision`` is
  ``torchvision``).
- Only index requirements (name, extras, version specifier) come back: a URL requirement is
  refused, so the installer fetches nothing from outside the package index.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import zipfile
from collections.abc import Mapping
from pathlib import Path

import packaging
from packaging.markers import default_environment
from packaging.metadata import parse_email
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from ext_proc.lab.vllm_local.common import VllmError

__all__ = [
    "EXCLUDED_REQUIREMENTS",
    "NO_DEPS_REQUIREMENTS",
    "marker_environment",
    "pip_spec",
    "requirements_from_metadata",
    "wheel_metadata",
]

# Never installed from METADATA: torch comes first on its own (the CPU build); PyPI's
# torchvision breaks start-up (`operator torchvision::nms does not exist`); triton (pulled by
# xgrammar) is a 1 GB CUDA build the CPU backend never loads.
EXCLUDED_REQUIREMENTS = frozenset({"torch", "torchvision", "torchaudio", "torchcodec", "triton"})
# Installed with --no-deps too, their own requirements filtered the same way (xgrammar → triton).
NO_DEPS_REQUIREMENTS = frozenset({"xgrammar"})

# Run by the target interpreter, isolated (-I), importing the `packaging` that evaluates the
# markers here (argv[1] is the directory that holds it), so both sides agree on the variables.
_MARKER_ENV_SCRIPT = """
import json, sys
sys.path.insert(0, sys.argv[1])
from packaging.markers import default_environment
print(json.dumps(default_environment()))
"""


def marker_environment(python: str | Path | None = None) -> dict[str, str]:
    """PEP 508 marker variables of ``python`` (default: this interpreter)."""
    exe = str(python) if python is not None else sys.executable
    lib = Path(packaging.__file__).resolve().parent.parent
    out = subprocess.run(
        [exe, "-I", "-B", "-c", _MARKER_ENV_SCRIPT, str(lib)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    env = json.loads(out)
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise VllmError(f"{exe}: unexpected marker environment {out!r}")
    return {str(k): v for k, v in env.items()}


def requirements_from_metadata(
    metadata: str,
    env: Mapping[str, str],
    exclude: frozenset[str] = EXCLUDED_REQUIREMENTS,
) -> list[Requirement]:
    """The ``Requires-Dist`` of a METADATA text that apply to ``env`` with no extras asked,
    less the names in ``exclude``, in file order (see the module's invariants)."""
    missing = sorted(default_environment().keys() - env.keys())
    if missing:
        raise ValueError(f"marker environment lacks {', '.join(missing)}")
    target = {**env, "extra": ""}
    skip = {canonicalize_name(n) for n in exclude}
    raw, _unparsed = parse_email(metadata)
    out: list[Requirement] = []
    for line in raw.get("requires_dist", []):
        req = Requirement(line)
        if req.url:
            raise ValueError(f"unsupported requirement (a URL, not the index): {line!r}")
        if canonicalize_name(req.name) in skip:
            continue
        if req.marker is not None and not req.marker.evaluate(target):
            continue
        out.append(req)
    return out


def pip_spec(req: Requirement) -> str:
    """``req`` as pip's command line takes it: without its marker (already evaluated)."""
    bare = copy.copy(req)
    bare.marker = None
    return str(bare)


def wheel_metadata(wheel: Path) -> str:
    """The ``*.dist-info/METADATA`` text of a wheel file."""
    with zipfile.ZipFile(wheel) as zf:
        names = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        if len(names) != 1:
            raise VllmError(f"{wheel.name}: expected one METADATA, found {names}")
        return zf.read(names[0]).decode("utf-8")
