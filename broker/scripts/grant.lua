-- grant: the provider attaches the requester's access (endpoint, CA bundle,
-- token, namespace) to a live reservation, which becomes Active, and the
-- requester is notified. The grant itself is not put on the event stream: the
-- requester reads it with the reservation (only the requester may).
--
-- KEYS[1]  prefix ("rb:{b}:")
-- ARGV[1]  reservation id
-- ARGV[2]  caller cluster id; it must be the target
-- ARGV[3]  grant as JSON
-- ARGV[4]  event stream max length
-- Reply: {status, reservation}
--   status  "granted" | "ended" | "notfound" | "forbidden"
local prefix, id, caller = KEYS[1], ARGV[1], ARGV[2]
local rk = prefix .. 'resv:' .. id
local flat = redis.call('HGETALL', rk)
if #flat == 0 then return {'notfound', {}} end
local r = to_map(flat)
if caller ~= r.target then return {'forbidden', {}} end
if not is_live(r.phase) then return {'ended', flat} end
r.phase = 'Active'
redis.call('HSET', rk, 'phase', 'Active', 'grant', ARGV[3], 'granted_ms', now_ms())
emit(prefix, r.requester, ARGV[4], event_fields('Granted', id, r))
return {'granted', redis.call('HGETALL', rk)}
