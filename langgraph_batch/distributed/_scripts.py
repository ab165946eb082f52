"""The Lua scripts that make Redis the engine of the distributed mode.

Leases, fencing and idempotent completion are Redis primitives run
atomically, server side:

- a job's lease is its entry in the consumer group's pending list (PEL):
  the owner is the consumer it is pending under, and its idle time is the
  time since the owner last proved it is alive;
- `heartbeat` resets the idle time of the entries a worker still owns
  (`XCLAIM ... JUSTID` to itself, which leaves the delivery count alone)
  and reports the ones it lost, so the worker cancels them;
- `claim` takes over entries idle for longer than the lease (`XAUTOCLAIM`:
  their worker is dead or paused), skips finished ones and dead-letters
  those delivered more than `max_deliveries` times;
- `start` and `complete` first check that the caller still owns the entry
  (fencing: a worker that was paused or partitioned past its lease cannot
  write), then `HSETNX` makes the first result win and `XACK` ends the job;
- `publish` adds jobs without duplicates (a parent re-submitting after a
  crash or a Redis data loss).

Every script that creates a key gives it a TTL. Scripts are registered with
redis-py's `register_script`, which reloads them after a Redis restart
(`NOSCRIPT`).
"""

from __future__ import annotations

from typing import Any

__all__ = ("Scripts",)

# Is `me` the consumer the entry `id` is pending under? (false when the
# stream or the group is gone: the run was finished, cancelled or lost).
_OWNER = """
local function owner(jobs, group, id, me)
  if redis.call('EXISTS', jobs) == 0 then return false end
  local p = redis.pcall('XPENDING', jobs, group, id, id, 1)
  if type(p) ~= 'table' or p.err or #p == 0 or p[1][2] ~= me then return false end
  return p[1]
end
local function keep(key, ttl)
  if redis.call('PTTL', key) < 0 then redis.call('PEXPIRE', key, ttl) end
end
"""

# KEYS: meta jobs results events dead flights queued
# ARGV: group ttl_ms job1 input1 job2 input2 ...
PUBLISH = """
local g = redis.pcall('XGROUP', 'CREATE', KEYS[2], ARGV[1], '0', 'MKSTREAM')
local added = 0
for i = 3, #ARGV, 2 do
  local job = ARGV[i]
  if redis.call('SADD', KEYS[7], job) == 1
     and redis.call('HEXISTS', KEYS[3], job) == 0 and redis.call('HEXISTS', KEYS[5], job) == 0 then
    redis.call('XADD', KEYS[2], '*', 'job', job, 'input', ARGV[i + 1])
    added = added + 1
  end
end
for i = 1, #KEYS do redis.call('PEXPIRE', KEYS[i], ARGV[2]) end
return added
"""

# KEYS: jobs results events   ARGV: group me entry_id job ttl_ms
# -> delivery count (started), 0 (already finished: acked), -1 (not the owner)
START = (
    _OWNER
    + """
local p = owner(KEYS[1], ARGV[1], ARGV[3], ARGV[2])
if not p then return -1 end
if redis.call('HEXISTS', KEYS[2], ARGV[4]) == 1 then
  redis.call('XACK', KEYS[1], ARGV[1], ARGV[3])
  return 0
end
redis.call('XADD', KEYS[3], '*', 'kind', 'started', 'job', ARGV[4])
keep(KEYS[3], ARGV[5])
return p[4]
"""
)

# KEYS: jobs   ARGV: group me id1 id2 ...  -> the ids no longer owned
HEARTBEAT = (
    _OWNER
    + """
local lost = {}
for i = 3, #ARGV do
  if owner(KEYS[1], ARGV[1], ARGV[i], ARGV[2]) then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'JUSTID')
  else
    lost[#lost + 1] = ARGV[i]
  end
end
return lost
"""
)

# KEYS: jobs results events   ARGV: group me entry_id job payload ttl_ms
# -> 1 accepted, 0 duplicate (a result was already there), -1 fenced off
COMPLETE = (
    _OWNER
    + """
if not owner(KEYS[1], ARGV[1], ARGV[3], ARGV[2]) then return -1 end
local new = redis.call('HSETNX', KEYS[2], ARGV[4], ARGV[5])
if new == 1 then
  redis.call('XADD', KEYS[3], '*', 'kind', 'done', 'job', ARGV[4])
  keep(KEYS[2], ARGV[6])
  keep(KEYS[3], ARGV[6])
end
redis.call('XACK', KEYS[1], ARGV[1], ARGV[3])
return new
"""
)

