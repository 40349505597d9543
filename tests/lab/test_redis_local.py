"""``ext_proc.lab.redis_local``: a real redis-server found, started, pinged, killed, restarted.

Checks: the binary runs (``--version``); a started server answers PING at its ``url`` and
keeps a value; ``kill`` (SIGKILL) leaves nothing answering; ``restart`` brings a fresh, empty
server back on the same port (nothing is saved); ``stop`` ends it; a second server cannot
start on a taken port and says so (``RedisStartError``); a binary of an unpacked tree gets
its library folders in ``LD_LIBRARY_PATH``. The session fixture ``redis_server``
(tests/conftest.py) is checked too. Skips only where no redis-server can be had
(``RedisMissing``).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ext_proc.lab.redis_local import (
    RedisMissing,
    RedisServer,
    RedisStartError,
    redis_env,
    redis_server_binary,
    start_redis,
)


@pytest.fixture(scope="module")
def binary() -> Path:
    try:
        return redis_server_binary()
    except RedisMissing as e:
        pytest.skip(f"no redis-server to run: {e}")


def test_ping_kill_restart_on_the_same_port(tmp_path: Path, binary: Path) -> None:
    with start_redis(tmp_path) as server:
        assert server.url == f"redis://127.0.0.1:{server.port}/0"
        assert server.ping()
        with server.client() as c:
            c.set("k", "v")
            assert c.get("k") == b"v"
        assert server.kill() == -9
        assert not server.running
        assert not server.ping()
        port = server.port
        server.restart()
        assert server.port == port
        assert server.ping()
        with server.client() as c:
            assert c.get("k") is None  # a fresh server: nothing was saved
        assert server.log_path.is_file()
        assert server.log_path.parent == tmp_path
    assert not server.running
    assert not server.ping()


def test_a_taken_port_is_a_start_error(tmp_path: Path, binary: Path) -> None:
    with start_redis(tmp_path / "a") as first:
        second = RedisServer(tmp_path / "b", first.port, binary)
        with pytest.raises(RedisStartError, match=f"port {first.port}"):
            second.start(timeout_s=5)
        assert not second.running
        assert first.ping()


def test_an_unpacked_binary_runs_with_its_libraries(tmp_path: Path) -> None:
    root = tmp_path / "redis"
    (root / "usr" / "bin").mkdir(parents=True)
    libs = root / "usr" / "lib" / "x86_64-linux-gnu"
    libs.mkdir(parents=True)
    (libs / "liblzf.so.1").write_bytes(b"")
    (root / "deb").write_text("redis-tools_7.0.15_amd64.deb\n")
    env = redis_env(root / "usr" / "bin" / "redis-server")
    assert env["LD_LIBRARY_PATH"].split(":")[0] == str(libs)
    installed = redis_env(Path("/usr/bin/redis-server"))  # no deb marker: left as it is
    assert installed.get("LD_LIBRARY_PATH") == os.environ.get("LD_LIBRARY_PATH")


def test_the_session_fixture_runs_one(redis_server: RedisServer) -> None:
    assert redis_server.running
    assert redis_server.ping()
