-- protect: replace the set of a requester's reservations whose pods a
-- PodDisruptionBudget protects now (no disruption allowed), as its agent
-- reports them; preempt.lua never takes those. The set expires unless
-- reported again, so that a requester that stops reporting protects nothing.
--
-- KEYS[1]  prefix ("rb:{b}:"); writes P.."protected:"..requester (set of
--          reservation ids as the requester chose them)
-- ARGV[1]  requester cluster id   ARGV[2]  how long the report holds (ms)
-- ARGV[3..] the protected reservation ids (none: nothing protected)
-- Reply: the number of ids protected
-- @include core
local key = KEYS[1] .. 'protected:' .. ARGV[1]
redis.call('DEL', key)
local n = #ARGV - 2
for first = 3, #ARGV, 1000 do
  redis.call('SADD', key, unpack(ARGV, first, math.min(first + 999, #ARGV)))
end
if n > 0 then redis.call('PEXPIRE', key, ARGV[2]) end
return n
