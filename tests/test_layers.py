"""The lab stays apart from the product: nothing outside ``ext_proc.lab`` imports it, except the
CLI's lab commands (the contract is ``[tool.importlinter]`` in pyproject.toml)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def _lint(cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(cwd)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_serve_path_does_not_import_the_lab() -> None:
    done = _lint(REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 kept, 0 broken" in done.stdout


def test_contract_breaks_when_a_product_module_imports_the_lab(tmp_path: Path) -> None:
    # A copy of the package whose pipeline imports the stack launcher, even lazily.
    shutil.copytree(
        REPO / "ext_proc", tmp_path / "ext_proc", ignore=shutil.ignore_patterns("*.pyc")
    )
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    pipeline = tmp_path / "ext_proc" / "pipeline.py"
    pipeline.write_text(
        pipeline.read_text()
        + "\n\ndef _lab() -> None:\n    from ext_proc.lab import stack  # noqa\n"
    )
    done = _lint(tmp_path)
    assert done.returncode != 0
    assert "ext_proc.pipeline -> ext_proc.lab.stack" in done.stdout


def test_the_lab_is_outside_the_container_image() -> None:
    ignored = (REPO / ".dockerignore").read_text().split()
    assert "ext_proc/lab" in ignored
