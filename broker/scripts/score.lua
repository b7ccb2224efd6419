-- score: score requests as reserve would decide them, and decide nothing: the
-- read-only pass of a request asked of several cells (store.Cells,
-- docs/redis.md "Cells"), which then reserves in the cell of the best
-- candidate. Each request is judged exactly as reserve.lua's candidates
-- stage judges it (same index walk, same scores, its preference terms), on
-- the cell's state at the call; none of reserve's gate runs (rate, replay,
-- limits, the priority gate, the waiting list): the reserve that follows
-- in the chosen cell runs it.
--
-- It writes no reservation, counter, usage, event or audit entry. Like
-- reserve.lua it first drops from the candidate index the clusters gone
-- stale since the last call (index upkeep, which the next reserve would do).
--
-- KEYS[1]  prefix ("rb:{b}:", a cell's "rb:{<cell>}:"): every key read derives from it
-- ARGV[1]  stale threshold (ms)
-- ARGV[2]  weight of resources    ARGV[3]  weight of cost (floats, sum 1)
-- ARGV[4]  how many candidates to report
-- ARGV[5..] the requests, one JSON object each, as reserve.lua's ARGV[9..]
-- Reply: per request, in order, {candidates_json, min_price, max_price}
--   candidates  JSON array of the best candidates {cluster, score,
--               resource_score, cost_score, price}, as reserve.lua reports
--               them ("[]": nothing fits)
--   min_price, max_price  the price range (micro-units per hour) over the
--               fitting clusters that normalised the cost scores (-1 when
--               nothing fits): a caller comparing cells rescales the cost
--               scores to the range over all of them
-- @include reservations

local prefix = KEYS[1]
local stale_ms = tonumber(ARGV[1])
local w_res, w_cost = tonumber(ARGV[2]), tonumber(ARGV[3])
local top_n = tonumber(ARGV[4])
local FIRST = 5 -- where the requests start in ARGV
-- reserve_commit's writes never run here; its reporting and the gate's
-- request decoding are what this script uses.
local so, audit_max, wait_ttl, weights = nil, nil, 0, ARGV[2] .. '/' .. ARGV[3]

local now = math.floor(now_us() / 1000)
local cut = now - stale_ms

-- @include reserve_candidates
-- @include reserve_prefs
-- @include reserve_commit

local function score(raw)
  local q = request_of(raw)
  local d = decision_of(q)
  if #d.top == 0 then return {'[]', -1, -1} end
  return {report(d.top), price_micros(d.min_price), price_micros(d.max_price)}
end

for _, cid in ipairs(redis.call('ZRANGEBYSCORE', prefix .. 'idx:live', '-inf', '(' .. cut)) do
  unindex_cluster(prefix, cid)
end
local replies = {}
for a = FIRST, #ARGV do
  replies[#replies + 1] = score(ARGV[a])
end
return replies
