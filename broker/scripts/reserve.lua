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
-- Reply: {outcome, reservation, candidates_json, rejections_json}
--   outcome     "reserved" (new), "replay" (id already decided: the first
--               answer), "conflict" (id belongs to another requester, or was
--               decided for other amounts),
--               "nofit" (nothing written but the audit entry)
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
local rejected = {stale = 0, requester = 0, selector = 0}
for _, res in ipairs(requested) do rejected['insufficient_' .. res] = 0 end
rejected.stale = redis.call('ZCOUNT', prefix .. 'clusters', '-inf', '(' .. (now - stale_ms))

-- First pass: the clusters that fit, with their resource score and price.
local fields = {'price_cpu', 'price_mem', 'price_gpu'}
for _, res in ipairs(requested) do
  fields[#fields + 1] = 'alloc_' .. res
  fields[#fields + 1] = 'used_' .. res
  fields[#fields + 1] = 'resv_' .. res
end
if selector then fields[#fields + 1] = 'labels' end

local fits = {}
local live = redis.call('ZRANGEBYSCORE', prefix .. 'clusters', now - stale_ms, '+inf')
for _, cid in ipairs(live) do
  if cid == requester then
    rejected.requester = rejected.requester + 1
  else
    local v = redis.call('HMGET', prefix .. 'cluster:' .. cid, unpack(fields))
    local ok, free_sum = true, 0
    for i, res in ipairs(requested) do
      local alloc = tonumber(v[3 * i + 1] or '0')
      local free = alloc - tonumber(v[3 * i + 2] or '0') - tonumber(v[3 * i + 3] or '0')
      if free < req[res] then
        rejected['insufficient_' .. res] = rejected['insufficient_' .. res] + 1
        ok = false
        break
      end
      free_sum = free_sum + (free - req[res]) / alloc
    end
    if ok and selector then
      local labels = {}
      if v[#fields] and v[#fields] ~= '' then labels = cjson.decode(v[#fields]) end
      for k, want in pairs(selector) do
        if labels[k] ~= want then ok = false break end
      end
      if not ok then rejected.selector = rejected.selector + 1 end
    end
    if ok then
      local price = req.cpu / 1000 * tonumber(v[1] or '0')
        + req.mem / 1073741824 * tonumber(v[2] or '0')
        + req.gpu * tonumber(v[3] or '0')
      fits[#fits + 1] = {cluster = cid, resource_score = 100 * free_sum / #requested, price = price}
    end
  end
end

local function record_audit(outcome, winner, score, candidates_json)
  redis.call('XADD', prefix .. 'audit', 'MAXLEN', '~', audit_max, '*',
    'reservation', id, 'requester', requester, 'outcome', outcome,
    'winner', winner, 'score', score,
    'request', cjson.encode({cpu = req_str.cpu, mem = req_str.mem, gpu = req_str.gpu, sto = req_str.sto,
      selector = ARGV[11], priority = ARGV[13], owner = ARGV[12]}),
    'weights', ARGV[9] .. '/' .. ARGV[10],
    'considered', #live, 'fitting', #fits,
    'candidates', candidates_json, 'rejected', cjson.encode(rejected), 'ts_ms', now)
end

if #fits == 0 then
  record_audit('nofit', '', '', '[]')
  return {'nofit', {}, '[]', cjson.encode(rejected)}
end

-- Second pass: cost score needs the price range over all fitting clusters.
local min_price, max_price = fits[1].price, fits[1].price
for _, c in ipairs(fits) do
  if c.price < min_price then min_price = c.price end
  if c.price > max_price then max_price = c.price end
end
local function better(a, b)
  if a.score ~= b.score then return a.score > b.score end
  return a.cluster < b.cluster
end
local top = {}
for _, c in ipairs(fits) do
  if max_price > min_price then
    c.cost_score = 100 * (max_price - c.price) / (max_price - min_price)
  else
    c.cost_score = 100
  end
  c.score = w_res * c.resource_score + w_cost * c.cost_score
  -- keep the best top_n in order (insertion into a short list)
  local pos = #top + 1
  while pos > 1 and better(c, top[pos - 1]) do pos = pos - 1 end
  if pos <= top_n then
    table.insert(top, pos, c)
    if #top > top_n then top[#top] = nil end
  end
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
return {'reserved', hash, candidates_json, cjson.encode(rejected)}
