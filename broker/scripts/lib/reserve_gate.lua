-- reserve_gate: the first stage of a reserve decision: what answers a
-- request before any cluster is judged (reserve.lua header: Fair share,
-- the priority gate), and the waiting list it joins when refused. Expects
-- reserve.lua's prefix, now, wait_ttl, so and audit_max above its directive.
-- @include reserve_batch

-- request_of decodes one request (reserve.lua ARGV) and adds what the
-- stages read: its qualified id and key, the amounts as numbers (req) and
-- the resources it asks for (requested).
local function request_of(raw)
  local q = cjson.decode(raw)
  q.lim = q.limits or {}
  q.qid = qualify(q.requester, q.id)
  q.rk = prefix .. 'resv:' .. q.qid
  q.req, q.requested = {}, {}
  for _, res in ipairs(RESOURCES) do
    q.req[res] = tonumber(q[res])
    if q.req[res] > 0 then q.requested[#q.requested + 1] = res end
  end
  return q
end

-- wait puts request q on the waiting list, or keeps it there (a retry
-- refreshes its lease but keeps its place); not for a request that may
-- not wait (v1). arrival_us orders it.
local function wait(q, arrival_us)
  if wait_ttl <= 0 or not q.wait then return end
  local wk = prefix .. 'wait:' .. q.qid
  local member = redis.call('HGET', wk, 'member')
  if not member then
    member = string.format('%018d', arrival_us) .. ':' .. q.qid
    local fields = {'requester', q.requester, 'cpu', q.cpu, 'mem', q.mem, 'gpu', q.gpu, 'sto', q.sto,
      'selector', q.selector, 'priority', q.priority, 'since_ms', now, 'member', member}
    for _, k in ipairs({'n', 'cpu', 'mem', 'gpu'}) do
      if q.lim[k] then
        fields[#fields + 1] = 'lim_' .. k
        fields[#fields + 1] = num(q.lim[k])
      end
    end
    redis.call('HSET', wk, unpack(fields))
    redis.call('ZADD', prefix .. 'waiting', -q.priority_n, member)
  end
  redis.call('PEXPIRE', wk, wait_ttl)
  redis.call('ZADD', prefix .. 'wait-due', now + wait_ttl, member)
end

-- fits_on tells whether cluster cid, not w's requester, can take waiting
-- request w now (need: its amounts, sel: its selector or nil).
local function fits_on(cid, w, need, sel)
  local rec = recs[cid]
  if cid == w.requester or not rec then return false end
  for _, res in ipairs(RESOURCES) do
    if need[res] > 0 and rec[FREE[res]] < need[res] then return false end
  end
  if sel then
    local l = labels_of[cid]
    for k, want in pairs(sel) do
      if l[k] ~= want then return false end
    end
  end
  return rec[REC.nodes] == 0 or node_fit(cid, rec, nil, need.cpu, need.mem, need.gpu, need.sto)
end

-- fits_somewhere tells whether waiting request w (its wait hash) could be
-- placed now: its requester is within its limits (those it waited with) and
-- some live cluster other than the requester can take it; it reads at most
-- 256 records, the clusters with the most free of w's scarcest resource
-- first. The index must be flushed.
local function fits_somewhere(w)
  local lim = {n = tonumber(w.lim_n), cpu = tonumber(w.lim_cpu), mem = tonumber(w.lim_mem), gpu = tonumber(w.lim_gpu)}
  if (lim.n or lim.cpu or lim.mem or lim.gpu) and over_limit(usage(w.requester), lim, w) then return false end
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
    load_recs(ids, sel ~= nil)
    for _, cid in ipairs(ids) do
      if fits_on(cid, w, need, sel) then return true end
    end
  end
  return false
end

-- defer answers request q, held back by waiting request wid (wait hash w).
local function defer(q, arrival_us, wid, w)
  tell_waiter(prefix, so, wid, w.requester, w.cpu, w.mem, w.gpu, w.sto)
  wait(q, arrival_us)
  local rejected_json = cjson.encode({waiting_higher_priority = 1})
  redis.call('XADD', prefix .. 'audit', 'MAXLEN', '~', audit_max, '*',
    'reservation', q.id, 'requester', q.requester, 'outcome', 'deferred', 'winner', '', 'score', '',
    'blocked_by', wid, 'priority', q.priority, 'blocked_priority', w.priority,
    'rejected', rejected_json, 'ts_ms', now)
  return {'nofit', {}, '[]', rejected_json, now}
end

-- priority_gate: a request may not take capacity while a waiting request of
-- higher priority could be placed now. It is deferred (and waits), and the
-- waiting request's requester is told to retry at once. Forgotten waiters
-- (their wait hash expired: the requester stopped retrying; or an older
-- member of a request that came back after its hash expired) met on the way
-- leave the list and hold nobody back; up to WAITERS_NOTIFIED live ones are
-- looked at. Returns the reply of a deferred request, else nil.
local function priority_gate(q, arrival_us)
  local looked, offset, flushed = 0, 0, false
  while looked < WAITERS_NOTIFIED do
    local higher = redis.call('ZRANGEBYSCORE', prefix .. 'waiting', '-inf', '(' .. (-q.priority_n),
      'LIMIT', offset, WAITERS_NOTIFIED)
    if #higher == 0 then return nil end
    if not flushed then
      flush()
      flushed = true
    end
    for _, m in ipairs(higher) do
      local wid = waiting_id(m)
      local w = to_map(redis.call('HGETALL', prefix .. 'wait:' .. wid))
      if not w.requester or w.member ~= m then
        forget_waiter(prefix, m) -- forgotten: its requester stopped retrying
      else
        offset = offset + 1
        looked = looked + 1
        if wid ~= q.qid and fits_somewhere(w) then return defer(q, arrival_us, wid, w) end
        if looked >= WAITERS_NOTIFIED then return nil end
      end
    end
  end
  return nil
end

-- gate answers what is decided before any cluster is judged, in order: the
-- requester's rate, a replay (or conflict) of an id already decided, its
-- limits, the priority ceiling (clamps q.priority; q.priority_asked keeps
-- the priority asked) and the priority gate. nil: go on to the candidates.
local function gate(q, arrival_us)
  local lim = q.lim
  local retry_ms = over_rate(q.requester, lim)
  if retry_ms then
    return {'limited', {}, '[]', cjson.encode({limit = 'rate', max = lim.rate, retry_after_ms = retry_ms}), now}
  end
  local existing = redis.call('HGETALL', q.rk)
  if #existing > 0 then
    local r = to_map(existing)
    if r.cpu ~= q.cpu or r.mem ~= q.mem or r.gpu ~= q.gpu or r.sto ~= q.sto then
      return {'conflict', {}, '[]', '{}', now}
    end
    with_live_end(prefix, q.qid, r, existing)
    with_access(prefix, r, existing)
    return {'replay', existing, r.candidates or '[]', '{}', now}
  end
  local over, max, used, asked = over_limit(usage(q.requester), lim, q.req)
  if over then
    if wait_ttl > 0 and stop_waiting(prefix, q.qid) then notify_waiters(prefix, so) end
    return {'limited', {}, '[]', cjson.encode({limit = over, max = max, used = used, asked = asked}), now}
  end
  if q.selector ~= '' then q.labels = cjson.decode(q.selector) end
  q.priority_n = tonumber(q.priority)
  if lim.priority and q.priority_n > lim.priority then
    q.priority_asked = q.priority
    q.priority_n = lim.priority
    q.priority = string.format('%d', lim.priority)
  end
  if wait_ttl > 0 then return priority_gate(q, arrival_us) end
  return nil
end
