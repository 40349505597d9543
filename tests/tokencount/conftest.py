"""Fixtures the tokencount tests share: ``families``, the tokenizer families of
tests/token_families.py trained once per session, each with its exact counter and its
reference (transformers' own tokenizer)."""

from __future__ import annotations

import pytest

from ext_proc.admit.reload_carry import estimate_request
from ext_proc.tokencount import ExactCounter, TokenizerSpec
from tests.token_families import Loaded, build, reference


@pytest.fixture(scope="session")
def families(tmp_path_factory: pytest.TempPathFactory) -> Loaded:
    root = tmp_path_factory.mktemp("families")
    out: Loaded = {}
    for family in build(root):
        spec = TokenizerSpec.from_model_dir(family.folder)
        counter = ExactCounter.load(spec, estimate=estimate_request)
        out[family.name] = (family, counter, reference(family))
    return out
