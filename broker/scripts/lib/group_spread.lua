-- group_spread: placing the members of a spread group (reserve_group.lua
-- header: Spread). Expects reserve_group.lua's locals and group_place.lua
-- above its directive; declares spread (nil: no spread group), copy and
-- spread_fit.
-- @include group_place

-- Spread: every candidate read, its domain, the group's counts.
local spread = nil
if spread_group ~= '' then
  while more_clusters() do end
  spread = {per = {}, total = 0, domain_of = {}, count = {}, unconstrained = {}, chosen = {}}
  local flat = redis.call('HGETALL', prefix .. 'spread:' .. requester .. '/' .. spread_group)
  for i = 1, #flat, 2 do
    spread.per[flat[i]] = tonumber(flat[i + 1])
    spread.total = spread.total + tonumber(flat[i + 1])
  end
  if spread_key ~= '' then
    -- Domains: every live provider matching the selector with the key, room or not.
    local ids = redis.call('ZRANGEBYSCORE', prefix .. 'idx:live', cut, '+inf')
    local labels = {}
    for first = 1, #ids, 128 do
      local last = math.min(first + 127, #ids)
      local raw = redis.call('HMGET', prefix .. 'idx:labels', unpack(ids, first, last))
      for i = 1, last - first + 1 do labels[ids[first + i - 1]] = decode_labels(raw[i]) end
    end
    for _, cid in ipairs(ids) do
      local v = labels[cid][spread_key]
      if cid ~= requester and (not matching or matching[cid]) and v ~= nil then
        v = tostring(v)
        spread.domain_of[cid] = v
        spread.count[v] = (spread.count[v] or 0) + (spread.per[cid] or 0)
      end
    end
  end
end
local function domain_min()
  local low = nil
  for _, n in pairs(spread.count) do
    if low == nil or n < low then low = n end
  end
  return low or 0
end
local function copy(t)
  local out = {}
  for k, v in pairs(t) do out[k] = v end
  return out
end

-- spread_fit places m by the spread rules: the candidates in order of
-- (share policy kept, domain count, free cpu, id), those a DoNotSchedule
-- constraint allows, first that holds m.
local function spread_fit(m)
  local low = domain_min()
  local cap = math.max(1, math.ceil(max_share * (spread.total + 1)))
  local ranked, refused = {}, 0
  for _, c in ipairs(clusters) do
    local d = spread.domain_of[c.id]
    local allowed = true
    if spread_key ~= '' and when == 'DoNotSchedule' then
      allowed = d ~= nil and spread.count[d] + 1 - low <= max_skew
    end
    if not allowed then refused = refused + 1 end
    if allowed then
      ranked[#ranked + 1] = {c = c, over = (max_share > 0 and (spread.per[c.id] or 0) + 1 > cap) and 1 or 0,
        n = d and spread.count[d] or math.huge}
    end
  end
  table.sort(ranked, function(x, y)
    if x.over ~= y.over then return x.over < y.over end
    if x.n ~= y.n then return x.n < y.n end
    if x.c.free.cpu ~= y.c.free.cpu then return x.c.free.cpu > y.c.free.cpu end
    return x.c.id < y.c.id
  end)
  for _, e in ipairs(ranked) do
    local node = fits(e.c, m)
    if node then return e.c, node end
  end
  -- Nothing allowed holds it: how many providers the constraint kept out.
  if refused > 0 then rejected.spread_max_skew = refused end
  return nil
end
