"""STEP's first part: the shared admission state kept up to date before the round.

Keys and arguments, lease open/release, expiry of crashed replicas' leases and
backlog, settlements, batched output charges, forgotten tenants, the backlog
and its lifts (rules.lifted), lease renewal and weights. The round that decides
follows in lua_step_round.py; redis_scripts.py joins them after the prelude.
"""

from __future__ import annotations

STEP_UPKEEP = r"""
-- Keys (all under P = 'fg:{domain}'): :vtc counters, :floor, :bl backlog
-- (member replica \0 tenant -> expiry ms), :ls lease expiries, :lt lease -> tenant,
-- :lk lease -> kv tokens, :in in-flight (n, kv, c:<tenant>, kv:<tenant>), :done
-- settled ids, :epoch, :w tenant -> weight, :b:<tenant> buckets.
local VTC, FLOOR, BL = P .. ':vtc', P .. ':floor', P .. ':bl'
local LS, LT, LK, IN, DONE = P .. ':ls', P .. ':lt', P .. ':lk', P .. ':in', P .. ':done'
local W, LA, ADM, RC, BLQ = P .. ':w', P .. ':la', P .. ':adm', P .. ':rc', P .. ':blq'
local replica = ARGV[2]
local lease_ttl, bl_ttl, done_ttl = num(ARGV[3]), num(ARGV[4]), num(ARGV[5])
local max_req, max_kv, w_in = num(ARGV[6]), num(ARGV[7]), num(ARGV[8])
local reserve_fraction, reserve_window = num(ARGV[9]), num(ARGV[10]) * 1000
local light_credit = num(ARGV[11])
local preempt = ARGV[12] == '1'  -- rules.Isolation.PREEMPT
local lend_slots = ARGV[12] == '2'  -- rules.Isolation.RESERVE_SLOTS
local allowance = num(ARGV[13])  -- rules.behind, rules.locality_pick; < 0: off
local w_cached = num(ARGV[14])
local unsent = num(ARGV[15])  -- rules.fits_slot_lent: this replica's requests held unsent
local i = 16
-- still active for the reserve a while after its last request left (memory_store.py)
local function seen(tenant)
  if reserve_window > 0 then redis.call('ZADD', RC, now + reserve_window, tenant) end
end
local function nxt() local v = ARGV[i]; i = i + 1; return v end

local state_lost = 0
if redis.call('SET', P .. ':epoch', '1', 'NX') then state_lost = 1 end

local function release(id)
  local tenant = redis.call('HGET', LT, id)
  if not tenant then return end
  local kv = tonumber(redis.call('HGET', LK, id)) or 0
  redis.call('HINCRBY', IN, 'n', -1)
  redis.call('HINCRBY', IN, 'kv', -kv)
  if redis.call('HINCRBY', IN, 'c:' .. tenant, -1) <= 0 then
    redis.call('HDEL', IN, 'c:' .. tenant, 'kv:' .. tenant)
  else
    redis.call('HINCRBY', IN, 'kv:' .. tenant, -kv)
  end
  redis.call('HDEL', LT, id)
  redis.call('HDEL', LK, id)
  redis.call('ZREM', LS, id)
end
local function open(id, tenant, kv)
  redis.call('HSET', LT, id, tenant)
  redis.call('HSET', LK, id, kv)
  redis.call('ZADD', LS, now + lease_ttl, id)
  redis.call('HINCRBY', IN, 'n', 1)
  redis.call('HINCRBY', IN, 'kv', kv)
  redis.call('HINCRBY', IN, 'c:' .. tenant, 1)
  redis.call('HINCRBY', IN, 'kv:' .. tenant, kv)
end
local function counter(tenant) return tonumber(redis.call('HGET', VTC, tenant)) or 0 end

-- expiry: crashed replicas' leases and backlog, old settlement ids
for _, id in ipairs(redis.call('ZRANGEBYSCORE', LS, '-inf', now)) do release(id) end
for _, m in ipairs(redis.call('ZRANGEBYSCORE', BL, '-inf', now)) do redis.call('HDEL', BLQ, m) end
redis.call('ZREMRANGEBYSCORE', BL, '-inf', now)
redis.call('ZREMRANGEBYSCORE', DONE, '-inf', now)
redis.call('ZREMRANGEBYSCORE', RC, '-inf', now)

-- settlements (idempotent by lease id)
local settled = 0
for _ = 1, num(nxt()) do
  local id, tenant, rq, tk = nxt(), nxt(), num(nxt()), num(nxt())
  local rr, rb, tr, tb = opt(nxt()), opt(nxt()), opt(nxt()), opt(nxt())
  seen(tenant)
  if not redis.call('ZSCORE', DONE, id) then
    release(id)
    bucket_add(tenant, rq, tk, rr, rb, tr, tb)
    redis.call('ZADD', DONE, now + done_ttl, id)
    settled = settled + 1
  end
end
-- batched output charges
for _ = 1, num(nxt()) do
  local tenant, delta = nxt(), nxt()
  redis.call('HINCRBYFLOAT', VTC, tenant, delta)
end
-- forgotten tenants (Step.forget; MemoryStore._forget, StoredBuckets.forget), if idle
local nf = num(nxt())
if nf > 0 then
  local busy = {}
  for _, m in ipairs(redis.call('ZRANGE', BL, 0, -1)) do
    busy[string.sub(m, string.find(m, '\0', 1, true) + 1)] = true
  end
  for _ = 1, nf do
    local tenant = nxt()
    local lims = {{'r', opt(nxt()), opt(nxt())}, {'t', opt(nxt()), opt(nxt())}}
    if not busy[tenant] and not redis.call('HGET', IN, 'c:' .. tenant) then
      redis.call('HDEL', VTC, tenant)
      redis.call('HDEL', W, tenant)
      redis.call('HDEL', LA, tenant)
      redis.call('ZREM', RC, tenant)
      -- full buckets (or no longer limited ones) go now, the others once full:
      -- the wait for a whole burst (rules.refill_s)
      local h = P .. ':b:' .. tenant
      local ms = 0
      for _, l in ipairs(lims) do
        local f, rate, burst = l[1], l[2], l[3]
        local left = 0
        if rate and burst then left = wait_ms(level(h, f, rate, burst), burst, rate, burst) end
        if left == 0 then redis.call('HDEL', h, f .. 'l', f .. 'ts') end
        ms = math.max(ms, left)
      end
      if ms > 0 then redis.call('PEXPIRE', h, math.ceil(ms)) end
    end
  end
end
-- backlog: withdraw, refresh, announce (lift)
for _ = 1, num(nxt()) do
  local tenant = nxt()
  redis.call('ZREM', BL, replica .. '\0' .. tenant)
  redis.call('HDEL', BLQ, replica .. '\0' .. tenant)
  seen(tenant)
end
local nb = num(nxt())
for _ = 1, nb do redis.call('ZADD', BL, now + bl_ttl, replica .. '\0' .. nxt()) end
-- this replica's queue lengths (capped) of its backlogged tenants, negative while
-- held by their own limits (memory_store.py: Step.queued); before the lifts
for _ = 1, num(nxt()) do
  local tenant, q = nxt(), nxt()
  redis.call('HSET', BLQ, replica .. '\0' .. tenant, q)
end
local counters = {}
for _ = 1, num(nxt()) do
  local tenant = nxt()
  local elsewhere, floor = false, nil
  for _, m in ipairs(redis.call('ZRANGE', BL, 0, -1)) do
    local sep = string.find(m, '\0', 1, true)
    local r, tt = string.sub(m, 1, sep - 1), string.sub(m, sep + 1)
    if tt == tenant then
      if r ~= replica then elsewhere = true end
    elseif (tonumber(redis.call('HGET', BLQ, m)) or 0) >= 0 then  -- eligible, not held
      local c = counter(tt)
      if floor == nil or c < floor then floor = c end
    end
  end
  if not elsewhere then
    if floor == nil then floor = tonumber(redis.call('GET', FLOOR)) or 0 end
    -- rules.lifted
    if counter(tenant) < floor then redis.call('HSET', VTC, tenant, fmt(floor)) end
    redis.call('HDEL', LA, tenant)  -- first among the tenants it ties with
  end
  redis.call('ZADD', BL, now + bl_ttl, replica .. '\0' .. tenant)
  counters[tenant] = counter(tenant)
end
-- lease renewal / adoption
local nr = num(nxt())
for _ = 1, nr do
  local id, tenant, kv = nxt(), nxt(), num(nxt())
  if redis.call('HEXISTS', LT, id) == 1 then
    redis.call('ZADD', LS, now + lease_ttl, id)
  elseif not redis.call('ZSCORE', DONE, id) then
    open(id, tenant, kv)
  end
end
-- weights (for the reserve's shares)
for _ = 1, num(nxt()) do
  local tenant, w = nxt(), nxt()
  redis.call('HSET', W, tenant, w)
end
"""
