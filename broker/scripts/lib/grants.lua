-- grants: the providers' access, stored once per (provider, requester) pair.
-- A provider grants each reservation of a requester the same access (its
-- tenant namespace, the tenant ServiceAccount's token, its API server and CA)
-- and a placement of its own (node, priority class). The access goes to the
-- pair's key, sealed by the broker (store.GrantKeys, bound to the pair); the
-- record keeps its placement and a share of the pair's access:
--
--   P.."grant:"..provider..":"..requester  hash  the pair's access: sealed (the newest
--                                   access posted, by its expiry), exp_ms (that expiry, ms;
--                                   0: none given), n (the live reservations holding a share
--                                   of it), gen (the ms the key was made: a record's share
--                                   names it, so a share of a key that expired and was made
--                                   again is not counted twice); deleted when n falls to 0,
--                                   and expires ACCESS_KEPT_MS after exp_ms (the token is dead
--                                   by then: the provider grants again at 2/3 of its lifetime)
--
-- A record holding a share has grant_gen (the gen of the pair key it counts
-- in) and, when the provider holds capacity for it, place_node and
-- place_class; these are short, so the record stays a listpack.
-- @include core

-- ACCESS_KEPT_MS: how long past its expiry (the provider's clock) a pair's
-- access is kept when no end has removed it: room for the clocks' skew. (Set
-- with PEXPIRE from now: the broker's Redis user has no PEXPIREAT.)
local ACCESS_KEPT_MS = 5 * 60 * 1000

local function grant_key(prefix, provider, requester)
  return prefix .. 'grant:' .. provider .. ':' .. requester
end

-- take_share stores a grant's access (sealed, expiring at exp_ms) as the
-- pair's unless the pair holds one expiring later, and gives live record rk
-- (map r) its share: counted once per record and key.
local function take_share(prefix, rk, r, sealed, exp_ms, now)
  local pk = grant_key(prefix, r.target, r.requester)
  local held = redis.call('HMGET', pk, 'gen', 'exp_ms')
  local gen = held[1]
  if not gen then
    gen = tostring(now)
    redis.call('HSET', pk, 'gen', gen, 'n', '0')
  end
  local exp = tonumber(exp_ms)
  if not held[1] or exp >= tonumber(held[2]) then
    redis.call('HSET', pk, 'sealed', sealed, 'exp_ms', exp_ms)
    if exp > 0 then redis.call('PEXPIRE', pk, string.format('%d', math.max(exp - now, 0) + ACCESS_KEPT_MS)) end
  end
  if r.grant_gen ~= gen then
    redis.call('HINCRBY', pk, 'n', 1)
    redis.call('HSET', rk, 'grant_gen', gen)
    r.grant_gen = gen
  end
end

-- drop_share takes a record's share (map r: the whole record) from its
-- pair's access as it ends: the last share deletes the access.
local function drop_share(prefix, rk, r)
  if not r.grant_gen then return end
  redis.call('HDEL', rk, 'grant_gen')
  local pk = grant_key(prefix, r.target, r.requester)
  if redis.call('HGET', pk, 'gen') == r.grant_gen and redis.call('HINCRBY', pk, 'n', -1) <= 0 then
    redis.call('DEL', pk)
  end
end

-- with_access adds to flat, the HGETALL reply of record r, the sealed
-- access of the pair it holds a share of, as the field 'access' (never
-- stored in the record): the broker composes the grant from it and the
-- record's placement (store.readReservation).
local function with_access(prefix, r, flat)
  if not r.grant_gen then return end
  local held = redis.call('HMGET', grant_key(prefix, r.target, r.requester), 'sealed', 'gen')
  if held[1] and held[2] == r.grant_gen then
    flat[#flat + 1] = 'access'
    flat[#flat + 1] = held[1]
  end
end
