-- release: end live reservations and give their capacity back, each exactly
-- once: the releases that queued at a replica while its earlier calls were
-- in flight, ended in order as one call each would (store.batcher).
-- Releasing an ended reservation changes nothing (idempotent). Releasing a
-- request that is still waiting for capacity withdraws it from the waiting
-- list (status "notfound": there is no reservation). Once the batch is
-- ended, the freed capacity notifies the first waiting requests
-- (waiting.lua notify_waiters): once for the batch, not once per release.
--
-- KEYS[1]  prefix ("rb:{b}:"): every key touched derives from it (key layout: lib/*.lua; one hash slot)
-- ARGV[1]  event stream max length   ARGV[2]  event stream TTL (ms)
-- ARGV[3]  how long to keep an ended reservation (ms)
-- ARGV[4]  how many ended reservations of one requester to keep at most (ended.lua)
-- ARGV[5..] the releases, three values each:
--   requester cluster id (ids are scoped per requester, core.lua),
--   reservation id, as its requester chose it,
--   caller cluster id; it must be the requester or the target
-- Reply: one {status, reservation, clamped, now_ms} per release, in order:
--   status       "released" | "ended" (was already over) | "notfound" | "forbidden" | "error"
--   reservation  flat field/value array of the reservation hash ({} if notfound,
--                forbidden or error; error: the message instead)
--   clamped      1 if a capacity counter had to be clamped at zero, else 0
--   now_ms       the Redis clock when answered (for the reservation's remaining time)
-- @include reservations
local prefix = KEYS[1]
local so = stream_opts(ARGV[1], ARGV[2])
local eo = ended_opts(ARGV[3], ARGV[4])
local now = now_ms()
local FIRST = 5

-- release ends one reservation; freed says whether it freed capacity (or
-- withdrew a waiting request that may have held back lower priorities).
local function release(requester, id, caller)
  local qid = qualify(requester, id)
  local flat = redis.call('HGETALL', prefix .. 'resv:' .. qid)
  if #flat == 0 then
    -- A request still waiting for capacity: its requester withdraws it.
    local withdrawn = caller == requester and redis.call('EXISTS', prefix .. 'wait:' .. qid) == 1
    if withdrawn then stop_waiting(prefix, qid) end
    return {'notfound', {}, 0, now}, withdrawn
  end
  local r = to_map(flat)
  if caller ~= r.requester and caller ~= r.target then return {'forbidden', {}, 0, now}, false end
  if not is_live(r.phase) then return {'ended', flat, 0, now}, false end
  local clamped = end_reservation(prefix, qid, r, 'Released', now, so, eo)
  return {'released', redis.call('HGETALL', prefix .. 'resv:' .. qid), clamped, now}, true
end

local replies, freed = {}, false
for a = FIRST, #ARGV - 2, 3 do
  local ok, reply, did = pcall(release, ARGV[a], ARGV[a + 1], ARGV[a + 2])
  if not ok then reply, did = {'error', {}, 0, now, tostring(reply)}, true end -- it may have ended part way
  replies[#replies + 1] = reply
  freed = freed or did
end
if freed then notify_waiters(prefix, so) end
return replies
