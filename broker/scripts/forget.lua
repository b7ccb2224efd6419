-- forget: remove a cluster from the federation at its own request (rbctl
-- leave): its advertisement, its nodes and the broker's debits on them, its
-- entries in the liveness and candidate indexes, its usage and rate state.
-- It is no candidate from then on, until it advertises again. Refused while
-- a live reservation names it, as requester or as provider: those end first
-- (released, or expired). Its event stream is left to its TTL (an agent
-- still reading it sees nothing new).
--
-- KEYS[1]  prefix ("rb:{b}:"): every key touched derives from it (key layout: lib/*.lua; one hash slot)
-- ARGV[1]  cluster id
-- Reply: {status, as_requester, as_provider}
--   status        "forgotten" | "unknown" (no advertisement: nothing changed)
--                 | "busy" (live reservations name it: nothing changed)
--   as_requester  its live reservations as requester; as_provider: as provider
-- @include index
local prefix, id = KEYS[1], ARGV[1]
local as_requester = redis.call('SCARD', prefix .. 'by-requester:' .. id)
local as_provider = redis.call('SCARD', prefix .. 'by-target:' .. id)
if as_requester + as_provider > 0 then return {'busy', as_requester, as_provider} end
if redis.call('EXISTS', prefix .. 'cluster:' .. id) == 0 then return {'unknown', 0, 0} end
unindex_cluster(prefix, id) -- reads the labels from the cluster's hash: before it goes
redis.call('ZREM', prefix .. 'clusters', id)
redis.call('DEL', prefix .. 'cluster:' .. id, prefix .. 'nodes:' .. id, prefix .. 'node-resv:' .. id,
  prefix .. 'node-listed:' .. id, prefix .. 'rate:' .. id, prefix .. 'leases:' .. id)
drop_renewal_set(prefix, id)
redis.call('HDEL', prefix .. 'usage', id)
return {'forgotten', 0, 0}
