"""Policy hot reload: notice that the policy file changed, validate the new one in full, and
say whether it can replace the one in force.

- ``FileWatch``: the file's identity (device, inode, mtime, size) through symlinks, so a
  Kubernetes ConfigMap update (the mounted directory's ``..data`` symlink is swapped to a
  new directory: a new inode, never an edit in place) and an editor's write-and-rename are
  both seen; ``changed()`` is a ``stat`` (checked every ``POLL_S``).
- ``candidate``: the new policy, loaded and checked by the same loader as at start
  (``load_policy``), with the sha256 of its bytes; or the one-line reason it is refused (the
  loader's message names the field), or that it cannot be taken without a restart.
- ``carried``: what a worker keeps across a reload (the in-flight KV ledger when the pools'
  endpoints are unchanged, the tokenizers when their files are unchanged).

Invariants: nothing here swaps anything (the server does, in one assignment per process);
a refused file never changes what is in force; the built-in policy (no file) never reloads.
"""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from ext_proc import telemetry
from ext_proc.policy.load import PolicyError, default_policy_text, load_policy
from ext_proc.policy.settings import Policy

__all__ = [
    "POLL_S",
    "Candidate",
    "FileWatch",
    "candidate",
    "policy_sha256",
    "record_in_force",
    "refused",
    "reloaded",
]

log = logging.getLogger("ice.reload")

POLL_S = 0.5  # a change is in force within a poll and a load (the checklist asks 30 s)


def policy_sha256(path: str | None) -> str:
    """The sha256 of the policy file's bytes (the built-in policy's when ``path`` is None)."""
    data = Path(path).read_bytes() if path else default_policy_text().encode("utf-8")
    return hashlib.sha256(data).hexdigest()


class FileWatch:
    """Whether a file is another file than the last time it was looked at."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._seen = self._identity()

    def _identity(self) -> tuple[int, int, int, int] | None:
        if self.path is None:
            return None
        try:
            st = os.stat(self.path)  # follows symlinks: ..data swaps change the inode
        except OSError:
            return None
        return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)

    def changed(self) -> bool:
        """True once per change (a missing file is no change: the last good one serves)."""
        now = self._identity()
        if now is None or now == self._seen:
            return False
        self._seen = now
        return True


@dataclass(frozen=True, slots=True)
class Candidate:
    policy: Policy
    sha256: str


def _needs_restart(old: Policy, new: Policy) -> str | None:
    """What a running ICE cannot take over without a restart."""
    if new.truncation_enabled and not old.truncation_enabled:
        return "truncation is switched on: the embedding worker starts only at start-up"
    if new.truncation_enabled and new.embedding != old.embedding:
        return "the embedding model changed: the embedding worker loads it only at start-up"
    return None


def candidate(path: str | None, in_force: Policy, in_force_sha: str) -> Candidate | str | None:
    """The policy at ``path`` if it may replace ``in_force``; a one-line reason if not; None
    when its bytes are the ones in force."""
    if path is None:
        return None
    try:
        sha = policy_sha256(path)
    except OSError as e:
        return f"{path}: cannot read: {e.strerror}"
    if sha == in_force_sha:
        return None
    try:
        policy = load_policy(path)
    except PolicyError as e:
        return str(e)  # names the file and the field
    reason = _needs_restart(in_force, policy)
    if reason is not None:
        return f"{path}: {reason}"
    return Candidate(policy, sha)


def record_in_force(sha: str, previous: str | None = None) -> None:
    """``ice_policy_info{sha256}``: 1 for the policy in force, 0 for the one it replaced."""
    if previous is not None and previous != sha:
        telemetry.POLICY_INFO.labels(sha256=previous).set(0)
    telemetry.POLICY_INFO.labels(sha256=sha).set(1)


def refused(reason: str, sha_in_force: str) -> None:
    log.error("policy reload refused: %s; still serving policy %s", reason, sha_in_force[:12])
    telemetry.POLICY_RELOADS.labels(result="refused").inc()


def reloaded(sha: str, previous: str) -> None:
    log.info("policy reloaded: %s (was %s)", sha[:12], previous[:12])
    telemetry.POLICY_RELOADS.labels(result="ok").inc()
    record_in_force(sha, previous)
