-- waiting: the waiting list, the requests nothing could take, served by priority:
--   P.."waiting"            zset    "<since_us, 18 digits>:<qid>" -> -priority
--                                   (ZRANGE order: highest priority, then oldest)
--   P.."wait:"..qid         hash    requester, cpu, mem, gpu, sto, selector, priority,
--                                   since_ms, member, and the requester's limits when it
--                                   waited (lim_n, lim_cpu, lim_mem, lim_gpu; absent: none);
--                                   expires after the wait TTL (store WaitTTL, rb-broker
--                                   --wait-ttl, default 5s) unless the requester retries the
--                                   same id (each retry renews it); a waiting member whose hash
--                                   is gone (or names another member) is forgotten: dropped
--                                   from the zset when met, and swept by expire.lua. v1
--                                   requests never wait (reserve.lua's wait value)
--   P.."wait-due"           zset    waiting member -> when its wait hash expires (ms): expire.lua
--                                   removes the members due, so that none outlives its request
-- @include events

-- waiting_id is the qualified reservation id of a waiting list member.
local function waiting_id(member)
  return string.match(member, '^%d+:(.*)$')
end

-- WAITERS_NOTIFIED: how many waiting requests a capacity change notifies.
local WAITERS_NOTIFIED = 8

-- tell_waiter sends CapacityAvailable for waiting request qid to its requester.
local function tell_waiter(prefix, so, qid, requester, cpu, mem, gpu, sto)
  emit(prefix, requester, so, {'type', 'CapacityAvailable', 'reservation', bare_id(qid), 'requester', requester,
    'provider', '', 'phase', 'Waiting', 'cpu', cpu, 'mem', mem, 'gpu', gpu, 'sto', sto, 'expires_ms', '0'})
end

-- forget_waiter drops waiting member m from the list (its request is gone).
local function forget_waiter(prefix, m)
  redis.call('ZREM', prefix .. 'waiting', m)
  redis.call('ZREM', prefix .. 'wait-due', m)
end

-- notify_waiters tells the requesters of the first waiting requests (highest
-- priority first) that capacity may be available, so their agents retry at
-- once instead of at their next back-off. Forgotten waiters (wait hash
-- expired, or the hash now names a newer member of the same id) leave the list.
local function notify_waiters(prefix, so)
  local members = redis.call('ZRANGE', prefix .. 'waiting', 0, WAITERS_NOTIFIED - 1)
  for _, m in ipairs(members) do
    local qid = waiting_id(m)
    local w = redis.call('HMGET', prefix .. 'wait:' .. qid, 'requester', 'cpu', 'mem', 'gpu', 'sto', 'member')
    if not w[1] or w[6] ~= m then
      forget_waiter(prefix, m)
    else
      tell_waiter(prefix, so, qid, w[1], w[2], w[3], w[4], w[5])
    end
  end
end

-- stop_waiting removes a request (qualified id) from the waiting list; returns true if it was there.
local function stop_waiting(prefix, qid)
  local wk = prefix .. 'wait:' .. qid
  local member = redis.call('HGET', wk, 'member')
  if not member then return false end
  forget_waiter(prefix, member)
  redis.call('DEL', wk)
  return true
end
