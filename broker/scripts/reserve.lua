-- reserve: decide a batch of reservation requests, in order, exactly as one
-- call per request would: for each, choose the best live cluster, lock its
-- capacity and record the decision; idempotent by reservation id, scoped
-- per requester (the same id from two requesters is two reservations).
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
-- Per-node fit. A cluster that advertises nodes (lib.lua nodes:<id>) is a
-- candidate only if one of them can hold the whole request: its free
-- capacity (advertised allocatable - used - the broker's debit) is at least
-- the request for every requested resource. The reservation takes the best
-- fit among those nodes (least free gpu, then cpu, memory, storage, then
-- name: GPU nodes stay for GPU requests, large nodes for large requests) and
-- debits it; the reply, the reservation (field node), the events and the
-- audit name it. Scoring is unchanged (the cluster's totals). A cluster that
-- advertises no nodes (v1, older agents) is judged on its totals alone. The
-- record's node summary (lib.lua idx:rec) decides most fits; the node record
-- (idx:nrec) is read only when it cannot.
--
-- Finding the best clusters does not read every cluster: the candidate index
-- (lib.lua) yields them. When one requested resource (or the label selector)
-- leaves few candidates, those are evaluated directly ("direct"); otherwise a
-- threshold algorithm walks the index's sorted sets of free fraction
-- (descending), reading clusters in batches from idx:rec, and stops once the
-- top candidates score above the best any unread cluster could reach
-- ("threshold"). The min and max price over the fitting clusters, which
-- normalise the cost score, are found first by walking the price sets.
-- The test-only reference (package scripts/reference, never loaded by the
-- broker) evaluates every live cluster from its hashes instead ("scan"): what
-- the index is tested against and the baseline of the benchmarks. All three
-- give the same decision and candidates.
-- Rejections (reply and audit, counted only when nothing fits in index mode)
-- count, per reason, the live clusters that fail it; a cluster may count
-- under several reasons, except insufficient_node_fit, which counts the
-- clusters that pass every other check (totals, selector) but none of whose
-- nodes can hold the request (present only when not zero).
--
-- Batches. The broker sends together the requests that arrive while its
-- previous call is in flight (store.batcher), so a busy broker pays the
-- script's fixed costs (the prelude, the stale prune, the index records, read
-- once and kept decoded in `recs`) once per batch, and writes the keys no
-- later decision of the batch reads (capacity counters, index entries, the
-- expiry and by-* sets) once per key at the end (flush). A decision reads the
-- capacity the earlier ones took from `recs`; the index's sorted sets, not
-- yet rewritten, can only overstate free capacity, so what they yield is a
-- superset of the fitting clusters and their scores upper bounds: the walks
-- stay exact. Whatever reads the index or the hashes otherwise (the full
-- scan, the priority gate, the rejection counts) flushes first.
--
-- Fair share. Each request carries its requester's limits (the operator's,
-- broker/policy), checked before anything else and against what the earlier
-- requests of the batch took:
--   - reserve calls per second (with a burst), replays included: a generic
--     cell rate algorithm on P.."rate:"..requester (lib.lua). A call over the
--     rate is refused (outcome "limited", limit "rate") with the time until
--     the next one is allowed;
--   - live reservations and the cpu, memory and gpu they hold (P.."usage"): a
--     new reservation that would take its requester past one is refused
--     (outcome "limited", naming the limit) and never waits: it leaves the
--     waiting list if it was on it;
--   - a priority ceiling: a higher priority is clamped to it (the request is
--     decided, waits and is stored at the ceiling; the audit keeps the
--     priority asked). Clamped rather than refused: the request is still
--     served, in the order the operator allows.
-- A waiting request whose requester has since reached its limits cannot be
-- placed, so it defers nobody (fits_somewhere).
--
-- KEYS[1]  prefix ("rb:{b}:"): every key touched derives from it (lib.lua key layout; one hash slot)
-- ARGV[1]  stale threshold (ms)
-- ARGV[2]  weight of resources    ARGV[3]  weight of cost (floats, sum 1)
-- ARGV[4]  how many candidates to report
-- ARGV[5]  event stream max length  ARGV[6]  audit stream max length
-- ARGV[7]  how long a request nothing fits stays on the waiting list without
--          a retry (ms; 0: no waiting list); each retry of the same request
--          renews it
-- ARGV[8]  event stream TTL (ms)
-- ARGV[9..] the requests, 19 values each: reservation id, requester cluster
--          id, cpu (millicores), memory (bytes), gpu (count), ephemeral
--          storage (bytes), duration (ms, > 0), label selector as a JSON
--          object of required labels or "", owner (free text), priority
--          (integer), wait ("1": refused, it takes or keeps a place on the
--          waiting list; "0": it never does, e.g. v1 requests, whose seed
--          agents never retry an id; both pass the priority gate alike),
--          lease (ms; 0: a fixed duration. Otherwise the reservation is a
--          lease: it ends duration after the decision -- its hold time --
--          unless renewed, renew.lua), then the requester's limits ("": no
--          limit): live reservations, cpu (millicores), memory (bytes), gpu
--          (count), priority ceiling, reserve calls per second (a float), burst
--          (calls, >= 1; with the rate)
-- Reply: per request, in order, {outcome, reservation, candidates_json, rejections_json, now_ms}
--   outcome     "reserved" (new), "replay" (id already decided: the first
--               answer), "conflict" (the requester decided this id before
--               for other amounts),
--               "nofit" (no reservation written: the request waits, by
--               priority, see lib.lua, if its wait value is "1"; rejections {waiting_higher_priority=1}
--               when a waiting request of higher priority could be placed now),
--               "limited" (refused by its requester's limits, nothing written;
--               rejections {limit, max, used, asked, retry_after_ms}: limit
--               "rate" (retry_after_ms: when the next call is allowed),
--               "reservations", "cpu", "mem" or "gpu"),
--               "error" (the request raised an error, e.g. a malformed selector,
--               before writing anything; the batch's other requests are decided)
--   reservation flat field/value array of the reservation hash ({} if none);
--               field node names the node debited (absent: the target
--               advertises no nodes)
--   candidates  JSON array of the best candidates {cluster, score, resource_score, cost_score, price}
--   rejections  JSON object: how many clusters were excluded, by reason
--               (outcome "error": the error message instead)
--   now_ms      the Redis clock of the call (for the reservation's remaining time)
local prefix = KEYS[1]
local stale_ms = tonumber(ARGV[1])
local w_res, w_cost = tonumber(ARGV[2]), tonumber(ARGV[3])
local top_n = tonumber(ARGV[4])
local so, audit_max = stream_opts(ARGV[5], ARGV[8]), ARGV[6]
local wait_ttl = tonumber(ARGV[7])
local FIRST, WIDTH = 9, 19 -- where the requests start in ARGV, and the values of each
-- DIRECT_MAX: up to this many candidates are evaluated directly, without the threshold walk.
local DIRECT_MAX = 128

local started_us = now_us()
local now = math.floor(started_us / 1000)
local cut = now - stale_ms

-- Keep the candidate index to live clusters: drop those gone stale since the last call.
for _, cid in ipairs(redis.call('ZRANGEBYSCORE', prefix .. 'idx:live', '-inf', '(' .. cut)) do
  unindex_cluster(prefix, cid)
end

-- recs: the idx:rec records this call has read (cluster id -> the 11 numbers,
-- lib.lua), kept current as the batch takes capacity; labels: their labels.
local recs, labels_of = {}, {}
-- read_missing fills cache[cid] = decode(value) from hash key for the ids not
-- in cache yet, 128 fields per HMGET.
local function read_missing(key, ids, cache, decode)
  local missing = {}
  for _, cid in ipairs(ids) do
    if cache[cid] == nil then missing[#missing + 1] = cid end
  end
  for first = 1, #missing, 128 do
    local last = math.min(first + 127, #missing)
    local raw = redis.call('HMGET', key, unpack(missing, first, last))
    for i = 1, last - first + 1 do cache[missing[first + i - 1]] = decode(raw[i]) end
  end
end
local function decode_rec(raw)
  return raw and read_rec(raw) or false
end
local function load_recs(ids, with_labels)
  read_missing(prefix .. 'idx:rec', ids, recs, decode_rec)
  if with_labels then read_missing(prefix .. 'idx:labels', ids, labels_of, decode_labels) end
end

-- nraw: the idx:nrec values this call has read (false: none); nodes_of: the
-- node tables decoded from them (lib.lua decode_nrec), kept current as the
-- batch takes capacity (a cluster taken from is read from its table only).
local nraw, nodes_of = {}, {}
local function node_raw(cid)
  local raw = nraw[cid]
  if raw == nil then
    raw = redis.call('HGET', prefix .. 'idx:nrec', cid) or false
    nraw[cid] = raw
  end
  return raw
end
local function node_table(cid)
  local nt = nodes_of[cid]
  if nt == nil then
    local raw = node_raw(cid)
    nt = raw and decode_nrec(raw) or false
    nodes_of[cid] = nt
  end
  return nt
end

-- node_holds tells whether node i of table nt has c, m, g, s free (a zero amount is not asked for).
local function node_holds(nt, i, c, m, g, s)
  local f, b = nt.f, 4 * i - 4
  return (c == 0 or f[b + 1] >= c) and (m == 0 or f[b + 2] >= m) and (g == 0 or f[b + 3] >= g)
    and (s == 0 or f[b + 4] >= s)
end

-- summary_fit decides from a record's node summary whether one of its
-- nodes can hold c, m, g, s: true, false, or nil when it cannot tell.
local function summary_fit(r, c, m, g, s)
  if (c == 0 or r[13] >= c) and (m == 0 or r[14] >= m) and (g == 0 or r[15] >= g) and (s == 0 or r[16] >= s) then
    return true -- the node with the most free cpu holds it
  end
  if (c > 0 and c > r[17]) or (m > 0 and m > r[18]) or (g > 0 and g > r[19]) or (s > 0 and s > r[20]) then
    return false -- more than any node has free
  end
  return nil
end

-- node_scan tells whether one node of cluster cid can hold c, m, g, s by
-- reading its nodes: nt, its node table, when the caller has it (the full
-- scan reads it from the hashes); else the one kept by a batch that took
-- from it; else the packed node record, scanned in place, most free cpu
-- first, up to the first node that holds it (no table built).
local function node_scan(cid, nt, c, m, g, s)
  nt = nt or nodes_of[cid]
  if nt == nil and HAS_STRUCT then
    local raw = node_raw(cid)
    for pos = 3, 2 + 32 * struct.unpack('<H', raw), 32 do
      local fc, fm, fg, fs = struct.unpack('<dddd', raw, pos)
      if (c == 0 or fc >= c) and (m == 0 or fm >= m) and (g == 0 or fg >= g) and (s == 0 or fs >= s) then return true end
    end
    return false
  end
  nt = nt or node_table(cid)
  for i = 1, nt.n do
    if node_holds(nt, i, c, m, g, s) then return true end
  end
  return false
end

-- node_fit tells whether one node of cluster cid can hold c, m, g, s; r is
-- its record, whose node summary decides most cases.
local function node_fit(cid, r, nt, c, m, g, s)
  local decided = summary_fit(r, c, m, g, s)
  if decided ~= nil then return decided end
  return node_scan(cid, nt, c, m, g, s)
end

-- best_node names the node a reservation of c, m, g, s takes on a cluster
-- whose node table is nt: the best fit among those that hold it, the least
-- free gpu, then cpu, memory, storage, then name. Bin packing: a GPU node
-- stays for GPU requests and a large node for large requests.
local BEST_FIT_ORDER = {3, 1, 2, 4} -- gpu, cpu, mem, sto in a node table's 4 numbers
local function best_node(nt, c, m, g, s)
  local names, f = node_names(nt), nt.f
  local best = nil
  for i = 1, nt.n do
    if node_holds(nt, i, c, m, g, s) then
      if best == nil then
        best = i
      else
        local b, o = 4 * i - 4, 4 * best - 4
        for _, k in ipairs(BEST_FIT_ORDER) do
          if f[b + k] ~= f[o + k] then
            if f[b + k] < f[o + k] then best = i end
            o = nil
            break
          end
        end
        if o and names[i] < names[best] then best = i end
      end
    end
  end
  return best and names[best]
end

-- table_of turns a sorted node list (lib.lua node_list) into a node table.
local function table_of(list)
  local f, names = {}, {}
  for i, e in ipairs(list) do
    f[4 * i - 3], f[4 * i - 2], f[4 * i - 1], f[4 * i] = e.cpu, e.mem, e.gpu, e.sto
    names[i] = e.name
  end
  return {n = #list, f = f, names = names, list = list}
end

-- The test-only reference (package scripts/reference) puts its full scan here.
local reference_scan = nil

-- take_node debits node of cluster cid in its node table (re-sorted as
-- idx:nrec keeps it) and in its record's node summary.
local function take_node(cid, node, amounts, rec)
  local nt = node_table(cid)
  local names, list = node_names(nt), {}
  for i = 1, nt.n do
    local b = 4 * i - 4
    local e = {name = names[i], cpu = nt.f[b + 1], mem = nt.f[b + 2], gpu = nt.f[b + 3], sto = nt.f[b + 4]}
    if e.name == node then
      for _, res in ipairs(RESOURCES) do e[res] = e[res] - amounts[res] end
    end
    list[i] = e
  end
  sort_nodes(list)
  nodes_of[cid] = table_of(list)
  if rec then
    for i, x in ipairs(node_summary(list)) do rec[REC_NODES - 1 + i] = x end
  end
end

-- usage_of: the requesters' usage (lib.lua read_usage) this call has read,
-- kept current as the batch reserves; usage_dirty: those to write at flush.
-- rate_tat: the rate state (ms) of the requesters met; rate_dirty: to write.
local usage_of, usage_dirty, rate_tat, rate_dirty = {}, {}, {}, {}
local function usage(requester)
  local u = usage_of[requester]
  if not u then
    u = read_usage(prefix, requester)
    usage_of[requester] = u
  end
  return u
end

-- The writes held back until flush: capacity taken per cluster (in the order
-- first taken) and per node, expiry entries, and members of the by-* sets.
local taken, taken_order, node_taken, expiry_add, set_add = {}, {}, {}, {}, {}
local function take(cid, amounts, node)
  load_recs({cid})
  local rec = recs[cid]
  local t = taken[cid]
  if not t then
    t = {cpu = 0, mem = 0, gpu = 0, sto = 0}
    taken[cid] = t
    taken_order[#taken_order + 1] = cid
  end
  for _, res in ipairs(RESOURCES) do
    local at = REC_AT[res]
    t[res] = t[res] + amounts[res]
    if rec then rec[at + 1] = rec[at + 1] - amounts[res] end
  end
  if node then
    take_node(cid, node, amounts, rec)
    local per_node = node_taken[cid] or {}
    node_taken[cid] = per_node
    local d = per_node[node] or {cpu = 0, mem = 0, gpu = 0, sto = 0}
    per_node[node] = d
    for _, res in ipairs(RESOURCES) do d[res] = d[res] + amounts[res] end
  end
end
local function add_to_set(key, member)
  local members = set_add[key]
  if not members then
    members = {}
    set_add[key] = members
  end
  members[#members + 1] = member
end
local function flush()
  for _, cid in ipairs(taken_order) do
    local t = taken[cid]
    local ck = prefix .. 'cluster:' .. cid
    for _, res in ipairs(RESOURCES) do
      if t[res] > 0 then redis.call('HINCRBY', ck, 'resv_' .. res, string.format('%d', t[res])) end
    end
    local per_node = node_taken[cid]
    if per_node then
      for node, d in pairs(per_node) do node_debit(prefix, cid, node, d, 1) end
    end
    local rec = recs[cid]
    if HAS_STRUCT and rec then
      index_record(prefix, cid, rec, t)
      if per_node then redis.call('HSET', prefix .. 'idx:nrec', cid, pack_nrec(nodes_of[cid].list)) end
    else
      index_free(prefix, cid, RESOURCES)
    end
  end
  taken, taken_order, node_taken = {}, {}, {}
  if #expiry_add > 0 then
    redis.call('ZADD', prefix .. 'expiry', unpack(expiry_add))
    expiry_add = {}
  end
  for key, members in pairs(set_add) do
    redis.call('SADD', key, unpack(members))
  end
  set_add = {}
  for requester in pairs(usage_dirty) do write_usage(prefix, requester, usage_of[requester]) end
  usage_dirty = {}
  for requester in pairs(rate_dirty) do
    local tat = rate_tat[requester]
    redis.call('SET', prefix .. 'rate:' .. requester, num(tat), 'PX', math.max(1, math.ceil(tat - now)))
  end
  rate_dirty = {}
end

-- limits_at reads a request's limits from ARGV[at..at+6] (lim: n, cpu, mem,
-- gpu, priority, rate, burst; nil: none).
local function limits_at(at)
  local function opt(v) if v == '' then return nil end return tonumber(v) end
  return {n = opt(ARGV[at]), cpu = opt(ARGV[at + 1]), mem = opt(ARGV[at + 2]), gpu = opt(ARGV[at + 3]),
    priority = opt(ARGV[at + 4]), rate = opt(ARGV[at + 5]), burst = opt(ARGV[at + 6])}
end

-- over_rate counts one reserve call of requester against its rate (generic
-- cell rate algorithm: each call moves the theoretical arrival time tat one
-- interval on; a call is allowed while tat stays within burst intervals of
-- now). It returns nil when allowed, else the ms until a call would be.
local function over_rate(requester, lim)
  if not lim.rate then return nil end
  local tat = rate_tat[requester]
  if tat == nil then tat = tonumber(redis.call('GET', prefix .. 'rate:' .. requester) or '0') end
  local next_tat, wait = gcra_step(tat, now, lim.rate, lim.burst)
  if wait then
    rate_tat[requester] = tat
    return wait
  end
  rate_tat[requester] = next_tat
  rate_dirty[requester] = true
  return nil
end

-- Per call, not per request: nothing in a batch changes them.
local stale_count, live_count = nil, nil

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
      local rec = recs[cid]
      if cid ~= w.requester and rec then
        local ok = true
        for _, res in ipairs(RESOURCES) do
          if need[res] > 0 and rec[REC_AT[res] + 1] < need[res] then ok = false break end
        end
        if ok and sel then
          local l = labels_of[cid]
          for k, want in pairs(sel) do
            if l[k] ~= want then ok = false break end
          end
        end
        if ok and rec[REC_NODES] > 0 then ok = node_fit(cid, rec, nil, need.cpu, need.mem, need.gpu, need.sto) end
        if ok then return true end
      end
    end
  end
  return false
end

-- decide handles the request whose values start at ARGV[a] and returns its reply.
-- arrival_us orders it on the waiting list: the call's time, plus its place in the batch.
local function decide(a, arrival_us)
  local id, requester = ARGV[a], ARGV[a + 1]
  local req_str = {cpu = ARGV[a + 2], mem = ARGV[a + 3], gpu = ARGV[a + 4], sto = ARGV[a + 5]}
  local duration, selector_json, owner, priority_str = ARGV[a + 6], ARGV[a + 7], ARGV[a + 8], ARGV[a + 9]
  local may_wait = ARGV[a + 10] == '1'
  local lease = ARGV[a + 11]
  local lim = limits_at(a + 12)
  local qid = qualify(requester, id)
  local rk = prefix .. 'resv:' .. qid

  local retry_ms = over_rate(requester, lim)
  if retry_ms then
    return {'limited', {}, '[]', cjson.encode({limit = 'rate', max = lim.rate, retry_after_ms = retry_ms}), now}
  end

  local existing = redis.call('HGETALL', rk)
  if #existing > 0 then
    local r = to_map(existing)
    if r.cpu ~= req_str.cpu or r.mem ~= req_str.mem or r.gpu ~= req_str.gpu or r.sto ~= req_str.sto then
      return {'conflict', {}, '[]', '{}', now}
    end
    return {'replay', existing, r.candidates or '[]', '{}', now}
  end

  local req = {}
  local requested = {}
  for _, res in ipairs(RESOURCES) do
    req[res] = tonumber(req_str[res])
    if req[res] > 0 then requested[#requested + 1] = res end
  end
  local u = usage(requester)
  local over, max, used, asked = over_limit(u, lim, req)
  if over then
    if wait_ttl > 0 and stop_waiting(prefix, qid) then notify_waiters(prefix, so) end
    return {'limited', {}, '[]', cjson.encode({limit = over, max = max, used = used, asked = asked}), now}
  end
  local selector = nil
  if selector_json ~= '' then selector = cjson.decode(selector_json) end
  local priority = tonumber(priority_str)
  local asked_priority = nil -- set when the ceiling clamped it
  if lim.priority and priority > lim.priority then
    asked_priority = priority_str
    priority = lim.priority
    priority_str = string.format('%d', priority)
  end

  -- wait puts this request on the waiting list, or keeps it there (a retry
  -- refreshes its lease but keeps its place); not for a request that may
  -- not wait (v1).
  local function wait()
    if wait_ttl <= 0 or not may_wait then return end
    local wk = prefix .. 'wait:' .. qid
    local member = redis.call('HGET', wk, 'member')
    if not member then
      member = string.format('%018d', arrival_us) .. ':' .. qid
      local fields = {'requester', requester, 'cpu', req_str.cpu, 'mem', req_str.mem,
        'gpu', req_str.gpu, 'sto', req_str.sto, 'selector', selector_json, 'priority', priority_str,
        'since_ms', now, 'member', member}
      for _, k in ipairs({'n', 'cpu', 'mem', 'gpu'}) do
        if lim[k] then
          fields[#fields + 1] = 'lim_' .. k
          fields[#fields + 1] = num(lim[k])
        end
      end
      redis.call('HSET', wk, unpack(fields))
      redis.call('ZADD', prefix .. 'waiting', -priority, member)
    end
    redis.call('PEXPIRE', wk, wait_ttl)
    redis.call('ZADD', prefix .. 'wait-due', now + wait_ttl, member)
  end

  -- Priority: a request may not take capacity while a waiting request of
  -- higher priority could be placed now. It is deferred (and waits), and the
  -- waiting request's requester is told to retry at once.
  -- Forgotten waiters (their wait hash expired: the requester stopped
  -- retrying; or an older member of a request that came back after its hash
  -- expired) met on the way leave the list and hold nobody back; up to
  -- WAITERS_NOTIFIED live ones are looked at.
  if wait_ttl > 0 then
    local looked, offset, flushed = 0, 0, false
    while looked < WAITERS_NOTIFIED do
      local higher = redis.call('ZRANGEBYSCORE', prefix .. 'waiting', '-inf', '(' .. (-priority),
        'LIMIT', offset, WAITERS_NOTIFIED)
      if #higher == 0 then break end
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
          if wid ~= qid and fits_somewhere(w) then
            tell_waiter(prefix, so, wid, w.requester, w.cpu, w.mem, w.gpu, w.sto)
            wait()
            local rejected_json = cjson.encode({waiting_higher_priority = 1})
            redis.call('XADD', prefix .. 'audit', 'MAXLEN', '~', audit_max, '*',
              'reservation', id, 'requester', requester, 'outcome', 'deferred', 'winner', '', 'score', '',
              'blocked_by', wid, 'priority', priority_str, 'blocked_priority', w.priority,
              'rejected', rejected_json, 'ts_ms', now)
            return {'nofit', {}, '[]', rejected_json, now}
          end
          if looked >= WAITERS_NOTIFIED then break end
        end
      end
    end
  end

  -- judge decides whether one cluster can take the request, from its record r
  -- (the 20 numbers of idx:rec: alloc and free per resource, the three
  -- prices, the node summary), with a selector its labels, and (the full
  -- scan) its node table nt. A fitting cluster is appended to the fits
  -- (parallel arrays: no table per cluster, this runs for every cluster a
  -- decision reads); a failing one is counted, per reason.
  local rc, rm, rg, rst = req.cpu, req.mem, req.gpu, req.sto
  local n_requested = #requested
  local rejected = {stale = 0, requester = 0, selector = 0}
  local rej = {cpu = 0, mem = 0, gpu = 0, sto = 0, selector = 0, node = 0}
  local examined = 0
  local fit_n, fit_id, fit_rs, fit_price = 0, {}, {}, {}
  local fit_min, fit_max -- the lowest and highest price among the fits so far
  -- deferred: while evaluate_records judges a batch of records, the clusters
  -- whose node record must be read (their node summary cannot decide),
  -- judged again once those records are read together.
  local deferred = nil
  local function judge(cid, r, labels, nt)
    examined = examined + 1
    -- Same order as the requested resources (cpu, mem, gpu, sto): the same
    -- sum to the last bit whatever path evaluates the cluster.
    local ok, sum = true, 0
    if rc > 0 then
      local f = r[2]
      if f < rc then rej.cpu = rej.cpu + 1; ok = false else sum = sum + (f - rc) / r[1] end
    end
    if rm > 0 then
      local f = r[4]
      if f < rm then rej.mem = rej.mem + 1; ok = false elseif ok then sum = sum + (f - rm) / r[3] end
    end
    if rg > 0 then
      local f = r[6]
      if f < rg then rej.gpu = rej.gpu + 1; ok = false elseif ok then sum = sum + (f - rg) / r[5] end
    end
    if rst > 0 then
      local f = r[8]
      if f < rst then rej.sto = rej.sto + 1; ok = false elseif ok then sum = sum + (f - rst) / r[7] end
    end
    if selector then
      for k, want in pairs(selector) do
        if labels[k] ~= want then
          rej.selector = rej.selector + 1
          ok = false
          break
        end
      end
    end
    if not ok then return end
    if r[REC_NODES] > 0 and not ((rc == 0 or r[13] >= rc) and (rm == 0 or r[14] >= rm)
      and (rg == 0 or r[15] >= rg) and (rst == 0 or r[16] >= rst)) then
      -- Not the node with the most free cpu: perhaps another.
      local fits = summary_fit(r, rc, rm, rg, rst)
      if fits == nil then
        if deferred and nodes_of[cid] == nil and nraw[cid] == nil then
          deferred[#deferred + 1] = cid
          examined = examined - 1 -- counted when judged again
          return
        end
        fits = node_scan(cid, nt, rc, rm, rg, rst)
      end
      if not fits then
        rej.node = rej.node + 1
        return
      end
    end
    local price = price_of(req, r[9], r[10], r[11])
    fit_n = fit_n + 1
    fit_id[fit_n], fit_rs[fit_n], fit_price[fit_n] = cid, 100 * sum / n_requested, price
    if fit_min == nil or price < fit_min then fit_min = price end
    if fit_max == nil or price > fit_max then fit_max = price end
  end

  -- evaluate_records judges clusters from their records; the requester is
  -- never a candidate, and counts as a rejection when met. The node records
  -- of the clusters whose totals hold the request but whose node summary
  -- cannot decide are read together, then those clusters judged.
  local function evaluate_records(ids)
    load_recs(ids, selector ~= nil)
    deferred = {}
    for _, cid in ipairs(ids) do
      local r = recs[cid]
      if cid == requester then
        rejected.requester = 1
      elseif r then
        judge(cid, r, labels_of[cid])
      end
    end
    local later = deferred
    deferred = nil
    if #later > 0 then
      read_missing(prefix .. 'idx:nrec', later, nraw, function(raw) return raw or false end)
      for _, cid in ipairs(later) do judge(cid, recs[cid], labels_of[cid]) end
    end
  end

  -- The threshold walk meets a cluster in several sorted sets: seen judges it once.
  local seen = {}
  local function evaluate_unseen(ids)
    local todo = {}
    for _, cid in ipairs(ids) do
      if not seen[cid] then
        seen[cid] = true
        todo[#todo + 1] = cid
      end
    end
    evaluate_records(todo)
  end

  local min_price, max_price
  -- offer scores fit k and keeps the best top_n in order (score, then cluster id).
  local top = {}
  local function offer(k)
    local price, rs, cid = fit_price[k], fit_rs[k], fit_id[k]
    local cs = 100
    if max_price > min_price then cs = 100 * (max_price - price) / (max_price - min_price) end
    local score = w_res * rs + w_cost * cs
    local pos = #top + 1
    while pos > 1 do
      local t = top[pos - 1]
      if score > t.score or (score == t.score and cid < t.cluster) then pos = pos - 1 else break end
    end
    if pos <= top_n then
      table.insert(top, pos, {cluster = cid, score = score, resource_score = rs, cost_score = cs, price = price})
      if #top > top_n then top[#top] = nil end
    end
  end
  local function decide_among(ids)
    evaluate_records(ids)
    min_price, max_price = fit_min, fit_max
    for k = 1, fit_n do offer(k) end
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
        evaluate_unseen(advance(cur))
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
      if highest then return fit_max end
      return fit_min
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

  -- rejections counted by judge (the index recounts below when nothing fits)
  local function count_rejections()
    for _, res in ipairs(requested) do rejected['insufficient_' .. res] = rej[res] end
    rejected.selector = rej.selector
    -- Complete when nothing fits: every cluster passing the other checks was judged.
    if rej.node > 0 then rejected.insufficient_node_fit = rej.node end
  end

  local method
  local scan_nodes -- the reference scan's node tables
  if reference_scan then
    method = 'scan'
    scan_nodes = reference_scan(prefix, cut, requester, rejected, selector ~= nil, judge)
    min_price, max_price = fit_min, fit_max
    for k = 1, fit_n do offer(k) end
    count_rejections()
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
        label_keys[#label_keys + 1] = prefix .. 'idx:label:' .. k .. '=' .. tostring(want)
      end
    end
    if selector then
      for k, want in pairs(selector) do
        local key = prefix .. 'idx:label:' .. k .. '=' .. tostring(want)
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
      -- A request for cpu and memory (no GPU) is priced per core at q GiB per
      -- core: the idx:pcm sets of the nearest ratios below and above q bound
      -- the price of every cluster not read yet (lib.lua), within the float
      -- rounding of those products, which price_margin absorbs.
      local cores = rc / 1000
      local pcm_lo, pcm_hi = nil, nil
      if rc > 0 and rm > 0 and rg == 0 then
        local q = (rm / 1073741824) / cores
        for _, r in ipairs(RATIOS) do
          if r <= q then pcm_lo = r end
          if r >= q and pcm_hi == nil then pcm_hi = r end
        end
      end
      local function price_margin(p) return 1e-12 * math.abs(p) + 1e-9 end
      local lo = nil -- ascending over idx:pcm:<pcm_lo>; the threshold walk goes on with it
      if pcm_lo then
        lo = cursor(prefix .. 'idx:pcm:' .. pcm_lo, false)
        walk({lo}, function()
          if fit_min == nil then return false end
          local bound = cores * lo.last
          return fit_min <= bound - price_margin(bound)
        end)
        min_price = fit_min
      else
        min_price = extreme_price(false)
      end
      if min_price ~= nil then
        if pcm_hi then
          local hi = cursor(prefix .. 'idx:pcm:' .. pcm_hi, true)
          walk({hi}, function()
            local bound = cores * hi.last
            return fit_max >= bound + price_margin(bound)
          end)
          max_price = fit_max
        else
          max_price = extreme_price(true)
        end
        -- The best score an unread cluster could reach: the free fraction at
        -- each resource cursor (cpu and mem share one, on their mean) less what
        -- the request takes from the largest allocatable, and the cost score
        -- of the lowest price it could have (at the price cursor; 100 without one).
        local free_cursors = {}
        local taken_share = 0 -- sum over requested resources of request / largest allocatable
        for _, res in ipairs(requested) do
          local top_alloc = redis.call('ZREVRANGE', prefix .. 'idx:alloc:' .. res, 0, 0, 'WITHSCORES')
          taken_share = taken_share + req[res] / tonumber(top_alloc[2] or '0')
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
        local cursors = {unpack(free_cursors)}
        if lo then cursors[#cursors + 1] = lo end
        local scored = 0
        walk(cursors, function()
          for k = scored + 1, fit_n do offer(k) end
          scored = fit_n
          if #top < top_n then return false end
          local rs = -taken_share
          for _, cur in ipairs(free_cursors) do rs = rs + cur.weight * cur.last end
          local cost = 100
          if lo and max_price > min_price then
            local lowest = cores * lo.last
            lowest = lowest - price_margin(lowest)
            cost = math.min(100, 100 * (max_price - lowest) / (max_price - min_price))
          end
          local bound = w_res * (100 * rs / n_requested) + w_cost * cost
          return top[#top].score > bound + 1e-9
        end)
        for k = scored + 1, fit_n do offer(k) end
      end
    end
    count_rejections()
    if #top == 0 then
      -- Count the rejections from the index: live clusters lacking each resource
      -- or the labels (the requester is not a candidate, so it is not counted).
      flush()
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
  if stale_count == nil then
    stale_count = redis.call('ZCOUNT', prefix .. 'clusters', '-inf', '(' .. cut)
    live_count = redis.call('ZCARD', prefix .. 'idx:live')
  end
  rejected.stale = stale_count

  local considered = live_count
  if reference_scan then considered = examined + rejected.requester end
  local function record_audit(outcome, winner, score, candidates_json, node)
    redis.call('XADD', prefix .. 'audit', 'MAXLEN', '~', audit_max, '*',
      'reservation', id, 'requester', requester, 'outcome', outcome,
      'winner', winner, 'node', node, 'score', score,
      'request', cjson.encode({cpu = req_str.cpu, mem = req_str.mem, gpu = req_str.gpu, sto = req_str.sto,
        selector = selector_json, priority = priority_str, priority_asked = asked_priority, owner = owner}),
      'weights', ARGV[2] .. '/' .. ARGV[3],
      'considered', considered, 'examined', examined, 'method', method,
      'candidates', candidates_json, 'rejected', cjson.encode(rejected), 'ts_ms', now)
  end

  if #top == 0 then
    wait()
    record_audit('nofit', '', '', '[]', '')
    return {'nofit', {}, '[]', cjson.encode(rejected), now}
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

  -- The node it takes, on a cluster that advertises nodes.
  local node = nil
  local nt = nil
  if scan_nodes then
    nt = scan_nodes[win.cluster]
  elseif recs[win.cluster][REC_NODES] > 0 then
    nt = node_table(win.cluster)
  end
  if nt then node = best_node(nt, rc, rm, rg, rst) end

  -- Lock the capacity (written at flush) and record the reservation.
  take(win.cluster, req, node)
  u.n = u.n + 1
  for _, res in ipairs(RESOURCES) do u[res] = u[res] + req[res] end
  usage_dirty[requester] = true
  if reference_scan then flush() end -- the reference reads the hashes: keep them current
  local expires = now + tonumber(duration)
  local r = {requester = requester, target = win.cluster, phase = 'Reserved',
    cpu = req_str.cpu, mem = req_str.mem, gpu = req_str.gpu, sto = req_str.sto,
    expires_ms = tostring(expires), node = node}
  local hash = {'requester', requester, 'target', win.cluster, 'phase', 'Reserved',
    'cpu', r.cpu, 'mem', r.mem, 'gpu', r.gpu, 'sto', r.sto,
    'created_ms', tostring(now), 'expires_ms', r.expires_ms, 'duration_ms', duration,
    'score', score, 'price', tostring(math.floor(win.price + 0.5)),
    'owner', owner, 'priority', priority_str, 'selector', selector_json,
    'candidates', candidates_json}
  if tonumber(lease) > 0 then
    hash[#hash + 1] = 'lease_ms'
    hash[#hash + 1] = lease
  end
  if node then
    hash[#hash + 1] = 'node'
    hash[#hash + 1] = node
  end
  redis.call('HSET', rk, unpack(hash))
  expiry_add[#expiry_add + 1] = expires
  expiry_add[#expiry_add + 1] = qid
  add_to_set(prefix .. 'by-target:' .. win.cluster, qid)
  add_to_set(prefix .. 'by-requester:' .. requester, qid)
  local ev = event_fields('Reserved', id, r, now)
  emit(prefix, requester, so, ev)
  emit(prefix, win.cluster, so, ev)
  record_audit('reserved', win.cluster, score, candidates_json, node or '')
  -- A waiting request placed at last: the next ones may now pass the priority gate.
  if stop_waiting(prefix, qid) then notify_waiters(prefix, so) end
  return {'reserved', hash, candidates_json, cjson.encode(rejected), now}
end

-- A request that raises an error (bad input that got past the broker) gets
-- it as its reply; the others are still decided, and the capacity the batch
-- took is still written: a reservation is recorded only after its capacity
-- is taken, so nothing recorded goes unaccounted.
local replies = {}
for a = FIRST, #ARGV, WIDTH do
  local ok, reply = pcall(decide, a, started_us + #replies)
  if not ok then reply = {'error', {}, '[]', tostring(reply), now} end
  replies[#replies + 1] = reply
end
flush()
return replies
