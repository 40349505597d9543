"""Fixtures of the e2e suite: one shared stack per session, reset before every test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .harness import E2E, running_stack


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2E]:
    """Dev backend + ICE (with its /metrics) + Envoy, shared by the tests that need them."""
    with running_stack(tmp_path_factory.mktemp("stack")) as e2e:
        yield e2e


@pytest.fixture(autouse=True)
def _fresh_backend(request: pytest.FixtureRequest) -> None:
    """Before each test that uses the shared stack: idle backend, nothing recorded."""
    if "stack" in request.fixturenames:
        e2e: E2E = request.getfixturevalue("stack")
        e2e.reset()
