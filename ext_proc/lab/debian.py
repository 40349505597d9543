"""Debian packages unpacked, not installed: ``apt-get download`` and ``dpkg-deb -x``.

Job: give the lab (``redis_local``) and the tests (``tests/lab/test_ops.py``'s Prometheus) a
program that no PyPI package ships, without installing it system-wide: the packages are
downloaded with ``apt-get download`` (any user; as root, after an ``apt-get update`` when the
first try fails, since a fresh container has no package lists) and unpacked with ``dpkg-deb
-x`` into a folder of their own, whose ``usr/bin`` and ``usr/lib/...`` then hold what they
ship. No maintainer script runs, so nothing is started or configured.

``unpack_debian_packages(packages, into)``: every package of ``packages`` unpacked into
``into``, replacing what was there; a file ``into/deb`` names the ``.deb`` files, one a line.
``library_dirs(root)``: the folders of shared libraries under an unpacked tree (for
``LD_LIBRARY_PATH``).

Invariants: ``into`` appears whole or not at all: the packages are unpacked into a staging
folder beside it and renamed into place, so a failed or interrupted unpack never leaves a
half tree that looks finished; every failure (no apt-get or dpkg-deb, a download that fails, a
package that did not come) raises ``DebianUnpackError`` with a one-line reason, and a program
that fails in a way of its own raises ``OSError`` / ``subprocess.SubprocessError``. Callers
that may run at once take a lock around it (``tests/lab/test_ops.py`` does).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

__all__ = ["DebianUnpackError", "library_dirs", "unpack_debian_packages"]


class DebianUnpackError(RuntimeError):
    """The packages could not be downloaded or unpacked (the message says why)."""


def _download(
    packages: Sequence[str], cwd: Path, timeout_s: float
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["apt-get", "download", *packages],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def unpack_debian_packages(
    packages: Sequence[str], into: Path, *, timeout_s: float = 600.0
) -> list[str]:
    """Download ``packages`` with ``apt-get download`` and unpack them all into ``into``
    (replaced whole); the names of the ``.deb`` files, also written to ``into/deb``.

    As root, a failed download is retried once after ``apt-get update`` (the package lists
    may be missing). ``DebianUnpackError`` when apt-get or dpkg-deb is missing, the download
    fails or a package's ``.deb`` did not come.
    """
    if not packages:
        raise ValueError("no package to unpack")
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        raise DebianUnpackError(
            f"no apt-get/dpkg-deb to fetch Debian's {' '.join(packages)} package(s) with"
        )
    into.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=into.parent) as tmp:
        got = _download(packages, Path(tmp), timeout_s)
        if got.returncode != 0 and os.geteuid() == 0:  # apt's package lists may be missing
            subprocess.run(
                ["apt-get", "update"], capture_output=True, timeout=timeout_s, check=False
            )
            got = _download(packages, Path(tmp), timeout_s)
        if got.returncode != 0:
            reason = " ".join(got.stderr.split())[-600:]
            raise DebianUnpackError(f"`apt-get download {' '.join(packages)}` failed: {reason}")
        debs: list[Path] = []
        for package in packages:
            found = sorted(Path(tmp).glob(f"{package}_*.deb"))
            if not found:
                raise DebianUnpackError(f"`apt-get download {package}` gave no .deb file")
            debs.append(found[0])
        staged = Path(tmp) / "root"
        for deb in debs:
            subprocess.run(["dpkg-deb", "-x", str(deb), str(staged)], check=True, timeout=300)
        names = [deb.name for deb in debs]
        (staged / "deb").write_text("".join(f"{name}\n" for name in names))
        if into.exists():
            shutil.rmtree(into)
        staged.rename(into)
    return names


def library_dirs(root: Path) -> list[Path]:
    """The folders under an unpacked tree ``root`` that hold shared libraries (``*.so*``
    files): ``lib``, ``usr/lib`` and their multiarch folders, in that order; none missing."""
    out: list[Path] = []
    for base in (root / "lib", root / "usr" / "lib"):
        if not base.is_dir():
            continue
        for folder in (base, *sorted(p for p in base.iterdir() if p.is_dir())):
            if any(folder.glob("*.so*")):
                out.append(folder)
    return out
