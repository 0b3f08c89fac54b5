"""STEP's second part: the admission round, the Lua twin of decision.admit_round.

Reads the candidates, then admits heads in fair order (rules.order_key, the
tie-break of rules.vtc_rank) with the locality window, the reserve
(rules.in_reserve, below_share), lending (rules.fits_lent) and the tenants
backlogged elsewhere (rules.behind); returns what it admitted, blocked or held.
Uses the locals that lua_step_upkeep.py declares.
"""

from __future__ import annotations

STEP_ROUND = r"""
-- the decision
local nc = num(nxt())
local cands, weighed = {}, {}
for k = 1, nc do
  local c = {id = nxt(), tenant = nxt()}
  local w = nxt()
  -- once per tenant (its candidates carry the same weight)
  if not weighed[c.tenant] then redis.call('HSET', W, c.tenant, w); weighed[c.tenant] = true end
  c.weight, c.prompt, c.kv, c.take = num(w), num(nxt()), num(nxt()), nxt() == '1'
  c.rr, c.rb, c.tr, c.tb, c.maxc = opt(nxt()), opt(nxt()), opt(nxt()), opt(nxt()), opt(nxt())
  c.queued, c.seq, c.cached, c.held = num(nxt()), num(nxt()), num(nxt()), num(nxt())
  -- what the buckets count: prompt + max_tokens as sent (store.Candidate.sent_tokens)
  c.sent = c.kv + math.min(math.max(0, c.cached), c.prompt)
  c.idx = k - 1
  counters[c.tenant] = counters[c.tenant] or counter(c.tenant)
  cands[k] = c
end
-- each candidate's tenant queued across the fleet: its own count here plus its
-- lengths on the other replicas (unknown: heavy), light or heavy as everywhere
-- else (store_round.py: StoreRound.queued)
do
  local others = {}
  for _, m in ipairs(redis.call('ZRANGE', BL, 0, -1)) do
    local sep = string.find(m, '\0', 1, true)
    if string.sub(m, 1, sep - 1) ~= replica then
      local tt = string.sub(m, sep + 1)
      local len = math.abs(tonumber(redis.call('HGET', BLQ, m)) or (LIGHT_QUEUE + 1))
      others[tt] = (others[tt] or 0) + len
    end
  end
  for _, c in ipairs(cands) do c.fq = c.queued + (others[c.tenant] or 0) end
end
-- the fair-share reserve (rules.in_reserve, below_share; store_round.py)
local function in_reserve(n_now, kv_now, c)
  local reserve_req = math.ceil(max_req * reserve_fraction)
  local reserve_kv = max_kv * reserve_fraction
  return n_now + 1 > max_req - reserve_req or kv_now + c.kv > max_kv - reserve_kv
end
-- rules.fits_lent: within the room plus the fraction lent beyond it (PREEMPT)
local function fits_lent(n_now, kv_now, c)
  local lent_req = math.ceil(max_req * reserve_fraction)
  local lent_kv = max_kv * reserve_fraction
  return n_now + 1 <= max_req + lent_req and kv_now + c.kv <= max_kv + lent_kv
end
-- rules.fits_slot_lent: the room's KV, its slots plus the fraction lent and the
-- requests in flight no engine has yet (RESERVE_SLOTS)
local function fits_slot_lent(n_now, kv_now, c)
  local lent_req = math.ceil(max_req * reserve_fraction)
  local at_engines = n_now - math.min(math.max(0, unsent), n_now)
  return at_engines + 1 <= max_req + lent_req and (n_now == 0 or kv_now + c.kv <= max_kv)
end
-- each backlogged tenant's queue length summed over the replicas it is backlogged
-- on (held ones count theirs; unknown: heavy) (store_round.py: _fleet_queued)
local function fleet_queued(members)
  local q = {}
  for _, m in ipairs(members) do
    local tenant = string.sub(m, string.find(m, '\0', 1, true) + 1)
    local len = math.abs(tonumber(redis.call('HGET', BLQ, m)) or (LIGHT_QUEUE + 1))
    q[tenant] = (q[tenant] or 0) + len
  end
  return q
end
-- the tenants active anywhere (backlogged on a replica, in flight, offered now, or
-- seen within the window), which of them are queued, and their weights' sum in
-- name order (store_round.py: StoreRound.load)
local active = nil
local function get_active()
  if active then return active end
  -- queue lengths: summed over the replicas it is backlogged on (one whose
  -- length is unknown counts as heavy); a candidate's own if it is in none
  active = {names = {}, queued = {}, total = 0}
  local known = {}
  local function add(tenant)
    if not known[tenant] then known[tenant] = true; table.insert(active.names, tenant) end
  end
  local members = redis.call('ZRANGE', BL, 0, -1)
  active.queued = fleet_queued(members)
  for _, m in ipairs(members) do add(string.sub(m, string.find(m, '\0', 1, true) + 1)) end
  for _, c in ipairs(cands) do
    if active.queued[c.tenant] == nil then active.queued[c.tenant] = c.queued end
    add(c.tenant)
  end
  local flat = redis.call('HGETALL', IN)
  for k = 1, #flat, 2 do
    if string.sub(flat[k], 1, 2) == 'c:' then add(string.sub(flat[k], 3), nil) end
  end
  for _, tenant in ipairs(redis.call('ZRANGE', RC, 0, -1)) do add(tenant, nil) end
  table.sort(active.names)
  for _, tenant in ipairs(active.names) do
    active.total = active.total + (tonumber(redis.call('HGET', W, tenant)) or 1)
  end
  return active
end
-- rules.below_share, with `kv` more tokens
local function below(tenant, share, kv)
  local tn = tonumber(redis.call('HGET', IN, 'c:' .. tenant)) or 0
  if share >= 1 - 1e-9 or tn == 0 then return true end
  local tkv = tonumber(redis.call('HGET', IN, 'kv:' .. tenant)) or 0
  return tn < share * max_req and tkv + kv <= share * max_kv
end
-- a tenant's weighted share among the active ones (decision.tenant_load)
local function share_of(tenant, a)
  return (tonumber(redis.call('HGET', W, tenant)) or 1) / a.total
end
-- rules.verdict's HOLD: at or above its share while another active, light tenant
-- (rules.light) is below its own (someone to keep the reserve for)
local function held_out(c)
  local a = get_active()
  if below(c.tenant, share_of(c.tenant, a), c.kv) then return false end
  for _, tenant in ipairs(a.names) do
    if tenant ~= c.tenant and (a.queued[tenant] or 0) <= LIGHT_QUEUE then
      if below(tenant, share_of(tenant, a), 0) then return true end
    end
  end
  return false
end
-- each tenant's candidates in its queue's order (store_round.py: decide)
local pend, names = {}, {}
for _, c in ipairs(cands) do
  if not pend[c.tenant] then pend[c.tenant] = {}; table.insert(names, c.tenant) end
  table.insert(pend[c.tenant], c)
end
local admitted, full, blocked, held, lent, turn = {}, 0, {}, {}, {}, 0
-- rules.behind: the smallest order_key among the other tenants backlogged and
-- eligible (length >= 0, or unknown) on another replica, their lengths summed over
-- the replicas (unknown: heavy) (store_round.py: _elsewhere); read once (the
-- backlog does not change during the decision; counters may: read at each use)
local elsewhere = nil
local function first_elsewhere(tenant)
  if elsewhere == nil then
    elsewhere = {}
    local members = redis.call('ZRANGE', BL, 0, -1)
    local others = false
    for _, m in ipairs(members) do
      if string.sub(m, 1, string.find(m, '\0', 1, true) - 1) ~= replica then others = true end
    end
    if others then
      local q = fleet_queued(members)
      for _, m in ipairs(members) do
        local sep = string.find(m, '\0', 1, true)
        local r, tt = string.sub(m, 1, sep - 1), string.sub(m, sep + 1)
        if r ~= replica and (tonumber(redis.call('HGET', BLQ, m)) or 0) >= 0 then
          elsewhere[tt] = q[tt]
        end
      end
    end
  end
  local first = nil
  for tt, qn in pairs(elsewhere) do
    if tt ~= tenant then
      local k = counter(tt)
      if qn <= LIGHT_QUEUE then k = k - light_credit end
      if first == nil or k < first then first = k end
    end
  end
  return first
end
local n = tonumber(redis.call('HGET', IN, 'n')) or 0
local kv = tonumber(redis.call('HGET', IN, 'kv')) or 0
-- one candidate: 'admit', 'own' (its own limits), 'hold' (held out of the
-- reserve) or 'full' (no room, nor lent room; neither recorded here), or 'stop'
-- (another replica's turn);
-- `trial` (a locality pick, decision.py): a stop is not recorded, the fair head
-- is decided instead
-- held by its own limits (max_concurrent, wait-mode buckets): recorded as blocked
local function own_limited(c)
  if c.maxc and (tonumber(redis.call('HGET', IN, 'c:' .. c.tenant)) or 0) >= c.maxc then
    table.insert(blocked, tostring(c.idx)); table.insert(blocked, '-1'); return true
  end
  if c.take then
    local _, w = bucket_wait(c.tenant, c.sent, c.rr, c.rb, c.tr, c.tb)
    if w ~= 0 then
      table.insert(blocked, tostring(c.idx)); table.insert(blocked, fmt(w)); return true
    end
  end
  return false
end
local function decide(c, trial)
  if redis.call('HEXISTS', LT, c.id) == 1 then table.insert(admitted, c.idx); return 'admit' end
  if own_limited(c) then return 'own' end
  if allowance >= 0 then
    local first = first_elsewhere(c.tenant)
    local key = counters[c.tenant]
    if c.fq <= LIGHT_QUEUE then key = key - light_credit end
    if first ~= nil and key > first + allowance then
      if not trial then turn = 1 end
      return 'stop'
    end
  end
  local room = not (n >= max_req or (n > 0 and kv + c.kv > max_kv))
  if preempt or (lend_slots and not room) then
    -- rules.verdict, PREEMPT (RESERVE_SLOTS: a slot): beyond the room only a light
    -- candidate that is not alone and is below its share (fleet-wide queue sums, as
    -- the reserve judges them), within the lent room (slots)
    if not room then
      local lend = false
      local fits = fits_lent
      if lend_slots then fits = fits_slot_lent end
      if reserve_fraction > 0 and fits(n, kv, c) then
        local a = get_active()
        local share = share_of(c.tenant, a)
        local light = (a.queued[c.tenant] or 0) <= LIGHT_QUEUE
        lend = light and share < 1 - 1e-9 and below(c.tenant, share, c.kv)
      end
      if not lend then return 'full' end
      table.insert(lent, tostring(c.idx))
    end
  else
    -- no room: the caller records it or hands the room over (decision.handover)
    if not room then return 'full' end
    -- held out of the reserve (rules.verdict: HOLD): the caller records it or
    -- hands the reserve over (decision.handover)
    if reserve_fraction > 0 and in_reserve(n, kv, c) and held_out(c) then
      return 'hold'
    end
  end
  if c.take then bucket_add(c.tenant, -1, -c.sent, c.rr, c.rb, c.tr, c.tb) end
  local counter_now = counters[c.tenant]
  local floor = tonumber(redis.call('GET', FLOOR)) or 0
  if counter_now > floor then redis.call('SET', FLOOR, fmt(counter_now)) end
  -- rules.admission_charge: the prefix a worker holds at w_cached, the most any
  -- holds (store.Candidate.charged_cached)
  local hit = math.min(math.max(0, c.cached, c.held), c.prompt)
  local after = counter_now + (w_in * (c.prompt - hit) + w_cached * hit) / c.weight
  redis.call('HSET', VTC, c.tenant, fmt(after))
  counters[c.tenant] = after
  redis.call('HSET', LA, c.tenant, redis.call('INCR', ADM))
  open(c.id, c.tenant, c.kv)
  -- one fewer queued here, exactly (store_round.py: StoreRound.admit); the reserve's view
  -- is read again
  local m = replica .. '\0' .. c.tenant
  if redis.call('ZSCORE', BL, m) then
    redis.call('HSET', BLQ, m, math.min(c.queued - 1, LIGHT_QUEUE + 1))
    active = nil
  end
  n = n + 1
  kv = kv + c.kv
  table.insert(admitted, c.idx)
  return 'admit'
end
local going = true
while going do
  -- the tenants' next candidates in counter order, a light one light_credit ahead
  -- (rules.order_key); ties to the tenant admitted least recently
  local heads = {}
  for _, t in ipairs(names) do
    local c = pend[t] and pend[t][1]
    if c then
      c.key = counters[t]
      if c.fq <= LIGHT_QUEUE then c.key = c.key - light_credit end
      c.last = tonumber(redis.call('HGET', LA, t)) or 0
      table.insert(heads, c)
    end
  end
  if #heads == 0 then break end
  table.sort(heads, function(a, b)
    if a.key ~= b.key then return a.key < b.key end
    if a.last ~= b.last then return a.last < b.last end
    if a.seq ~= b.seq then return a.seq < b.seq end  -- the earlier head (rules.vtc_rank)
    return a.idx < b.idx
  end)
  going = false
  local k, stop = 1, false
  while k <= #heads and not stop do
    local c = heads[k]
    if c.gone then
      k = k + 1
    elseif redis.call('HEXISTS', LT, c.id) == 0 and own_limited(c) then
      -- its own limits first: no anchor for locality's window (decision.admit_round)
      pend[c.tenant] = nil
      c.gone = true
      k = k + 1
    else
      -- locality (decision.prefer, window_end; store_round.py: heads_upto), while a slot
      -- is free: the other heads within the allowance of c, in fair order, not one
      -- admitted by an earlier try; the one a worker holds most of goes first
      -- when it may (decision.py), by at least LOCALITY_MIN_GAIN more than c
      -- (rules.locality_pick), else c is decided
      local pick, done = c, false
      -- never past a light tenant's head (rules.locality_may_pass)
      if allowance >= 0 and n < max_req and c.fq > LIGHT_QUEUE then
        local limit = c.key + allowance
        for j = k + 1, #heads do
          local h = heads[j]
          if not h.gone and h.key <= limit and h.cached > pick.cached
            and h.cached >= c.cached + LOCALITY_MIN_GAIN
            and redis.call('HEXISTS', LT, h.id) == 0 then
            pick = h
          end
        end
      end
      if pick ~= c then
        local v = decide(pick, true)
        if v == 'own' then
          pend[pick.tenant] = nil
          pick.gone = true
          done = true
        elseif v == 'admit' then
          table.remove(pend[pick.tenant], 1)
          going = #pend[pick.tenant] > 0 or pick.queued <= 1
          done, stop = true, true
        end
      end
      if not done then
        local v = decide(c, false)
        if v == 'own' then
          pend[c.tenant] = nil
          c.gone = true
          k = k + 1
        elseif v == 'stop' then
          stop = true
        elseif v == 'hold' or v == 'full' then
          -- decision.handover: the first light head after c in fair order that may
          -- go (when full: one that leaves its tenant within its share, with the
          -- reserve or the lent room on) takes the reserve c is held out of, or the
          -- room c does not fit; else the round stops at c
          local given = nil
          local a = (v == 'full' and reserve_fraction > 0) and get_active() or nil
          for j = k + 1, (v == 'hold' or a) and #heads or 0 do
            local h = heads[j]
            if not h.gone and h.fq <= LIGHT_QUEUE and redis.call('HEXISTS', LT, h.id) == 0
              and (v == 'hold' or below(h.tenant, share_of(h.tenant, a), h.kv)) then
              local w = decide(h, true)
              if w == 'own' then
                pend[h.tenant] = nil
                h.gone = true
              elseif w == 'admit' then
                given = h
                break
              end
            end
          end
          if given then
            table.remove(pend[given.tenant], 1)
            going = #pend[given.tenant] > 0 or given.queued <= 1
          elseif v == 'hold' then
            table.insert(held, tostring(c.idx))
          else
            full = 1
          end
          stop = true
        else
          table.remove(pend[c.tenant], 1)
          -- a tenant's last candidate admitted while it has more queued: its next
          -- request, not offered, may come first
          going = #pend[c.tenant] > 0 or c.queued <= 1
          stop = true
        end
      end
    end
  end
end
local flat = {}
for tenant, c in pairs(counters) do table.insert(flat, tenant); table.insert(flat, fmt(c)) end
-- the admitted whose tenant was light across the fleet (store_round.py: decide)
local light = {}
for _, i in ipairs(admitted) do
  if cands[i + 1].fq <= LIGHT_QUEUE then table.insert(light, i) end
end
return {admitted, full, blocked, flat, settled, state_lost, n, held, lent, turn, light}
"""
