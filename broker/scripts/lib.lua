-- lib.lua: helpers shared by every script. The broker prepends this file to each
-- script before SCRIPT LOAD, so each script is still one atomic operation and
-- touches only keys derived from the hash-tagged prefix in KEYS[1].
--
-- Reservation ids are scoped per requester: two requesters may use the same
-- id and get two reservations. Every key and member that names a reservation
-- uses its qualified id, qid = requester.."/"..id (cluster ids are DNS labels
-- and ids DNS subdomains, so the first "/" splits them); events and the API
-- carry the bare id and the requester apart.
--
-- Key layout (prefix P = KEYS[1], e.g. "rb:{b}:"):
--   P.."cluster:"..id       hash    advertised fields + broker-owned resv_*
--   P.."clusters"           zset    cluster id -> seen_ms (liveness index)
--   P.."resv:"..qid         hash    one reservation: requester, target, phase, cpu, mem, gpu,
--                                   sto, created_ms, expires_ms, duration_ms (the hold time),
--                                   lease_ms (absent: a fixed duration, never renewed), score,
--                                   price, owner, priority, selector, candidates, node,
--                                   grant (sealed by the broker, store.GrantKeys; removed when
--                                   the reservation ends), granted_ms, ended_ms; an ended one
--                                   expires after the retention
--   P.."expiry"             zset    live reservation qid -> expires_ms
--   P.."by-target:"..id     set     live reservation qids provided by a cluster
--   P.."by-requester:"..id  set     live reservation qids requested by a cluster
--   P.."events:"..id        stream  notifications for one cluster, capped near the events max
--                                   length (MAXLEN ~); it expires (PEXPIRE) once no event was added
--                                   for the events TTL
--   P.."audit"              stream  every reserve decision, capped near the audit max length
--                                   (MAXLEN ~); expire.lua trims what is older than the audit
--                                   retention (XTRIM MINID ~)
--
-- Fair share (the operator's per-requester limits, broker/policy; reserve.lua ARGV):
--   P.."usage"              hash    requester -> "n=.. cpu=.. mem=.. gpu=.. sto=..": how many live
--                                   reservations it holds and what they hold (field absent: none),
--                                   what its limits are checked against
--   P.."rate:"..requester   string  its reserve-call rate state (GCRA: the theoretical arrival
--                                   time of its next call, ms); expires once that time has passed
--
-- Per-node fit (a cluster that advertises no nodes is judged on its totals only):
--   P.."nodes:"..id         hash    node -> "alloc_cpu=.. alloc_mem=.. alloc_gpu=.. alloc_sto=..
--                                   used_cpu=.. used_mem=.. used_gpu=.. used_sto=..": the nodes
--                                   the cluster advertised, used including the pods of reservations
--   P.."node-resv:"..id     hash    node -> "cpu=.. mem=.. gpu=.. sto=..": the broker's debit, the
--                                   live reservations placed on that node that the cluster's
--                                   last advertisement did not list (field absent: none)
--   P.."node-listed:"..id   set     live reservation qids placed on a node of the cluster that its
--                                   last advertisement listed: their pods are in its node figures,
--                                   so the broker does not debit them
--
-- The candidate index (derived from the cluster hashes, live clusters only;
-- reserve drops the clusters that went stale, advertise adds them back):
--   P.."idx:live"           zset    cluster id -> seen_ms
--   P.."idx:free:"..r       zset    cluster id -> free r = alloc - used - resv
--   P.."idx:hfree:"..r      zset    cluster id -> free r / alloc r (0 when alloc is 0)
--   P.."idx:hfree:cm"       zset    cluster id -> mean of the cpu and mem free fractions
--                                   (every API request asks for both: one walk instead of two)
--   P.."idx:rec"            hash    cluster id -> record of 20 numbers: alloc_cpu, free_cpu,
--                                   alloc_mem, free_mem, alloc_gpu, free_gpu, alloc_sto,
--                                   free_sto, price_cpu, price_mem, price_gpu, then the node
--                                   summary: nodes advertised (0: none), the free cpu, mem, gpu,
--                                   sto of the node with the most free cpu, and the most free of
--                                   each on any node -- what a decision reads, for a batch of
--                                   clusters in one HMGET; packed little-endian doubles
--                                   (struct), JSON where the Lua has no struct library (the
--                                   demo's embedded server)
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
--
-- The waiting list (requests nothing could take, served by priority):
--   P.."waiting"            zset    "<since_us, 18 digits>:<qid>" -> -priority
--                                   (ZRANGE order: highest priority, then oldest)
--   P.."wait:"..qid         hash    requester, cpu, mem, gpu, sto, selector, priority,
--                                   since_ms, member, and the requester's limits when it
--                                   waited (lim_n, lim_cpu, lim_mem, lim_gpu; absent: none);
--                                   expires after the wait TTL (store WaitTTL, rb-broker
--                                   --wait-ttl, default 5s) unless the requester retries the
--                                   same id (each retry renews it); a waiting member whose hash
--                                   is gone (or names another member) is forgotten: dropped
--                                   from the zset when met, and swept by expire.lua. v1
--                                   requests never wait (reserve.lua's wait value)
--   P.."wait-due"           zset    waiting member -> when its wait hash expires (ms): expire.lua
--                                   removes the members due, so that none outlives its request
--
-- Spread (reserve_group.lua):
--   P.."spread:"..requester.."/"..group  hash  provider id -> how many live reservations of
--                                   that spread group (an owner's replicas) it holds; the
--                                   reservations carry the group in their field spread
--
-- Preemption (preempt.lua, protect.lua):
--   P.."protected:"..requester  set  the requester's reservation ids whose pods a
--                                   PodDisruptionBudget protects now, as its agent reports them;
--                                   never preempted; expires unless reported again
--
-- Leases (renew.lua): a reservation with lease_ms ends at expires_ms unless its
-- requester renews it; a renewal sets expires_ms (and its expiry score) to
-- now + lease_ms when that is later. All times are the Redis server's (TIME).
--
-- Broker outages (expire.lua, renew.lua):
--   P.."clock"              hash    tick_ms: the last expire run of any replica; gap_ms: how
--                                   long without a run counts as an outage; outage_from_ms,
--                                   outage_to_ms: the last outage (no replica ran, or Redis
--                                   was frozen, restarted or failed over)

-- RESOURCES are the resource suffixes used in every hash: cpu in millicores,
-- mem and sto in bytes, gpu as a count.
local RESOURCES = {'cpu', 'mem', 'gpu', 'sto'}

-- now_us and now_ms read the Redis server clock: one clock for every broker replica.
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local function now_ms()
  return math.floor(now_us() / 1000)
end

-- Time in which no broker could hear renewals must not count against a
-- lease. Every replica runs expire.lua about every second and stamps
-- clock.tick_ms; a gap longer than clock.gap_ms means no broker ran (all
-- replicas down, Redis frozen or restarting, a failover). A lease that was
-- still live when the outage began ends no earlier than a whole lease after
-- the broker came back, so its requester gets a full lease to renew. Only the
-- last outage matters: a lease credited for an earlier one either ended
-- before the last began (it had a whole lease of broker time to renew) or is
-- covered by it. Fixed-duration reservations are not credited: nobody renews
-- them. The clock also reports an outage still pending (no expire run since
-- the broker came back), so a renewal that comes first is not refused.
local function last_outage(prefix, now)
  local c = redis.call('HMGET', prefix .. 'clock', 'tick_ms', 'gap_ms', 'outage_from_ms', 'outage_to_ms')
  local tick, gap = tonumber(c[1]), tonumber(c[2])
  if tick and gap and now - tick > gap then
    return tick, now
  end
  return tonumber(c[3]) or 0, tonumber(c[4]) or 0
end

-- credited_end is when a lease (expires_ms, lease_ms) really ends, given the
-- last outage [from, to): later than expires_ms only if the lease was live
-- when the outage began.
local function credited_end(expires, lease, from, to)
  if lease > 0 and to > 0 and expires > from then
    return math.max(expires, to + lease)
  end
  return expires
end

-- REC_AT: where each resource's alloc sits in an idx:rec record (free follows it).
local REC_AT = {cpu = 1, mem = 3, gpu = 5, sto = 7}

-- REC_NODES: where the node summary starts in an idx:rec record (lib.lua header).
local REC_NODES = 12

-- pack_rec packs an idx:rec record (20 values); read_rec reads one into a
-- table. struct.unpack is about six times faster than cjson.decode, and a
-- decision reads hundreds of records at 10,000 clusters. The node summary
-- (8 values after the count) is unpacked only for a cluster that has nodes,
-- so that the others cost what they did before nodes existed.
local REC_FORMAT = '<' .. string.rep('d', 20)
local REC_HEAD = '<' .. string.rep('d', 12) -- the 11 numbers and the node count
local HAS_STRUCT = pcall(function() return struct.pack end) -- reading a missing global raises
local function pack_rec(values)
  if HAS_STRUCT then return struct.pack(REC_FORMAT, unpack(values)) end
  return cjson.encode(values)
end
local NO_NODES = HAS_STRUCT and struct.pack('<d', 0) -- the bytes of a node count of 0
local function read_rec(s)
  if not HAS_STRUCT then return cjson.decode(s) end
  if string.sub(s, 89, 96) == NO_NODES then -- without nodes: 12 values (index_record pads the zeros back)
    local ac, fc, am, fm, ag, fg, as, fs, pc, pm, pg, n = struct.unpack(REC_HEAD, s)
    return {ac, fc, am, fm, ag, fg, as, fs, pc, pm, pg, n} -- not struct.unpack's next position
  end
  local ac, fc, am, fm, ag, fg, as, fs, pc, pm, pg, n, tc, tm, tg, ts, mc, mm, mg, ms = struct.unpack(REC_FORMAT, s)
  return {ac, fc, am, fm, ag, fg, as, fs, pc, pm, pg, n, tc, tm, tg, ts, mc, mm, mg, ms}
end

-- INDEX_VERSION names the index layout; a Redis holding another is reindexed at start-up.
-- 4: reservation keys and members carry the requester (qualified ids, header);
-- reindex.lua moves the live reservations of an older layout.
-- 5: the requesters' usage and the waiting list's due times (header), which
-- reindex.lua builds from the live reservations and the waiting list.
local INDEX_VERSION = '5'

-- RATIOS are the GiB-per-core ratios of the idx:pcm sets.
local RATIOS = {0, 0.5, 1, 2, 4, 8, 16, 32, 64}

-- PRICED are the resources that have a price.
local PRICED = {'cpu', 'mem', 'gpu'}

-- num formats a number for ZADD without losing precision (tostring keeps 14 digits).
local function num(x)
  return string.format('%.17g', x)
end

-- price_of prices a request at a cluster's rates. The index's bounds call it
-- with the rates at a list's cursor: the expression is monotone in every rate,
-- so a bound computed with it compares exactly with the clusters' prices.
local function price_of(req, pc, pm, pg)
  return req.cpu / 1000 * pc + req.mem / 1073741824 * pm + req.gpu * pg
end

local function decode_labels(s)
  if s and s ~= '' then return cjson.decode(s) end
  return {}
end

-- parse_amounts reads "k=v k=v ..." (the node hashes' values) into a table of numbers.
local function parse_amounts(s)
  local t = {}
  if s then
    for k, v in string.gmatch(s, '([%w_]+)=(%-?%d+)') do t[k] = tonumber(v) end
  end
  return t
end

-- sort_nodes orders a node list as idx:nrec keeps it: most free cpu first, then by name.
local function sort_nodes(list)
  table.sort(list, function(x, y)
    if x.cpu ~= y.cpu then return x.cpu > y.cpu end
    return x.name < y.name
  end)
end

-- node_list reads a cluster's advertised nodes and the broker's debits from
-- their hashes: a list of {name, cpu, mem, gpu, sto} free capacities (advertised
-- allocatable - used - debit), most free cpu first (then by name), or nil when
-- the cluster advertises no nodes.
local function node_list(prefix, cid)
  local flat = redis.call('HGETALL', prefix .. 'nodes:' .. cid)
  if #flat == 0 then return nil end
  local debits = {}
  local d = redis.call('HGETALL', prefix .. 'node-resv:' .. cid)
  for i = 1, #d, 2 do debits[d[i]] = parse_amounts(d[i + 1]) end
  local list = {}
  for i = 1, #flat, 2 do
    local a, debit = parse_amounts(flat[i + 1]), debits[flat[i]] or {}
    local e = {name = flat[i]}
    for _, res in ipairs(RESOURCES) do
      e[res] = (a['alloc_' .. res] or 0) - (a['used_' .. res] or 0) - (debit[res] or 0)
    end
    list[#list + 1] = e
  end
  sort_nodes(list)
  return list
end

-- node_summary is the tail of an idx:rec record for a sorted node list (nil:
-- no nodes): the count, the free capacity of the first node (the most free
-- cpu), and the most free of each resource on any node. Enough to decide most
-- fits without reading the nodes: a request the first node holds fits, one
-- beyond a maximum does not.
local function node_summary(list)
  if not list or #list == 0 then return {0, 0, 0, 0, 0, 0, 0, 0, 0} end
  local top = list[1]
  local out = {#list, top.cpu, top.mem, top.gpu, top.sto, top.cpu, top.mem, top.gpu, top.sto}
  for _, e in ipairs(list) do
    for i, res in ipairs(RESOURCES) do
      if e[res] > out[5 + i] then out[5 + i] = e[res] end
    end
  end
  return out
end

-- pack_nrec packs a sorted node list as an idx:nrec value; decode_nrec reads
-- one into a node table {n, f = {cpu1, mem1, gpu1, sto1, cpu2, ...}, names}
-- (names split only when asked for: node_names).
local NREC_FORMATS = {}
local function nrec_format(n)
  local f = NREC_FORMATS[n]
  if not f then
    f = '<' .. string.rep('d', 4 * n)
    NREC_FORMATS[n] = f
  end
  return f
end
local function pack_nrec(list)
  local f, names = {}, {}
  for i, e in ipairs(list) do
    f[4 * i - 3], f[4 * i - 2], f[4 * i - 1], f[4 * i] = e.cpu, e.mem, e.gpu, e.sto
    names[i] = e.name
  end
  if HAS_STRUCT then
    return struct.pack('<H', #list) .. struct.pack(nrec_format(#list), unpack(f)) .. table.concat(names, ' ')
  end
  return cjson.encode({names = names, f = f})
end
local function decode_nrec(raw)
  if HAS_STRUCT then
    local n = struct.unpack('<H', raw)
    local f = {struct.unpack(nrec_format(n), raw, 3)}
    local pos = f[4 * n + 1]
    f[4 * n + 1] = nil
    return {n = n, f = f, raw_names = string.sub(raw, pos)}
  end
  local v = cjson.decode(raw)
  return {n = #v.names, f = v.f, names = v.names}
end
local function node_names(nt)
  if not nt.names then
    local names = {}
    for name in string.gmatch(nt.raw_names, '%S+') do names[#names + 1] = name end
    nt.names = names
  end
  return nt.names
end

-- index_free refreshes a cluster's record, node record and free-capacity
-- entries for some resources (and the cpu+mem mean) after its advertisement,
-- used_*, resv_* or node debits changed. A cluster out of the live index stays out.
local function index_free(prefix, cid, resources)
  if not redis.call('ZSCORE', prefix .. 'idx:live', cid) then return end
  local fields = {}
  for _, res in ipairs(RESOURCES) do
    fields[#fields + 1] = 'alloc_' .. res
    fields[#fields + 1] = 'used_' .. res
    fields[#fields + 1] = 'resv_' .. res
  end
  fields[#fields + 1] = 'price_cpu'
  fields[#fields + 1] = 'price_mem'
  fields[#fields + 1] = 'price_gpu'
  fields[#fields + 1] = 'labels'
  local v = redis.call('HMGET', prefix .. 'cluster:' .. cid, unpack(fields))
  local rec, alloc, free, h = {}, {}, {}, {}
  for i, res in ipairs(RESOURCES) do
    alloc[res] = tonumber(v[3 * i - 2] or '0')
    free[res] = alloc[res] - tonumber(v[3 * i - 1] or '0') - tonumber(v[3 * i] or '0')
    h[res] = 0
    if alloc[res] > 0 then h[res] = free[res] / alloc[res] end
    rec[#rec + 1] = alloc[res]
    rec[#rec + 1] = free[res]
  end
  for i = 13, 15 do rec[#rec + 1] = tonumber(v[i] or '0') end
  local nodes = node_list(prefix, cid)
  for _, x in ipairs(node_summary(nodes)) do rec[#rec + 1] = x end
  redis.call('HSET', prefix .. 'idx:rec', cid, pack_rec(rec))
  if nodes then
    redis.call('HSET', prefix .. 'idx:nrec', cid, pack_nrec(nodes))
  else
    redis.call('HDEL', prefix .. 'idx:nrec', cid)
  end
  local labels = v[16]
  if not labels or labels == '' then labels = '{}' end
  redis.call('HSET', prefix .. 'idx:labels', cid, labels)
  for _, res in ipairs(resources) do
    redis.call('ZADD', prefix .. 'idx:free:' .. res, num(free[res]), cid)
    redis.call('ZADD', prefix .. 'idx:hfree:' .. res, num(h[res]), cid)
  end
  redis.call('ZADD', prefix .. 'idx:hfree:cm', num((h.cpu + h.mem) / 2), cid)
end

-- index_record rewrites a live cluster's record and free-capacity entries
-- from rec, its record with the capacity reserve just took (taken: resource
-- -> amount) already subtracted and its node summary current, instead of
-- reading its hash again: the same numbers as index_free (integers below 2^53
-- are exact in doubles). Only with struct-packed records (JSON ones round
-- large numbers: index_free then).
local function index_record(prefix, cid, rec, taken)
  local h = {}
  for _, res in ipairs(RESOURCES) do
    local at = REC_AT[res]
    h[res] = 0
    if rec[at] > 0 then h[res] = rec[at + 1] / rec[at] end
    if taken[res] > 0 then
      redis.call('ZADD', prefix .. 'idx:free:' .. res, num(rec[at + 1]), cid)
      redis.call('ZADD', prefix .. 'idx:hfree:' .. res, num(h[res]), cid)
    end
  end
  for i = #rec + 1, 20 do rec[i] = 0 end -- a record read without its node summary (no nodes)
  redis.call('HSET', prefix .. 'idx:rec', cid, pack_rec(rec))
  redis.call('ZADD', prefix .. 'idx:hfree:cm', num((h.cpu + h.mem) / 2), cid)
end

-- index_cluster (re)writes every index entry of a live cluster. old_labels is
-- the labels JSON the index holds for it (nil: none).
local function index_cluster(prefix, cid, seen, old_labels)
  redis.call('ZADD', prefix .. 'idx:live', seen, cid)
  index_free(prefix, cid, RESOURCES)
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
end

-- gcra_step counts one reserve call against a rate (calls per second) with
-- a burst (generic cell rate algorithm: each call moves the theoretical
-- arrival time tat one interval on; a call is allowed while tat stays within
-- burst intervals of now). It returns the new tat when the call is allowed,
-- else nil and the ms until a call would be. tat is P.."rate:"..requester's.
local function gcra_step(tat, now, rate, burst)
  local interval = 1000 / rate
  local next_tat = math.max(tat, now) + interval
  local wait = next_tat - now - (burst or 1) * interval
  if wait > 0 then return nil, math.ceil(wait) end
  return next_tat, nil
end

local function to_map(flat)
  local m = {}
  for i = 1, #flat, 2 do m[flat[i]] = flat[i + 1] end
  return m
end

-- streams_opts are the bounds of the event streams a script writes (header):
-- maxlen entries (approximately), and ttl_ms without a new event before the
-- stream goes.
local function stream_opts(maxlen, ttl_ms)
  return {maxlen = maxlen, ttl = ttl_ms, touched = {}}
end

-- emit appends one notification to a cluster's event stream, and sets the
-- stream's TTL once per call (time is frozen while a script runs, so once is
-- the same as after every event).
local function emit(prefix, cluster, so, fields)
  local key = prefix .. 'events:' .. cluster
  redis.call('XADD', key, 'MAXLEN', '~', so.maxlen, '*', unpack(fields))
  if not so.touched[key] then
    so.touched[key] = true
    redis.call('PEXPIRE', key, so.ttl)
  end
end

-- USAGE: the fields of a requester's usage (header, P.."usage").
local USAGE = {'n', 'cpu', 'mem', 'gpu', 'sto'}

-- read_usage reads a requester's usage: every field of USAGE, 0 when absent.
local function read_usage(prefix, requester)
  local u = parse_amounts(redis.call('HGET', prefix .. 'usage', requester))
  for _, f in ipairs(USAGE) do u[f] = u[f] or 0 end
  return u
end

-- write_usage stores a requester's usage; none left removes its field.
local function write_usage(prefix, requester, u)
  if u.n <= 0 then
    redis.call('HDEL', prefix .. 'usage', requester)
  else
    redis.call('HSET', prefix .. 'usage', requester,
      string.format('n=%d cpu=%d mem=%d gpu=%d sto=%d', u.n, u.cpu, u.mem, u.gpu, u.sto))
  end
end

-- over_limit tells whether one more reservation of amounts (cpu, mem, gpu)
-- would take a requester whose usage is u past one of its limits lim (n,
-- cpu, mem, gpu; nil: no limit): it returns the limit's name, the limit, the
-- usage and the amount asked, or nil within them. A resource not asked for
-- is never over its limit.
local LIMITED = {'cpu', 'mem', 'gpu'}
local function over_limit(u, lim, amounts)
  if lim.n and u.n + 1 > lim.n then return 'reservations', lim.n, u.n, 1 end
  for _, res in ipairs(LIMITED) do
    local want = tonumber(amounts[res] or '0')
    if lim[res] and want > 0 and u[res] + want > lim[res] then return res, lim[res], u[res], want end
  end
  return nil
end

-- qualify and bare_id convert between a reservation's id and its qualified id (header).
local function qualify(requester, id)
  return requester .. '/' .. id
end
local function bare_id(qid)
  return string.match(qid, '^[^/]*/(.*)$') or qid
end

local function is_live(phase)
  return phase == 'Reserved' or phase == 'Active'
end

-- remaining_ms is how long reservation r still lives at now (ms, Redis clock;
-- 0 once ended): what answers and events carry, so that no agent compares the
-- broker's absolute times with its own clock.
local function remaining_ms(r, now)
  if not is_live(r.phase) then return 0 end
  return math.max(0, tonumber(r.expires_ms or '0') - now)
end

-- event_fields are the fields of an event about reservation r (bare id id) at now.
local function event_fields(kind, id, r, now)
  local f = {'type', kind, 'reservation', id, 'requester', r.requester, 'provider', r.target,
    'phase', r.phase, 'cpu', r.cpu, 'mem', r.mem, 'gpu', r.gpu, 'sto', r.sto,
    'expires_ms', r.expires_ms, 'remaining_ms', string.format('%d', remaining_ms(r, now))}
  if r.node and r.node ~= '' then
    f[#f + 1] = 'node'
    f[#f + 1] = r.node
  end
  return f
end

-- waiting_id is the qualified reservation id of a waiting list member.
local function waiting_id(member)
  return string.match(member, '^%d+:(.*)$')
end

-- WAITERS_NOTIFIED: how many waiting requests a capacity change notifies.
local WAITERS_NOTIFIED = 8

-- tell_waiter sends CapacityAvailable for waiting request qid to its requester.
local function tell_waiter(prefix, so, qid, requester, cpu, mem, gpu, sto)
  emit(prefix, requester, so, {'type', 'CapacityAvailable', 'reservation', bare_id(qid), 'requester', requester,
    'provider', '', 'phase', 'Waiting', 'cpu', cpu, 'mem', mem, 'gpu', gpu, 'sto', sto, 'expires_ms', '0'})
end

-- notify_waiters tells the requesters of the first waiting requests (highest
-- priority first) that capacity may be available, so their agents retry at
-- once instead of at their next back-off. Forgotten waiters (wait hash
-- expired, or the hash now names a newer member of the same id) leave the list.
-- forget_waiter drops waiting member m from the list (its request is gone).
local function forget_waiter(prefix, m)
  redis.call('ZREM', prefix .. 'waiting', m)
  redis.call('ZREM', prefix .. 'wait-due', m)
end

local function notify_waiters(prefix, so)
  local members = redis.call('ZRANGE', prefix .. 'waiting', 0, WAITERS_NOTIFIED - 1)
  for _, m in ipairs(members) do
    local qid = waiting_id(m)
    local w = redis.call('HMGET', prefix .. 'wait:' .. qid, 'requester', 'cpu', 'mem', 'gpu', 'sto', 'member')
    if not w[1] or w[6] ~= m then
      forget_waiter(prefix, m)
    else
      tell_waiter(prefix, so, qid, w[1], w[2], w[3], w[4], w[5])
    end
  end
end

-- stop_waiting removes a request (qualified id) from the waiting list; returns true if it was there.
local function stop_waiting(prefix, qid)
  local wk = prefix .. 'wait:' .. qid
  local member = redis.call('HGET', wk, 'member')
  if not member then return false end
  forget_waiter(prefix, member)
  redis.call('DEL', wk)
  return true
end

-- node_debit adds sign * amounts (a map with cpu, mem, gpu, sto) to the
-- broker's debit of one node of cluster cid; a debit that would go below zero
-- is clamped (returns 1: a broken invariant), one back at zero is removed.
local function node_debit(prefix, cid, node, amounts, sign)
  local key = prefix .. 'node-resv:' .. cid
  local d = parse_amounts(redis.call('HGET', key, node))
  local clamped, zero = 0, true
  for _, res in ipairs(RESOURCES) do
    local v = (d[res] or 0) + sign * tonumber(amounts[res] or '0')
    if v < 0 then
      v = 0
      clamped = 1
    end
    d[res] = v
    if v ~= 0 then zero = false end
  end
  if zero then
    redis.call('HDEL', key, node)
  else
    redis.call('HSET', key, node, string.format('cpu=%d mem=%d gpu=%d sto=%d', d.cpu, d.mem, d.gpu, d.sto))
  end
  return clamped
end

-- spread_count adds delta to the live reservations of a requester's spread
-- group on provider cid (header); a count back at zero is removed.
local function spread_count(prefix, requester, group, cid, delta)
  local key = prefix .. 'spread:' .. requester .. '/' .. group
  if redis.call('HINCRBY', key, cid, delta) <= 0 then redis.call('HDEL', key, cid) end
end

-- end_reservation moves a live reservation (qualified id qid, map r) to a final phase and gives
-- its capacity back to the target exactly once: the cluster's counters, and
-- the debit of its node unless the target's last advertisement listed it
-- (then the broker holds no debit for it), and to its requester's usage. Its
-- grant goes (the provider's token is of no use any more), and the record
-- expires after retention_ms. Returns 1 when a counter had to be clamped at
-- zero (a broken invariant worth a metric), else 0.
local function end_reservation(prefix, qid, r, phase, now, so, retention_ms)
  local ck = prefix .. 'cluster:' .. r.target
  local clamped = 0
  if redis.call('EXISTS', ck) == 1 then
    for _, res in ipairs(RESOURCES) do
      local amount = r[res] or '0'
      if amount ~= '0' then
        local left = redis.call('HINCRBY', ck, 'resv_' .. res, '-' .. amount)
        if left < 0 then
          redis.call('HSET', ck, 'resv_' .. res, '0')
          clamped = 1
        end
      end
    end
    if r.node and r.node ~= '' and redis.call('SREM', prefix .. 'node-listed:' .. r.target, qid) == 0 then
      clamped = math.max(clamped, node_debit(prefix, r.target, r.node, r, -1))
    end
    index_free(prefix, r.target, RESOURCES)
  elseif r.node and r.node ~= '' then
    redis.call('SREM', prefix .. 'node-listed:' .. r.target, qid)
  end
  if r.spread and r.spread ~= '' then spread_count(prefix, r.requester, r.spread, r.target, -1) end
  local u = read_usage(prefix, r.requester)
  u.n = u.n - 1
  for _, res in ipairs(RESOURCES) do
    u[res] = u[res] - tonumber(r[res] or '0')
    if u[res] < 0 or (u.n <= 0 and u[res] ~= 0) then
      u[res] = 0
      clamped = 1
    end
  end
  if u.n < 0 then clamped = 1 end
  write_usage(prefix, r.requester, u)
  local rk = prefix .. 'resv:' .. qid
  r.phase = phase
  r.ended_ms = tostring(now)
  redis.call('HSET', rk, 'phase', phase, 'ended_ms', r.ended_ms)
  redis.call('HDEL', rk, 'grant')
  redis.call('PEXPIRE', rk, retention_ms)
  redis.call('ZREM', prefix .. 'expiry', qid)
  redis.call('SREM', prefix .. 'by-target:' .. r.target, qid)
  redis.call('SREM', prefix .. 'by-requester:' .. r.requester, qid)
  local fields = event_fields(phase, bare_id(qid), r, now)
  emit(prefix, r.requester, so, fields)
  emit(prefix, r.target, so, fields)
  return clamped
end
-- end of lib.lua
