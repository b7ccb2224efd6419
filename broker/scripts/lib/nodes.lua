-- nodes: per-node fit. A cluster that advertises nodes holds a request only
-- if one of them does; one that advertises none is judged on its totals.
--   P.."nodes:"..id         hash    node -> "alloc_cpu=.. alloc_mem=.. alloc_gpu=.. alloc_sto=..
--                                   used_cpu=.. used_mem=.. used_gpu=.. used_sto=..": the nodes
--                                   the cluster advertised, used including the pods of reservations
--   P.."node-resv:"..id     hash    node -> "cpu=.. mem=.. gpu=.. sto=..": the broker's debit, the
--                                   live reservations placed on that node that the cluster's
--                                   last advertisement did not list (field absent: none)
--   P.."node-listed:"..id   set     live reservation qids placed on a node of the cluster that its
--                                   last advertisement listed: their pods are in its node figures,
--                                   so the broker does not debit them
-- A node list is an array of {name, cpu, mem, gpu, sto} free capacities,
-- most free cpu first, then by name; a node table (idx:nrec decoded) is
-- {n, f = {cpu1, mem1, gpu1, sto1, cpu2, ...}, names}, cheaper to read.
-- @include records

-- holds tells whether free (the four resources) holds need; a resource
-- need does not ask for is not looked at.
local function holds(free, need)
  for _, res in ipairs(RESOURCES) do
    if need[res] > 0 and free[res] < need[res] then return false end
  end
  return true
end

-- fits_better tells whether a node with free g, c, m, s named name is a
-- better fit than one with bg, bc, bm, bs named bname: least free gpu, then
-- cpu, memory, storage, then the name. Bin packing: a GPU node stays for GPU
-- requests and a large node for large requests.
local function fits_better(g, c, m, s, name, bg, bc, bm, bs, bname)
  if g ~= bg then return g < bg end
  if c ~= bc then return c < bc end
  if m ~= bm then return m < bm end
  if s ~= bs then return s < bs end
  return name < bname
end

-- best_fit is the node of a node list a reservation of need takes: among
-- those that hold it, the best fit (fits_better); nil if none. Every
-- decision that places a reservation on a node chooses it here or in
-- best_fit_in, the same on a node table.
local function best_fit(list, need)
  local best = nil
  for _, e in ipairs(list) do
    if holds(e, need) and (best == nil or
      fits_better(e.gpu, e.cpu, e.mem, e.sto, e.name, best.gpu, best.cpu, best.mem, best.sto, best.name)) then
      best = e
    end
  end
  return best
end

-- precedes is the order of node lists and node tables: most free cpu
-- first, then by name.
local function precedes(c, name, oc, oname)
  if c ~= oc then return c > oc end
  return name < oname
end

-- sort_nodes orders a node list (precedes).
local function sort_nodes(list)
  table.sort(list, function(x, y) return precedes(x.cpu, x.name, y.cpu, y.name) end)
end

