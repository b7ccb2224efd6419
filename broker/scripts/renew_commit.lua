-- renew_commit: make the leases a full renewal tagged with a generation
-- (renew.lua) the requester's renewal set, which its next renewals naming
-- the same ids renew at once (lib/renew_set.lua). The caller commits only when
-- every id of the renewal was renewed; nothing is committed if the
-- generation is no longer pending: a newer full renewal opened another, or
-- a lease it tagged ended (reservations.lua drop_lease).
--
-- KEYS[1]  prefix ("rb:{b}:"): every key touched derives from it (key layout: lib/*.lua; one hash slot)
-- ARGV[1]  requester cluster id
-- ARGV[2]  digest of the ids the renewal named (store.renewalDigest)
-- ARGV[3]  the generation renew.lua opened for it
-- ARGV[4]  the shortest lease renewed (ms)
-- Reply: {1} committed, {0} not
local sk = KEYS[1] .. 'renewal:' .. ARGV[1]
if redis.call('HGET', sk, 'pending') ~= ARGV[3] or tonumber(ARGV[4]) <= 0 then return {0} end
redis.call('HSET', sk, 'digest', ARGV[2], 'lease_ms', ARGV[4])
redis.call('HDEL', sk, 'pending')
return {1}
