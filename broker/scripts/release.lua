-- release: end a live reservation and give its capacity back, exactly once.
-- Releasing an ended reservation changes nothing (idempotent). Releasing a
-- request that is still waiting for capacity withdraws it from the waiting
-- list (reply "notfound": there is no reservation). Freed capacity notifies
-- the first waiting requests (waiting.lua notify_waiters).
--
-- KEYS[1]  prefix ("rb:{b}:"): every key touched derives from it (key layout: lib/*.lua; one hash slot)
-- ARGV[1]  requester cluster id (ids are scoped per requester, core.lua)
-- ARGV[2]  reservation id, as its requester chose it
-- ARGV[3]  caller cluster id; it must be the requester or the target
-- ARGV[4]  event stream max length   ARGV[5]  event stream TTL (ms)
-- ARGV[6]  how long to keep an ended reservation (ms)
-- ARGV[7]  how many ended reservations of one requester to keep at most (ended.lua)
-- Reply: {status, reservation, clamped, now_ms}
--   status       "released" | "ended" (was already over) | "notfound" | "forbidden"
--   reservation  flat field/value array of the reservation hash ({} if notfound or forbidden)
--   clamped      1 if a capacity counter had to be clamped at zero, else 0
--   now_ms       the Redis clock when answered (for the reservation's remaining time)
-- @include reservations
local prefix, requester, caller = KEYS[1], ARGV[1], ARGV[3]
local qid = qualify(requester, ARGV[2])
local so = stream_opts(ARGV[4], ARGV[5])
local eo = ended_opts(ARGV[6], ARGV[7])
local now = now_ms()
local flat = redis.call('HGETALL', prefix .. 'resv:' .. qid)
if #flat == 0 then
  -- A request still waiting for capacity: its requester withdraws it.
  if caller == requester and redis.call('EXISTS', prefix .. 'wait:' .. qid) == 1 then
    stop_waiting(prefix, qid)
    notify_waiters(prefix, so) -- it may have held back lower priorities
  end
  return {'notfound', {}, 0, now}
end
local r = to_map(flat)
if caller ~= r.requester and caller ~= r.target then return {'forbidden', {}, 0, now} end
if not is_live(r.phase) then return {'ended', flat, 0, now} end
local clamped = end_reservation(prefix, qid, r, 'Released', now, so, eo)
notify_waiters(prefix, so)
return {'released', redis.call('HGETALL', prefix .. 'resv:' .. qid), clamped, now}
