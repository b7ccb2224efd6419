-- reserve: choose the best live cluster for a request, lock its capacity and
-- record the decision; idempotent by reservation id.
--
-- Candidates are live (seen within the stale threshold, broker clock), not the
-- requester, match the label selector, and fit: for every requested resource
-- free = alloc - used - resv >= request. Score in [0,100]:
--   w_res * resource_score + w_cost * cost_score
--   resource_score = 100 * mean over requested resources of (free - request) / alloc
--   cost_score     = 100 * (max_price - price) / (max_price - min_price), 100 if all equal
--   price          = the request priced at the cluster's hourly rates
-- Ties go to the smallest cluster id, so the decision is deterministic.
--
-- Finding the best clusters does not read every cluster: the candidate index
-- (lib.lua) yields them. When one requested resource (or the label selector)
-- leaves few candidates, those are evaluated directly ("direct"); otherwise a
-- threshold algorithm walks the index's sorted sets of free fraction
-- (descending), reading clusters in batches from idx:rec, and stops once the
-- top candidates score above the best any unread cluster could reach
-- ("threshold"). The min and max price over the fitting clusters, which
-- normalise the cost score, are found first by walking the price sets. ARGV[17] = "scan"
-- evaluates every live cluster instead ("scan"): the reference the index is
-- tested against, and the baseline of the benchmarks. All three give the same
-- decision and candidates. Rejections (reply and audit, counted only when
-- nothing fits in index mode) count, per reason, the live clusters that fail
-- it; a cluster may count under several reasons.
--
-- KEYS[1]  prefix ("rb:{b}:")
-- ARGV[1]  reservation id         ARGV[2]  requester cluster id
-- ARGV[3]  cpu (millicores)       ARGV[4]  memory (bytes)
-- ARGV[5]  gpu (count)            ARGV[6]  ephemeral storage (bytes)
-- ARGV[7]  duration (ms, > 0)     ARGV[8]  stale threshold (ms)
-- ARGV[9]  weight of resources    ARGV[10] weight of cost (floats, sum 1)
-- ARGV[11] label selector as a JSON object of required labels, or ""
-- ARGV[12] owner (free text)      ARGV[13] priority (integer)
-- ARGV[14] how many candidates to report
-- ARGV[15] event stream max length  ARGV[16] audit stream max length
-- ARGV[17] "index" (default) or "scan"
-- ARGV[18] how long a request nothing fits stays on the waiting list without
--          a retry (ms; 0: no waiting list)
-- Reply: {outcome, reservation, candidates_json, rejections_json}
--   outcome     "reserved" (new), "replay" (id already decided: the first
--               answer), "conflict" (id belongs to another requester, or was
--               decided for other amounts),
--               "nofit" (no reservation written: the request waits, by
--               priority, see lib.lua; rejections {waiting_higher_priority=1}
--               when a waiting request of higher priority could be placed now)
--   reservation flat field/value array of the reservation hash ({} if none)
--   candidates  JSON array of the best candidates {cluster, score, resource_score, cost_score, price}
--   rejections  JSON object: how many clusters were excluded, by reason
local prefix, id, requester = KEYS[1], ARGV[1], ARGV[2]
local rk = prefix .. 'resv:' .. id

local existing = redis.call('HGETALL', rk)
if #existing > 0 then
  local r = to_map(existing)
  if r.requester ~= requester or r.cpu ~= ARGV[3] or r.mem ~= ARGV[4] or r.gpu ~= ARGV[5] or r.sto ~= ARGV[6] then
    return {'conflict', {}, '[]', '{}'}
  end
  return {'replay', existing, r.candidates or '[]', '{}'}
end

