"""The Lua prelude every Redis script starts with: the fleet's one clock and the
token buckets' helpers (the Lua twin of rules.bucket_*).

Prepended to the Redis store's scripts (redis_scripts.py) and the key gate's
(redis_key_state.py). Numbers cross the script boundary as strings ("%.17g")
because Redis truncates Lua numbers to integers.
"""

from __future__ import annotations

# ARGV[1] is always P, the key prefix; `now` is Redis' TIME in ms.
PRELUDE = r"""
local P = ARGV[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000  -- ms
local function num(s) return tonumber(s) end
local function fmt(x) return string.format('%.17g', x) end
local function opt(s) local v = tonumber(s); if v == nil or v < 0 then return nil end; return v end

local function level(h, f, rate, burst)
  local v = redis.call('HMGET', h, f .. 'l', f .. 'ts')
  local l, ts = tonumber(v[1]), tonumber(v[2])
  if l == nil then return burst end
  if now > ts then l = l + (now - ts) / 1000 * rate end
  if l > burst then l = burst end
  return l
end
local function set_level(h, f, l)
  redis.call('HSET', h, f .. 'l', fmt(l), f .. 'ts', fmt(now))
  redis.call('PERSIST', h)  -- written again: no longer a forgotten tenant's (STEP)
end
local function wait_ms(l, n, rate, burst)
  local slack = 1e-9 * math.max(1, n)
  if n > burst + slack then return -1 end  -- never
  local missing = n - l
  if missing <= slack then return 0 end
  return missing / rate * 1000
end
-- (binding limit, wait ms; -1 = never) for 1 request + n tokens
local function bucket_wait(tenant, n, rr, rb, tr, tb)
  local h = P .. ':b:' .. tenant
  local lim, w = '', 0
  if rr and rb then
    local x = wait_ms(level(h, 'r', rr, rb), 1, rr, rb)
    if x < 0 then return 'requests_per_s', -1 end
    if x > w then lim, w = 'requests_per_s', x end
  end
  if tr and tb then
    local x = wait_ms(level(h, 't', tr, tb), n, tr, tb)
    if x < 0 then return 'tokens_per_min', -1 end
    if x > w then lim, w = 'tokens_per_min', x end
  end
  return lim, w
end
local function bucket_add(tenant, req, tok, rr, rb, tr, tb)
  local h = P .. ':b:' .. tenant
  if req ~= 0 and rr and rb then set_level(h, 'r', math.min(rb, level(h, 'r', rr, rb) + req)) end
  if tok ~= 0 and tr and tb then set_level(h, 't', math.min(tb, level(h, 't', tr, tb) + tok)) end
end
"""
