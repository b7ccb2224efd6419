-- ended: the ended reservations kept readable (their requesters' agents read
-- how they ended), counted against their requester, so that no member's
-- ended reservations can fill Redis up for every member:
--   P.."ended:"..requester  zset    qid -> ended_ms: the requester's ended reservations kept,
--                                   at most the cap (store MaxEndedPerMember, rb-broker
--                                   --max-ended-per-member): beyond it the oldest go, records
--                                   and all, before their retention; it expires with its newest
--                                   member's record
--   P.."ended-requesters"   zset    requester -> the ended_ms of its last ended reservation: who
--                                   has ended reservations kept (GET /api/v2/usage);
--                                   expire.lua drops those past the retention
-- @include core

-- ended_opts are how long an ended reservation is kept (ms) and how many of
-- one requester's are kept at most.
local function ended_opts(retention_ms, max_per_requester)
  return {retention = tonumber(retention_ms), max = tonumber(max_per_requester)}
end

-- drop_ended removes an ended reservation before its retention is over, as
-- the retention would: all it still owns is its hash (end_reservation took
-- it out of every index and set). A live reservation of the same qid (its id
-- used again once the record was gone) is left alone.
local function drop_ended(prefix, qid)
  local rk = prefix .. 'resv:' .. qid
  if not is_live(redis.call('HGET', rk, 'phase')) then redis.call('DEL', rk) end
end

-- keep_ended keeps the record of qid, which its requester's reservation
-- ended at now, for the retention, and counts it against the requester:
-- the members past the retention (their records have expired) leave its
-- set, and beyond the cap its oldest go.
local function keep_ended(prefix, requester, qid, now, eo)
  redis.call('PEXPIRE', prefix .. 'resv:' .. qid, eo.retention)
  local key = prefix .. 'ended:' .. requester
  redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%d', now - eo.retention))
  redis.call('ZADD', key, string.format('%d', now), qid)
  local over = redis.call('ZCARD', key) - eo.max
  if over > 0 then
    local oldest = redis.call('ZPOPMIN', key, over)
    for i = 1, #oldest, 2 do drop_ended(prefix, oldest[i]) end
  end
  redis.call('PEXPIRE', key, eo.retention)
  redis.call('ZADD', prefix .. 'ended-requesters', string.format('%d', now), requester)
end