local req_str = {cpu = ARGV[3], mem = ARGV[4], gpu = ARGV[5], sto = ARGV[6]}
local req = {}
local requested = {}
for _, res in ipairs(RESOURCES) do
  req[res] = tonumber(req_str[res])
  if req[res] > 0 then requested[#requested + 1] = res end
end
local duration_ms = tonumber(ARGV[7])
local stale_ms = tonumber(ARGV[8])
local w_res, w_cost = tonumber(ARGV[9]), tonumber(ARGV[10])
local selector = nil
if ARGV[11] ~= '' then selector = cjson.decode(ARGV[11]) end
local top_n = tonumber(ARGV[14])
local events_max, audit_max = ARGV[15], ARGV[16]

local now = now_ms()
local cut = now - stale_ms
local scan_mode = ARGV[17] == 'scan'
-- DIRECT_MAX: up to this many candidates are evaluated directly, without the threshold walk.
local DIRECT_MAX = 128

-- Keep the candidate index to live clusters: drop those gone stale since the last decision.
for _, cid in ipairs(redis.call('ZRANGEBYSCORE', prefix .. 'idx:live', '-inf', '(' .. cut)) do
  unindex_cluster(prefix, cid)
end

-- Priority: a request may not take capacity while a waiting request of
-- higher priority could be placed now. It is deferred (and waits), and the
-- waiting request's requester is told to retry at once.
local priority = tonumber(ARGV[13])
local wait_ttl = tonumber(ARGV[18] or '0')

-- fits_somewhere tells whether some live cluster other than its requester can
-- take waiting request w (its wait hash) now; it reads at most 256 records,
-- the clusters with the most free of w's scarcest resource first.
local function fits_somewhere(w)
  local need, scarcest, fewest = {}, nil, nil
  for _, res in ipairs(RESOURCES) do
    need[res] = tonumber(w[res] or '0')
    if need[res] > 0 then
      local n = redis.call('ZCOUNT', prefix .. 'idx:free:' .. res, w[res], '+inf')
      if n == 0 then return false end
      if fewest == nil or n < fewest then scarcest, fewest = res, n end
    end
  end
  if scarcest == nil then return false end
  local sel = nil
  if w.selector and w.selector ~= '' then sel = cjson.decode(w.selector) end
  for offset = 0, 192, 64 do
    local ids = redis.call('ZREVRANGEBYSCORE', prefix .. 'idx:free:' .. scarcest, '+inf', w[scarcest],
      'LIMIT', offset, 64)
    if #ids == 0 then return false end
    local recs = redis.call('HMGET', prefix .. 'idx:rec', unpack(ids))
    local labels = {}
    if sel then labels = redis.call('HMGET', prefix .. 'idx:labels', unpack(ids)) end
    for i, cid in ipairs(ids) do
      if cid ~= w.requester then
        local rec = unpack_rec(recs[i])
        local ok = true
        for _, res in ipairs(RESOURCES) do
          if need[res] > 0 and rec[REC_AT[res] + 1] < need[res] then ok = false break end
        end
        if ok and sel then
          local l = decode_labels(labels[i])
          for k, want in pairs(sel) do
            if l[k] ~= want then ok = false break end
          end
        end
        if ok then return true end
      end
    end
  end
  return false
end

-- wait puts this request on the waiting list, or keeps it there (a retry
-- refreshes its lease but keeps its place).
local function wait()
  if wait_ttl <= 0 then return end
  local wk = prefix .. 'wait:' .. id
  if redis.call('EXISTS', wk) == 0 then
    local member = string.format('%015d', now) .. ':' .. id
    redis.call('HSET', wk, 'requester', requester, 'cpu', ARGV[3], 'mem', ARGV[4], 'gpu', ARGV[5],
      'sto', ARGV[6], 'selector', ARGV[11], 'priority', ARGV[13], 'since_ms', now, 'member', member)
    redis.call('ZADD', prefix .. 'waiting', -priority, member)
  end
  redis.call('PEXPIRE', wk, wait_ttl)
end

if wait_ttl > 0 then
  local higher = redis.call('ZRANGEBYSCORE', prefix .. 'waiting', '-inf', '(' .. (-priority),
    'LIMIT', 0, WAITERS_NOTIFIED)
  for _, m in ipairs(higher) do
    local wid = string.sub(m, 17)
    local w = to_map(redis.call('HGETALL', prefix .. 'wait:' .. wid))
    if not w.requester then
      redis.call('ZREM', prefix .. 'waiting', m) -- forgotten: its requester stopped retrying
    elseif wid ~= id and fits_somewhere(w) then
      tell_waiter(prefix, events_max, wid, w.requester, w.cpu, w.mem, w.gpu, w.sto)
      wait()
      local rejected_json = cjson.encode({waiting_higher_priority = 1})
      redis.call('XADD', prefix .. 'audit', 'MAXLEN', '~', audit_max, '*',
        'reservation', id, 'requester', requester, 'outcome', 'deferred', 'winner', '', 'score', '',
        'blocked_by', wid, 'priority', ARGV[13], 'blocked_priority', w.priority,
        'rejected', rejected_json, 'ts_ms', now)
      return {'nofit', {}, '[]', rejected_json}
    end
  end
end

-- judge decides whether one cluster can take the request from its record
-- (the layout of idx:rec, lib.lua: alloc and free per resource, the three
-- prices; then the labels as a table when there is a selector) and returns its candidate {cluster, resource_score,
-- price}, or false; it also counts, per reason, why clusters fail.
local rejected = {stale = 0, requester = 0, selector = 0}
for _, res in ipairs(requested) do rejected['insufficient_' .. res] = 0 end
local seen, examined, fits = {}, 0, {}
local function judge(cid, rec)
  examined = examined + 1
  local ok, free_sum = true, 0
  for _, res in ipairs(requested) do
    local at = REC_AT[res]
    local free = rec[at + 1]
    if free < req[res] then
      rejected['insufficient_' .. res] = rejected['insufficient_' .. res] + 1
      ok = false
    elseif ok then
      free_sum = free_sum + (free - req[res]) / rec[at]
    end
  end
  if selector then
    local labels = rec[12]
    for k, want in pairs(selector) do
      if labels[k] ~= want then
        rejected.selector = rejected.selector + 1
        ok = false
        break
      end
    end
  end
  local c = false
  if ok then
    c = {cluster = cid, resource_score = 100 * free_sum / #requested, price = price_of(req, rec[9], rec[10], rec[11])}
    fits[#fits + 1] = c
  end
  seen[cid] = c
end

-- evaluate_hash judges one cluster from its hash (the full scan: the
-- reference the index is tested against).
local hash_fields = {'price_cpu', 'price_mem', 'price_gpu', 'labels'}
for _, res in ipairs(requested) do
  hash_fields[#hash_fields + 1] = 'alloc_' .. res
  hash_fields[#hash_fields + 1] = 'used_' .. res
  hash_fields[#hash_fields + 1] = 'resv_' .. res
end
local function evaluate_hash(cid)
  if seen[cid] ~= nil then return end
  if cid == requester then
    rejected.requester = 1
    seen[cid] = false
    return
  end
  local v = redis.call('HMGET', prefix .. 'cluster:' .. cid, unpack(hash_fields))
  local rec = {}
  for i, res in ipairs(requested) do
    local alloc = tonumber(v[3 * i + 2] or '0')
    rec[REC_AT[res]] = alloc
    rec[REC_AT[res] + 1] = alloc - tonumber(v[3 * i + 3] or '0') - tonumber(v[3 * i + 4] or '0')
  end
  rec[9], rec[10], rec[11] = tonumber(v[1] or '0'), tonumber(v[2] or '0'), tonumber(v[3] or '0')
  if selector then rec[12] = decode_labels(v[4]) end
  judge(cid, rec)
end

-- evaluate_batch judges the clusters not judged yet among ids from their
-- index records, read in one HMGET.
local function evaluate_batch(ids)
  local todo = {}
  for _, cid in ipairs(ids) do
    if seen[cid] == nil then
      seen[cid] = false -- judge overwrites it; this also dedupes ids within the batch
      if cid == requester then
        rejected.requester = 1
      else
        todo[#todo + 1] = cid
      end
    end
  end
  if #todo == 0 then return end
  local recs = redis.call('HMGET', prefix .. 'idx:rec', unpack(todo))
  local labels = nil
  if selector then labels = redis.call('HMGET', prefix .. 'idx:labels', unpack(todo)) end
  for i, cid in ipairs(todo) do
    local rec = unpack_rec(recs[i])
    if labels then rec[12] = decode_labels(labels[i]) end
    judge(cid, rec)
  end
end

local min_price, max_price
local function price_range(list)
  min_price, max_price = nil, nil
  for _, c in ipairs(list) do
    if min_price == nil or c.price < min_price then min_price = c.price end
    if max_price == nil or c.price > max_price then max_price = c.price end
  end
end
local function cost_score(price)
  if max_price > min_price then return 100 * (max_price - price) / (max_price - min_price) end
  return 100
end
local function better(a, b)
  if a.score ~= b.score then return a.score > b.score end
  return a.cluster < b.cluster
end
-- offer scores a fitting cluster and keeps the best top_n in order.
local top = {}
local function offer(c)
  c.cost_score = cost_score(c.price)
  c.score = w_res * c.resource_score + w_cost * c.cost_score
  local pos = #top + 1
  while pos > 1 and better(c, top[pos - 1]) do pos = pos - 1 end
  if pos <= top_n then
    table.insert(top, pos, c)
    if #top > top_n then top[#top] = nil end
  end
end
local function decide_among(ids, by_hash)
  if by_hash then
    for _, cid in ipairs(ids) do evaluate_hash(cid) end
  else
    for i = 1, #ids, 64 do evaluate_batch({unpack(ids, i, math.min(i + 63, #ids))}) end
  end
  price_range(fits)
  for _, c in ipairs(fits) do offer(c) end
end

-- A cursor over one sorted set of the index, read in growing chunks.
local function cursor(key, descending)
  return {key = key, desc = descending, pos = 0, chunk = 4, last = nil, done = false}
end
local function advance(cur)
  local cmd = 'ZRANGE'
  if cur.desc then cmd = 'ZREVRANGE' end
  local r = redis.call(cmd, cur.key, cur.pos, cur.pos + cur.chunk - 1, 'WITHSCORES')
  cur.pos = cur.pos + cur.chunk
  if #r < 2 * cur.chunk then cur.done = true end
  if #r > 0 then cur.last = tonumber(r[#r]) end
  cur.chunk = math.min(cur.chunk * 2, 32)
  local ids = {}
  for i = 1, #r, 2 do ids[#ids + 1] = r[i] end
  return ids
end
-- walk reads the cursors in turn, evaluating every cluster met, until
-- done() says no unread cluster can matter or a cursor runs out (then every
-- live cluster has been read).
local function walk(cursors, done)
  while true do
    local exhausted = false
    for _, cur in ipairs(cursors) do
      evaluate_batch(advance(cur))
      if cur.done then exhausted = true end
    end
    if exhausted or done() then return end
  end
end
local function rate_at(cursors, res)
  for _, cur in ipairs(cursors) do
    if cur.res == res then return cur.last end
  end
  return 0
end
-- extreme_price finds the min (or max) price over the fitting clusters by
-- walking the price sets upwards (or downwards).
local function extreme_price(highest)
  local cursors = {}
  for _, res in ipairs(PRICED) do
    if req[res] > 0 then
      local cur = cursor(prefix .. 'idx:price:' .. res, highest)
      cur.res = res
      cursors[#cursors + 1] = cur
    end
  end
  if #cursors == 0 then -- nothing requested has a price: every price is 0
    return 0
  end
  local function best()
    local b = nil
    for _, c in ipairs(fits) do
      if b == nil or (highest and c.price > b) or (not highest and c.price < b) then b = c.price end
    end
    return b
  end
  walk(cursors, function()
    local b = best()
    if b == nil then return false end
    local bound = price_of(req, rate_at(cursors, 'cpu'), rate_at(cursors, 'mem'), rate_at(cursors, 'gpu'))
    if highest then return b >= bound end
    return b <= bound
  end)
  return best()
end

local method
if scan_mode then
  method = 'scan'
  decide_among(redis.call('ZRANGEBYSCORE', prefix .. 'clusters', cut, '+inf'), true)
else
  -- How many live clusters have enough of each requested resource (or carry
  -- the selector's labels): the smallest set holds every fitting cluster.
  local smallest, smallest_ids = nil, nil
  local nofit = false
  for _, res in ipairs(requested) do
    local n = redis.call('ZCOUNT', prefix .. 'idx:free:' .. res, req_str[res], '+inf')
    if n == 0 then nofit = true end
    if smallest == nil or n < smallest then
      smallest = n
      smallest_ids = function()
        return redis.call('ZRANGEBYSCORE', prefix .. 'idx:free:' .. res, req_str[res], '+inf')
      end
    end
  end
  local label_keys = {}
  if selector then
    for k, want in pairs(selector) do
      local key = prefix .. 'idx:label:' .. k .. '=' .. tostring(want)
      label_keys[#label_keys + 1] = key
      local n = redis.call('SCARD', key)
      if n == 0 then nofit = true end
      if smallest == nil or n < smallest then
        smallest = n
        smallest_ids = function() return redis.call('SINTER', unpack(label_keys)) end
      end
    end
  end
  if smallest == nil then -- nothing requested, no selector: every live cluster
    smallest = 0
    smallest_ids = function() return redis.call('ZRANGE', prefix .. 'idx:live', 0, -1) end
  end
  if nofit then
    method = 'direct'
  elseif smallest <= DIRECT_MAX then
    method = 'direct'
    decide_among(smallest_ids())
  else
    method = 'threshold'
    min_price = extreme_price(false)
    if min_price ~= nil then
      max_price = extreme_price(true)
      -- The best score an unread cluster could reach: the free fraction at
      -- each resource cursor (cpu and mem share one, on their mean) less what
      -- the request takes from the largest allocatable, and a cost score of
      -- 100. (Walking the price sets too, to lower the cost part of the bound,
      -- read about twice as many clusters on the benchmark's data.)
      local free_cursors = {}
      local taken = 0 -- sum over requested resources of request / largest allocatable
      for _, res in ipairs(requested) do
        local top_alloc = redis.call('ZREVRANGE', prefix .. 'idx:alloc:' .. res, 0, 0, 'WITHSCORES')
        taken = taken + req[res] / tonumber(top_alloc[2] or '0')
      end
      local cm = req.cpu > 0 and req.mem > 0
      if cm then
        local cur = cursor(prefix .. 'idx:hfree:cm', true)
        cur.weight = 2
        free_cursors[#free_cursors + 1] = cur
      end
      for _, res in ipairs(requested) do
        if not (cm and (res == 'cpu' or res == 'mem')) then
          local cur = cursor(prefix .. 'idx:hfree:' .. res, true)
          cur.weight = 1
          free_cursors[#free_cursors + 1] = cur
        end
      end
      local scored = 0
      walk(free_cursors, function()
        for i = scored + 1, #fits do offer(fits[i]) end
        scored = #fits
        if #top < top_n then return false end
        local rs = -taken
        for _, cur in ipairs(free_cursors) do rs = rs + cur.weight * cur.last end
        local bound = w_res * (100 * rs / #requested) + w_cost * 100
        return top[#top].score > bound + 1e-9
      end)
      for i = scored + 1, #fits do offer(fits[i]) end
    end
  end
  if #top == 0 then
    -- Count the rejections from the index: live clusters lacking each resource
    -- or the labels (the requester is not a candidate, so it is not counted).
    local req_live = redis.call('ZSCORE', prefix .. 'idx:live', requester) and 1 or 0
    rejected.requester = req_live
    for _, res in ipairs(requested) do
      local n = redis.call('ZCOUNT', prefix .. 'idx:free:' .. res, '-inf', '(' .. req_str[res])
      if req_live == 1 and tonumber(redis.call('ZSCORE', prefix .. 'idx:free:' .. res, requester)) < req[res] then
        n = n - 1
      end
      rejected['insufficient_' .. res] = n
    end
    if selector then
      local matching = redis.call('SINTER', unpack(label_keys))
      local n = redis.call('ZCARD', prefix .. 'idx:live') - req_live - #matching
      for _, cid in ipairs(matching) do
        if cid == requester then n = n + 1 end
      end
      rejected.selector = n
    end
  end
end
rejected.stale = redis.call('ZCOUNT', prefix .. 'clusters', '-inf', '(' .. cut)

local considered = redis.call('ZCARD', prefix .. 'idx:live')
if scan_mode then considered = examined + rejected.requester end
local function record_audit(outcome, winner, score, candidates_json)
  redis.call('XADD', prefix .. 'audit', 'MAXLEN', '~', audit_max, '*',
    'reservation', id, 'requester', requester, 'outcome', outcome,
    'winner', winner, 'score', score,
    'request', cjson.encode({cpu = req_str.cpu, mem = req_str.mem, gpu = req_str.gpu, sto = req_str.sto,
      selector = ARGV[11], priority = ARGV[13], owner = ARGV[12]}),
    'weights', ARGV[9] .. '/' .. ARGV[10],
    'considered', considered, 'examined', examined, 'method', method,
    'candidates', candidates_json, 'rejected', cjson.encode(rejected), 'ts_ms', now)
end

if #top == 0 then
  wait()
  record_audit('nofit', '', '', '[]')
  return {'nofit', {}, '[]', cjson.encode(rejected)}
end

local function round2(x) return math.floor(x * 100 + 0.5) / 100 end
local report = {}
for i, c in ipairs(top) do
  report[i] = {cluster = c.cluster, score = round2(c.score), resource_score = round2(c.resource_score),
    cost_score = round2(c.cost_score), price = math.floor(c.price + 0.5)}
end
local candidates_json = cjson.encode(report)
local win = top[1]
local score = string.format('%.2f', win.score)

-- Lock the capacity and record the reservation.
local ck = prefix .. 'cluster:' .. win.cluster
for _, res in ipairs(requested) do
  redis.call('HINCRBY', ck, 'resv_' .. res, req_str[res])
end
index_free(prefix, win.cluster, requested)
local expires = now + duration_ms
local r = {requester = requester, target = win.cluster, phase = 'Reserved',
  cpu = req_str.cpu, mem = req_str.mem, gpu = req_str.gpu, sto = req_str.sto,
  expires_ms = tostring(expires)}
local hash = {'requester', requester, 'target', win.cluster, 'phase', 'Reserved',
  'cpu', r.cpu, 'mem', r.mem, 'gpu', r.gpu, 'sto', r.sto,
  'created_ms', tostring(now), 'expires_ms', r.expires_ms, 'duration_ms', ARGV[7],
  'score', score, 'price', tostring(math.floor(win.price + 0.5)),
  'owner', ARGV[12], 'priority', ARGV[13], 'selector', ARGV[11],
  'candidates', candidates_json}
redis.call('HSET', rk, unpack(hash))
redis.call('ZADD', prefix .. 'expiry', expires, id)
redis.call('SADD', prefix .. 'by-target:' .. win.cluster, id)
redis.call('SADD', prefix .. 'by-requester:' .. requester, id)
local ev = event_fields('Reserved', id, r)
emit(prefix, requester, events_max, ev)
emit(prefix, win.cluster, events_max, ev)
record_audit('reserved', win.cluster, score, candidates_json)
-- A waiting request placed at last: the next ones may now pass the priority gate.
if stop_waiting(prefix, id) then notify_waiters(prefix, events_max) end
return {'reserved', hash, candidates_json, cjson.encode(rejected)}
