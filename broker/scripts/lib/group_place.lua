-- group_place: the candidates of a reserve_group.lua call and the first
-- fit of a member (reserve_group.lua header: Placement). Expects
-- reserve_group.lua's locals above its directive (prefix, requester, cut,
-- members, min_member, selector_json); the script goes on with what it
-- declares: rejected, live, clusters, count_rejections, order (the members,
-- largest first), take, first_fit and what they placed (used, used_list,
-- placed).
-- @include reservations

-- The candidates: live, not the requester, matching the selector, with the
-- smallest member's cpu free; their records (records.lua).
local least = {cpu = math.huge, mem = math.huge, gpu = math.huge, sto = math.huge}
for _, m in ipairs(members) do
  for _, res in ipairs(RESOURCES) do least[res] = math.min(least[res], m[res]) end
end
local rejected = {members = #members, min_member = min_member, placeable = 0}
local live = redis.call('ZCOUNT', prefix .. 'idx:live', cut, '+inf')
local matching = clusters_with_labels(prefix, selector_json)
-- live_now tells whether cluster cid is live (seen since the cut).
local function live_now(cid)
  local seen = redis.call('ZSCORE', prefix .. 'idx:live', cid)
  return seen and tonumber(seen) >= cut
end

-- clusters: the candidates read so far, most free cpu first (the order of
-- idx:free:cpu), from the smallest member's cpu up; more_clusters reads the
-- next chunk of them (false: none left). A group that fits reads only the
-- first chunks.
local clusters, offset, exhausted = {}, 0, false
local CHUNK = 64
local function more_clusters()
  if exhausted then return false end
  local ids = redis.call('ZREVRANGEBYSCORE', prefix .. 'idx:free:cpu', '+inf', string.format('%d', least.cpu),
    'LIMIT', offset, CHUNK)
  offset = offset + CHUNK
  if #ids < CHUNK then exhausted = true end
  local cands = {}
  for _, cid in ipairs(ids) do
    if cid ~= requester and (not matching or matching[cid]) and live_now(cid) then cands[#cands + 1] = cid end
  end
  if #cands == 0 then return not exhausted end
  local raw = redis.call('HMGET', prefix .. 'idx:rec', unpack(cands))
  for i, cid in ipairs(cands) do
    if raw[i] then
      local r = read_rec(raw[i])
      clusters[#clusters + 1] = {id = cid, free = free_of(r), has_nodes = r[REC.nodes] > 0, rec = r}
    end
  end
  return true
end

-- count_rejections says, once nothing more can be placed (every candidate
-- read), why the live providers were excluded: how many are the requester,
-- miss the selector's labels, lack the smallest member's cpu.
local function count_rejections()
  rejected.stale = redis.call('ZCOUNT', prefix .. 'idx:live', '-inf', '(' .. cut)
  rejected.requester = live_now(requester) and 1 or 0
  local eligible = live - rejected.requester
  if matching then
    local n = 0
    for cid in pairs(matching) do
      if cid ~= requester and live_now(cid) then n = n + 1 end
    end
    rejected.selector = eligible - n
    eligible = n
  end
  rejected.insufficient_cpu = eligible - #clusters
end

-- fits tells whether cluster c holds member m (totals and, with nodes, one
-- node); it returns the node (nodes.lua best_fit), or true without nodes.
local function fits(c, m)
  if not holds(c.free, m) then return nil end
  if not c.has_nodes then return true end
  if not c.nodes then c.nodes = node_list(prefix, c.id) or {} end
  return best_fit(c.nodes, m)
end

-- Place the members, largest first.
local order = {}
for i = 1, #members do order[i] = i end
table.sort(order, function(x, y)
  local a, b = members[x], members[y]
  for _, res in ipairs({'cpu', 'mem', 'gpu', 'sto'}) do
    if a[res] ~= b[res] then return a[res] > b[res] end
  end
  return a.id < b.id
end)
local used, used_list, placed = {}, {}, 0
local function take(m, c, node)
  placed = placed + 1
  m.cluster = c
  for _, res in ipairs(RESOURCES) do c.free[res] = c.free[res] - m[res] end
  if node ~= true then
    m.node = node.name
    for _, res in ipairs(RESOURCES) do node[res] = node[res] - m[res] end
  end
  if not used[c.id] then
    used[c.id] = true
    used_list[#used_list + 1] = c
  end
end

-- first_fit places m on the providers the group uses, then on the others.
local function first_fit(m)
  for _, c in ipairs(used_list) do
    local node = fits(c, m)
    if node then return c, node end
  end
  local k = 1
  while true do
    if k > #clusters and not more_clusters() then return nil end
    local c = clusters[k]
    if c and not used[c.id] then
      local node = fits(c, m)
      if node then return c, node end
    end
    k = k + 1
  end
end
