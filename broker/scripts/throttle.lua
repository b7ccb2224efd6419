-- throttle: count one call of a member against its rates (broker/policy
-- members: advertisements, renewals and the ids and bytes they carry,
-- writes, protections), all or nothing: the call is allowed only if every
-- rate allows it, and then counts against each; a refused call counts
-- against none. Reserve calls are not throttled here: reserve.lua and
-- reserve_group.lua count them in the same step as the decision.
--
-- KEYS[1]  prefix ("rb:{b}:"): every key touched derives from it (key layout: lib/limits.lua)
-- ARGV[1]  member (the caller's cluster id)
-- ARGV[2 .. ]  per rate, four values: kind (e.g. "renewal-ids"), units per
--          second, burst (units at once), this call's cost in units
-- Reply:   {} when allowed, else {kind, max, retry_after_ms}: the first rate
--          that refused it, its units per second and the ms until the call
--          would be allowed (nothing written)
-- @include limits
local prefix, member = KEYS[1], ARGV[1]
local now = now_ms()
local allowed = {}
for i = 2, #ARGV, 4 do
  local key = prefix .. 'rate:' .. ARGV[i] .. ':' .. member
  local rate = tonumber(ARGV[i + 1])
  local tat, wait = gcra_step(tonumber(redis.call('GET', key) or '0'), now, rate, tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3]))
  if not tat then return {ARGV[i], ARGV[i + 1], wait} end
  allowed[#allowed + 1] = {key, tat}
end
for _, a in ipairs(allowed) do
  redis.call('SET', a[1], num(a[2]), 'PX', math.max(1, math.ceil(a[2] - now)))
end
return {}
