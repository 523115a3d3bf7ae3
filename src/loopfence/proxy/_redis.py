"""Run state on Redis: many `loopfence proxy` replicas, one fence (`--state redis://HOST:PORT/N`).

The rules are the embedded store's own (`Runs`: `_exchange`, `settle`, the stops); only where a run's
state lives changes. A run's state is its log: the lines in the Redis list `lf:log:<id>` are the
truth, and a replica rebuilds the run from them as a restart does (`_restore.fold`: the ring's steps
run again over the recorded traffic). Beside the list, the hash `lf:run:<id>` holds what the log does
not: who opened it, its version (the list's length), the latest request's digest and its answer, the
stop's answer, the conversation digests (`meta`), and the summary `GET /loopfence/runs` shows. The
keys `lf:name:<key>/<name>`, `lf:conv:<key>/<digest>` and `lf:latest:<key>/<digest>` (`<key>`: the client
key's digest, empty without keys) route a request to its run, and the sorted set `lf:owned:<key>` lists
a key's runs, oldest first (`GET /loopfence/runs` reads a page of it, never another key's runs) (the name first; else a retry of an open run's latest request; else the longest view of the
request that a run's latest request had, `_view.digests`).

One request is two round trips, each one Lua script (atomic: Redis runs one at a time):

    claim   route the request (name, conversation, or the same first request), and then either give
            the answer it already has (a retry: a copy that found its twin in flight and waited, or one
            within RETRY_S of an answer no client has marked `delivered`; a stopped run's stop), say
            "wait" (another replica is at work on the run), or take the run's lease (`lf:lock:<id>`,
            expiring) and return its version, and its log unless this replica holds that version already
    commit  while the lease is still ours and the version unchanged: append the request's log lines,
            store its answer, move the routes, refresh every key's expiry, let the lease go

So two replicas cannot both pass a budget with room for one: the second waits for the lease, then
folds the first one's lines and meets the stop. A replica killed mid-request commits nothing: its
lease expires (`lease` seconds, renewed while the request is at work), and the client's retry, on any
replica, is that request again, counted once. A replica that cannot reach Redis, or whose commit
comes back refused, answers 503 and gives no answer: it never lets a run go on unaccounted.

Redis losing its data (restarted without persistence, flushed) is told from what the replicas know:
the epoch key `lf:epoch` changed or gone under a replica that joined it (at a claim, and every WATCH_S:
`look`), a replica starting on a store with no epoch while its log folder says it served a store
before (EPOCH_FILE) and logged runs within `expire_after` (`connect`). Each marks the store `lf:lost`
for one expiry period (a replica starting on an empty store with no such logs cannot tell new from
lost: it waits SETTLE_S before it serves, while the others look), and meanwhile a request that may
continue a run Redis no longer holds (a conversation under way, any run name: a replica cannot tell
a new name from a lost one) is answered 503, never started afresh with its budgets reset. A copy
waiting on its twin at work on another replica (claim said "wait", naming the twin's lease) takes the
answer commit kept under that lease, wherever the run went since, and waits no longer than WAIT_S.
Run Redis with `appendonly yes` and `appendfsync always` so that a restart loses nothing.

The log file `<logs>/<id>.jsonl` is written from the list: after each commit the replica brings the
file up to the version it committed (under `flock`, fetching lines it did not write), so on a shared
volume there is one log per run, complete and in order, whichever replica served each request (and a
replica starting brings every file up to the store: `heal`). Keys
expire after `expire_after` seconds idle; the files stay.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

from .._log._reader import parse_log
from .._log._writer import RunLog, line
from ._answer import Answer
from ._restore import fold
from ._runs import RETRY_S, RUN_ID, Runs, Settings, WireRun, id_base, keyed, no_cursor, numbered
from ._upstream import Relay, Upstream
from ._wire import BadRequest, Incoming

__all__ = ["PREFIX", "RedisRuns", "StoreDown"]

PREFIX = "lf:"
CACHED = 4096  # runs a replica keeps folded (the versions it committed last)
POOL = 64  # connections to Redis per replica; a request holds one only for the length of one script
WAIT_S = 50.0  # how long a copy of a request waits on its twin at work on another replica before a 503
WATCH_S = 2.0  # how often a replica looks at the store's epoch (a store made anew since it joined has lost data)
EPOCH_FILE = ".redis-epoch"  # in the log folder: the store epoch its replicas joined last (it served a store)
SETTLE_S = 2.5 * WATCH_S  # a replica that finds the store empty, having logged nothing lately, waits this long
#                           before it serves: a replica that joined the store before looks meanwhile (`look`)

_CLAIM = """
local P, A = KEYS[1], ARGV
local T = redis.call('TIME')
local NOW = tonumber(T[1]) * 1000 + math.floor(tonumber(T[2]) / 1000)
local epoch = redis.call('GET', P .. 'epoch')
if not epoch then
  redis.call('SET', P .. 'epoch', A[13])
  redis.call('SET', P .. 'lost', '1', 'PX', A[12])
  return {'lost', A[13]}
