-- expire: end every live reservation whose expires_ms has passed (broker
-- clock), sweep the waiting list of the requests whose wait expired, and trim
-- the audit stream to its retention. Every broker replica runs it on a timer;
-- running it concurrently is safe because each call is atomic and ended
-- reservations leave the index. Freed capacity notifies the first waiting
-- requests (lib.lua notify_waiters).
--
-- KEYS[1]  prefix ("rb:{b}:"): every key touched derives from it (lib.lua key layout; one hash slot)
-- ARGV[1]  at most this many reservations ended, and as many waiting members
--          swept, per call (the caller loops while the reservations ended
--          equal it; the waiting members left go at its next run)
-- ARGV[2]  event stream max length   ARGV[3]  event stream TTL (ms)
-- ARGV[4]  how long to keep an ended reservation (ms)
-- ARGV[5]  how long to keep an audit entry (ms)
-- Reply: {expired, clamped, swept}  how many reservations ended, how many of
--        them needed a counter clamped, and how many waiting members were swept
local prefix = KEYS[1]
local limit = tonumber(ARGV[1])
local so = stream_opts(ARGV[2], ARGV[3])
local now = now_ms()
local due = redis.call('ZRANGEBYSCORE', prefix .. 'expiry', '-inf', now, 'LIMIT', 0, limit)
local clamped = 0
for _, qid in ipairs(due) do
  local flat = redis.call('HGETALL', prefix .. 'resv:' .. qid)
  if #flat == 0 then
    redis.call('ZREM', prefix .. 'expiry', qid)
  else
    local r = to_map(flat)
    if is_live(r.phase) then
      clamped = clamped + end_reservation(prefix, qid, r, 'Expired', now, so, ARGV[4])
    else
      redis.call('ZREM', prefix .. 'expiry', qid)
    end
  end
end
if #due > 0 then notify_waiters(prefix, so) end

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
return {#due, clamped, #gone}
