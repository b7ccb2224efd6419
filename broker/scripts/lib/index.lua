-- index: the candidate index, derived from the cluster hashes, live clusters
-- only (reserve drops the clusters that went stale, advertise adds them back):
--   P.."idx:live"           zset    cluster id -> seen_ms
--   P.."idx:free:"..r       zset    cluster id -> free r = alloc - used - resv
--   P.."idx:hfree:"..r      zset    cluster id -> free r / alloc r (0 when alloc is 0)
--   P.."idx:hfree:cm"       zset    cluster id -> mean of the cpu and mem free fractions
--                                   (every API request asks for both: one walk instead of two)
--   P.."idx:rec"            hash    cluster id -> its record (records.lua): free and
--                                   allocatable capacity, prices, node summary
--   P.."idx:nrec"           hash    cluster id -> its advertised nodes' free capacity (advertised
--                                   free less the broker's debit), most free cpu first: a count
--                                   (uint16), 4 doubles per node (cpu, mem, gpu, sto), the names
--                                   separated by spaces (JSON {names, f} without struct); read
--                                   only when the record's summary cannot decide a fit, and
--                                   for the winner (to choose its node)
--   P.."idx:labels"         hash    cluster id -> labels JSON (read only for a label selector)
--   P.."idx:alloc:"..r      zset    cluster id -> alloc r
--   P.."idx:price:"..r      zset    cluster id -> price of r (cpu, mem, gpu)
--   P.."idx:label:"..k.."="..v  set  cluster ids carrying that label
--   P.."idx:pcm:"..r        zset    cluster id -> price_cpu + r * price_mem, for r in RATIOS:
--                                   the price of a core with r GiB; a request of q GiB
--                                   per core costs cores * (price_cpu + q * price_mem), at
--                                   least cores * pcm:r for r <= q and at most for r >= q
--                                   (prices are not negative), so these sets bound the
--                                   price of unread clusters for the threshold walk
--   P.."idx:version"        string  INDEX_VERSION once the index has been built (reindex.lua)
--   P.."idx:feed"           hash    seq: how many changes of records and labels there have
--                                   been; epoch: the Redis time of the first (the numbering's name)
--   P.."idx:changes"        zset    cluster id -> the seq of its record's last change (or
--                                   removal): what the replicas' views read from (store/view.go)
-- @include nodes

-- INDEX_VERSION names the index layout; a Redis holding another is reindexed at start-up.
-- 4: reservation keys and members carry the requester (qualified ids, core.lua);
-- reindex.lua moves the live reservations of an older layout.
-- 5: the requesters' usage and the waiting list's due times (limits.lua,
-- waiting.lua), which reindex.lua builds from the live reservations and the
-- waiting list.
local INDEX_VERSION = '5'

-- RATIOS are the GiB-per-core ratios of the idx:pcm sets.
local RATIOS = {0, 0.5, 1, 2, 4, 8, 16, 32, 64}

-- PRICED are the resources that have a price.
local PRICED = {'cpu', 'mem', 'gpu'}

