-- reserve_candidates: finding the best clusters for a decision through the
-- candidate index (reserve.lua header), without reading every cluster:
-- "direct" when one requested resource (or the selector) leaves few
-- candidates, else "threshold", a walk of the index's sorted sets that stops
-- once the top candidates score above the best any unread cluster could
-- reach. A preference term's request (reserve_prefs.lua) names its
-- clusters (q.only, evaluated directly) or adds labels to the selector.
-- The test-only reference (scripts/reference) replaces this include
-- with a full scan of the same contract: candidates(d) fills d.top,
-- d.rejected, d.method and d.considered.
-- Expects reserve.lua's prefix, w_res, w_cost and top_n above its directive.
-- @include reserve_score

-- DIRECT_MAX: up to this many candidates are evaluated directly, without the threshold walk.
local DIRECT_MAX = 128

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
local function walk(d, cursors, done)
  while true do
    local exhausted = false
    for _, cur in ipairs(cursors) do
      evaluate_unseen(d, advance(cur))
      if cur.done then exhausted = true end
    end
    if exhausted or done() then return end
  end
end

-- rate_at is the rate of res at its price cursor (0: res not requested).
local function rate_at(cursors, res)
  for _, cur in ipairs(cursors) do
    if cur.res == res then return cur.last end
  end
  return 0
end

