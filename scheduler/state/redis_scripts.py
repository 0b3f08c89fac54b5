"""Lua sources of the Redis store (see redis_store.py for the key layout).

Every script reads the clock with TIME (one clock for the fleet), touches only
keys of one hash slot (`{<domain>}`) and is atomic. Each starts with the prelude
(lua_prelude.py: clock, number formats, token buckets); STEP, the admission
step, is its upkeep (lua_step_upkeep.py) then its round (lua_step_round.py).
"""

from __future__ import annotations

from scheduler.rules import LIGHT_QUEUE, LOCALITY_MIN_GAIN
from scheduler.state.lua_prelude import PRELUDE
from scheduler.state.lua_step_round import STEP_ROUND
from scheduler.state.lua_step_upkeep import STEP_UPKEEP

RESERVE = (
    PRELUDE
    + r"""
-- ARGV: P, tenant, tokens, rr, rb, tr, tb
local tenant, n = ARGV[2], num(ARGV[3])
local rr, rb, tr, tb = opt(ARGV[4]), opt(ARGV[5]), opt(ARGV[6]), opt(ARGV[7])
local lim, w = bucket_wait(tenant, n, rr, rb, tr, tb)
if w ~= 0 then return {lim, fmt(w)} end
bucket_add(tenant, -1, -n, rr, rb, tr, tb)
return {'', '0'}
"""
)

STEP = (
    PRELUDE
    # rules.LIGHT_QUEUE and rules.LOCALITY_MIN_GAIN, stated once (in Python).
    + f"local LIGHT_QUEUE = {LIGHT_QUEUE}\n"
    + f"local LOCALITY_MIN_GAIN = {LOCALITY_MIN_GAIN}\n"
    + STEP_UPKEEP
    + STEP_ROUND
)

SNAPSHOT = r"""
local P = ARGV[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
return {
  redis.call('HGETALL', P .. ':in'),
  redis.call('HGETALL', P .. ':vtc'),
  redis.call('ZRANGEBYSCORE', P .. ':ls', '(' .. now, '+inf'),
  redis.call('ZRANGEBYSCORE', P .. ':bl', '(' .. now, '+inf'),
}
"""