# KEYS: jobs results events dead   ARGV: group me min_idle_ms max_deliveries ttl_ms
# -> {entry_id, job, input, deliveries} or nil
CLAIM = (
    _OWNER
    + """
for _ = 1, 16 do
  local r = redis.pcall('XAUTOCLAIM', KEYS[1], ARGV[1], ARGV[2], ARGV[3], '0-0', 'COUNT', 1)
  if type(r) ~= 'table' or r.err or #r[2] == 0 then return nil end
  local id, fields = r[2][1][1], r[2][1][2]
  local job, input = nil, ''
  for i = 1, #fields, 2 do
    if fields[i] == 'job' then job = fields[i + 1]
    elseif fields[i] == 'input' then input = fields[i + 1] end
  end
  local count = redis.call('XPENDING', KEYS[1], ARGV[1], id, id, 1)[1][4]
  if job == nil
     or redis.call('HEXISTS', KEYS[2], job) == 1 or redis.call('HEXISTS', KEYS[4], job) == 1 then
    redis.call('XACK', KEYS[1], ARGV[1], id)
  elseif count > tonumber(ARGV[4]) then
    redis.call('HSETNX', KEYS[4], job, count - 1)
    redis.call('XADD', KEYS[3], '*', 'kind', 'dead', 'job', job)
    keep(KEYS[4], ARGV[5])
    keep(KEYS[3], ARGV[5])
    redis.call('XACK', KEYS[1], ARGV[1], id)
  else
    return {id, job, input, count}
  end
end
return nil
"""
)

_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# KEYS: sem   ARGV: limit lease_ms holder1 holder2 ...  -> 1 acquired, 0 full
# Redis's own clock decides expiry, so workers' clocks never need to agree.
SEM_ACQUIRE = (
    _NOW
    + """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local want, held = #ARGV - 2, 0
for i = 3, #ARGV do
  if redis.call('ZSCORE', KEYS[1], ARGV[i]) then held = held + 1 end
end
if held < want then
  if redis.call('ZCARD', KEYS[1]) - held + want > tonumber(ARGV[1]) then return 0 end
  for i = 3, #ARGV do redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[i]) end
end
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]) * 2)
return 1
"""
)

# KEYS: sem   ARGV: lease_ms holder1 ...  -> how many were still held (and renewed)
SEM_RENEW = (
    _NOW
    + """
local renewed = 0
for i = 2, #ARGV do
  if redis.call('ZSCORE', KEYS[1], ARGV[i]) then
    redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[1]), ARGV[i])
    renewed = renewed + 1
  end
end
if renewed > 0 then redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[1]) * 2) end
return renewed
"""
)

# KEYS: sem   ARGV: holder1 ...
SEM_RELEASE = """
return redis.call('ZREM', KEYS[1], unpack(ARGV))
"""

# KEYS: lock res flights meta   ARGV: token lease_ms ttl_ms
# -> {'done', payload} | {'leader'} | {'wait'} | {'norun'}
SF_ACQUIRE = """
local r = redis.call('XRANGE', KEYS[2], '-', '+', 'COUNT', 1)
if #r > 0 then return {'done', r[1][2][2]} end
if redis.call('EXISTS', KEYS[4]) == 0 then return {'norun'} end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  redis.call('SADD', KEYS[3], KEYS[1], KEYS[2])
  if redis.call('PTTL', KEYS[3]) < 0 then redis.call('PEXPIRE', KEYS[3], ARGV[3]) end
  return {'leader'}
end
if redis.call('GET', KEYS[1]) == ARGV[1] then return {'leader'} end
return {'wait'}
"""

# KEYS: lock   ARGV: token lease_ms  -> 1 still the leader, 0 lost
SF_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""

# KEYS: lock res meta   ARGV: token payload ttl_ms  (empty payload: release only)
SF_FINISH = """
if ARGV[2] ~= '' and redis.call('EXISTS', KEYS[3]) == 1 and redis.call('XLEN', KEYS[2]) == 0 then
  redis.call('XADD', KEYS[2], '*', 'v', ARGV[2])
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
end
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 1
"""


class Scripts:
    """The scripts, registered on one client (`script(keys=[...], args=[...])`)."""

    def __init__(self, client: Any) -> None:
        self.publish = client.register_script(PUBLISH)
        self.start = client.register_script(START)
        self.heartbeat = client.register_script(HEARTBEAT)
        self.complete = client.register_script(COMPLETE)
        self.claim = client.register_script(CLAIM)
        self.sem_acquire = client.register_script(SEM_ACQUIRE)
        self.sem_renew = client.register_script(SEM_RENEW)
        self.sem_release = client.register_script(SEM_RELEASE)
        self.sf_acquire = client.register_script(SF_ACQUIRE)
        self.sf_renew = client.register_script(SF_RENEW)
        self.sf_finish = client.register_script(SF_FINISH)
