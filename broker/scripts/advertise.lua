-- advertise: upsert one cluster's advertisement, mark it seen now and
-- (re)index it as a live candidate (see lib.lua).
-- It never writes the broker-owned fields (resv_*, seen_ms): only the fields
-- listed in ADVERTISED below are accepted, whatever the caller sends.
--
-- KEYS[1]  prefix ("rb:{b}:")
-- ARGV[1]  cluster id
-- ARGV[2]  event stream max length (for the waiting requests it notifies)
-- ARGV[3.] field, value, field, value, ... (integers as decimal strings)
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
for i = 3, #ARGV, 2 do
  if not ADVERTISED[ARGV[i]] then
    return redis.error_reply('ERR unknown field ' .. tostring(ARGV[i]))
  end
  fields[#fields + 1] = ARGV[i]
  fields[#fields + 1] = ARGV[i + 1]
end

local now = now_ms()
local ck = prefix .. 'cluster:' .. id
local old_labels = nil -- the labels the candidate index holds for this cluster
local old_free = nil   -- its free capacity, to tell whether the advertisement adds some
if redis.call('ZSCORE', prefix .. 'idx:live', id) then
  old_labels = redis.call('HGET', ck, 'labels')
  old_free = {}
  for _, res in ipairs(RESOURCES) do
    old_free[res] = tonumber(redis.call('ZSCORE', prefix .. 'idx:free:' .. res, id))
  end
end
redis.call('HSET', ck, 'seen_ms', now, unpack(fields))
redis.call('HSETNX', ck, 'first_seen_ms', now)
redis.call('ZADD', prefix .. 'clusters', now, id)
index_cluster(prefix, id, now, old_labels)
-- A cluster back from stale, or with more free capacity than before, may take
-- a waiting request: tell the first ones (a heartbeat that changes nothing is silent).
local grew = old_free == nil or old_labels ~= redis.call('HGET', ck, 'labels')
if not grew then
  for _, res in ipairs(RESOURCES) do
    if tonumber(redis.call('ZSCORE', prefix .. 'idx:free:' .. res, id)) > old_free[res] then grew = true end
  end
end
if grew then notify_waiters(prefix, ARGV[2]) end
local resv = redis.call('HMGET', ck, 'resv_cpu', 'resv_mem', 'resv_gpu', 'resv_sto')
return {tostring(now), resv[1] or '0', resv[2] or '0', resv[3] or '0', resv[4] or '0'}
