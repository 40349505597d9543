"""Fixtures shared by the whole suite (tests/e2e/conftest.py adds the e2e stack's own).

``redis_server``: one real ``redis-server`` per session (``ext_proc.lab.redis_local``: on
PATH, else installed with apt-get as root, else unpacked from Debian's packages), on a free
loopback port, stopped at the end. It skips only when no redis-server can be had at all
(``RedisMissing``, whose reason the skip shows); CI runs as root on Debian with apt, so there
it runs. The server is shared: a test that needs an empty database flushes it itself.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ext_proc.lab.redis_local import RedisMissing, RedisServer, start_redis


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A started ``RedisServer`` (``.url``: ``redis://127.0.0.1:PORT/0``), for the session."""
    try:
        server = start_redis(tmp_path_factory.mktemp("redis"))
    except RedisMissing as e:
        pytest.skip(f"no redis-server to run: {e}")
    with server:
        yield server
