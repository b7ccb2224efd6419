-- clock: leases and broker outages, on the Redis server's clock.
--
-- Leases (renew.lua): a reservation with lease_ms ends at its expiry score
-- (first its expires_ms) unless its requester renews it; a renewal raises the
-- score to now + lease_ms when that is later. All times are the Redis server's (TIME).
--
-- Broker outages (expire.lua, renew.lua):
--   P.."clock"              hash    tick_ms: the last expire run of any replica; gap_ms: how
--                                   long without a run counts as an outage; outage_from_ms,
--                                   outage_to_ms: the last outage (no replica ran, or Redis
--                                   was frozen, restarted or failed over)
-- @include core

-- Time in which no broker could hear renewals must not count against a
-- lease. Every replica runs expire.lua about every second and stamps
-- clock.tick_ms; a gap longer than clock.gap_ms means no broker ran (all
-- replicas down, Redis frozen or restarting, a failover). A lease that was
-- still live when the outage began ends no earlier than a whole lease after
-- the broker came back, so its requester gets a full lease to renew. Only the
-- last outage matters: a lease credited for an earlier one either ended
-- before the last began (it had a whole lease of broker time to renew) or is
-- covered by it. Fixed-duration reservations are not credited: nobody renews
-- them. The clock also reports an outage still pending (no expire run since
-- the broker came back), so a renewal that comes first is not refused.
local function last_outage(prefix, now)
  local c = redis.call('HMGET', prefix .. 'clock', 'tick_ms', 'gap_ms', 'outage_from_ms', 'outage_to_ms')
  local tick, gap = tonumber(c[1]), tonumber(c[2])
  if tick and gap and now - tick > gap then
    return tick, now
  end
  return tonumber(c[3]) or 0, tonumber(c[4]) or 0
end

-- credited_end is when a lease (its end expires, lease_ms) really ends, given the
-- last outage [from, to): later than expires_ms only if the lease was live
-- when the outage began.
local function credited_end(expires, lease, from, to)
  if lease > 0 and to > 0 and expires > from then
    return math.max(expires, to + lease)
  end
  return expires
end
