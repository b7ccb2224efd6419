-- renew_set: a requester's renewal set (renew.lua): renew every lease of it
-- at once when a renewal names the same ids as the set's last full renewal;
-- else open a new generation of the set for a full renewal, or note the ids.
--
-- A requester renews the leases of the pods it still runs, and those are
-- the same ids period after period. Renewing each id moves its end (a ZADD
-- into expiry and, every other time, its record and leases entry): at a
-- million leases that is most of what Redis does in a steady state. The
-- renewal set makes it one write per requester: the replica names the ids
-- by a digest; when the digest is the set's, the set's at_ms moves to now
-- and every lease it covers lives a lease from now (core.lua covered_end),
-- its expiry score left behind (expire.lua moves it when it comes near).
--
-- A set is opened when a renewal names the same ids as the one before it
-- (their digest is the candidate): renew.lua tags each lease it renews with
-- the generation this script opened, and renew_commit.lua makes them the
-- set if every id was renewed and no lease of it ended meanwhile. Leases
-- join and leave a committed set (reservations.lua note_lease, drop_lease:
-- the digest is a sum over the ids), so the requester's next renewal,
-- naming the leases it then holds, is the set's whatever churn there was,
-- and one still naming a lease that ended is full and tells the requester.
-- A renewal naming other ids leaves the set as it is, unless it opens a
-- new generation: then the set's ends are first written into expiry if it
-- was renewed at once since they were last written, so that a lease it
-- covered (parked ones too: expire.lua) and the next set does not keeps the
-- end it gave it, a lease after its last renewal.
--
-- renew_set runs for a requester's renewal naming ids whose digest is
-- digest (store.renewalDigest), on the broker's clock now. Returns "same"
-- and the set's shortest lease (every lease of the set renewed: each lives
-- at least that long from now), or "changed" and the generation opened for
-- this renewal's leases to be tagged with (renew.lua; then committed by
-- renew_commit.lua if every id was renewed), 0 when none was opened (the
-- ids are not those the renewal before named, or the requester holds no
-- lease entry yet): renew them one by one.
-- @include clock
local function renew_set(prefix, requester, digest, now)
  local sk = prefix .. 'renewal:' .. requester
  local lk = prefix .. 'leases:' .. requester
  local v = redis.call('HMGET', sk, 'digest', 'gen', 'at_ms', 'lease_ms', 'renewed', 'candidate')
  local gen, at, lease = tonumber(v[2] or '0'), tonumber(v[3] or '0'), tonumber(v[4] or '0')

  -- Every lease of the set is live while its shortest one is: none of them
  -- ended (drop_lease took each that did out of the digest), and each lives
  -- at least that long after the set's last renewal.
  if v[1] == digest and lease > 0 and at + lease > now then
    redis.call('HSET', sk, 'at_ms', now, 'renewed', '1')
    -- its parked leases' end, if it has any (expire.lua)
    redis.call('ZADD', prefix .. 'set-ends', 'XX', now + lease, requester)
    return 'same', lease
  end

  if redis.call('EXISTS', lk) == 0 then
    drop_renewal_set(prefix, requester)
    return 'changed', 0
  end
  -- A set is opened for ids named twice in a row: a requester whose ids
  -- change at every renewal (pods coming and going) is renewed id by id, as
  -- without sets, not tagged at every call for nothing. Until then the set
  -- still covers its leases: a renewal of a few of them (the agent renews a
  -- pod just bound at once) or of ids the set does not know changes nothing
  -- of it.
  if v[6] ~= digest then
    redis.call('HSET', sk, 'candidate', digest)
    return 'changed', 0
  end
  -- The new generation ends the set's cover. Only a set renewed at once gave
  -- its leases ends past their scores (a full renewal writes each score)
  -- and had any parked (expire.lua): they are written first, once.
  if v[5] then
    local entries = redis.call('HGETALL', lk)
    local qids, lengths = {}, {}
    for i = 1, #entries, 2 do
      local l, _, g = lease_entry(entries[i + 1])
      if l and g == gen then
        qids[#qids + 1] = entries[i]
        lengths[#lengths + 1] = l
      end
    end
    write_covered_ends(prefix, qids, lengths, at)
    redis.call('HDEL', sk, 'renewed')
    redis.call('ZREM', prefix .. 'set-ends', requester)
  end
  local next_gen = math.max(now, gen + 1)
  redis.call('HSET', sk, 'gen', next_gen, 'pending', next_gen, 'at_ms', now)
  redis.call('HDEL', sk, 'digest', 'lease_ms', 'candidate')
  return 'changed', next_gen
end