end
if epoch ~= A[1] then return {'epoch', epoch} end
if A[17] ~= '' then  -- a copy told to wait for its twin (the lease A[17]): its answer, wherever the run went since
  local done = redis.call('GET', P .. 'answer:' .. A[17])
  if done then return {'answer', done} end
end
local rid
if A[2] ~= '' then rid = redis.call('GET', P .. 'name:' .. A[6] .. '/' .. A[2])
else
  local again = redis.call('GET', P .. 'latest:' .. A[6] .. '/' .. A[4])
  local g = again and redis.call('HMGET', P .. 'run:' .. again, 'finished', 'stopped', 'latest', 'at', 'delivered') or {}
  local old = A[17] == '' and g[3] == A[4] and g[4] and (g[5] == A[4] or NOW - tonumber(g[4]) >= tonumber(A[16]))
  if again and g[1] ~= '1' and not old then rid = again end
  if not rid then
    for d in string.gmatch(A[3], '%S+') do
      rid = redis.call('GET', P .. 'conv:' .. A[6] .. '/' .. d)
      if rid then break end
    end
  end
  if not rid and again and g[2] then rid = again end
end
if rid and redis.call('EXISTS', P .. 'run:' .. rid) == 0 then rid = false end
if rid and redis.call('HGET', P .. 'run:' .. rid, 'owner') ~= A[6] then rid = false end  -- never another key's
if rid then
  local f = redis.call('HMGET', P .. 'run:' .. rid, 'owner', 'latest', 'answer', 'finished', 'stopped', 'at',
                       'delivered')
  if f[2] == A[4] and f[3] and (A[17] ~= '' or (f[7] ~= A[4] and not (f[6] and NOW - tonumber(f[6]) >= tonumber(A[16])))) then
    return {'answer', f[3]}
  end
  local lock = redis.call('GET', P .. 'lock:' .. rid)
  if lock then
    if string.sub(lock, 34) == A[4] then  -- a copy of the request at work: it waits for that one's answer
      redis.call('SET', P .. 'waiting:' .. string.sub(lock, 1, 32), '1', 'PX', A[18])
      return {'wait', string.sub(lock, 1, 32)}
    end
    return {'busy'}
  end
  if f[4] == '1' then
    if f[5] then return {'answer', f[5]} end
    rid = false
  elseif f[2] and f[2] ~= A[4] and redis.call('GET', P .. 'latest:' .. A[6] .. '/' .. f[2]) == rid then
    redis.call('DEL', P .. 'latest:' .. A[6] .. '/' .. f[2])
  end
