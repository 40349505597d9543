"""Load a ``bench/`` script as a module, for the tests of its parts (the benches are scripts,
not a package). Registered in ``sys.modules`` under ``name`` (dataclasses look their module
up by name), once."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[1] / "bench"


def load_bench(script: str, name: str) -> ModuleType:
    """``bench/<script>`` as the module ``name``."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, BENCH / script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
