-- lib.lua: helpers shared by every script. The broker prepends this file to each
-- script before SCRIPT LOAD, so each script is still one atomic operation and
-- touches only keys derived from the hash-tagged prefix in KEYS[1].
--
-- Key layout (prefix P = KEYS[1], e.g. "rb:{b}:"):
--   P.."cluster:"..id       hash    advertised fields + broker-owned resv_*
--   P.."clusters"           zset    cluster id -> seen_ms (liveness index)
--   P.."resv:"..id          hash    one reservation
--   P.."expiry"             zset    live reservation id -> expires_ms
--   P.."by-target:"..id     set     live reservation ids provided by a cluster
--   P.."by-requester:"..id  set     live reservation ids requested by a cluster
--   P.."events:"..id        stream  notifications for one cluster
--   P.."audit"              stream  every reserve decision

-- RESOURCES are the resource suffixes used in every hash: cpu in millicores,
-- mem and sto in bytes, gpu as a count.
local RESOURCES = {'cpu', 'mem', 'gpu', 'sto'}

-- now_ms reads the Redis server clock: one clock for every broker replica.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function to_map(flat)
  local m = {}
  for i = 1, #flat, 2 do m[flat[i]] = flat[i + 1] end
  return m
end

-- emit appends one notification to a cluster's event stream.
local function emit(prefix, cluster, maxlen, fields)
  redis.call('XADD', prefix .. 'events:' .. cluster, 'MAXLEN', '~', maxlen, '*', unpack(fields))
end

local function event_fields(kind, id, r)
  return {'type', kind, 'reservation', id, 'requester', r.requester, 'provider', r.target,
    'phase', r.phase, 'cpu', r.cpu, 'mem', r.mem, 'gpu', r.gpu, 'sto', r.sto,
    'expires_ms', r.expires_ms}
end

-- end_reservation moves a live reservation (map r) to a final phase and gives
-- its capacity back to the target exactly once. Returns 1 when a counter had
-- to be clamped at zero (a broken invariant worth a metric), else 0.
local function end_reservation(prefix, id, r, phase, now, maxlen, retention_ms)
  local ck = prefix .. 'cluster:' .. r.target
  local clamped = 0
  if redis.call('EXISTS', ck) == 1 then
    for _, res in ipairs(RESOURCES) do
      local amount = r[res] or '0'
      if amount ~= '0' then
        local left = redis.call('HINCRBY', ck, 'resv_' .. res, '-' .. amount)
        if left < 0 then
          redis.call('HSET', ck, 'resv_' .. res, '0')
          clamped = 1
        end
      end
    end
  end
  local rk = prefix .. 'resv:' .. id
  r.phase = phase
  r.ended_ms = tostring(now)
  redis.call('HSET', rk, 'phase', phase, 'ended_ms', r.ended_ms)
  redis.call('PEXPIRE', rk, retention_ms)
  redis.call('ZREM', prefix .. 'expiry', id)
  redis.call('SREM', prefix .. 'by-target:' .. r.target, id)
  redis.call('SREM', prefix .. 'by-requester:' .. r.requester, id)
  local fields = event_fields(phase, id, r)
  emit(prefix, r.requester, maxlen, fields)
  emit(prefix, r.target, maxlen, fields)
  return clamped
end

local function is_live(phase)
  return phase == 'Reserved' or phase == 'Active'
end
-- end of lib.lua
