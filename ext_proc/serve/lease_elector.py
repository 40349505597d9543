"""The election of ``ice serve --leader-elect`` (``lease``): the Kubernetes Python client's own
``LeaderElection`` loop in a daemon thread, a watchdog thread beside it, and each change
(leading, standing by) reported to the server's asyncio loop.

- ``LeaseTimings``: the election's periods, checked (client-go's defaults 15/10/2 s): the
  leader renews every retry period; it steps down when no renewal succeeded for the renew
  deadline; a standby takes over once the lease went unrenewed for the lease duration,
  checking every retry period.
- ``ElectionLock``: the lock interface of ``kubernetes.leaderelection`` (``lease`` makes the
  client's Lease lock); ``_Guard``: that lock as the client's election sees it.
- ``LeaderElector``: the election, standing again after each term, and the watchdog.

Invariants:

- Standby first: ``start`` reports standby before the thread runs; leading is reported only
  after the lock was written with this identity.
- A lost lease is reported at once: when the client's renew loop gives up, when a read shows
  another holder, when the watchdog finds no renewal for renew deadline + retry period (a
  call hung past its timeout), or when the election thread fails. A leader so steps down by
  its last renewal + renew deadline + 1.5 retry periods, before a standby can take over (at
  the earliest the lease duration after it saw that renewal): ``LeaseTimings`` checks it.
- Reports reach the loop in the order they were decided (``loop.call_soon_threadsafe``
  under one lock), and only on a change.
- ``stop``: no lock call starts after it; standby is reported; a held lease is released
  (``release``: holder cleared, as client-go's ReleaseOnCancel), so a standby takes over at
  its next retry instead of after the lease duration.
- An error in a call on the lock is a failed try, never the end of the election thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["JITTER", "ElectionLock", "LeaderElector", "LeaseTimings"]

log = logging.getLogger("ice.lease")

JITTER = 1.2  # kubernetes.leaderelection.electionconfig.Config.jitter_factor


@dataclass(frozen=True, slots=True)
class LeaseTimings:
    """The election's periods, checked: ``lease_duration_s`` in whole seconds (a Lease's
    ``leaseDurationSeconds``), renew deadline above 1.2 retry periods (the client's rule),
    and the lease duration above renew deadline + 1.5 retry periods (when a leader has
    stepped down at the latest: the module's invariant). ValueError otherwise."""

    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0

    def __post_init__(self) -> None:
        if not self.retry_period_s > 0:
            raise ValueError(f"retry period {self.retry_period_s} s: must be above 0")
        if self.lease_duration_s < 1 or not float(self.lease_duration_s).is_integer():
            raise ValueError(f"lease duration {self.lease_duration_s} s: whole seconds, ≥ 1")
        if not self.renew_deadline_s > JITTER * self.retry_period_s:
            raise ValueError(
                f"renew deadline {self.renew_deadline_s} s: must be above {JITTER} × the "
                f"retry period ({self.retry_period_s} s)"
            )
        if not self.lease_duration_s > self.renew_deadline_s + 1.5 * self.retry_period_s:
            raise ValueError(
                f"lease duration {self.lease_duration_s} s: must be above the renew deadline "
                "+ 1.5 retry periods (a leader steps down by then)"
            )


class ElectionLock(Protocol):
    """The lock interface of ``kubernetes.leaderelection`` (its ``resourcelock`` classes):
    ``get`` → (found, the ``LeaderElectionRecord``; or, not found, the error, whose ``body``
    is the API's JSON: only code 404 lets the election create the lock), ``create`` and
    ``update`` → whether the write went through."""

    name: str
    namespace: str
    identity: str

    def get(self, name: str, namespace: str) -> tuple[bool, Any]: ...

    def create(self, name: str, namespace: str, election_record: Any) -> bool: ...

    def update(self, name: str, namespace: str, updated_record: Any) -> bool: ...


class _Abort(Exception):
    """Raised through the client's election loop to end it: stopped, or the lease lost."""


class _Refused:
    """A failed read that is not a 404 (the client reads ``body`` and ``reason``): the
    election tries again next period."""

    body = None

    def __init__(self, reason: str) -> None:
        self.reason = reason


@dataclass
class _ElectionConfig:
    """What ``LeaderElection`` reads of its config. Not the client's ``electionconfig.Config``:
    that one calls ``sys.exit`` on a bad value and refuses periods under 1 s;
    ``LeaseTimings`` checks the same rules with ValueError."""

    lock: _Guard
    lease_duration: int
    renew_deadline: float
    retry_period: float
    onstarted_leading: Callable[[], None]
    onstopped_leading: Callable[[], None]


class _Guard:
    """The lock as the client's election sees it: the real lock's calls one at a time (so
    ``stop`` can wait out the one in flight), an exception turned into a failed try, the
    elector told of each write and each holder read; ``_Abort`` once the run must end."""

    def __init__(self, lock: ElectionLock, elector: LeaderElector) -> None:
        self.lock = lock
        self.name, self.namespace, self.identity = lock.name, lock.namespace, lock.identity
        self.calls = threading.Lock()
        self._elector = elector

    def get(self, name: str, namespace: str) -> tuple[bool, Any]:
        with self.calls:
            self._elector.check_run()
            try:
                found, record = self.lock.get(name, namespace)
            except Exception as e:
                log.warning("lease %s/%s: read failed: %s", namespace, name, e)
                return False, _Refused(f"{type(e).__name__}: {e}")
            if found and record is not None:
                self._elector.saw_holder(getattr(record, "holder_identity", None))
            return found, record

    def create(self, name: str, namespace: str, election_record: Any) -> bool:
        return self._write(self.lock.create, name, namespace, election_record)

    def update(self, name: str, namespace: str, updated_record: Any) -> bool:
        return self._write(self.lock.update, name, namespace, updated_record)

    def _write(self, call: Callable[[str, str, Any], bool], name: str, ns: str, rec: Any) -> bool:
        with self.calls:
            self._elector.check_run()
            try:
                done = bool(call(name, ns, rec))
            except Exception as e:
                log.warning("lease %s/%s: write failed: %s", ns, name, e)
                return False
            if done:  # the client writes only records naming this identity
                self._elector.renewed()
            return done


class LeaderElector:
    """The client's election in a daemon thread, standing again after each term.

    ``on_leading`` / ``on_standby`` run on ``loop``'s thread. ``release``: called by
    ``stop`` when this replica led (clears the holder: ``release_lease``)."""

    def __init__(
        self,
        lock: ElectionLock,
        *,
        on_leading: Callable[[], None],
        on_standby: Callable[[], None],
        loop: asyncio.AbstractEventLoop,
        timings: LeaseTimings | None = None,
        release: Callable[[], object] | None = None,
    ) -> None:
        self.timings = timings or LeaseTimings()
        self.identity = lock.identity
        self._guard = _Guard(lock, self)
        self._on_leading, self._on_standby, self._loop = on_leading, on_standby, loop
        self._release = release
        self._state = threading.Lock()
        self._leading = False
        self._reported: bool | None = None
        self._run = 0  # the current term of candidacy (one LeaderElection.run)
        self._run_over = False  # it lost, or must end: its lock calls raise _Abort
        self._last_write = 0.0  # monotonic time of the last successful write
        self._stopping = threading.Event()
        self._threads = [
            threading.Thread(target=self._elect, name="ice-lease", daemon=True),
            threading.Thread(target=self._watch, name="ice-lease-watchdog", daemon=True),
        ]

    @property
    def leading(self) -> bool:
        return self._leading

    def start(self) -> None:
        with self._state:
            self._report(False)
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        """Blocking (at most one API call's timeout, then the release): see the module's
        invariants. Idempotent."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        with self._state:
            led = self._leading
            self._leading, self._run_over = False, True
            self._report(False)
        with self._guard.calls:  # the call in flight, if any, is over; no other starts
            if led and self._release is not None:
                try:
                    self._release()
                    log.info("lease %s released", self.name)
                except Exception as e:
                    log.warning("lease %s: release failed (%s): it expires", self.name, e)

    async def aclose(self) -> None:
        """``stop`` off the event loop."""
        await asyncio.to_thread(self.stop)

    @property
    def name(self) -> str:
        return self._guard.name

    # --- called by the guard and the client, on the election's threads ----------------------

    def check_run(self) -> None:
        if self._stopping.is_set():
            raise _Abort("stopped")
        with self._state:
            if self._run_over:
                raise _Abort("lease lost")

    def saw_holder(self, holder: str | None) -> None:
        with self._state:
            if self._leading and holder is not None and holder != self.identity:
                log.warning("lease %s: now held by %s: standing by", self.name, holder)
                self._lose()
                raise _Abort(f"lease held by {holder}")

    def renewed(self) -> None:
        self._last_write = time.monotonic()

    def _started(self, run: int) -> None:
        """The client's onstarted_leading (its own thread: may come after the term ended)."""
        with self._state:
            if run != self._run or self._run_over or self._stopping.is_set():
                return
            self._leading = True
            self._report(True)
        log.info("lease %s: leading as %s", self.name, self.identity)

    def _stopped(self, run: int) -> None:
        """The client's onstopped_leading: no renewal for the renew deadline."""
        with self._state:
            if run == self._run and self._leading:
                log.warning("lease %s: renewals failed: standing by", self.name)
                self._lose()

    def _lose(self) -> None:  # holding self._state
        self._leading, self._run_over = False, True
        self._report(False)

    def _report(self, leading: bool) -> None:  # holding self._state
        if self._reported is leading or (leading and self._stopping.is_set()):
            return
        self._reported = leading
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody to tell
            self._loop.call_soon_threadsafe(self._on_leading if leading else self._on_standby)

    def _elect(self) -> None:
        from kubernetes.leaderelection.leaderelection import LeaderElection

        t = self.timings
        while not self._stopping.is_set():
            with self._state:
                self._run += 1
                run, self._run_over = self._run, False
            config = _ElectionConfig(
                lock=self._guard,
                lease_duration=int(t.lease_duration_s),
                renew_deadline=t.renew_deadline_s,
                retry_period=t.retry_period_s,
                onstarted_leading=functools.partial(self._started, run),
                onstopped_leading=functools.partial(self._stopped, run),
            )
            try:
                LeaderElection(config).run()  # type: ignore[no-untyped-call]
            except _Abort:
                pass
            except Exception:
                log.exception("lease %s: the election failed; standing again", self.name)
            with self._state:
                if run == self._run and self._leading:
                    self._lose()
            self._stopping.wait(t.retry_period_s)

    def _watch(self) -> None:
        """Step down when no write succeeded for renew deadline + retry period, even while
        the election thread is stuck in a call."""
        t = self.timings
        limit_s = t.renew_deadline_s + t.retry_period_s
        while not self._stopping.wait(t.retry_period_s / 2):
            with self._state:
                if self._leading and time.monotonic() - self._last_write > limit_s:
                    log.warning("lease %s: not renewed for %.1f s: standing by", self.name, limit_s)
                    self._lose()
