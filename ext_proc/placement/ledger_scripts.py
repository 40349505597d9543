"""The shared ledger's Lua scripts (``ext_proc.placement.ledger_redis``), each run atomically
by Redis: the others' figures (``STATE_SCRIPT``), the checked reservation
(``RESERVE_SCRIPT``) and the heartbeat (``HEARTBEAT_SCRIPT``).

Invariants: Redis's ``TIME`` is the only clock (a replica sends durations); a script writes
only the calling replica's own members and fields, except that it deletes the live totals of
replicas no longer in ``ice:replicas``; every answer but the heartbeat's is
``{ok, A pairs, L pairs, peers}`` (the other replicas' figures for the pool and how many
other replicas are alive).
"""

from __future__ import annotations

__all__ = ["HEARTBEAT_SCRIPT", "RESERVE_SCRIPT", "STATE_SCRIPT"]

# Shared by every script: the other replicas' figures for one pool (A since the view, L).
_STATE = """
local seen, live = KEYS[1], KEYS[2]
local me, age, keep = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', seen, '-inf', now - keep)
local A, L = {}, {}
for _, m in ipairs(redis.call('ZRANGEBYSCORE', seen, '(' .. (now - age), '+inf')) do
  local r, e, b = string.match(m, '^([^|]*)|[^|]*|(.*)|(%d+)$')
  if r and r ~= me then A[e] = (A[e] or 0) + tonumber(b) end
end
redis.call('ZREMRANGEBYSCORE', 'ice:replicas', '-inf', now)
local peers = redis.call('ZCARD', 'ice:replicas')
if redis.call('ZSCORE', 'ice:replicas', me) then peers = peers - 1 end
local h, alive = redis.call('HGETALL', live), {}
for i = 1, #h, 2 do
  local r, e = string.match(h[i], '^([^|]*)|(.*)$')
  if r and r ~= me then
    local ok = alive[r]
    if ok == nil then
      ok = redis.call('ZSCORE', 'ice:replicas', r) ~= false
      alive[r] = ok
    end
    if ok then L[e] = (L[e] or 0) + tonumber(h[i + 1]) else redis.call('HDEL', live, h[i]) end
  end
end
local function flat(m)
  local out = {}
  for k, v in pairs(m) do out[#out + 1] = k; out[#out + 1] = v end
  return out
end
"""

STATE_SCRIPT = _STATE + "return {1, flat(A), flat(L), peers}\n"

# ARGV[4..]: endpoint, blocks, seq, live total after, slack (-1: no check), then per checked
# endpoint: name, A and L it was judged with (the mirror's "" plus its own).
RESERVE_SCRIPT = (
    _STATE
    + """
local endpoint, blocks, seq = ARGV[4], tonumber(ARGV[5]), ARGV[6]
local total, slack = tonumber(ARGV[7]), tonumber(ARGV[8])
if slack >= 0 then
  for i = 9, #ARGV, 3 do
    local e = ARGV[i]
    local a = (A[''] or 0) + (A[e] or 0) - tonumber(ARGV[i + 1])
    local l = (L[''] or 0) + (L[e] or 0) - tonumber(ARGV[i + 2])
    if math.max(a, l) > slack then return {0, flat(A), flat(L), peers} end
  end
end
if blocks > 0 then
  redis.call('ZADD', seen, now, me .. '|' .. seq .. '|' .. endpoint .. '|' .. blocks)
end
if total > 0 then
  redis.call('HSET', live, me .. '|' .. endpoint, total)
else
  redis.call('HDEL', live, me .. '|' .. endpoint)
end
return {1, flat(A), flat(L), peers}
"""
)

# KEYS: the replicas set, then one live hash per pool; ARGV: ttl ms, me, then per pool the
# number of its totals and (endpoint, total) pairs: the replica's own totals, rewritten whole.
HEARTBEAT_SCRIPT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[1]), ARGV[2])
local me, i = ARGV[2], 3
for k = 2, #KEYS do
  local n = tonumber(ARGV[i]); i = i + 1
  local keep = {}
  for _ = 1, n do
    keep[me .. '|' .. ARGV[i]] = ARGV[i + 1]; i = i + 2
  end
  local h = redis.call('HGETALL', KEYS[k])
  for j = 1, #h, 2 do
    if string.sub(h[j], 1, #me + 1) == me .. '|' and keep[h[j]] == nil then
      redis.call('HDEL', KEYS[k], h[j])
    end
  end
  for f, v in pairs(keep) do
    if tonumber(v) > 0 then redis.call('HSET', KEYS[k], f, v)
    else redis.call('HDEL', KEYS[k], f) end
  end
end
return 1
"""
