-- grant: the provider attaches the requester's access (endpoint, CA bundle,
-- token, namespace) to a live reservation, which becomes Active, and the
-- requester is notified. The grant itself is not put on the event stream: the
-- requester reads it with the reservation (only the requester may). The
-- access is the same for every reservation of the requester at this provider:
-- it is stored once per pair (grants.lua take_share), sealed by the broker
-- (store.GrantKeys: Redis never holds the token in clear); the record keeps
-- its placement and a share of it. end_reservation (reservations.lua) drops
-- the share when the reservation ends, and the last share the access.
--
-- KEYS[1]  prefix ("rb:{b}:"): every key touched derives from it (key layout: lib/*.lua; one hash slot)
-- ARGV[1]  requester cluster id (ids are scoped per requester, core.lua)
-- ARGV[2]  reservation id, as its requester chose it
-- ARGV[3]  caller cluster id; it must be the target
-- ARGV[4]  the access (the grant without its placement), sealed for the pair
-- ARGV[5]  the access' expiry (ms; 0: none given): the newest access is the pair's
-- ARGV[6]  "placed" when the grant has a placement, else ""
-- ARGV[7]  the placement's node   ARGV[8]  its priority class
-- ARGV[9]  event stream max length   ARGV[10]  event stream TTL (ms)
-- Reply: {status, reservation, now_ms}
--   status       "granted" | "ended" | "notfound" | "forbidden"
--   reservation  the record's HGETALL, with the pair's access (grants.lua with_access)
-- @include reservations
local prefix, id, caller = KEYS[1], ARGV[2], ARGV[3]
local qid = qualify(ARGV[1], id)
local rk = prefix .. 'resv:' .. qid
local now = now_ms()
local flat = redis.call('HGETALL', rk)
if #flat == 0 then return {'notfound', {}, now} end
local r = to_map(flat)
if caller ~= r.target then return {'forbidden', {}, now} end
if not is_live(r.phase) then return {'ended', flat, now} end
with_live_end(prefix, qid, r)
r.phase = 'Active'
take_share(prefix, rk, r, ARGV[4], ARGV[5], now)
redis.call('HSET', rk, 'phase', 'Active', 'granted_ms', now)
-- A grant replaces the last one whole: a record of the previous release
-- loses its own sealed grant, a placement not given again goes.
redis.call('HDEL', rk, 'grant')
if ARGV[6] == 'placed' then
  redis.call('HSET', rk, 'place_node', ARGV[7], 'place_class', ARGV[8])
else
  redis.call('HDEL', rk, 'place_node', 'place_class')
end
emit(prefix, r.requester, stream_opts(ARGV[9], ARGV[10]), event_fields('Granted', id, r, now))
flat = redis.call('HGETALL', rk)
with_live_end(prefix, qid, r, flat)
with_access(prefix, r, flat)
return {'granted', flat, now}
