-- release: end a live reservation and give its capacity back, exactly once.
-- Releasing an ended reservation changes nothing (idempotent). Releasing a
-- request that is still waiting for capacity withdraws it from the waiting
-- list (reply "notfound": there is no reservation). Freed capacity notifies
-- the first waiting requests (lib.lua notify_waiters).
--
-- KEYS[1]  prefix ("rb:{b}:")
-- ARGV[1]  reservation id
-- ARGV[2]  caller cluster id; it must be the requester or the target
-- ARGV[3]  event stream max length
-- ARGV[4]  how long to keep an ended reservation (ms)
-- Reply: {status, reservation, clamped}
--   status       "released" | "ended" (was already over) | "notfound" | "forbidden"
--   reservation  flat field/value array of the reservation hash ({} if notfound)
--   clamped      1 if a capacity counter had to be clamped at zero, else 0
local prefix, id, caller = KEYS[1], ARGV[1], ARGV[2]
local flat = redis.call('HGETALL', prefix .. 'resv:' .. id)
if #flat == 0 then
  -- A request still waiting for capacity: its requester withdraws it.
  if redis.call('HGET', prefix .. 'wait:' .. id, 'requester') == caller then
    stop_waiting(prefix, id)
    notify_waiters(prefix, ARGV[3]) -- it may have held back lower priorities
  end
  return {'notfound', {}, 0}
end
local r = to_map(flat)
if caller ~= r.requester and caller ~= r.target then return {'forbidden', {}, 0} end
if not is_live(r.phase) then return {'ended', flat, 0} end
local clamped = end_reservation(prefix, id, r, 'Released', now_ms(), ARGV[3], ARGV[4])
notify_waiters(prefix, ARGV[3])
return {'released', redis.call('HGETALL', prefix .. 'resv:' .. id), clamped}
