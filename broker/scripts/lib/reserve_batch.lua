-- reserve_batch: what one reserve.lua call keeps across the requests of its
-- batch: the index records it has read, decoded and kept current as the
-- batch takes capacity (recs, labels_of, nodes_of), the requesters' usage
-- and rate state, and the writes held back until flush (reserve.lua header:
-- Batches). Expects reserve.lua's prefix, now and cut above its directive.
-- @include reservations

-- recs: the idx:rec records this call has read (records.lua; false: none);
-- labels_of: their labels. read_missing fills cache[cid] = decode(value)
-- from hash key for the ids not in cache yet, 128 fields per HMGET.
local recs, labels_of = {}, {}
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
-- node tables decoded from them, kept current as the batch takes capacity
-- (a cluster taken from is read from its table only).
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
  local f = nt.f
  for b = 0, 4 * nt.n - 4, 4 do
    if (c == 0 or f[b + 1] >= c) and (m == 0 or f[b + 2] >= m) and (g == 0 or f[b + 3] >= g)
      and (s == 0 or f[b + 4] >= s) then return true end
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

-- usage_of: the requesters' usage (limits.lua read_usage) this call has
-- read, kept current as the batch reserves; usage_dirty: those to write at
-- flush. rate_tat: the rate state (ms) of the requesters met; rate_dirty: to write.
local usage_of, usage_dirty, rate_tat, rate_dirty = {}, {}, {}, {}
local function usage(requester)
  local u = usage_of[requester]
  if not u then
    u = read_usage(prefix, requester)
    usage_of[requester] = u
  end
  return u
end

-- over_rate counts one reserve call of requester against its rate
-- (limits.lua gcra_step): nil when allowed, else the ms until a call would be.
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

-- The writes held back until flush: capacity taken per cluster (in the order
-- first taken) and per node, expiry entries, and members of the by-* sets.
local taken, taken_order, node_taken, expiry_add, set_add = {}, {}, {}, {}, {}
local from_hashes = {} -- clusters whose index flush writes from their hashes (index_free)

-- take_node debits node of cluster cid in its node table (kept in the
-- order idx:nrec keeps) and in its record's node summary.
local function take_node(cid, node, amounts, rec)
  local nt = node_table(cid)
  local i = nt and node_index(nt, node)
  if not i then -- the node record does not hold it: flush refreshes the cluster from its hashes
    from_hashes[cid] = true
    return
  end
  move_node(nt, i, amounts, -1)
  if rec then summarize_table(rec, nt) end
end

-- take takes amounts from cluster cid (and its node, if any) for the rest
-- of the batch, and holds the writes back until flush.
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
    t[res] = t[res] + amounts[res]
    if rec then rec[FREE[res]] = rec[FREE[res]] - amounts[res] end
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

-- flush_taken writes the capacity the batch took, per cluster and node,
-- and the index entries it changed.
local function flush_taken()
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
    if HAS_STRUCT and rec and not from_hashes[cid] then
      index_record(prefix, cid, rec, t)
      if per_node then redis.call('HSET', prefix .. 'idx:nrec', cid, pack_table(nodes_of[cid])) end
    else
      index_free(prefix, cid, RESOURCES)
    end
  end
  taken, taken_order, node_taken, from_hashes = {}, {}, {}, {}
end

-- flush writes everything held back: whatever reads the index or the
-- hashes otherwise calls it first.
local function flush()
  flush_taken()
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

-- call_counts: the stale and live clusters, per call, not per request:
-- nothing in a batch changes them.
local stale_count, live_n = nil, nil
local function call_counts()
  if stale_count == nil then
    stale_count = redis.call('ZCOUNT', prefix .. 'clusters', '-inf', '(' .. cut)
    live_n = redis.call('ZCARD', prefix .. 'idx:live')
  end
  return stale_count, live_n
end
