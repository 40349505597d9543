"""The house's contracts (``[tool.importlinter]`` in pyproject.toml, docs/architecture.md):
the lab stays apart from the product, each layer imports only the layers below it, no module
imports itself back through others, and the modules stay small enough to read in one sitting.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "ext_proc"
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
MAX_MODULE_LINES = 450
MAX_SERVE_PATH_FUNCTION_LINES = 60
# The packages a request's way runs through in `ice serve` (with the collector beside it).
SERVE_PATH = (
    "serve",
    "admit",
    "placement",
    "policy",
    "schemas",
    "sysprompt",
    "media",
    "tokencount",
    "truncate",
    "prefix",
    "signals",
)


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


def _copy_with(tmp_path: Path, module: str, extra: str) -> Path:
    """A copy of the package whose ``module`` (a path under ext_proc/) ends with ``extra``."""
    shutil.copytree(PACKAGE, tmp_path / "ext_proc", ignore=shutil.ignore_patterns("*.pyc"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / "ext_proc" / module
    target.write_text(target.read_text() + extra)
    return tmp_path


def test_every_contract_is_kept() -> None:
    done = _lint(REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 kept, 0 broken" in done.stdout


def test_contract_breaks_when_a_product_module_imports_the_lab(tmp_path: Path) -> None:
    # the pipeline imports the stack launcher, even lazily
    extra = "\n\ndef _lab() -> None:\n    from ext_proc.lab import stack  # noqa\n"
    done = _lint(_copy_with(tmp_path, "admit/pipeline.py", extra))
    assert done.returncode != 0
    assert "ext_proc.admit.pipeline -> ext_proc.lab.stack" in done.stdout


@pytest.mark.parametrize(
    ("module", "imported"),
    [
        ("signals/collector.py", "ext_proc.policy.settings"),
        ("policy/evaluate.py", "ext_proc.admit.verdict"),
        ("placement/poolview.py", "ext_proc.admit.pipeline"),
        ("schemas/base.py", "ext_proc.sysprompt.scan"),
        ("telemetry.py", "ext_proc.signals.snapshot"),
        ("admit/pipeline.py", "ext_proc.serve.render"),
    ],
    ids=[
        "signals-policy",
        "policy-admit",
        "placement-admit",
        "schemas-sysprompt",
        "telemetry-signals",
        "admit-serve",
    ],
)
def test_layers_contract_breaks_on_an_import_that_runs_up(
    tmp_path: Path, module: str, imported: str
) -> None:
    extra = f"\n\ndef _up() -> None:\n    import {imported}  # noqa\n"
    done = _lint(_copy_with(tmp_path, module, extra))
    assert done.returncode != 0
    source = "ext_proc." + module.removesuffix(".py").replace("/", ".")
    assert f"{source} -> {imported}" in done.stdout


def _cycles() -> list[list[str]]:
    """The import graph's strongly connected components of more than one module (Tarjan)."""
    graph = grimp.build_graph("ext_proc", cache_dir=None)
    modules = sorted(m for m in graph.modules if not m.startswith("ext_proc._pb"))
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.find_modules_directly_imported_by(v):
            if w.startswith("ext_proc._pb"):
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10_000))
    try:
        for m in modules:
            if m not in index:
                visit(m)
    finally:
        sys.setrecursionlimit(limit)
    return found


def test_no_module_imports_itself_back_through_others() -> None:
    assert _cycles() == []


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "_pb" not in p.parts)


def test_every_module_is_short_enough_to_read_in_one_sitting() -> None:
    long = {
        str(p.relative_to(REPO)): n
        for p in _modules()
        if (n := p.read_text().count("\n")) > MAX_MODULE_LINES
    }
    assert long == {}


def test_no_serve_path_function_runs_over_sixty_lines() -> None:
    long: dict[str, int] = {}
    for p in _modules():
        rel = p.relative_to(PACKAGE)
        if rel.parts[0] not in SERVE_PATH:
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_SERVE_PATH_FUNCTION_LINES:
                    long[f"{rel}:{node.lineno} {node.name}"] = lines
    assert long == {}


def test_the_lab_is_outside_the_container_image() -> None:
    ignored = (REPO / ".dockerignore").read_text().split()
    assert "ext_proc/lab" in ignored
