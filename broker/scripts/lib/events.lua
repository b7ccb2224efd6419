-- events: the notifications a script sends to a cluster's event stream
-- (core.lua P.."events:"..id).
-- @include core

-- streams_opts are the bounds of the event streams a script writes (header):
-- maxlen entries (approximately), and ttl_ms without a new event before the
-- stream goes.
local function stream_opts(maxlen, ttl_ms)
  return {maxlen = maxlen, ttl = ttl_ms, touched = {}}
end

-- emit appends one notification to a cluster's event stream, and sets the
-- stream's TTL once per call (time is frozen while a script runs, so once is
-- the same as after every event).
local function emit(prefix, cluster, so, fields)
  local key = prefix .. 'events:' .. cluster
  redis.call('XADD', key, 'MAXLEN', '~', so.maxlen, '*', unpack(fields))
  if not so.touched[key] then
    so.touched[key] = true
    redis.call('PEXPIRE', key, so.ttl)
  end
end

-- remaining_ms is how long reservation r still lives at now (ms, Redis clock;
-- 0 once ended): what answers and events carry, so that no agent compares the
-- broker's absolute times with its own clock.
local function remaining_ms(r, now)
  if not is_live(r.phase) then return 0 end
  return math.max(0, tonumber(r.expires_ms or '0') - now)
end

-- event_fields are the fields of an event about reservation r (bare id id) at now.
local function event_fields(kind, id, r, now)
  local f = {'type', kind, 'reservation', id, 'requester', r.requester, 'provider', r.target,
    'phase', r.phase, 'cpu', r.cpu, 'mem', r.mem, 'gpu', r.gpu, 'sto', r.sto,
    'expires_ms', r.expires_ms, 'remaining_ms', string.format('%d', remaining_ms(r, now))}
  if r.node and r.node ~= '' then
    f[#f + 1] = 'node'
    f[#f + 1] = r.node
  end
  return f
end