-- extreme_price finds the min (or max) price over the fitting clusters by
-- walking the price sets upwards (or downwards).
local function extreme_price(d, highest)
  local req, cursors = d.q.req, {}
  for _, res in ipairs(PRICED) do
    if req[res] > 0 then
      local cur = cursor(prefix .. 'idx:price:' .. res, highest)
      cur.res = res
      cursors[#cursors + 1] = cur
    end
  end
  if #cursors == 0 then return 0 end -- nothing requested has a price: every price is 0
  local function best()
    if highest then return d.fit_max end
    return d.fit_min
  end
  walk(d, cursors, function()
    local b = best()
    if b == nil then return false end
    local bound = price_of(req, rate_at(cursors, 'cpu'), rate_at(cursors, 'mem'), rate_at(cursors, 'gpu'))
    if highest then return b >= bound end
    return b <= bound
  end)
  return best()
end

local function price_margin(p) return 1e-12 * math.abs(p) + 1e-9 end

-- price_range finds the min and max price over the fitting clusters (nil:
-- none fits). A request for cpu and memory (no GPU) is priced per core at q
-- GiB per core: the idx:pcm sets of the nearest ratios below and above q
-- bound the price of every cluster not read yet (index.lua), within the
-- float rounding of those products, which price_margin absorbs. It returns
-- the cursor over the lower ratio's set (nil: none), which the score walk
-- goes on with.
local function price_range(d)
  local req = d.q.req
  local cores = req.cpu / 1000
  local pcm_lo, pcm_hi = nil, nil
  if req.cpu > 0 and req.mem > 0 and req.gpu == 0 then
    local q = (req.mem / 1073741824) / cores
    for _, r in ipairs(RATIOS) do
      if r <= q then pcm_lo = r end
      if r >= q and pcm_hi == nil then pcm_hi = r end
    end
  end
  local lo = nil
  if pcm_lo then
    lo = cursor(prefix .. 'idx:pcm:' .. pcm_lo, false)
    walk(d, {lo}, function()
      if d.fit_min == nil then return false end
      local bound = cores * lo.last
      return d.fit_min <= bound - price_margin(bound)
    end)
    d.min_price = d.fit_min
  else
    d.min_price = extreme_price(d, false)
  end
  if d.min_price == nil then return lo end
  if pcm_hi then
    local hi = cursor(prefix .. 'idx:pcm:' .. pcm_hi, true)
    walk(d, {hi}, function()
      local bound = cores * hi.last
      return d.fit_max >= bound + price_margin(bound)
    end)
    d.max_price = d.fit_max
  else
    d.max_price = extreme_price(d, true)
  end
  return lo
end

-- free_cursors are the cursors of the score walk over the free fractions
-- (cpu and mem share one, on their mean, weight 2), with taken_share, the
-- sum over requested resources of request / largest allocatable.
local function free_cursors(d)
  local req, cursors, taken_share = d.q.req, {}, 0
  for _, res in ipairs(d.q.requested) do
    local top_alloc = redis.call('ZREVRANGE', prefix .. 'idx:alloc:' .. res, 0, 0, 'WITHSCORES')
    taken_share = taken_share + req[res] / tonumber(top_alloc[2] or '0')
  end
  local cm = req.cpu > 0 and req.mem > 0
  if cm then
    local cur = cursor(prefix .. 'idx:hfree:cm', true)
    cur.weight = 2
    cursors[#cursors + 1] = cur
  end
  for _, res in ipairs(d.q.requested) do
    if not (cm and (res == 'cpu' or res == 'mem')) then
      local cur = cursor(prefix .. 'idx:hfree:' .. res, true)
      cur.weight = 1
      cursors[#cursors + 1] = cur
    end
  end
  return cursors, taken_share
end

-- threshold finds the price range, then walks the free fractions until the
-- top candidates score above the best score an unread cluster could reach:
-- the free fraction at each cursor less what the request takes from the
-- largest allocatable, and the cost score of the lowest price it could
-- have (at the price cursor lo; 100 without one).
local function threshold(d)
  local lo = price_range(d)
  if d.min_price == nil then return end
  local frees, taken_share = free_cursors(d)
  local cursors = {unpack(frees)}
  if lo then cursors[#cursors + 1] = lo end
  local cores, n_requested = d.q.req.cpu / 1000, #d.q.requested
  walk(d, cursors, function()
    score_fits(d)
    if #d.top < top_n then return false end
    local rs = -taken_share
    for _, cur in ipairs(frees) do rs = rs + cur.weight * cur.last end
    local cost = 100
    if lo and d.max_price > d.min_price then
      local lowest = cores * lo.last
      lowest = lowest - price_margin(lowest)
      cost = math.min(100, 100 * (d.max_price - lowest) / (d.max_price - d.min_price))
    end
    local bound = w_res * (100 * rs / n_requested) + w_cost * cost
    return d.top[#d.top].score > bound + 1e-9
  end)
  score_fits(d)
end

-- smallest_set finds, among the live clusters with enough of each requested
-- resource and those carrying the selector's labels, the smallest such set
-- (it holds every fitting cluster): its size, a function listing it, and
-- whether one is empty (nothing fits).
local function smallest_set(d)
  local q = d.q
  local smallest, list, nofit = nil, nil, false
  for _, res in ipairs(q.requested) do
    local n = redis.call('ZCOUNT', prefix .. 'idx:free:' .. res, q[res], '+inf')
    if n == 0 then nofit = true end
    if smallest == nil or n < smallest then
      smallest = n
      list = function() return redis.call('ZRANGEBYSCORE', prefix .. 'idx:free:' .. res, q[res], '+inf') end
    end
  end
  for _, key in ipairs(d.label_keys) do
    local n = redis.call('SCARD', key)
    if n == 0 then nofit = true end
    if smallest == nil or n < smallest then
      smallest = n
      list = function() return redis.call('SINTER', unpack(d.label_keys)) end
    end
  end
  if smallest == nil then -- nothing requested, no selector: every live cluster
    return 0, function() return redis.call('ZRANGE', prefix .. 'idx:live', 0, -1) end, false
  end
  return smallest, list, nofit
end

-- index_rejections counts, when nothing fits, the live clusters lacking each
-- resource or the labels, from the index (the requester is not a
-- candidate, so it is not counted). The index must be flushed.
local function index_rejections(d)
  local q, rejected = d.q, d.rejected
  local req_live = redis.call('ZSCORE', prefix .. 'idx:live', q.requester) and 1 or 0
  rejected.requester = req_live
  for _, res in ipairs(q.requested) do
    local n = redis.call('ZCOUNT', prefix .. 'idx:free:' .. res, '-inf', '(' .. q[res])
    if req_live == 1 and tonumber(redis.call('ZSCORE', prefix .. 'idx:free:' .. res, q.requester)) < q.req[res] then
      n = n - 1
    end
    rejected['insufficient_' .. res] = n
  end
  if q.labels then
    local matching = redis.call('SINTER', unpack(d.label_keys))
    local n = redis.call('ZCARD', prefix .. 'idx:live') - req_live - #matching
    for _, cid in ipairs(matching) do
      if cid == q.requester then n = n + 1 end
    end
    rejected.selector = n
  end
end

-- candidates fills d.top with the best candidates, best first, and the
-- rejections; d.method says how they were found.
local function candidates(d)
  d.label_keys = {}
  for k, want in pairs(d.q.labels or {}) do
    d.label_keys[#d.label_keys + 1] = prefix .. 'idx:label:' .. k .. '=' .. tostring(want)
  end
  if d.q.only then -- a preference term's clusters (reserve_prefs.lua): a few, evaluated directly
    d.method = 'direct'
    decide_among(d, d.q.only)
  else
    local smallest, list, nofit = smallest_set(d)
    if nofit then
      d.method = 'direct'
    elseif smallest <= DIRECT_MAX then
      d.method = 'direct'
      decide_among(d, list())
    else
      d.method = 'threshold'
      threshold(d)
    end
  end
  count_rejections(d)
  -- A preference term nothing fits is followed by another decision: its
  -- rejections are nobody's, not worth the recount.
  if #d.top == 0 and not d.q.term then
    flush()
    index_rejections(d)
  end
  local _, live = call_counts()
  d.considered = live
end
