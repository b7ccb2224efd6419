-- heartbeat: a cluster says its advertisement is still the one the broker
-- stored (advertise.lua), named by its digest, without sending it again:
-- its liveness is refreshed and nothing else is written, as advertise.lua's
-- own heartbeat path does (seen_ms, P.."clusters", P.."idx:live"). The
-- agent sends one while its figures stay within a band of those it last
-- advertised (agent/publisher); docs/architecture.md says why that is safe.
--
-- The broker must hold that very advertisement and have the cluster in its
-- candidate index; otherwise nothing is written and the cluster is told to
-- advertise in full: it never advertised here, another replica or agent
-- stored a newer one (another digest), Redis lost its state, or a decision
-- dropped it from the index as stale (only a full advertisement indexes a
-- cluster again, from its figures).
--
-- KEYS[1]  prefix ("rb:{b}:"): every key touched derives from it (key layout: lib/*.lua; one hash slot)
-- ARGV[1]  cluster id
-- ARGV[2]  digest of the advertisement it repeats, as advertise stored it
-- Reply:   {seen_ms, resv_cpu, resv_mem, resv_gpu, resv_sto, alloc_cpu,
--          alloc_mem, alloc_gpu, alloc_sto, used_cpu, used_mem, used_gpu,
--          used_sto} (what the broker reserves on it and the figures
--          stored, to answer what is available), or {} when the cluster
--          must advertise in full (nothing written)
-- @include core
local prefix, id, digest = KEYS[1], ARGV[1], ARGV[2]
local ck = prefix .. 'cluster:' .. id
local held = redis.call('HMGET', ck, 'digest', 'resv_cpu', 'resv_mem', 'resv_gpu', 'resv_sto',
  'alloc_cpu', 'alloc_mem', 'alloc_gpu', 'alloc_sto', 'used_cpu', 'used_mem', 'used_gpu', 'used_sto')
if held[1] ~= digest or not redis.call('ZSCORE', prefix .. 'idx:live', id) then
  return {}
end
local now = now_ms()
redis.call('HSET', ck, 'seen_ms', now)
redis.call('ZADD', prefix .. 'clusters', now, id)
redis.call('ZADD', prefix .. 'idx:live', now, id)
local reply = {tostring(now)}
for i = 2, #held do reply[i] = held[i] or '0' end
return reply