-- CLUSTER_FIELDS: what a record is built from in a cluster hash, in order.
local CLUSTER_FIELDS = {}
for _, res in ipairs(RESOURCES) do
  for _, f in ipairs({'alloc_', 'used_', 'resv_'}) do CLUSTER_FIELDS[#CLUSTER_FIELDS + 1] = f .. res end
end
for _, f in ipairs({'price_cpu', 'price_mem', 'price_gpu', 'labels', 'nodes'}) do
  CLUSTER_FIELDS[#CLUSTER_FIELDS + 1] = f
end

-- record_from_hash builds a cluster's record from its hash and its nodes
-- (nodes.lua node_list, read unless the hash's node count is 0, or given:
-- advertised); it returns the record, the node list (nil: none) and the
-- labels JSON.
local function record_from_hash(prefix, cid, advertised)
  local v = redis.call('HMGET', prefix .. 'cluster:' .. cid, unpack(CLUSTER_FIELDS))
  local rec = {}
  for i, res in ipairs(RESOURCES) do
    local alloc = tonumber(v[3 * i - 2] or '0')
    rec[ALLOC[res]] = alloc
    rec[FREE[res]] = alloc - tonumber(v[3 * i - 1] or '0') - tonumber(v[3 * i] or '0')
  end
  rec[REC.price_cpu], rec[REC.price_mem], rec[REC.price_gpu] = tonumber(v[13] or '0'), tonumber(v[14] or '0'), tonumber(v[15] or '0')
  local nodes = nil
  if advertised or v[17] == false or tonumber(v[17]) > 0 then nodes = node_list(prefix, cid, advertised) end -- absent: not known
  summarize_nodes(rec, nodes)
  return rec, nodes, v[16]
end

-- write_free writes a live cluster's free-capacity entries for some
-- resources (and the cpu+mem mean) from its record.
local function write_free(prefix, cid, rec, resources)
  local h = {}
  for _, res in ipairs(RESOURCES) do
    h[res] = 0
    if rec[ALLOC[res]] > 0 then h[res] = rec[FREE[res]] / rec[ALLOC[res]] end
  end
  for _, res in ipairs(resources) do
    redis.call('ZADD', prefix .. 'idx:free:' .. res, num(rec[FREE[res]]), cid)
    redis.call('ZADD', prefix .. 'idx:hfree:' .. res, num(h[res]), cid)
  end
  redis.call('ZADD', prefix .. 'idx:hfree:cm', num((h.cpu + h.mem) / 2), cid)
end

-- mark_changed numbers a change of cluster cid's record or labels, or its
-- removal from the index, for the replicas' views (store/view.go), which
-- read the clusters changed since the number they last saw.
-- The first change names the numbering (field epoch, the Redis time then),
-- so that a view notices a numbering started again (the keys lost) even
-- once it has gone past the view's.
local function mark_changed(prefix, cid)
  local feed = prefix .. 'idx:feed'
  local seq = redis.call('HINCRBY', feed, 'seq', 1)
  if seq == 1 then
    local t = redis.call('TIME')
    redis.call('HSET', feed, 'epoch', t[1] .. '.' .. t[2])
  end
  redis.call('ZADD', prefix .. 'idx:changes', seq, cid)
end

-- index_free refreshes a cluster's record, node record and free-capacity
-- entries for some resources (and the cpu+mem mean) after its advertisement,
-- used_*, resv_* or node debits changed. A cluster out of the live index
-- stays out. advertised: as record_from_hash's.
local function index_free(prefix, cid, resources, advertised)
  if not redis.call('ZSCORE', prefix .. 'idx:live', cid) then return end
  local rec, nodes, labels = record_from_hash(prefix, cid, advertised)
  redis.call('HSET', prefix .. 'idx:rec', cid, pack_rec(rec))
  if nodes then
    redis.call('HSET', prefix .. 'idx:nrec', cid, pack_nrec(nodes))
  else
    redis.call('HDEL', prefix .. 'idx:nrec', cid)
  end
  if not labels or labels == '' then labels = '{}' end
  redis.call('HSET', prefix .. 'idx:labels', cid, labels)
  write_free(prefix, cid, rec, resources)
  mark_changed(prefix, cid)
end

-- index_record rewrites a live cluster's record and free-capacity entries
-- from rec, its record with the capacity reserve just took (taken: resource
-- -> amount) already subtracted and its node summary current, instead of
-- reading its hash again: the same numbers as index_free (integers below 2^53
-- are exact in doubles). Only with struct-packed records (JSON ones round
-- large numbers: index_free then).
local function index_record(prefix, cid, rec, taken)
  local changed = {}
  for _, res in ipairs(RESOURCES) do
    if taken[res] > 0 then changed[#changed + 1] = res end
  end
  redis.call('HSET', prefix .. 'idx:rec', cid, pack_rec(rec))
  write_free(prefix, cid, rec, changed)
  mark_changed(prefix, cid)
end

-- index_returned gives a live cluster's record back what an ended
-- reservation held (amounts: resource -> its decimal string) after its
-- resv_* counters were lowered by as much, and, when node names the node
-- whose debit was lowered too, gives that node its share back in the node
-- record (moved to its place, the summary recomputed). It reads the record and the
-- node record instead of the cluster's hashes: index_free parses and sorts
-- every node, most of a release's time at 50 nodes. The same numbers
-- (integers below 2^53 are exact in doubles), so only with struct-packed
-- records and a node the node record holds; otherwise index_free.
local function index_returned(prefix, cid, amounts, node)
  if not redis.call('ZSCORE', prefix .. 'idx:live', cid) then return end
  local raw = HAS_STRUCT and redis.call('HGET', prefix .. 'idx:rec', cid)
  if not raw then return index_free(prefix, cid, RESOURCES) end
  local rec, back = read_rec(raw), {}
  for _, res in ipairs(RESOURCES) do
    back[res] = tonumber(amounts[res] or '0')
    rec[FREE[res]] = rec[FREE[res]] + back[res]
  end
  if node then
    local nraw = redis.call('HGET', prefix .. 'idx:nrec', cid)
    local nt = nraw and decode_nrec(nraw)
    local i = nt and node_index(nt, node)
    if not i then return index_free(prefix, cid, RESOURCES) end
    move_node(nt, i, back, 1)
    summarize_table(rec, nt)
    redis.call('HSET', prefix .. 'idx:nrec', cid, pack_table(nt))
  end
  index_record(prefix, cid, rec, back)
end

-- index_cluster (re)writes every index entry of a live cluster. old_labels is
-- the labels JSON the index holds for it (nil: none). advertised: as
-- record_from_hash's. fixed_held: the index already holds the cluster's
-- allocatable, prices and labels as they are now (an advertisement that
-- changed only what is used), whose entries are then not written again.
local function index_cluster(prefix, cid, seen, old_labels, advertised, fixed_held)
  redis.call('ZADD', prefix .. 'idx:live', seen, cid)
  index_free(prefix, cid, RESOURCES, advertised)
  if fixed_held then return end
  local ck = prefix .. 'cluster:' .. cid
  local v = redis.call('HMGET', ck, 'alloc_cpu', 'alloc_mem', 'alloc_gpu', 'alloc_sto',
    'price_cpu', 'price_mem', 'price_gpu', 'labels')
  for i, res in ipairs(RESOURCES) do
    redis.call('ZADD', prefix .. 'idx:alloc:' .. res, num(tonumber(v[i] or '0')), cid)
  end
  for i, res in ipairs(PRICED) do
    redis.call('ZADD', prefix .. 'idx:price:' .. res, num(tonumber(v[4 + i] or '0')), cid)
  end
  local pc, pm = tonumber(v[5] or '0'), tonumber(v[6] or '0')
  for _, r in ipairs(RATIOS) do
    redis.call('ZADD', prefix .. 'idx:pcm:' .. r, num(pc + r * pm), cid)
  end
  local new = decode_labels(v[8])
  for k, val in pairs(decode_labels(old_labels)) do
    if new[k] ~= val then redis.call('SREM', prefix .. 'idx:label:' .. k .. '=' .. tostring(val), cid) end
  end
  for k, val in pairs(new) do
    redis.call('SADD', prefix .. 'idx:label:' .. k .. '=' .. tostring(val), cid)
  end
end

-- clusters_with_labels is the set of cluster ids carrying every label of
-- selector_json, or nil when there is no selector ('').
local function clusters_with_labels(prefix, selector_json)
  if selector_json == '' then return nil end
  local keys = {}
  for k, v in pairs(cjson.decode(selector_json)) do keys[#keys + 1] = prefix .. 'idx:label:' .. k .. '=' .. tostring(v) end
  local matching = {}
  if #keys > 0 then
    for _, cid in ipairs(redis.call('SINTER', unpack(keys))) do matching[cid] = true end
  end
  return matching
end

-- unindex_cluster removes a cluster from the candidate index (it went stale).
local function unindex_cluster(prefix, cid)
  redis.call('ZREM', prefix .. 'idx:live', cid)
  for _, res in ipairs(RESOURCES) do
    redis.call('ZREM', prefix .. 'idx:free:' .. res, cid)
    redis.call('ZREM', prefix .. 'idx:hfree:' .. res, cid)
    redis.call('ZREM', prefix .. 'idx:alloc:' .. res, cid)
  end
  redis.call('ZREM', prefix .. 'idx:hfree:cm', cid)
  redis.call('HDEL', prefix .. 'idx:rec', cid)
  redis.call('HDEL', prefix .. 'idx:nrec', cid)
  redis.call('HDEL', prefix .. 'idx:labels', cid)
  for _, res in ipairs(PRICED) do
    redis.call('ZREM', prefix .. 'idx:price:' .. res, cid)
  end
  for _, r in ipairs(RATIOS) do
    redis.call('ZREM', prefix .. 'idx:pcm:' .. r, cid)
  end
  local labels = redis.call('HGET', prefix .. 'cluster:' .. cid, 'labels')
  for k, val in pairs(decode_labels(labels)) do
    redis.call('SREM', prefix .. 'idx:label:' .. k .. '=' .. tostring(val), cid)
  end
  mark_changed(prefix, cid)
end