end
if not rid then
  if redis.call('EXISTS', P .. 'lost') == 1 and (A[3] ~= '' or A[11] == '1') then return {'unaccounted'} end
  rid = A[5]
  local n = tonumber(A[14])
  while redis.call('EXISTS', P .. 'run:' .. rid) == 1 do
    n = n + 1
    local suffix = '-' .. n
    rid = string.sub(A[15], 1, 128 - #suffix) .. suffix
  end
  redis.call('HSET', P .. 'run:' .. rid, 'owner', A[6], 'version', '0', 'named', A[2])
  redis.call('PEXPIRE', P .. 'run:' .. rid, A[12])
  local owned = P .. 'owned:' .. A[6]
  for _, old in ipairs(redis.call('ZRANGE', owned, 0, 2)) do  -- its oldest entries, gone since: pruned
    if redis.call('EXISTS', P .. 'run:' .. old) == 0 then redis.call('ZREM', owned, old) end
  end
  redis.call('ZADD', owned, NOW, rid)  -- the key's runs, oldest first: its listing
  redis.call('PEXPIRE', owned, A[12])
  if A[2] ~= '' then redis.call('SET', P .. 'name:' .. A[6] .. '/' .. A[2], rid, 'PX', A[12]) end
end
redis.call('SET', P .. 'lock:' .. rid, A[7] .. '|' .. A[4], 'PX', A[8])
redis.call('SET', P .. 'latest:' .. A[6] .. '/' .. A[4], rid, 'PX', A[12])
local run = P .. 'run:' .. rid
local v = redis.call('HGET', run, 'version')
local out = {'run', rid, v, redis.call('HGET', run, 'meta') or ''}
if A[9] ~= rid or A[10] ~= v then
  local lines = redis.call('LRANGE', P .. 'log:' .. rid, 0, -1)
  for i = 1, #lines do out[#out + 1] = lines[i] end
end
return out
"""

_COMMIT = """
local P, A = KEYS[1], ARGV
local T = redis.call('TIME')
local NOW = tonumber(T[1]) * 1000 + math.floor(tonumber(T[2]) / 1000)
local rid = A[1]
local run, lk, log = P .. 'run:' .. rid, P .. 'lock:' .. rid, P .. 'log:' .. rid
local lock = redis.call('GET', lk)
if (lock and lock ~= A[2]) or redis.call('HGET', run, 'version') ~= A[3] then return 0 end
local n = #A - 13
if n > 0 then redis.call('RPUSH', log, unpack(A, 14)) end
redis.call('HSET', run, 'version', tostring(tonumber(A[3]) + n), 'latest', A[5], 'answer', A[6], 'finished', A[7],
           'meta', A[9], 'desc', A[12], 'at', NOW)
if A[8] ~= '' then redis.call('HSET', run, 'stopped', A[8]) end
local named = redis.call('HMGET', run, 'named', 'owner')
local who = (named[2] or '') .. '/'
for d in string.gmatch(A[11], '%S+') do
  if redis.call('GET', P .. 'conv:' .. who .. d) == rid then redis.call('DEL', P .. 'conv:' .. who .. d) end
end
for d in string.gmatch(A[10], '%S+') do redis.call('SET', P .. 'conv:' .. who .. d, rid, 'PX', A[4]) end
if named[1] and named[1] ~= '' then redis.call('PEXPIRE', P .. 'name:' .. who .. named[1], A[4]) end
redis.call('PEXPIRE', P .. 'latest:' .. who .. A[5], A[4])
local waiting = P .. 'waiting:' .. string.sub(A[2], 1, 32)
if redis.call('EXISTS', waiting) == 1 then  -- copies wait on this lease: its answer kept for them
  redis.call('SET', P .. 'answer:' .. string.sub(A[2], 1, 32), A[6], 'PX', A[13])
  redis.call('DEL', waiting)
end
redis.call('PEXPIRE', run, A[4])
redis.call('PEXPIRE', log, A[4])
redis.call('PEXPIRE', P .. 'owned:' .. (named[2] or ''), A[4])
redis.call('DEL', lk)
return 1
"""

_DELIVERED = """
if redis.call('HGET', KEYS[1], 'latest') == ARGV[1] then return redis.call('HSET', KEYS[1], 'delivered', ARGV[1]) end
return 0
"""

_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""

_FREE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class StoreDown(BadRequest):
    """The run state store cannot account for this request: HTTP 503, nothing forwarded or answered."""

    def __init__(self, message: str) -> None:
        super().__init__(message, None, 503)

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": "service_unavailable", "param": None,
                          "code": "state_store_unavailable"}}


def _text(v: Any) -> str:
    return v.decode("utf-8") if isinstance(v, bytes) else str(v)


class RedisRuns(Runs):
    """`Runs` whose state lives on Redis at `url` (the module doc). `lease`: seconds a replica holds a
    run it is at work on before another may take it over (renewed while it works)."""

    def __init__(self, upstream: Upstream, settings: Settings, url: str, *, lease: float = 30.0,
                 client: Any = None) -> None:
        super().__init__(upstream, settings)
        try:
            import redis.asyncio as aioredis
            from redis.exceptions import RedisError
        except ImportError as exc:
            raise ValueError(f"--state {url}: the redis extra is missing ({exc.name}): "
                             "pip install 'loopfence[redis]'") from None
        self.url = url
        # A pool that waits for a free connection (redis-py's default pool refuses past 100: a replica
        # serving 1,000 requests at once would fail them closed). No health-check PINGs: a dead
        # connection fails its call, which answers 503, and redis-py's own retry reconnects.
        pool = aioredis.BlockingConnectionPool.from_url(url, max_connections=POOL, timeout=5.0, socket_timeout=5.0,
                                                        socket_connect_timeout=2.0)
        self.redis = client if client is not None else aioredis.Redis(connection_pool=pool)
        self._errors: tuple[type[BaseException], ...] = (RedisError, OSError)
        self.lease_ms = max(int(lease * 1000), 100)
        ttl = settings.expire_after
        self.ttl_ms = int(ttl * 1000) if ttl is not None else 10 * 365 * 86400 * 1000
        self.epoch = uuid.uuid4().hex
        self.joined = False  # whether this replica adopted the store's epoch (a different one since: data lost)
        self._watcher: asyncio.Future[None] | None = None
        self.cache: OrderedDict[str, tuple[str, WireRun]] = OrderedDict()  # run id -> (version, run)
        self.waiting: Callable[[], Awaitable[None]] | None = None  # called when told to wait on a twin (tests)
        self._claim = self.redis.register_script(_CLAIM)
        self._commit = self.redis.register_script(_COMMIT)
        self._renew = self.redis.register_script(_RENEW)
        self._release = self.redis.register_script(_RELEASE)
        self._free = self.redis.register_script(_FREE)
        self._delivered = self.redis.register_script(_DELIVERED)

    def describe_store(self) -> str:
        return f"redis {self.url.split('@')[-1]}"

    async def connect(self) -> str | None:
        """Join the store: adopt its epoch (or set ours), then bring the log files up to the store
        (`heal`). The problem, in words, if Redis is unreachable. Then watches the store's epoch (`watch`)."""
        if self._watcher is None:
            self._watcher = asyncio.ensure_future(self.watch())
        try:
            if await self.redis.set(PREFIX + "epoch", self.epoch, nx=True):  # a new store, or one that lost its data
                if self._served_lately():  # runs logged on a store before may be under way
                    await self._mark_lost()
                else:  # it cannot tell: the replicas that joined the store before can (they mark it meanwhile)
                    await asyncio.sleep(SETTLE_S)
            self._join(_text(await self.redis.get(PREFIX + "epoch") or self.epoch))
            await self.heal()
        except self._errors as exc:
            return f"{type(exc).__name__}: {exc}"
        return None

    def _served_lately(self) -> bool:
        """Whether the log folder served a store before (EPOCH_FILE) and holds a run logged within
        `expire_after` (one the store may still have held). A folder of the in-process store's runs
        does not count: their state never was the store's."""
        logs, ttl = self.settings.logs, self.settings.expire_after
        if logs is None or not (logs / EPOCH_FILE).exists():
            return False
        since = time.time() - (ttl if ttl is not None else float("inf"))
        return any(p.stat().st_mtime >= since for p in logs.glob("*.jsonl") if p.is_file())

    def _join(self, epoch: str) -> None:
        """The store's epoch adopted, and written in the log folder (EPOCH_FILE)."""
        self.epoch, self.joined = epoch, True
        if self.settings.logs is not None:
            with contextlib.suppress(OSError):
                (self.settings.logs / EPOCH_FILE).write_text(epoch + "\n")

    async def _mark_lost(self) -> None:
        """The store lost its data: for one expiry period, a request that may continue a run it held is
        refused rather than started afresh."""
        await self.redis.set(PREFIX + "lost", "1", px=self.ttl_ms)

    async def watch(self) -> None:
        """`look` every WATCH_S, until cancelled (`aclose`)."""
        while True:
            await asyncio.sleep(WATCH_S)
            with contextlib.suppress(*self._errors):
                await self.look()

    async def look(self) -> None:
        """A store whose epoch changed since this replica joined it, or is gone, lost its data (restarted
        empty, flushed: another replica may have made it anew without knowing): marked lost for one
        expiry period, and its epoch adopted."""
        if not self.joined:
            return
        now = await self.redis.get(PREFIX + "epoch")
        if now is None or _text(now) != self.epoch:
            await self.redis.set(PREFIX + "epoch", uuid.uuid4().hex, nx=True)
            await self._mark_lost()
            self._join(_text(await self.redis.get(PREFIX + "epoch") or self.epoch))
            self.cache.clear()

    async def heal(self) -> int:
        """Every log file of a run the store holds, brought up to the store's version (a replica killed
        between a commit and its file write leaves the file short), and every run in its key's listing
        index (a run older than the index). How many files were behind."""
        logs, behind = self.settings.logs, 0
        async for key in self.redis.scan_iter(match=PREFIX + "run:*", count=500):
            rid = _text(key)[len(PREFIX) + 4:]
            version, who = await self.redis.hmget(key, "version", "owner")
            if version is None or not RUN_ID.fullmatch(rid):
                continue
            await self.redis.zadd(f"{PREFIX}owned:{_text(who or b'')}", {rid: 0}, nx=True)
            path = None if logs is None else logs / f"{rid}.jsonl"
            have = path.read_bytes().count(b"\n") if path is not None and path.exists() else 0
            if path is not None and have < int(version):
                await self._mirror(rid, int(version), [])
                behind += 1
        return behind

    async def aclose(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
        await self.redis.aclose()
        await self.redis.connection_pool.disconnect()

    async def _call(self, script: Any, args: list[Any]) -> Any:
        try:
            return await script(keys=[PREFIX], args=args)
        except self._errors as exc:
            raise self._down(exc) from None

    def _down(self, exc: BaseException) -> StoreDown:
        return StoreDown(f"the run state store ({self.describe_store()}) cannot be reached or failed "
                         f"({type(exc).__name__}: {str(exc)[:200]}); the proxy fails closed: this request was not "
                         "answered, send it again once the store is back")

    # -- what the app reads -----------------------------------------------------------------------
    async def listing(self, owner: str | None, after: str | None = None,
                      limit: int = 100) -> tuple[list[dict[str, Any]], bool]:
        """A page of this key's runs from its index (`lf:owned:<key>`, oldest first): a read of the index
        and one of each run shown, whatever other keys hold. Runs expired since leave the index here."""
        index = f"{PREFIX}owned:{owner or ''}"
        out: list[dict[str, Any]] = []
        try:
            start = 0
            if after:
                rank = await self.redis.zrank(index, after)
                if rank is None:
                    raise no_cursor(after)
                start = rank + 1
            while True:
                ids = [_text(x) for x in await self.redis.zrange(index, start, start + limit)]  # one past: more?
                async with self.redis.pipeline(transaction=False) as pipe:
                    for rid in ids:
                        pipe.hmget(PREFIX + "run:" + rid, "owner", "desc")
                    found = await pipe.execute() if ids else []
                gone = [rid for rid, (who, _) in zip(ids, found) if who is None]  # expired (one at its first
                out += [json.loads(desc) for who, desc in found  # request has no summary yet: not shown, kept)
                        if desc is not None and who is not None and _text(who) == (owner or "")]
                if gone:
                    await self.redis.zrem(index, *gone)  # expired: the index forgets them too
                if len(out) > limit or len(ids) <= limit:
                    return out[:limit], len(out) > limit
                start += len(ids) - len(gone)
        except self._errors as exc:
            raise self._down(exc) from None

    async def one(self, rid: str, owner: str | None) -> dict[str, Any] | None:
        try:
            found = await self.redis.get(f"{PREFIX}name:{owner or ''}/{rid}")
            key = PREFIX + "run:" + (_text(found) if found is not None else rid)
            who, desc = await self.redis.hmget(key, "owner", "desc")
        except self._errors as exc:
            raise self._down(exc) from None
        if desc is None or _text(who) != (owner or ""):
            return None
        return json.loads(desc)

    async def delivered(self, rid: str, whole: str) -> None:
        """The run's latest answer reached its client (after the response: off the request's path).
        A store that cannot be reached leaves it undelivered: a copy within RETRY_S then shares it."""
        with contextlib.suppress(Exception):
            await self._delivered(keys=[PREFIX + "run:" + rid], args=[whole])

    async def reset(self, rid: str, owner: str | None) -> dict[str, Any] | None:
        """`Runs.reset` on the store: under the run's lease, its log folded, ended, committed; then
        its name is free."""
        name_key = f"{PREFIX}name:{owner or ''}/{rid}"
        try:
            found = await self.redis.get(name_key)
            rid = _text(found) if found is not None else rid
            who, named = await self.redis.hmget(PREFIX + "run:" + rid, "owner", "named")
            if who is None or _text(who) != (owner or ""):
                return None
            lock = f"{uuid.uuid4().hex}|reset"
            pause = 0.005
            while not await self.redis.set(PREFIX + "lock:" + rid, lock, nx=True, px=self.lease_ms):
                await asyncio.sleep(pause)  # a request of the run is at work: it goes first
                pause = min(pause * 2, 0.05)
            version, meta, latest, given = await self.redis.hmget(PREFIX + "run:" + rid, "version", "meta", "latest",
                                                                  "answer")
            lines = [bytes(x) for x in await self.redis.lrange(PREFIX + "log:" + rid, 0, -1)]
        except self._errors as exc:
            raise self._down(exc) from None
        if not lines:  # its first request never committed: nothing to end
            with contextlib.suppress(*self._errors):
                await self._let_go(rid, lock)
            return None
        try:
            self.cache.pop(rid, None)
            run = await self._held(rid, _text(version), json.loads(_text(meta or b"{}")), lines, None, "", owner, "",
                                   _text(named) or None)  # type: ignore[arg-type]  (lines: never a new run)
            self.end(run, "ended at POST /loopfence/runs/{id}/reset")
            new = [line(r).rstrip(b"\n") for r in run.fenced.log.events]
            run.fenced.log.events.clear()
            ok = await self._call(self._commit, [
                rid, lock, _text(version), self.ttl_ms, _text(latest or b""), _text(given or b""), "1",
                json.dumps(run.stopped.to_json()) if run.stopped is not None else "", _text(meta or b"{}"), "", "",
                json.dumps(run.describe()), int(WAIT_S * 2000), *new])
            if ok and named:  # the name freed only if it still routes to this run (one script: atomic)
                await self._free(keys=[f"{PREFIX}name:{owner or ''}/{_text(named)}"], args=[rid])
        except self._errors as exc:
            raise self._down(exc) from None
        finally:
            with contextlib.suppress(*self._errors):
                await self._let_go(rid, lock)
        if self.settings.logs is not None:
            await self._mirror(rid, int(_text(version)), new)
        return run.describe()

    # -- one request ------------------------------------------------------------------------------
    async def answer(self, incoming: Incoming, *, named: str | None = None, user_agent: str = "",
                     owner: str | None = None, relay: Relay | None = None,
                     on_run: Callable[[str], None] | None = None, session: str | None = None) -> tuple[Answer, bool]:
        if named is not None and not RUN_ID.fullmatch(named):
            raise BadRequest("the X-Loopfence-Run header must be 1-128 characters of A-Z a-z 0-9 . _ - "
                             "(starting with a letter or digit)", "X-Loopfence-Run")
        session = None if named is not None else session
        if session is not None and incoming.scope != session:
            incoming = incoming.scoped(session)  # its conversations' routes are the session's own
        conv = " ".join(incoming.extends[:64]) if named is None else ""
        token = uuid.uuid4().hex
        cand, n = self._candidate(named or session, owner)
        base = id_base(named or session or "", owner)
        named_run = "1" if named is not None else ""  # (the store lost its data: no name can be told new)
        model = self.upstream.model_name(incoming.model, incoming.wire)
        pause, since = 0.005, 0.0  # since: when it was first told to wait on its twin
        waited = ""  # the lease of this same request in flight, once told to wait on it: its answer is ours
        while True:
            got = await self._call(self._claim, [
                self.epoch, named or "", conv, incoming.whole, cand, owner or "", token, self.lease_ms,
                *self._have(named, owner, incoming), named_run, self.ttl_ms, uuid.uuid4().hex, n, base,
                int(RETRY_S * 1000), waited, int(WAIT_S * 2000)])
            kind = _text(got[0])
            if kind == "answer":
                return Answer.from_json(json.loads(got[1])), False
            if kind == "run":
                break
            if kind in ("lost", "epoch"):
                self.cache.clear()
                if kind == "epoch" and self.joined:  # another replica made the store anew: it lost what we saw
                    try:
                        await self._mark_lost()
                    except self._errors as exc:
                        raise self._down(exc) from None
                    kind = "lost"
                self._join(_text(got[1]))
                if kind == "lost":
                    raise StoreDown(f"the run state store ({self.describe_store()}) lost its data (restarted "
                                    "empty, or flushed): runs under way cannot be accounted for; this request was "
                                    "not answered")
                continue
            if kind == "unaccounted":
                raise StoreDown(f"the run state store ({self.describe_store()}) lost its data, and this request "
                                f"{'names a run' if named else 'continues a conversation'} it no longer holds (or "
                                "never held: a replica cannot tell): the proxy will not start it afresh with its "
                                "budgets reset. It is served again once the store's mark `lf:lost` expires (one "
                                "--expire-after period) or is deleted")
            if kind == "wait":  # (busy: another request of the run at work, which a lease bounds, as in one process)
                waited, since = _text(got[1]), since or time.monotonic()
            if since and time.monotonic() - since > WAIT_S:
                raise StoreDown(f"another replica has been at work on this same request for {WAIT_S:g}s, and this "
                                "copy of it waited for its answer that long; it was not forwarded: send it again")
            if kind == "wait" and self.waiting is not None:
                await self.waiting()
            await asyncio.sleep(pause)  # busy or wait: another replica is at work on the run
            pause = min(pause * 2, 0.05)
        rid, version, meta = _text(got[1]), _text(got[2]), json.loads(got[3] or "{}")
        lines = [bytes(x) if isinstance(x, (bytes, bytearray)) else _text(x).encode() for x in got[4:]]
        lock = f"{token}|{incoming.whole}"
        try:
            run = await self._held(rid, version, meta, lines, incoming, user_agent, owner, model, named, session)
        except Exception:
            await self._let_go(rid, lock)
            raise
        if on_run is not None:
            on_run(rid)
        return await self._work(run, version, lock, incoming, relay), True

    def _candidate(self, named: str | None, owner: str | None) -> tuple[str, int]:
        """The id a new run would get: the name under its key's tag (or that, numbered, past the logs on
        file: `numbered`), else a fresh one."""
        if named is None:
            return uuid.uuid4().hex, 1
        base, n = id_base(named, owner), 1
        rid = numbered(base, n)
        while self.settings.logs is not None and (self.settings.logs / f"{rid}.jsonl").exists():
            n += 1
            rid = numbered(base, n)
        return rid, n

    def _have(self, named: str | None, owner: str | None, incoming: Incoming) -> tuple[str, str]:
        """The run this replica guesses the request is for, and the version it holds of it ("" none):
        claim returns the log only if that is not the run's version now."""
        if named is not None:
            guess = self.runs.get(self.names.get((owner, named), ""))
        else:
            guess = self._route(incoming, None, owner)
        if guess is None or guess.id not in self.cache:
            return "", ""
        return guess.id, self.cache[guess.id][0]

    async def _held(self, rid: str, version: str, meta: dict[str, Any], lines: list[bytes], incoming: Incoming,
                    user_agent: str, owner: str | None, model: str, named: str | None,
                    session: str | None = None) -> WireRun:
        """The run as the store has it at `version`: this replica's own copy, else folded from its log."""
        mine = self.cache.get(rid)
        if mine is not None and mine[0] == version and not lines:
            self.cache.move_to_end(rid)
            return mine[1]
        self.cache.pop(rid, None)
        if not lines:  # a new run (or one whose first request never committed)
            run = self.make(rid, incoming, user_agent, owner, RunLog(None), named, session=session)
        else:
            log = parse_log(f"{self.describe_store()} {PREFIX}log:{rid}", b"".join(x + b"\n" for x in lines))
            started = datetime.fromisoformat(log.header.started_at).timestamp()
            run, _ = await fold(log, rid, owner, meta.get("model") or model, None,
                                t0=time.monotonic() - max(0.0, time.time() - started))
            run.conv, run.before = meta.get("conv"), meta.get("before")
            run.held = set(meta.get("held") or [])
            if meta.get("stopped"):
                run.stopped = Answer.from_json(meta["stopped"])
        run.store["named"] = named if not lines else meta.get("named")
        run.named = run.store["named"]
        if self.settings.logs is not None:
            run.log = str(self.settings.logs / f"{rid}.jsonl")
        return run

    async def _work(self, run: WireRun, version: str, lock: str, incoming: Incoming, relay: Relay | None) -> Answer:
        """The exchange under the run's lease (renewed while it works), then the commit."""
        run.asked = incoming.model
        renew = asyncio.ensure_future(self._keep(run.id, lock))
        try:
            made = await self._exchange(run, incoming, relay)
        except BaseException:
            self.cache.pop(run.id, None)  # its copy went past the store's: fold it again next time
            renew.cancel()
            with contextlib.suppress(*self._errors):
                await self._let_go(run.id, lock)
            raise
        finally:
            renew.cancel()
        log = run.fenced.log
        records = list(log.events)
        log.events.clear()
        new = [line(r).rstrip(b"\n") for r in records]
        before = run.before
        self.remember_local(run, incoming, made)
        f = run.fenced
        meta = {"model": run.model, "named": run.store.get("named"), "conv": run.conv, "before": run.before, "held": sorted(run.held),
                "stopped": None if run.stopped is None else run.stopped.to_json()}
        try:
            ok = await self._call(self._commit, [
                run.id, lock, version, self.ttl_ms, incoming.whole, json.dumps(made.to_json()),
                "1" if f.finished else "0", json.dumps(run.stopped.to_json()) if run.stopped is not None else "",
                json.dumps(meta), run.conv or "", before or "", json.dumps(run.describe()), int(WAIT_S * 2000), *new])
        except StoreDown:
            self.cache.pop(run.id, None)
            raise
        if not ok:
            self.cache.pop(run.id, None)
            raise StoreDown(f"run {run.id}: this replica's lease on the run ran out while the request was at work "
                            "and the run moved on without it; nothing of this request was kept: send it again")
        done = str(int(version) + len(new))
        self.cache[run.id] = (done, run)
        self.cache.move_to_end(run.id)
        while len(self.cache) > CACHED:
            old, _ = self.cache.popitem(last=False)
            self._forget(old)
        if self.settings.logs is not None:
            await self._mirror(run.id, int(version), new)
        return made

    def remember_local(self, run: WireRun, incoming: Incoming, made: Answer) -> None:
        """The routes this replica keeps to guess a request's run and hold its log ready (the store's
        routes are the truth)."""
        self.remember(run, incoming.conv)
        self.runs[run.id] = run
        previous = run.store.get("whole")
        if previous is not None and self.by_latest.get(keyed(run.owner, previous)) is run:
            del self.by_latest[keyed(run.owner, previous)]
        run.store["whole"] = incoming.whole
        self.by_latest[keyed(run.owner, incoming.whole)] = run
        if run.store.get("named"):
            run.named = run.store["named"]
            self.names[(run.owner, run.store["named"])] = run.id

    def _forget(self, rid: str) -> None:
        run = self.runs.pop(rid, None)
        for index in (self.by_conv, self.by_latest):
            for k in [k for k, r in index.items() if r is run]:
                del index[k]

    async def _keep(self, rid: str, lock: str) -> None:
        while True:
            await asyncio.sleep(self.lease_ms / 3000)
            with contextlib.suppress(*self._errors):
                await self._renew(keys=[PREFIX + "lock:" + rid], args=[lock, self.lease_ms])

    async def _let_go(self, rid: str, lock: str) -> None:
        await self._release(keys=[PREFIX + "lock:" + rid], args=[lock])

    async def _mirror(self, rid: str, version: int, new: list[bytes]) -> None:
        """Bring `<logs>/<rid>.jsonl` up to version + len(new) lines: under flock, the lines the file
        lacks (fetched from the store when they are not this request's own)."""
        assert self.settings.logs is not None
        path = self.settings.logs / f"{rid}.jsonl"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o666)  # as RunLog makes one: the umask decides
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            data = _read_all(fd)
            whole = data.rfind(b"\n") + 1
            if whole < len(data):  # a writer killed mid-line: the torn line goes
                os.ftruncate(fd, whole)
            have = data[:whole].count(b"\n")
            if have < version:
                with contextlib.suppress(*self._errors):
                    got = await self.redis.lrange(PREFIX + "log:" + rid, have, version - 1)
                    if len(got) == version - have:
                        os.write(fd, b"".join(bytes(x) + b"\n" for x in got))
                        have = version
            if version <= have < version + len(new):
                os.write(fd, b"".join(x + b"\n" for x in new[have - version:]))
        finally:
            os.close(fd)


def _read_all(fd: int) -> bytes:
    os.lseek(fd, 0, os.SEEK_SET)
    parts = []
    while chunk := os.read(fd, 1 << 20):
        parts.append(chunk)
    return b"".join(parts)

