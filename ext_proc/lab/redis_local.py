"""A real ``redis-server`` on loopback, for the shared-ledger tests and ``bench/replicas.py``.

Job: find a ``redis-server`` (or get one) and run it as a throw-away server: no config file,
no persistence, bound to 127.0.0.1 on a free port.

``redis_server_binary()`` looks, in this order:

1. ``redis-server`` on PATH;
2. as root with apt-get: ``apt-get install -y -q redis-server`` (after ``apt-get update``
   only when the first install fails); Debian's package may start a daemon on :6379, which
   nothing here uses (every server here has a port of its own);
3. otherwise Debian's packages unpacked, not installed, into ``~/.cache/ice/redis``
   (``ext_proc.lab.debian``: ``apt-get download`` + ``dpkg-deb -x`` of ``PACKAGES``). In
   Debian 12 ``/usr/bin/redis-server`` is a symlink, from the ``redis-server`` package, to
   ``redis-check-rdb`` of ``redis-tools``, the real binary (it picks its mode from the name
   it runs as), so the unpacked tree gets that symlink made; it runs with
   ``LD_LIBRARY_PATH`` naming the tree's library folders (``redis_env``);

and raises ``RedisMissing`` with a one-line reason naming what was tried when none works. A
binary counts as found when ``redis-server --version`` runs.

``start_redis(workdir, port=None)`` (or ``RedisServer(...).start()``; both are context
managers): ``redis-server --port P --bind 127.0.0.1 --save "" --appendonly no
--protected-mode yes --dir workdir``, its output in ``workdir/redis-P.log``, returned once
PING answers (the ``redis`` client). ``url`` is ``redis://127.0.0.1:P/0``; ``stop()`` (SIGTERM,
then SIGKILL past the timeout), ``kill()`` (SIGKILL: a crash), ``restart()`` (a fresh, empty
server on the same port).

Invariants: a started server is stopped by ``stop``/``kill``/the ``with`` block's exit, on
error too, and only the process this object started is signalled (by its pid); a server that
does not answer within the timeout, as itself (``INFO``'s ``process_id``: not another server
that holds the port), is killed before ``RedisStartError`` is raised; nothing
is written outside ``workdir`` and the cache folder.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ext_proc.lab.debian import DebianUnpackError, library_dirs, unpack_debian_packages
from ext_proc.lab.stack import free_port

__all__ = [
    "CACHE",
    "PACKAGES",
    "RedisMissing",
    "RedisServer",
    "RedisStartError",
    "redis_env",
    "redis_server_binary",
    "start_redis",
]

# Where Debian's packages are unpacked when redis-server is neither on PATH nor installable.
CACHE = Path.home() / ".cache" / "ice" / "redis"
# redis-tools ships the real binary (redis-check-rdb); the rest are its libraries that a slim
# image may lack (libssl3 and libsystemd0 are in every Debian base image).
PACKAGES = ("redis-tools", "liblzf1", "libjemalloc2", "libatomic1")


class RedisMissing(RuntimeError):
    """No redis-server could be found, installed or unpacked (the message says what was
    tried)."""


class RedisStartError(RuntimeError):
    """A redis-server was found but did not start (the message holds its log's tail)."""


def _unpacked_root(binary: Path) -> Path | None:
    """The unpacked tree ``binary`` lives in (``<root>/usr/bin/redis-server`` beside the
    ``<root>/deb`` marker), else None (an installed binary)."""
    root = binary.parent.parent.parent
    return root if (root / "deb").is_file() else None


def redis_env(binary: Path) -> dict[str, str]:
    """The environment to run ``binary`` with: this one, and for a binary of an unpacked
    tree ``LD_LIBRARY_PATH`` naming its library folders first."""
    env = dict(os.environ)
    root = _unpacked_root(binary)
    if root is not None:
        dirs = [str(d) for d in library_dirs(root)]
        if env.get("LD_LIBRARY_PATH"):
            dirs.append(env["LD_LIBRARY_PATH"])
        env["LD_LIBRARY_PATH"] = ":".join(dirs)
    return env


def _version(binary: Path) -> str:
    """``redis-server --version``'s line; RedisMissing when it does not run."""
    try:
        out = subprocess.run(
            [str(binary), "--version"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
            env=redis_env(binary),
        )
    except (OSError, subprocess.SubprocessError) as e:
        raise RedisMissing(f"{binary} does not run: {e}") from e
    if out.returncode != 0 or "Redis server" not in out.stdout:
        said = " ".join((out.stderr or out.stdout).split())[-300:]
        raise RedisMissing(f"{binary} --version failed ({out.returncode}): {said}")
    return out.stdout.strip()


def _on_path() -> Path | None:
    found = shutil.which("redis-server")
    return Path(found) if found else None


def _apt_install() -> None:
    """``apt-get install -y -q redis-server`` (after ``apt-get update`` when it fails);
    RedisMissing when it still fails."""
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", "redis-server"]
    got = subprocess.run(install, capture_output=True, text=True, timeout=900, check=False, env=env)
    if got.returncode != 0:
        subprocess.run(["apt-get", "update"], capture_output=True, timeout=900, check=False)
        got = subprocess.run(
            install, capture_output=True, text=True, timeout=900, check=False, env=env
        )
    if got.returncode != 0:
        said = " ".join(got.stderr.split())[-300:]
        raise RedisMissing(f"`apt-get install redis-server` failed: {said}")


def _unpacked(cache: Path) -> Path:
    """``cache/usr/bin/redis-server``, unpacking Debian's packages there the first time (under
    a lock: two runs at once unpack once); RedisMissing when that fails."""
    binary = cache / "usr" / "bin" / "redis-server"
    real = binary.with_name("redis-check-rdb")
    cache.parent.mkdir(parents=True, exist_ok=True)
    with (cache.parent / f"{cache.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not real.exists() and not binary.exists():
            try:
                unpack_debian_packages(PACKAGES, cache)
            except (DebianUnpackError, OSError, subprocess.SubprocessError) as e:
                raise RedisMissing(f"unpacking Debian's {' '.join(PACKAGES)} failed: {e}") from e
        if not binary.exists() and not binary.is_symlink():
            if not real.exists():
                raise RedisMissing(f"{cache}: Debian's redis-tools has no redis-check-rdb")
            binary.symlink_to(real.name)  # redis-check-rdb runs as a server under this name
    return binary


def redis_server_binary(cache: Path = CACHE) -> Path:
    """A ``redis-server`` that runs: on PATH, else installed with apt-get (as root), else
    unpacked from Debian's packages into ``cache``; RedisMissing saying what was tried."""
    tried: list[str] = []
    found = _on_path()
    if found is not None:
        try:
            _version(found)
            return found
        except RedisMissing as e:
            tried.append(str(e))
    else:
        tried.append("redis-server is not on PATH")
    if os.geteuid() == 0 and shutil.which("apt-get") is not None:
        try:
            _apt_install()
            found = _on_path()
            if found is None:
                raise RedisMissing("apt-get installed redis-server, yet it is not on PATH")
            _version(found)
            return found
        except (RedisMissing, OSError, subprocess.SubprocessError) as e:
            tried.append(str(e))
    else:
        tried.append("not root with apt-get: no apt-get install")
    try:
        binary = _unpacked(cache)
        _version(binary)
        return binary
    except RedisMissing as e:
        tried.append(str(e))
    raise RedisMissing("no redis-server: " + "; ".join(tried))


@dataclass
class RedisServer:
    """One ``redis-server`` process on 127.0.0.1:``port``; ``start()`` runs it."""

    workdir: Path
    port: int
    binary: Path
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def log_path(self) -> Path:
        return self.workdir / f"redis-{self.port}.log"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def argv(self) -> list[str]:
        return [
            str(self.binary),
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "yes",
            "--dir",
            str(self.workdir),
        ]

    def client(self, timeout_s: float = 2.0, *, retries: int = 0) -> redis.Redis:
        """A client of this server (db 0); ``retries``: redis-py's own retries of a failed
        call (its default, 3 with backoff, takes seconds to report a server that is down)."""
        return redis.Redis(
            host="127.0.0.1",
            port=self.port,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), retries),
        )

    def ping(self) -> bool:
        """Whether the server answers PING now."""
        try:
            with self.client(timeout_s=0.5) as c:
                return bool(c.ping())
        except redis.RedisError:
            return False

    def _answers_as(self, pid: int) -> bool:
        """Whether the server on the port answers, and is process ``pid`` (not another
        server that holds the port)."""
        try:
            with self.client(timeout_s=0.5) as c:
                info = c.info("server")
        except redis.RedisError:
            return False
        return isinstance(info, dict) and info.get("process_id") == pid

    def start(self, timeout_s: float = 10.0) -> RedisServer:
        """Run the server and wait until it answers (as itself: the pid ``INFO`` gives);
        RedisStartError (the server killed and its log's tail in the message) when it exits
        or stays silent."""
        if self.running:
            raise RedisStartError(f"redis-server on port {self.port} is already running")
        self.workdir.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.argv(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=redis_env(self.binary),
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            if self._answers_as(self.proc.pid):
                return self
            time.sleep(0.05)
        code = self.proc.poll()
        self.kill()
        what = f"exited with {code}" if code is not None else f"no PING answer in {timeout_s} s"
        raise RedisStartError(f"redis-server on port {self.port} {what}: {self._log_tail()}")

    def _log_tail(self, lines: int = 10) -> str:
        with contextlib.suppress(OSError):
            return " | ".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return "(no log)"

    def _signal(self, sig: int, timeout_s: float) -> int | None:
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                proc.wait(5)
        return proc.returncode

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """SIGTERM (SIGKILL past ``timeout_s``); the exit code (None: never started)."""
        return self._signal(signal.SIGTERM, timeout_s)

    def kill(self) -> int | None:
        """SIGKILL, as a crash; the exit code (None: never started)."""
        return self._signal(signal.SIGKILL, 5.0)

    def restart(self, timeout_s: float = 10.0) -> RedisServer:
        """Stop the server if it runs, then start a fresh one (no data: nothing is saved) on
        the same port."""
        self.stop()
        return self.start(timeout_s)

    def __enter__(self) -> RedisServer:
        if not self.running:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_redis(workdir: Path, port: int | None = None, *, cache: Path = CACHE) -> RedisServer:
    """A started ``RedisServer`` on ``port`` (default: a free one), its log in ``workdir``;
    RedisMissing when there is no redis-server (``redis_server_binary``), RedisStartError
    when it does not start."""
    binary = redis_server_binary(cache)
    return RedisServer(workdir, port or free_port(), binary).start()
