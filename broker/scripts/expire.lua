-- expire: end every live reservation whose expires_ms has passed (broker
-- clock). Every broker replica runs it on a timer; running it concurrently is
-- safe because each call is atomic and ended reservations leave the index.
-- Freed capacity notifies the first waiting requests (lib.lua notify_waiters).
--
-- KEYS[1]  prefix ("rb:{b}:")
-- ARGV[1]  at most this many reservations per call (the caller loops while the reply equals it)
-- ARGV[2]  event stream max length
-- ARGV[3]  how long to keep an ended reservation (ms)
-- Reply: {expired, clamped}  how many ended, and how many needed a counter clamped
local prefix = KEYS[1]
local now = now_ms()
local due = redis.call('ZRANGEBYSCORE', prefix .. 'expiry', '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
local clamped = 0
for _, qid in ipairs(due) do
  local flat = redis.call('HGETALL', prefix .. 'resv:' .. qid)
  if #flat == 0 then
    redis.call('ZREM', prefix .. 'expiry', qid)
  else
    local r = to_map(flat)
    if is_live(r.phase) then
      clamped = clamped + end_reservation(prefix, qid, r, 'Expired', now, ARGV[2], ARGV[3])
    else
      redis.call('ZREM', prefix .. 'expiry', qid)
    end
  end
end
if #due > 0 then notify_waiters(prefix, ARGV[2]) end
return {#due, clamped}
