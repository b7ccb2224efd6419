-- expire: end every live reservation whose end (its expiry score) has
-- passed (broker clock), sweep the waiting list of the requests whose wait
-- expired, and trim the audit stream and the requesters with ended reservations kept
-- (ended.lua) to their retention. Every broker replica runs it on a timer;
-- running it concurrently is safe because each call is atomic and ended
-- reservations leave the index. Freed capacity notifies the first waiting
-- requests (waiting.lua notify_waiters).
--
-- KEYS[1]  prefix ("rb:{b}:"): every key touched derives from it (key layout: lib/*.lua; one hash slot)
-- ARGV[1]  at most this many reservations ended, and as many waiting members
--          swept, per call (the caller loops while the reservations ended
--          equal it; the waiting members left go at its next run)
-- ARGV[2]  event stream max length   ARGV[3]  event stream TTL (ms)
-- ARGV[4]  how long to keep an ended reservation (ms)
-- ARGV[5]  how long to keep an audit entry (ms)
-- ARGV[6]  how long without any expire run counts as a broker outage (ms;
--          clock.lua last_outage)
-- ARGV[7]  how many ended reservations of one requester to keep at most (ended.lua)
-- Reply: {expired, clamped, swept, credited, outage_ms}  how many reservations
--        ended, how many of them needed a counter clamped, how many waiting
--        members were swept, how many due leases were given more time for the
--        last outage instead of ending, and the outage this call found (ms; 0:
--        none)
-- @include clock
-- @include reservations
local prefix = KEYS[1]
local limit = tonumber(ARGV[1])
local so = stream_opts(ARGV[2], ARGV[3])
local eo = ended_opts(ARGV[4], ARGV[7])
local now = now_ms()

-- Stamp the clock first: an outage found now is recorded before any lease
-- is judged.
local outage_ms = 0
local tick = tonumber(redis.call('HGET', prefix .. 'clock', 'tick_ms'))
if tick and now - tick > tonumber(ARGV[6]) then
  outage_ms = now - tick
  redis.call('HSET', prefix .. 'clock', 'outage_from_ms', tick, 'outage_to_ms', now)
end
redis.call('HSET', prefix .. 'clock', 'tick_ms', now, 'gap_ms', ARGV[6])
local from, to = last_outage(prefix, now)

-- A live reservation's end is its expiry score (core.lua with_live_end):
-- an outage credit moves only the score.
local due = redis.call('ZRANGEBYSCORE', prefix .. 'expiry', '-inf', now, 'WITHSCORES', 'LIMIT', 0, limit)
local clamped, credited, ended = 0, 0, 0
for i = 1, #due, 2 do
  local qid, score = due[i], due[i + 1]
  local rk = prefix .. 'resv:' .. qid
  local flat = redis.call('HGETALL', rk)
  if #flat == 0 then
    redis.call('ZREM', prefix .. 'expiry', qid)
  else
    local r = to_map(flat)
    local until_ms = credited_end(tonumber(score), tonumber(r.lease_ms or '0'), from, to)
    if not is_live(r.phase) then
      redis.call('ZREM', prefix .. 'expiry', qid)
    elseif until_ms > now then
      redis.call('ZADD', prefix .. 'expiry', string.format('%d', until_ms), qid)
      credited = credited + 1
    else
      r.expires_ms = score
      clamped = clamped + end_reservation(prefix, qid, r, 'Expired', now, so, eo)
      ended = ended + 1
    end
  end
end
if ended > 0 then notify_waiters(prefix, so) end

-- Waiting members whose wait hash has expired (the requester stopped
-- retrying): their requests are gone. A hash that still names the member
-- goes with it (it expires at the same instant).
local gone = redis.call('ZRANGEBYSCORE', prefix .. 'wait-due', '-inf', now, 'LIMIT', 0, limit)
for _, m in ipairs(gone) do
  forget_waiter(prefix, m)
  local wk = prefix .. 'wait:' .. waiting_id(m)
  if redis.call('HGET', wk, 'member') == m then redis.call('DEL', wk) end
end

redis.call('XTRIM', prefix .. 'audit', 'MINID', '~', string.format('%d', now - tonumber(ARGV[5])))
-- A requester whose last ended reservation is past the retention has none
-- kept (its P.."ended:" set expired with that record).
redis.call('ZREMRANGEBYSCORE', prefix .. 'ended-requesters', '-inf', string.format('%d', now - eo.retention))
return {ended, clamped, #gone, credited, outage_ms}
