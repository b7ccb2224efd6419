-- grant: the provider attaches the requester's access (endpoint, CA bundle,
-- token, namespace) to a live reservation, which becomes Active, and the
-- requester is notified. The grant itself is not put on the event stream: the
-- requester reads it with the reservation (only the requester may). The
-- broker seals it before (store.GrantKeys): Redis never holds the token in
-- clear; end_reservation (reservations.lua) removes it when the reservation ends.
--
-- KEYS[1]  prefix ("rb:{b}:"): every key touched derives from it (key layout: lib/*.lua; one hash slot)
-- ARGV[1]  requester cluster id (ids are scoped per requester, core.lua)
-- ARGV[2]  reservation id, as its requester chose it
-- ARGV[3]  caller cluster id; it must be the target
-- ARGV[4]  the grant, sealed
-- ARGV[5]  event stream max length   ARGV[6]  event stream TTL (ms)
-- Reply: {status, reservation, now_ms}
--   status  "granted" | "ended" | "notfound" | "forbidden"
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
redis.call('HSET', rk, 'phase', 'Active', 'grant', ARGV[4], 'granted_ms', now)
emit(prefix, r.requester, stream_opts(ARGV[5], ARGV[6]), event_fields('Granted', id, r, now))
flat = redis.call('HGETALL', rk)
with_live_end(prefix, qid, r, flat)
return {'granted', flat, now}
