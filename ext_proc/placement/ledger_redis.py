"""The in-flight KV ledger shared by several ICE replicas through Redis (``--ledger redis://``).

Job: each ICE replica (each worker of each ``ice serve``) keeps its own ledger
(``ext_proc.placement.poolview``): the blocks of the requests it passed since a pool's view was
taken (A) and the blocks its live requests reserve (L). Behind Envoy's round robin N replicas
would each admit what the view's free blocks allow, N times over. Here every replica also
writes its entries and live totals to one Redis, and judges with the *other* replicas' figures
added (its ``mirror``), so N replicas admit no more than one would.

Keys (one standalone Redis, or one primary; ``{pool}`` hash-tagged)::

    ice:{<pool>}:seen   ZSET  member "<replica>|<seq>|<endpoint>|<blocks>", score = Redis time
                               (ms) it was passed; trimmed after ``KEEP_MS``
    ice:{<pool>}:live   HASH  "<replica>|<endpoint>" → that replica's live total (blocks);
                               "<replica>|" TENANT_FIELD "<tenant>" → the blocks that
                               tenant's live requests hold there (``tenant_ledger``)
    ice:replicas        ZSET  replica → the Redis time (ms) it stops counting unless renewed:
                               now + ``ttl_s`` at each heartbeat (every ``HEARTBEAT_S``)

Invariants:

- Redis's clock only: an entry's time is Redis ``TIME`` when it was reserved, and a replica
  sends its view's *age* (its own monotonic clock measures a duration, never an instant), so
  the entries newer than the view are those after Redis-now − age. Clock skew between
  replicas does not matter.
- A replica writes only its own fields, and absolute totals, not deltas: a lost write is
  corrected by its next one, and the heartbeat rewrites all of them every second.
- A replica that died stops counting within ``ttl_s``: its entry in ``ice:replicas`` expires,
  and the scripts skip (and delete) the live totals of replicas that are not in it. Its seen entries
  count only until the next view, as everyone's.
- Reserve is one atomic script (``RESERVE``): it recomputes the other replicas' figures, and
  refuses (a conflict) when they grew, since the mirror the request was judged with, by more
  than the request's slack (its room after it, ``room − need``); else it adds the entry and
  the new live total. Room is min(F − A, U − L) per endpoint (poolview), so growth of at most
  the slack in both A and L keeps ``need ≤ room``. The caller re-judges on a conflict.
- While the ledger is local, a replica counts its own figures ``1 + peers`` times, peers = the
  other replicas alive when Redis last answered: under a balanced balancer each holds about
  what this one does, so N replicas still admit about what one would (``fallback_factor``).
- Never more than ``deadline_s`` on Redis per call (default 5 ms): past it the request goes
  on with its local hold, and the reservation is written again without the check in the
  background (the first may have landed, or been refused: either way the others count it,
  at worst twice in A until the next view). Releases are written in the background too.
  An error (Redis unreachable, refused, failing), ``SLOW_CALLS_DOWN`` slow calls in a row,
  or a failed heartbeat turn the ledger ``local`` at once (the mirror empties: the replica
  judges with its own ledger and the host's shared memory), logged once, counted; the
  heartbeat brings it back (scripts loaded and ``WARM_CONNECTIONS`` connections open first).

Cost: one round trip per passed request (``RESERVE``'s answer also refreshes the mirror), a
second one only when a verdict was limited by memory and the mirror held others' blocks
(``sync``, then judge again: the mirror may be older than the others' releases).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import secrets
import socket
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

from ext_proc import telemetry
from ext_proc.placement.ledger_scripts import HEARTBEAT_SCRIPT, RESERVE_SCRIPT, STATE_SCRIPT

__all__ = [
    "DEFAULT_DEADLINE_S",
    "DEFAULT_TTL_S",
    "TENANT_FIELD",
    "LedgerURLError",
    "RedisLedger",
    "Reserve",
    "check_ledger_url",
]

log = logging.getLogger(__name__)

DEFAULT_DEADLINE_S = 0.005
DEFAULT_TTL_S = 3.0
HEARTBEAT_S = 1.0
BACKGROUND_DEADLINE_S = 0.5  # writes no request waits on (releases, late reservations)
SLOW_CALLS_DOWN = 3  # calls in a row past the deadline that turn the ledger local
WARM_CONNECTIONS = 16  # open before judging with Redis: concurrent calls of a burst
KEEP_MS = 120_000  # seen entries older than this are dropped (no view is that old)
# A live-hash field for a tenant's total, after "<replica>|": a control character no serving
# address starts with (ext_proc.placement.tenant_ledger).
TENANT_FIELD = "\x1ftenant:"


class LedgerURLError(ValueError):
    """A ``--ledger`` URL that is not one: one line, naming it."""


def check_ledger_url(url: str) -> str:
    """``url`` if it names a Redis (redis://, rediss://, unix://), else ``LedgerURLError``."""
    from redis.connection import parse_url

    if not url.startswith(("redis://", "rediss://", "unix://")):
        raise LedgerURLError(f"--ledger {url!r}: want redis://HOST:PORT/DB")
    try:
        parse_url(url)  # type: ignore[no-untyped-call]
    except (ValueError, TypeError) as e:
        raise LedgerURLError(f"--ledger {url!r}: {e}") from None
    return url


def seen_key(pool: str) -> str:
    return f"ice:{{{pool}}}:seen"


def live_key(pool: str) -> str:
    return f"ice:{{{pool}}}:live"


REPLICAS_KEY = "ice:replicas"


def default_replica_id() -> str:
    """Unique per process start: host, pid and a random tag (a restart is a new replica)."""
    host = socket.gethostname().replace("|", "_")
    return f"{host}-{os.getpid()}-{secrets.token_hex(3)}"


def _pairs(flat: Sequence[Any]) -> dict[str, int]:
    out: dict[str, int] = {}
    for k, v in zip(flat[::2], flat[1::2], strict=True):
        key = k.decode() if isinstance(k, bytes) else str(k)
        out[key] = int(v)
    return out


def _split(live: dict[str, int]) -> tuple[dict[str, int], dict[str, int]]:
    """A pool's live totals as (by endpoint, by tenant): the tenant fields apart."""
    n = len(TENANT_FIELD)
    tenants = {k[n:]: v for k, v in live.items() if k.startswith(TENANT_FIELD)}
    if not tenants:
        return live, tenants
    return {k: v for k, v in live.items() if not k.startswith(TENANT_FIELD)}, tenants


class Reserve:
    """What a request judged with the mirror asks of ``RedisLedger.reserve``: ``blocks`` at
    ``endpoint`` ("" anywhere) of ``pool``, this replica's live total there once reserved,
    and the check: ``slack`` (room after it; None: reserve without a check) over
    ``checked`` endpoints."""

    __slots__ = ("blocks", "checked", "endpoint", "pool", "slack", "total", "view_age_ms")

    def __init__(
        self,
        pool: str,
        endpoint: str,
        blocks: int,
        total: int,
        view_age_ms: int,
        slack: int | None = None,
        checked: Sequence[str] = (),
    ) -> None:
        self.pool, self.endpoint, self.blocks, self.total = pool, endpoint, blocks, total
        self.view_age_ms, self.slack, self.checked = view_age_ms, slack, tuple(checked)


class RedisLedger:
    """One replica's handle on the shared ledger, with its mirror of the others' figures.

    ``own_totals``: this replica's live totals, pool → endpoint → blocks (the heartbeat
    rewrites them in Redis); ``view_age_ms``: pool → the age of the view it judges with now
    (None: no view), for the heartbeat's refresh of the mirror."""

    def __init__(
        self,
        url: str,
        *,
        replica: str | None = None,
        deadline_s: float = DEFAULT_DEADLINE_S,
        ttl_s: float = DEFAULT_TTL_S,
        own_totals: Callable[[], Mapping[str, Mapping[str, int]]] = dict,
        own_tenants: Callable[[], Mapping[str, Mapping[str, int]]] = dict,
        view_age_ms: Callable[[str], int | None] = lambda _pool: None,
        pools: Callable[[], Iterable[str]] = tuple,
    ) -> None:
        # lazy: the redis client is imported only by a replica started with --ledger redis://
        import redis.asyncio as aioredis

        try:
            self.client: Any = aioredis.from_url(
                url, socket_connect_timeout=1.0, socket_timeout=1.0, health_check_interval=0
            )
        except ValueError as e:
            raise LedgerURLError(f"--ledger {url!r}: {e}") from None
        self.url = url
        self.replica = replica or default_replica_id()
        self.deadline_s = deadline_s
        self.ttl_s = ttl_s
        self.own_totals = own_totals
        self.own_tenants = own_tenants  # pool → tenant → blocks, rewritten with the totals
        self.view_age_ms = view_age_ms
        self.pools = pools
        self.active = False
        # other replicas alive when Redis last answered: while it does not, this replica
        # counts its own ledger (1 + peers) times (``fallback_factor``)
        self.peers = 0
        self._seq = itertools.count()
        # pool → (A by endpoint since the view it was read for, L by endpoint): others only
        self.mirror: dict[str, tuple[dict[str, int], dict[str, int]]] = {}
        # pool → the other replicas' blocks held per tenant (their TENANT_FIELD totals)
        self.tenant_mirror: dict[str, dict[str, int]] = {}
        self._reserve = self.client.register_script(RESERVE_SCRIPT)
        self._state = self.client.register_script(STATE_SCRIPT)
        self._heartbeat = self.client.register_script(HEARTBEAT_SCRIPT)
        self._task: asyncio.Task[None] | None = None
        self._pending: set[asyncio.Task[Any]] = set()
        self._said_down = False
        self._slow = 0  # calls in a row past the deadline
        self._set_backend(False)

    # --- the mirror, read on every request by poolview ------------------------------------

    def unseen(self, pool: str) -> Mapping[str, int]:
        """The other replicas' blocks passed to ``pool`` since the view, by endpoint."""
        got = self.mirror.get(pool) if self.active else None
        return got[0] if got is not None else {}

    def live(self, pool: str) -> Mapping[str, int]:
        """The other replicas' live reservations in ``pool``, by endpoint."""
        got = self.mirror.get(pool) if self.active else None
        return got[1] if got is not None else {}

    def tenants(self, pool: str) -> Mapping[str, int]:
        """The other replicas' blocks held in ``pool``, by tenant."""
        return self.tenant_mirror.get(pool, {}) if self.active else {}

    def _mirrored(self, pool: str, a: Sequence[Any], l_: Sequence[Any]) -> None:
        live, tenants = _split(_pairs(l_))
        self.mirror[pool] = (_pairs(a), live)
        self.tenant_mirror[pool] = tenants

    @property
    def fallback_factor(self) -> int:
        """While Redis does not answer: how many times this replica counts its own ledger,
        1 + the other replicas alive when it last answered (balanced traffic: each holds
        about what this one does); 1 while it answers, or never did."""
        return 1 if self.active else 1 + self.peers

    def has_others(self, pool: str) -> bool:
        got = self.mirror.get(pool) if self.active else None
        return got is not None and (any(got[0].values()) or any(got[1].values()))

    # --- calls ------------------------------------------------------------------------------

    async def start(self) -> None:
        """First heartbeat (unreachable: start local and say so), then one every second."""
        ok = await self._beat()
        if not ok:
            log.warning("ledger %s unreachable at start: judging with the local ledger", self.url)
            self._said_down = True
        self._task = asyncio.create_task(self._loop(), name="ledger-heartbeat")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        for t in list(self._pending):
            t.cancel()
        with contextlib.suppress(Exception):  # leaving: the others stop counting us now
            await asyncio.wait_for(self.client.zrem(REPLICAS_KEY, self.replica), 0.2)
        await self.client.aclose()

    async def reserve(self, r: Reserve) -> bool:
        """Reserve ``r`` (atomic check and write); False: a conflict (the mirror is now
        fresh; judge again) — a Redis fault answers True (the local ledger holds it)."""
        if not self.active:
            return True
        slack = -1 if r.slack is None else max(0, r.slack)
        argv: list[Any] = [self.replica, r.view_age_ms, KEEP_MS, r.endpoint, r.blocks]
        argv += [next(self._seq), r.total, slack]
        if r.slack is not None:
            a, l_ = self.mirror.get(r.pool, ({}, {}))
            for e in r.checked:
                argv += [e, a.get("", 0) + a.get(e, 0), l_.get("", 0) + l_.get(e, 0)]
        keys = [seen_key(r.pool), live_key(r.pool)]
        got = await self._call("reserve", self._reserve(keys=keys, args=argv))
        if got is None:
            if self.active and r.slack is not None:  # slow: the request goes on, so make
                r.slack = None  # sure the others count it (its check may have refused it)
                self._spawn(self._forced(r))
            return True
        ok, a, l_, self.peers = got
        self._mirrored(r.pool, a, l_)
        if not ok:
            telemetry.LEDGER_CONFLICTS.labels(pool=r.pool).inc()
        return bool(ok)

    async def _forced(self, r: Reserve) -> None:
        """``r`` reserved without the check, in the background, with the heartbeat's
        deadline (no request waits on it)."""
        argv: list[Any] = [self.replica, r.view_age_ms, KEEP_MS, r.endpoint, r.blocks]
        argv += [next(self._seq), r.total, -1]
        keys = [seen_key(r.pool), live_key(r.pool)]
        await self._call("reserve", self._reserve(keys=keys, args=argv), BACKGROUND_DEADLINE_S)

    def reserve_later(self, r: Reserve) -> None:
        """``reserve`` without a check, in the background (paths that cannot wait)."""
        if self.active:
            self._spawn(self._forced(r))

    async def sync(self, pool: str, view_age_ms: int) -> None:
        """Read the other replicas' figures for ``pool`` into the mirror."""
        if not self.active:
            return
        keys = [seen_key(pool), live_key(pool)]
        got = await self._call(
            "sync", self._state(keys=keys, args=[self.replica, view_age_ms, KEEP_MS])
        )
        if got is not None:
            self._mirrored(pool, got[1], got[2])
            self.peers = int(got[3])

    def released(self, pool: str, endpoint: str, total: int) -> None:
        """This replica's live total at ``endpoint`` of ``pool`` is now ``total`` (a request
        ended), written in the background."""
        if not self.active:
            return
        field = f"{self.replica}|{endpoint}"
        key = live_key(pool)
        call = self.client.hset(key, field, total) if total > 0 else self.client.hdel(key, field)
        self._spawn(self._call("release", call, BACKGROUND_DEADLINE_S))

    # --- internals -------------------------------------------------------------------------

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _call(self, op: str, call: Awaitable[Any], deadline_s: float | None = None) -> Any:
        """``call`` within the deadline; None on a fault (then the ledger is local)."""
        try:
            async with asyncio.timeout(deadline_s or self.deadline_s):  # no task of its own
                got = await call
            self._slow = 0
            return got
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self._down(op, e)
            return None

    def _down(self, op: str, error: BaseException) -> None:
        telemetry.LEDGER_ERRORS.labels(op=op).inc()
        if isinstance(error, TimeoutError) and op != "heartbeat":
            self._slow += 1  # a slow call is a blip; several in a row, a Redis in trouble
            if self._slow < SLOW_CALLS_DOWN:
                return
        if self.active:
            self.active = False
            self.mirror.clear()
            self.tenant_mirror.clear()
            self._set_backend(False)
        if not self._said_down:
            self._said_down = True
            kind = "timed out" if isinstance(error, TimeoutError) else type(error).__name__
            log.warning("ledger %s: %s %s; judging with the local ledger", self.url, op, kind)

    def _set_backend(self, redis_up: bool) -> None:
        telemetry.LEDGER_BACKEND.labels(backend="redis").set(1 if redis_up else 0)
        telemetry.LEDGER_BACKEND.labels(backend="local").set(0 if redis_up else 1)

    async def _beat(self) -> bool:
        """Renew this replica's presence and rewrite its live totals; refresh the mirror of
        every pool with a view. True when Redis answered."""
        totals, tenants = self.own_totals(), self.own_tenants()
        pools = sorted(set(self.pools()) | set(totals) | set(tenants))
        keys = [REPLICAS_KEY, *(live_key(p) for p in pools)]
        argv: list[Any] = [int(self.ttl_s * 1000), self.replica]
        for p in pools:
            own = [(e, b) for e, b in totals.get(p, {}).items()]
            own += [(TENANT_FIELD + t, b) for t, b in tenants.get(p, {}).items()]
            argv.append(len(own))
            for e, b in own:
                argv += [e, b]
        try:  # the heartbeat may take longer than a request's deadline: it holds up nobody
            await asyncio.wait_for(self._heartbeat(keys=keys, args=argv), max(0.5, self.deadline_s))
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self._down("heartbeat", e)
            return False
        if not self.active:
            if not await self._warm():
                return False
            self.active = True
            self._set_backend(True)
            if self._said_down:
                log.warning("ledger %s reachable again: judging with the shared ledger", self.url)
            self._said_down = False
        for p in pools:
            age = self.view_age_ms(p)
            if age is not None:
                await self.sync(p, age)
        return self.active

    async def _warm(self) -> bool:
        """Before judging with Redis: load the scripts (a restarted Redis has none: the first
        call would take two round trips) and open ``WARM_CONNECTIONS`` connections (a burst's
        concurrent calls would otherwise each connect first, past the deadline)."""
        try:
            for script in (self._reserve, self._state):
                script.sha = await asyncio.wait_for(self.client.script_load(script.script), 0.5)
            pings = [self.client.ping() for _ in range(WARM_CONNECTIONS)]
            await asyncio.wait_for(asyncio.gather(*pings), 1.0)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self._down("heartbeat", e)
            return False
        return True

    async def _loop(self) -> None:
        while True:
            started = time.monotonic()
            await self._beat()
            await asyncio.sleep(max(0.05, HEARTBEAT_S - (time.monotonic() - started)))
