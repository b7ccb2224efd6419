-- reindex: build the candidate index (index.lua) from the cluster hashes: live
-- clusters are indexed, stale ones removed. The broker runs it at start-up
-- when the index is missing or of another INDEX_VERSION (a Redis written by
-- an older broker); advertise, reserve, release and expire keep it up to
-- date afterwards.
--
-- It also moves the live reservations of the layout before qualified ids
-- (INDEX_VERSION 3 and older: keys and members named by the bare id) to
-- the qualified ones (core.lua): their hash, expiry entry, by-target,
-- by-requester and node-listed members. Waiting entries of that layout are
-- dropped (they last seconds; a live requester's next retry comes back).
-- Ended reservations of that layout keep their old keys until retention
-- removes them: no longer readable through the API.
--
-- It rebuilds the requesters' usage (limits.lua P.."usage") from the live
-- reservations, and the waiting list's due times (P.."wait-due") from the
-- wait hashes' TTLs (a member whose hash is gone leaves the list).
--
-- KEYS[1]  prefix ("rb:{b}:"): every key touched derives from it (key layout: lib/*.lua; one hash slot)
-- ARGV[1]  stale threshold (ms)
-- ARGV[2]  "force" to rebuild even if idx:version says the index exists
-- Reply: number of live clusters indexed, or -1 when the index already existed
-- @include index
-- @include limits
-- @include waiting
local prefix = KEYS[1]
if ARGV[2] ~= 'force' and redis.call('GET', prefix .. 'idx:version') == INDEX_VERSION then return -1 end

-- Live reservations of the older layout: a qualified id holds a '/', a bare one never does.
local ek = prefix .. 'expiry'
for _, old in ipairs(redis.call('ZRANGE', ek, 0, -1)) do
  if not string.find(old, '/', 1, true) then
    local rk = prefix .. 'resv:' .. old
    local v = redis.call('HMGET', rk, 'requester', 'target')
    if v[1] then
      local qid = qualify(v[1], old)
      local score = redis.call('ZSCORE', ek, old)
      redis.call('RENAME', rk, prefix .. 'resv:' .. qid)
      redis.call('ZADD', ek, score, qid)
      for _, key in ipairs({'by-target:' .. v[2], 'by-requester:' .. v[1]}) do
        if redis.call('SREM', prefix .. key, old) == 1 then redis.call('SADD', prefix .. key, qid) end
      end
      if redis.call('SREM', prefix .. 'node-listed:' .. v[2], old) == 1 then
        redis.call('SADD', prefix .. 'node-listed:' .. v[2], qid)
      end
    end
    redis.call('ZREM', ek, old)
  end
end
for _, m in ipairs(redis.call('ZRANGE', prefix .. 'waiting', 0, -1)) do
  local id = waiting_id(m)
  if id and not string.find(id, '/', 1, true) then
    redis.call('ZREM', prefix .. 'waiting', m)
    redis.call('DEL', prefix .. 'wait:' .. id)
  end
end

-- The requesters' usage: the sum of their live reservations.
local usage = {}
for _, qid in ipairs(redis.call('ZRANGE', ek, 0, -1)) do
  local v = redis.call('HMGET', prefix .. 'resv:' .. qid, 'requester', 'phase', 'cpu', 'mem', 'gpu', 'sto')
  if v[1] and is_live(v[2]) then
    local u = usage[v[1]]
    if not u then
      u = {n = 0, cpu = 0, mem = 0, gpu = 0, sto = 0}
      usage[v[1]] = u
    end
    u.n = u.n + 1
    for i, res in ipairs(RESOURCES) do u[res] = u[res] + tonumber(v[2 + i] or '0') end
  end
end
redis.call('DEL', prefix .. 'usage')
for requester, u in pairs(usage) do write_usage(prefix, requester, u) end

-- The waiting list's due times: when each member's wait hash expires.
local now = now_ms()
redis.call('DEL', prefix .. 'wait-due')
for _, m in ipairs(redis.call('ZRANGE', prefix .. 'waiting', 0, -1)) do
  local wk = prefix .. 'wait:' .. waiting_id(m)
  local ttl = redis.call('PTTL', wk)
  if ttl < 0 or redis.call('HGET', wk, 'member') ~= m then
    redis.call('ZREM', prefix .. 'waiting', m)
  else
    redis.call('ZADD', prefix .. 'wait-due', now + ttl, m)
  end
end

local cut = now - tonumber(ARGV[1])
local indexed = 0
local all = redis.call('ZRANGE', prefix .. 'clusters', 0, -1, 'WITHSCORES')
for i = 1, #all, 2 do
  local cid, seen = all[i], tonumber(all[i + 1])
  unindex_cluster(prefix, cid)
  if seen >= cut then
    index_cluster(prefix, cid, seen, nil)
    indexed = indexed + 1
  end
end
redis.call('SET', prefix .. 'idx:version', INDEX_VERSION)
return indexed