-- node_list reads a cluster's node list from its hashes (free = advertised
-- allocatable - used - the broker's debit), or nil when it advertises none.
-- advertised, when given, is the node hash's content already in hand (an
-- array of {name, amounts}: parse_amounts' tables), so it is not read back.
local function node_list(prefix, cid, advertised)
  if not advertised then
    local flat = redis.call('HGETALL', prefix .. 'nodes:' .. cid)
    advertised = {}
    for i = 1, #flat, 2 do advertised[#advertised + 1] = {flat[i], parse_amounts(flat[i + 1])} end
  end
  if #advertised == 0 then return nil end
  local debits = {}
  local d = redis.call('HGETALL', prefix .. 'node-resv:' .. cid)
  for i = 1, #d, 2 do debits[d[i]] = parse_amounts(d[i + 1]) end
  local list = {}
  for _, n in ipairs(advertised) do
    local a, debit = n[2], debits[n[1]] or {}
    local e = {name = n[1]}
    for _, res in ipairs(RESOURCES) do
      e[res] = (a['alloc_' .. res] or 0) - (a['used_' .. res] or 0) - (debit[res] or 0)
    end
    list[#list + 1] = e
  end
  sort_nodes(list)
  return list
end

-- summary_fit decides from a record's node summary whether one of its
-- nodes can hold c, m, g, s: true, false, or nil when it cannot tell.
local function summary_fit(r, c, m, g, s)
  if (c == 0 or r[TOP.cpu] >= c) and (m == 0 or r[TOP.mem] >= m) and (g == 0 or r[TOP.gpu] >= g)
    and (s == 0 or r[TOP.sto] >= s) then
    return true -- the node with the most free cpu holds it
  end
  if (c > 0 and c > r[MAX.cpu]) or (m > 0 and m > r[MAX.mem]) or (g > 0 and g > r[MAX.gpu])
    or (s > 0 and s > r[MAX.sto]) then
    return false -- more than any node has free
  end
  return nil
end

-- pack_table (below) packs a node table as an idx:nrec value; decode_nrec
-- reads one into a node table (names split only when asked for: node_names).
local NREC_FORMATS = {}
local function nrec_format(n)
  local f = NREC_FORMATS[n]
  if not f then
    f = '<' .. string.rep('d', 4 * n)
    NREC_FORMATS[n] = f
  end
  return f
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

-- table_of turns a sorted node list into a node table.
local function table_of(list)
  local f, names = {}, {}
  for i, e in ipairs(list) do
    f[4 * i - 3], f[4 * i - 2], f[4 * i - 1], f[4 * i] = e.cpu, e.mem, e.gpu, e.sto
    names[i] = e.name
  end
  return {n = #list, f = f, names = names}
end

-- pack_table packs a node table as an idx:nrec value; pack_nrec a sorted
-- node list.
local function pack_table(nt)
  local names = node_names(nt)
  if HAS_STRUCT then
    return struct.pack('<H', nt.n) .. struct.pack(nrec_format(nt.n), unpack(nt.f, 1, 4 * nt.n)) .. table.concat(names, ' ')
  end
  return cjson.encode({names = names, f = nt.f})
end
local function pack_nrec(list)
  return pack_table(table_of(list))
end

-- The decisions' work on a node table is done in its arrays, without a
-- table per node: a commit finds its node (best_fit_in), debits it and
-- moves it to its place (move_node: only that node changed, no sort), and
-- summarizes the table (summarize_table): the choice of best_fit and the
-- order of sort_nodes (fits_better, precedes).

-- best_fit_in is best_fit on node table nt: the index of the node a
-- reservation of need takes, nil if none holds it.
local function best_fit_in(nt, need)
  local f, names = nt.f, node_names(nt)
  local c, m, g, s = need.cpu, need.mem, need.gpu, need.sto
  local best = nil
  for i = 1, nt.n do
    local b = 4 * i - 4
    local fc, fm, fg, fs = f[b + 1], f[b + 2], f[b + 3], f[b + 4]
    if (c <= 0 or fc >= c) and (m <= 0 or fm >= m) and (g <= 0 or fg >= g) and (s <= 0 or fs >= s) then
      local o = best and 4 * best - 4
      if best == nil or fits_better(fg, fc, fm, fs, names[i], f[o + 3], f[o + 1], f[o + 2], f[o + 4], names[best]) then
        best = i
      end
    end
  end
  return best
end

-- node_index is the index of the node named name in node table nt, or nil.
local function node_index(nt, name)
  for i, n in ipairs(node_names(nt)) do
    if n == name then return i end
  end
  return nil
end

-- move_node adds sign * amounts to node i of node table nt and moves it to
-- its place (most free cpu first, then by name: sort_nodes' order).
local function move_node(nt, i, amounts, sign)
  local f, names = nt.f, node_names(nt)
  local b = 4 * i - 4
  local name = names[i]
  local c, m, g, s = f[b + 1] + sign * amounts.cpu, f[b + 2] + sign * amounts.mem,
    f[b + 3] + sign * amounts.gpu, f[b + 4] + sign * amounts.sto
  local function goes_before(j) -- node j precedes the moved one
    return precedes(f[4 * j - 3], names[j], c, name)
  end
  local function shift(from, to) -- node from takes slot to
    local x, y = 4 * from - 4, 4 * to - 4
    f[y + 1], f[y + 2], f[y + 3], f[y + 4] = f[x + 1], f[x + 2], f[x + 3], f[x + 4]
    names[to] = names[from]
  end
  while i < nt.n and goes_before(i + 1) do
    shift(i + 1, i)
    i = i + 1
  end
  while i > 1 and not goes_before(i - 1) do
    shift(i - 1, i)
    i = i - 1
  end
  b = 4 * i - 4
  f[b + 1], f[b + 2], f[b + 3], f[b + 4] = c, m, g, s
  names[i] = name
end

-- summarize_table sets a record's node summary (records.lua) from a node
-- table, summarize_nodes from a sorted node list (nil: no nodes). Enough to
-- decide most fits without reading the nodes: a request the first node holds
-- fits, one beyond a maximum does not.
local function summarize_table(rec, nt)
  local f = nt.f
  rec[REC.nodes] = nt.n
  for k, res in ipairs(RESOURCES) do
    local top = nt.n > 0 and f[k] or 0
    local most = top
    for b = k, 4 * nt.n, 4 do
      if f[b] > most then most = f[b] end
    end
    rec[TOP[res]], rec[MAX[res]] = top, most
  end
end
local function summarize_nodes(rec, list)
  summarize_table(rec, table_of(list or {}))
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
