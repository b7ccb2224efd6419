-- advertise: upsert one cluster's advertisement, mark it seen now and
-- (re)index it as a live candidate (see index.lua).
-- It never writes the broker-owned fields (resv_*, seen_ms): only the fields
-- listed in ADVERTISED below are accepted, whatever the caller sends.
--
-- Nodes (per-node fit, docs/architecture.md): the nodes the cluster lists
-- replace the ones it listed before (none: the cluster is judged on its
-- totals only). Their used amounts include the pods of reservations, and the
-- reservation ids listed are those pods': the broker stops debiting a listed
-- reservation's node (its pod is in the figures now) and debits it again
-- when a later advertisement no longer lists it while it is still live.
--
-- A heartbeat, an advertisement that changes nothing a decision reads (the
-- cluster is in the candidate index, and its fields, its nodes' figures and
-- the debits its listed reservations leave are those stored), refreshes the
-- cluster's liveness only (seen_ms, P.."clusters", P.."idx:live"): no index
-- rewrite, no waiting request told.
--
-- KEYS[1]  prefix ("rb:{b}:"): every key touched derives from it (key layout: lib/*.lua; one hash slot)
-- ARGV[1]  cluster id
-- ARGV[2]  event stream max length (for the waiting requests it notifies)
-- ARGV[3]  event stream TTL (ms)
-- ARGV[4]  digest of this advertisement (the store's, of all the arguments
--          below): stored as the cluster's `digest`, which a heartbeat names
--          (heartbeat.lua)
-- ARGV[5]  N, how many nodes follow (0: none advertised)
-- ARGV[6 .. 5+9N]  per node: name, alloc_cpu, alloc_mem, alloc_gpu, alloc_sto,
--          used_cpu, used_mem, used_gpu, used_sto (integers as decimal strings)
-- ARGV[6+9N]  M, how many reservation ids follow
-- ARGV[7+9N .. 6+9N+M]  ids of the reservations whose pods the node figures include
-- ARGV[7+9N+M ..] field, value, field, value, ... (integers as decimal strings)
-- Reply:   {seen_ms, resv_cpu, resv_mem, resv_gpu, resv_sto, node_debits}
--          node_debits: flat node, "cpu=.. mem=.. gpu=.. sto=.." array of node-resv
--          or an error reply "ERR unknown field <f>" / "ERR bad node name <n>" (nothing written)
-- @include index
-- @include waiting
local ADVERTISED = {}
for _, res in ipairs(RESOURCES) do
  ADVERTISED['cap_' .. res] = true
  ADVERTISED['alloc_' .. res] = true
  ADVERTISED['used_' .. res] = true
end
for _, f in ipairs({'price_cpu', 'price_mem', 'price_gpu', 'currency', 'endpoint', 'name', 'labels'}) do
  ADVERTISED[f] = true
end

-- FIXED: the fields of the index's entries other than free capacity
-- (index.lua index_cluster), labels last.
local FIXED = {'alloc_cpu', 'alloc_mem', 'alloc_gpu', 'alloc_sto', 'price_cpu', 'price_mem', 'price_gpu', 'labels'}

local prefix, id, digest = KEYS[1], ARGV[1], ARGV[4]
local n_nodes = tonumber(ARGV[5])
local FIRST_NODE = 6 -- the first node's first argument
local node_fields = {} -- the node hash's fields and values
for i = FIRST_NODE, FIRST_NODE - 1 + 9 * n_nodes, 9 do
  local name = ARGV[i]
  -- Names are DNS subdomains (the API checks); a space would break idx:nrec.
  if not string.match(name, '^[%w%.%-]+$') then
    return redis.error_reply('ERR bad node name ' .. tostring(name))
  end
  node_fields[#node_fields + 1] = name
  node_fields[#node_fields + 1] = string.format(
    'alloc_cpu=%s alloc_mem=%s alloc_gpu=%s alloc_sto=%s used_cpu=%s used_mem=%s used_gpu=%s used_sto=%s',
    ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4], ARGV[i + 5], ARGV[i + 6], ARGV[i + 7], ARGV[i + 8])
end

-- advertised is the node hash's content as node_list reads it (nodes.lua),
-- from the arguments rather than read back (only to index the cluster).
local function advertised()
  local nodes = {}
  for i = FIRST_NODE, FIRST_NODE - 1 + 9 * n_nodes, 9 do
    nodes[#nodes + 1] = {ARGV[i], {
      alloc_cpu = tonumber(ARGV[i + 1]), alloc_mem = tonumber(ARGV[i + 2]), alloc_gpu = tonumber(ARGV[i + 3]),
      alloc_sto = tonumber(ARGV[i + 4]), used_cpu = tonumber(ARGV[i + 5]), used_mem = tonumber(ARGV[i + 6]),
      used_gpu = tonumber(ARGV[i + 7]), used_sto = tonumber(ARGV[i + 8])}}
  end
  return nodes
end
local at = FIRST_NODE + 9 * n_nodes
local listed_ids = {}
for i = at + 1, at + tonumber(ARGV[at]) do listed_ids[#listed_ids + 1] = ARGV[i] end
local fields = {}
for i = at + 1 + #listed_ids, #ARGV, 2 do
  if not ADVERTISED[ARGV[i]] then
    return redis.error_reply('ERR unknown field ' .. tostring(ARGV[i]))
  end
  fields[#fields + 1] = ARGV[i]
  fields[#fields + 1] = ARGV[i + 1]
end

local now = now_ms()
local ck = prefix .. 'cluster:' .. id
local nk = prefix .. 'nodes:' .. id

-- The listed reservations, decided before anything is written: the broker's
-- debit goes for those newly listed and comes back for those no longer listed
-- (still live: an ended one has left the set). Only a live reservation of
-- this cluster placed on a node counts; an id listed twice counts once.
local lk = prefix .. 'node-listed:' .. id
local was = {}
for _, rid in ipairs(redis.call('SMEMBERS', lk)) do was[rid] = true end
local function placed(rid)
  local v = redis.call('HMGET', prefix .. 'resv:' .. rid, 'target', 'phase', 'node', 'cpu', 'mem', 'gpu', 'sto')
  if v[1] ~= id or not is_live(v[2]) or not v[3] or v[3] == '' then return nil end
  return v[3], {cpu = v[4], mem = v[5], gpu = v[6], sto = v[7]}
end
local is_listed, newly_listed, unlisted = {}, {}, {}
local debits_move = false
for _, rid in ipairs(listed_ids) do
  if not was[rid] and not is_listed[rid] then
    local node, amounts = placed(rid)
    if node then
      newly_listed[#newly_listed + 1] = {rid = rid, node = node, amounts = amounts}
      debits_move = true
    end
  end
  is_listed[rid] = true
end
for rid in pairs(was) do
  if not is_listed[rid] then
    local node, amounts = placed(rid)
    unlisted[#unlisted + 1] = {rid = rid, node = node, amounts = amounts}
    if node then debits_move = true end
  end
end

-- repeats tells whether the advertisement's fields and nodes are the very
-- strings the cluster's hash and node hash hold.
local function repeats()
  local names, sent = {'nodes'}, {tostring(n_nodes)}
  for i = 1, #fields, 2 do
    names[#names + 1] = fields[i]
    sent[#sent + 1] = fields[i + 1]
  end
  local held = redis.call('HMGET', ck, unpack(names))
  for i = 1, #sent do
    if held[i] ~= sent[i] then return false end
  end
  if n_nodes == 0 then return true end
  local held_nodes = redis.call('HGETALL', nk)
  if #held_nodes ~= #node_fields then return false end
  held_nodes = to_map(held_nodes)
  for i = 1, #node_fields, 2 do
    if held_nodes[node_fields[i]] ~= node_fields[i + 1] then return false end
  end
  return true
end

-- A heartbeat: the cluster is in the candidate index and nothing a decision
-- reads changes (its fields, its nodes, its nodes' debits), so the index
-- stays as it is and nobody waiting is told; only its liveness is refreshed.
-- A cluster out of the index (new, or dropped as stale by a decision) is
-- indexed again whatever it sends.
local in_index = redis.call('ZSCORE', prefix .. 'idx:live', id)
local heartbeat = in_index and not debits_move and repeats()

local old_labels = nil -- the labels the candidate index holds for this cluster
local old_free = nil   -- its free capacity, to tell whether the advertisement adds some
local old_nodes = nil  -- and its nodes' (name -> node table index), from idx:nrec
local old_nt = nil
local fixed_held = false -- the index holds its allocatable, prices and labels as sent
if in_index and not heartbeat then
  local held = redis.call('HMGET', ck, unpack(FIXED))
  old_labels = held[#FIXED]
  local sent = to_map(fields)
  fixed_held = true
  for i, f in ipairs(FIXED) do
    if sent[f] ~= nil and sent[f] ~= held[i] then fixed_held = false end
  end
  old_free = {}
  for _, res in ipairs(RESOURCES) do
    old_free[res] = tonumber(redis.call('ZSCORE', prefix .. 'idx:free:' .. res, id))
  end
  local raw = redis.call('HGET', prefix .. 'idx:nrec', id)
  if raw then
    old_nt = decode_nrec(raw)
    old_nodes = {}
    for i, name in ipairs(node_names(old_nt)) do old_nodes[name] = i end
  end
end
-- short: the resources whose reserved amount an advertisement left above
-- what the cluster offers (alloc - used): a node gone NotReady or cordoned,
-- local pods started. No decision does that (one takes only free capacity),
-- so the invariant excuses a negative free for a resource only while it is
-- marked here and its reserved amount is no more than when it was marked.
-- A resource is marked when an advertisement lowers its offer below what is
-- reserved, stays marked while the offer stays below (with the smaller of
-- the amounts), and is cleared once the offer covers what is reserved.
local OFFER = {}
for _, res in ipairs(RESOURCES) do
  OFFER[#OFFER + 1] = 'alloc_' .. res
  OFFER[#OFFER + 1] = 'used_' .. res
  OFFER[#OFFER + 1] = 'resv_' .. res
end
OFFER[#OFFER + 1] = 'short'
-- offer reads the cluster's offer and reserved amount by resource, and its
-- short marks.
local function offer()
  local v = redis.call('HMGET', ck, unpack(OFFER))
  local out = {}
  for i, res in ipairs(RESOURCES) do
    out[res] = {offer = (tonumber(v[3 * i - 2]) or 0) - (tonumber(v[3 * i - 1]) or 0), resv = tonumber(v[3 * i]) or 0}
  end
  return out, parse_amounts(v[#OFFER] or nil)
end
local function mark_short(before, was_short)
  local after, marks = offer(), {}
  for _, res in ipairs(RESOURCES) do
    local a, marked = after[res], was_short[res]
    if a.offer < a.resv and (marked or a.offer < before[res].offer) then
      marks[#marks + 1] = res .. '=' .. math.min(marked or a.resv, a.resv)
    end
  end
  if #marks > 0 then
    redis.call('HSET', ck, 'short', table.concat(marks, ' '))
  else
    redis.call('HDEL', ck, 'short')
  end
end

if heartbeat then
  redis.call('HSET', ck, 'seen_ms', now, 'digest', digest)
else
  local before, was_short = offer()
  redis.call('HSET', ck, 'seen_ms', now, 'digest', digest, 'nodes', n_nodes, unpack(fields))
  mark_short(before, was_short)
  redis.call('HSETNX', ck, 'first_seen_ms', now)
  redis.call('DEL', nk)
  if #node_fields > 0 then redis.call('HSET', nk, unpack(node_fields)) end
end
redis.call('ZADD', prefix .. 'clusters', now, id)

for _, r in ipairs(newly_listed) do
  node_debit(prefix, id, r.node, r.amounts, -1)
  redis.call('SADD', lk, r.rid)
end
for _, r in ipairs(unlisted) do
  if r.node then node_debit(prefix, id, r.node, r.amounts, 1) end
  redis.call('SREM', lk, r.rid)
end

if heartbeat then
  redis.call('ZADD', prefix .. 'idx:live', now, id)
else
  index_cluster(prefix, id, now, old_labels, advertised(), fixed_held)
  -- A cluster back from stale, or with more free capacity than before (in
  -- total or on a node), may take a waiting request: tell the first ones.
  local grew = old_free == nil or old_labels ~= redis.call('HGET', ck, 'labels')
  if not grew then
    for _, res in ipairs(RESOURCES) do
      if tonumber(redis.call('ZSCORE', prefix .. 'idx:free:' .. res, id)) > old_free[res] then grew = true end
    end
  end
  if not grew then
    local raw = redis.call('HGET', prefix .. 'idx:nrec', id)
    if old_nt and not raw then grew = true end -- judged on its totals from now on
    if raw then
      local nt = decode_nrec(raw)
      for i, name in ipairs(node_names(nt)) do
        local o = old_nodes and old_nodes[name]
        for k = 4 * i - 3, 4 * i do
          if not o or nt.f[k] > old_nt.f[4 * o - 4 * i + k] then grew = true end
        end
      end
    end
  end
  if grew then notify_waiters(prefix, stream_opts(ARGV[2], ARGV[3])) end
end
local resv = redis.call('HMGET', ck, 'resv_cpu', 'resv_mem', 'resv_gpu', 'resv_sto')
return {tostring(now), resv[1] or '0', resv[2] or '0', resv[3] or '0', resv[4] or '0',
  redis.call('HGETALL', prefix .. 'node-resv:' .. id)}
