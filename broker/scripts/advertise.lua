-- advertise: upsert one cluster's advertisement, mark it seen now and
-- (re)index it as a live candidate (see lib.lua).
-- It never writes the broker-owned fields (resv_*, seen_ms): only the fields
-- listed in ADVERTISED below are accepted, whatever the caller sends.
--
-- KEYS[1]  prefix ("rb:{b}:")
-- ARGV[1]  cluster id
-- ARGV[2.] field, value, field, value, ... (integers as decimal strings)
-- Reply:   {seen_ms, resv_cpu, resv_mem, resv_gpu, resv_sto}
--          or an error reply "ERR unknown field <f>" (nothing written)
local ADVERTISED = {}
for _, res in ipairs(RESOURCES) do
  ADVERTISED['cap_' .. res] = true
  ADVERTISED['alloc_' .. res] = true
  ADVERTISED['used_' .. res] = true
end
for _, f in ipairs({'price_cpu', 'price_mem', 'price_gpu', 'currency', 'endpoint', 'name', 'labels'}) do
  ADVERTISED[f] = true
end

local prefix, id = KEYS[1], ARGV[1]
local fields = {}
for i = 2, #ARGV, 2 do
  if not ADVERTISED[ARGV[i]] then
    return redis.error_reply('ERR unknown field ' .. tostring(ARGV[i]))
  end
  fields[#fields + 1] = ARGV[i]
  fields[#fields + 1] = ARGV[i + 1]
end

local now = now_ms()
local ck = prefix .. 'cluster:' .. id
local old_labels = nil -- the labels the candidate index holds for this cluster
if redis.call('ZSCORE', prefix .. 'idx:live', id) then old_labels = redis.call('HGET', ck, 'labels') end
redis.call('HSET', ck, 'seen_ms', now, unpack(fields))
redis.call('HSETNX', ck, 'first_seen_ms', now)
redis.call('ZADD', prefix .. 'clusters', now, id)
index_cluster(prefix, id, now, old_labels)
local resv = redis.call('HMGET', ck, 'resv_cpu', 'resv_mem', 'resv_gpu', 'resv_sto')
return {tostring(now), resv[1] or '0', resv[2] or '0', resv[3] or '0', resv[4] or '0'}
