-- limits: fair share, the operator's per-requester limits (broker/policy),
-- which each request carries:
--   P.."usage"              hash    requester -> "n=.. cpu=.. mem=.. gpu=.. sto=..": how many live
--                                   reservations it holds and what they hold (field absent: none),
--                                   what its limits are checked against
--   P.."rate:"..requester   string  its reserve-call rate state (GCRA: the theoretical arrival
--                                   time of its next call, ms); expires once that time has passed
--   P.."rate:"..kind..":"..member   string  the same for a member's other calls (throttle.lua:
--                                   advertisements, renewals, writes, protections)
-- @include core

-- gcra_step counts one call of cost units (default 1; at most burst: a call
-- dearer than the burst costs the burst) against a rate (units per second)
-- with a burst (generic cell rate algorithm: each unit moves the theoretical
-- arrival time tat one interval on; a call is allowed while tat stays within
-- burst intervals of now). It returns the new tat when the call is allowed,
-- else nil and the ms until the call would be. tat is the rate key's
-- (P.."rate:"..requester for reserve calls, throttle.lua's for the others).
local function gcra_step(tat, now, rate, burst, cost)
  burst = burst or 1
  local interval = 1000 / rate
  local next_tat = math.max(tat, now) + math.min(cost or 1, burst) * interval
  local wait = next_tat - now - burst * interval
  if wait > 0 then return nil, math.ceil(wait) end
  return next_tat, nil
end

-- USAGE: the fields of a requester's usage (P.."usage" above).
local USAGE = {'n', 'cpu', 'mem', 'gpu', 'sto'}

-- read_usage reads a requester's usage: every field of USAGE, 0 when absent.
local function read_usage(prefix, requester)
  local u = parse_amounts(redis.call('HGET', prefix .. 'usage', requester))
  for _, f in ipairs(USAGE) do u[f] = u[f] or 0 end
  return u
end

-- write_usage stores a requester's usage; none left removes its field.
local function write_usage(prefix, requester, u)
  if u.n <= 0 then
    redis.call('HDEL', prefix .. 'usage', requester)
  else
    redis.call('HSET', prefix .. 'usage', requester,
      string.format('n=%d cpu=%d mem=%d gpu=%d sto=%d', u.n, u.cpu, u.mem, u.gpu, u.sto))
  end
end

-- over_limit tells whether one more reservation of amounts (cpu, mem, gpu)
-- would take a requester whose usage is u past one of its limits lim (n,
-- cpu, mem, gpu; nil: no limit): it returns the limit's name, the limit, the
-- usage and the amount asked, or nil within them. A resource not asked for
-- is never over its limit.
local LIMITED = {'cpu', 'mem', 'gpu'}
local function over_limit(u, lim, amounts)
  if lim.n and u.n + 1 > lim.n then return 'reservations', lim.n, u.n, 1 end
  for _, res in ipairs(LIMITED) do
    local want = tonumber(amounts[res] or '0')
    if lim[res] and want > 0 and u[res] + want > lim[res] then return res, lim[res], u[res], want end
  end
  return nil
end
