-- preempt_victims: choosing the victims of a preemption on one provider
-- (preempt.lua header: Victims). Expects preempt.lua's prefix, req,
-- priority, now, grace and holds_req above its directive. A search (st)
-- keeps the best choice so far, best = {key, cid, node, victims}, and the
-- counts the nofit answer reports.
-- @include reservations

local RESV_FIELDS = {'requester', 'priority', 'cpu', 'mem', 'gpu', 'sto', 'node', 'phase', 'expires_ms', 'lease_ms'}

-- live_by_node reads provider cid's live reservations, by node ('' when
-- the provider advertises no nodes).
local function live_by_node(cid, without_nodes)
  local by_node = {}
  for _, rq in ipairs(redis.call('SMEMBERS', prefix .. 'by-target:' .. cid)) do
    local v = redis.call('HMGET', prefix .. 'resv:' .. rq, unpack(RESV_FIELDS))
    if v[8] == 'Reserved' or v[8] == 'Active' then
      local r = {qid = rq, requester = v[1], priority = tonumber(v[2] or '0'), node = v[7] or '',
        expires = tonumber(v[9] or '0'), lease = v[10]}
      for i, res in ipairs(RESOURCES) do r[res] = tonumber(v[2 + i] or '0') end
      if without_nodes then r.node = '' end
      by_node[r.node] = by_node[r.node] or {}
      table.insert(by_node[r.node], r)
    end
  end
  return by_node
end

-- plus is a + sign * b, resource by resource.
local function plus(a, b, sign)
  local out = {}
  for _, res in ipairs(RESOURCES) do out[res] = a[res] + sign * b[res] end
  return out
end

-- plus_all is a plus every reservation of list (a copy of a for none).
local function plus_all(a, list)
  a = plus(a, a, 0)
  for _, r in ipairs(list) do a = plus(a, r, 1) end
  return a
end

-- spare takes the lower-priority reservations whose capacity, with the
-- node's free capacity (free) and the provider's (tfree), holds the
-- request, and spares them again, highest priority (then smallest cpu)
-- first, while the rest makes room. It returns the victims.
local function spare(lower, free, tfree)
  free, tfree = plus_all(free, lower), plus_all(tfree, lower)
  table.sort(lower, function(x, y)
    if x.priority ~= y.priority then return x.priority > y.priority end
    if x.cpu ~= y.cpu then return x.cpu < y.cpu end
    return x.qid < y.qid
  end)
  local victims = {}
  for _, r in ipairs(lower) do
    local f, t = plus(free, r, -1), plus(tfree, r, -1)
    if holds_req(f) and holds_req(t) then
      free, tfree = f, t
    else
      victims[#victims + 1] = r
    end
  end
  return victims
end

-- consider keeps victims on node of cid as st's best if they come first:
-- the fewest, then the lowest highest priority, the lowest sum of
-- priorities, then provider id and node name.
local function consider(st, cid, node, victims)
  local top, sum = -math.huge, 0
  for _, r in ipairs(victims) do
    top = math.max(top, r.priority)
    sum = sum + r.priority
  end
  local key = {#victims, top, sum, cid, node}
  local better = st.best == nil
  if not better then
    for i = 1, 5 do
      if key[i] ~= st.best.key[i] then
        better = key[i] < st.best.key[i]
        break
      end
    end
  end
  if better then st.best = {key = key, cid = cid, node = node, victims = victims} end
end

-- search_node looks at node n of provider cid (total: the provider's free
-- capacity; resv: the live reservations on n). It answers "wait" when the
-- capacity expiring within the grace period would hold the request.
local function search_node(st, cid, n, total, resv)
  local soon, lower = plus_all(n, {}), {}
  for _, r in ipairs(resv) do
    if not r.lease and r.expires <= now + grace then soon = plus(soon, r, 1) end
    if r.priority < priority then
      if redis.call('SISMEMBER', prefix .. 'protected:' .. r.requester, bare_id(r.qid)) == 1 then
        st.protected_seen = st.protected_seen + 1 -- its pod's disruption budget allows none now
      else
        lower[#lower + 1] = r
      end
    end
  end
  if holds_req(soon) then return {'wait', {}, '[]', cjson.encode({provider = cid, node = n.name}), now} end
  st.lower_seen = st.lower_seen + #lower
  if #lower == 0 or not (holds_req(plus_all(n, lower)) and holds_req(plus_all(total, lower))) then return nil end
  st.feasible = st.feasible + 1
  consider(st, cid, n.name, spare(lower, n, total))
  return nil
end

-- search_provider looks at every node of provider cid (one node, its
-- totals, without nodes); it answers "fits" when one holds the request
-- as it is, "wait" as search_node does.
local function search_provider(st, cid)
  local raw = redis.call('HGET', prefix .. 'idx:rec', cid)
  local total = raw and free_of(read_rec(raw)) or {cpu = 0, mem = 0, gpu = 0, sto = 0}
  local nodes = node_list(prefix, cid) or {{name = '', cpu = total.cpu, mem = total.mem, gpu = total.gpu, sto = total.sto}}
  for _, n in ipairs(nodes) do
    if holds_req(n) and holds_req(total) then
      return {'fits', {}, '[]', cjson.encode({provider = cid, node = n.name}), now}
    end
  end
  local by_node = live_by_node(cid, nodes[1].name == '')
  for _, n in ipairs(nodes) do
    local answer = search_node(st, cid, n, total, by_node[n.name] or {})
    if answer then return answer end
  end
  return nil
end
