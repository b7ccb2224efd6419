-- expire: end every live reservation whose end (its expiry score, or its
-- requester's renewal set's: core.lua covered_end) has passed (broker
-- clock), park the leases a renewal set covers when they come near their
-- scores and write their ends back when their set's end passes, sweep the
-- waiting list of the requests whose wait expired, and trim the audit
-- stream and the requesters with ended reservations kept (ended.lua) to
-- their retention. Every broker replica runs it on a timer;
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
-- ARGV[8]  how far ahead (ms) to look for leases whose requester's renewal
--          set covers them (lib/renew_set.lua), to park them before their
--          score is due
-- Reply: {expired, clamped, swept, credited, outage_ms, moved, more, parked,
--        unparked}  how many reservations ended, how many of them needed a
--        counter clamped, how many waiting members were swept, how many due
--        leases were given more time for the last outage instead of ending,
--        the outage this call found (ms; 0: none), how many covered leases
--        had their score moved to their end (a set not committed), 1 when
--        the call stopped at its limit with more to do, how many covered
--        leases were parked, and how many had their end written back
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

-- A live reservation's end is its expiry score, or later while its
-- requester's renewal set covers it (core.lua with_live_end, covered_end).
-- A covered lease near its score is parked (score PARKED, +inf): no run reads
-- it again while its set is renewed, and the set's entry in set-ends (its
-- end: its last renewal plus its shortest lease, moved by renew_set.lua)
-- stands for it. When that entry is due (the requester stopped renewing),
-- its parked leases get their ends back here, before the range below reads
-- them: they end as they did before they were parked. (A set not committed
-- has no renewal to move set-ends: its covered leases have their scores
-- moved to their ends instead.) An outage credit moves only the score.
local ahead = tonumber(ARGV[8] or '0')
local unparked = 0
local passed = redis.call('ZRANGEBYSCORE', prefix .. 'set-ends', '-inf', now, 'LIMIT', 0, limit)
for _, requester in ipairs(passed) do
  local set = renewal_set(prefix, requester)
  if set.lease > 0 and set.at + set.lease > now then
    redis.call('ZADD', prefix .. 'set-ends', set.at + set.lease, requester)
  else
    -- The set's leases, and any parked lease of another generation (a
    -- replica of an earlier release opened a new one without writing them
    -- back): that one lives a lease from now.
    local entries = redis.call('HGETALL', prefix .. 'leases:' .. requester)
    local covered, lengths, others, other_lengths = {}, {}, {}, {}
    for i = 1, #entries, 2 do
      local l, _, g = lease_entry(entries[i + 1])
      if l and g > 0 and g == set.gen then
        covered[#covered + 1], lengths[#lengths + 1] = entries[i], l
      elseif l then
        others[#others + 1], other_lengths[#other_lengths + 1] = entries[i], l
      end
    end
    unparked = unparked + write_covered_ends(prefix, covered, lengths, set.at, true)
      + write_covered_ends(prefix, others, other_lengths, now, true)
    redis.call('ZREM', prefix .. 'set-ends', requester)
  end
end
local due = redis.call('ZRANGEBYSCORE', prefix .. 'expiry', '-inf', now + ahead, 'WITHSCORES', 'LIMIT', 0, limit)
-- The range's leases entries, one HMGET per requester, and the renewal set
-- of each requester with a covered one.
local qids_of, requesters = {}, {}
for i = 1, #due, 2 do
  local requester = requester_of(due[i])
  if requester then
    if not qids_of[requester] then
      qids_of[requester] = {}
      requesters[#requesters + 1] = requester
    end
    table.insert(qids_of[requester], due[i])
  end
end
local live_end_of, sets = {}, {}
for _, requester in ipairs(requesters) do
  local qids = qids_of[requester]
  local entries = redis.call('HMGET', prefix .. 'leases:' .. requester, unpack(qids))
  for j, qid in ipairs(qids) do
    local lease, rec_end, gen = lease_entry(entries[j]) -- rec_end unused: the score stands for it
    if lease and gen > 0 then
      sets[requester] = sets[requester] or renewal_set(prefix, requester)
      live_end_of[qid] = {sets[requester], lease, gen}
    end
  end
end

local clamped, credited, ended, waits = 0, 0, 0, 0
local moves, parks, set_ends = {}, {}, {}
for i = 1, #due, 2 do
  local qid, score = due[i], tonumber(due[i + 1])
  local live_end = score
  local c = live_end_of[qid]
  if c then live_end = covered_end(c[1], c[2], c[3], score) end
  if live_end > score and live_end > now and c[1].lease > 0 then
    parks[#parks + 1] = 'inf'
    parks[#parks + 1] = qid
    set_ends[requester_of(qid)] = c[1].at + c[1].lease
  elseif live_end > score and live_end > now then
    moves[#moves + 1] = string.format('%d', live_end)
    moves[#moves + 1] = qid
  elseif score > now then
    waits = waits + 1 -- not due yet, and no set covers it further
  else
    local rk = prefix .. 'resv:' .. qid
    local flat = redis.call('HGETALL', rk)
    if #flat == 0 then
      redis.call('ZREM', prefix .. 'expiry', qid)
    else
      local r = to_map(flat)
      local until_ms = credited_end(live_end, tonumber(r.lease_ms or '0'), from, to)
      if not is_live(r.phase) then
        redis.call('ZREM', prefix .. 'expiry', qid)
      elseif until_ms > now then
        redis.call('ZADD', prefix .. 'expiry', string.format('%d', until_ms), qid)
        credited = credited + 1
      else
        r.expires_ms = string.format('%d', live_end)
        clamped = clamped + end_reservation(prefix, qid, r, 'Expired', now, so, eo)
        ended = ended + 1
      end
    end
  end
end
-- The moved leases are others than those ended; an ended one that was its
-- requester's last took the set with it, and so no other lease of it is
-- covered (drop_lease).
local moved, parked = #moves / 2, #parks / 2
if moved > 0 then redis.call('ZADD', prefix .. 'expiry', unpack(moves)) end
if parked > 0 then redis.call('ZADD', prefix .. 'expiry', unpack(parks)) end
for requester, set_end in pairs(set_ends) do
  redis.call('ZADD', prefix .. 'set-ends', set_end, requester)
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
-- More to do when the limit cut the range and everything in it was due or
-- moved: what is left may be too (the rest is looked at on the next run).
local more = 0
if (#due / 2 >= limit and waits == 0) or #passed >= limit then more = 1 end
return {ended, clamped, #gone, credited, outage_ms, moved, more, parked, unparked}
