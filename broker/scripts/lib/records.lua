-- records: a cluster's record in the candidate index (index.lua idx:rec),
-- what a decision reads for a batch of clusters in one HMGET, its numbers
-- named (REC_FIELDS): alloc_<r> and free_<r> per resource, price_cpu, price_mem,
-- price_gpu, then the node summary (nodes.lua summarize_nodes): nodes (how many
-- the cluster advertises, 0: none), top_<r> (the free capacity of the node
-- with the most free cpu) and max_<r> (the most free of each on any node).
-- Stored as packed little-endian doubles in REC_FIELDS order (struct), JSON
-- where the Lua has no struct library (the demo's embedded server).
-- @include core

local REC_FIELDS = {'alloc_cpu', 'free_cpu', 'alloc_mem', 'free_mem', 'alloc_gpu', 'free_gpu',
  'alloc_sto', 'free_sto', 'price_cpu', 'price_mem', 'price_gpu',
  'nodes', 'top_cpu', 'top_mem', 'top_gpu', 'top_sto', 'max_cpu', 'max_mem', 'max_gpu', 'max_sto'}

-- A record is an array in REC_FIELDS order, read by name: rec[REC.free_cpu]
-- (REC maps each name to its position), or per resource rec[FREE[res]]
-- (ALLOC, FREE, TOP, MAX). An array rather than a table of named fields:
-- building one costs half as much, and a decision builds hundreds.
local REC, ALLOC, FREE, TOP, MAX = {}, {}, {}, {}, {}
for i, f in ipairs(REC_FIELDS) do REC[f] = i end
for _, res in ipairs(RESOURCES) do
  ALLOC[res], FREE[res], TOP[res], MAX[res] = REC['alloc_' .. res], REC['free_' .. res], REC['top_' .. res], REC['max_' .. res]
end

-- pack_rec packs a record (a summary position absent counts 0); read_rec
-- reads one. struct.unpack is about six times faster than cjson.decode, and
-- a decision reads hundreds of records at 10,000 clusters. The node summary
-- is unpacked only for a cluster that has nodes, so that the others cost
-- what they did before nodes existed (their summary positions stay absent).
local REC_FORMAT = '<' .. string.rep('d', #REC_FIELDS)
local REC_HEAD = '<' .. string.rep('d', REC.nodes) -- up to the node count
local HAS_STRUCT = pcall(function() return struct.pack end) -- reading a missing global raises
local function pack_rec(rec)
  local values = {}
  for i = 1, #REC_FIELDS do values[i] = rec[i] or 0 end
  if HAS_STRUCT then return struct.pack(REC_FORMAT, unpack(values)) end
  return cjson.encode(values)
end
local NO_NODES = HAS_STRUCT and struct.pack('<d', 0) -- the bytes of a node count of 0
local function read_rec(s)
  if not HAS_STRUCT then return cjson.decode(s) end
  if string.sub(s, 89, 96) == NO_NODES then
    local ac, fc, am, fm, ag, fg, as, fs, pc, pm, pg, n = struct.unpack(REC_HEAD, s)
    return {ac, fc, am, fm, ag, fg, as, fs, pc, pm, pg, n} -- not struct.unpack's next position
  end
  local ac, fc, am, fm, ag, fg, as, fs, pc, pm, pg, n, tc, tm, tg, ts, mc, mm, mg, ms = struct.unpack(REC_FORMAT, s)
  return {ac, fc, am, fm, ag, fg, as, fs, pc, pm, pg, n, tc, tm, tg, ts, mc, mm, mg, ms}
end

-- free_of is a record's free capacity as a table of the four resources.
local function free_of(rec)
  return {cpu = rec[FREE.cpu], mem = rec[FREE.mem], gpu = rec[FREE.gpu], sto = rec[FREE.sto]}
end

-- price_of prices a request at a cluster's rates. The index's bounds call it
-- with the rates at a list's cursor: the expression is monotone in every rate,
-- so a bound computed with it compares exactly with the clusters' prices.
local function price_of(req, pc, pm, pg)
  return req.cpu / 1000 * pc + req.mem / 1073741824 * pm + req.gpu * pg
end

-- price_at prices a request at a record's rates.
local function price_at(req, rec)
  return price_of(req, rec[REC.price_cpu], rec[REC.price_mem], rec[REC.price_gpu])
end
