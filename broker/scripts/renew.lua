-- renew: extend leases of one requester, many ids in one atomic call, on the
-- broker's clock (TIME): each lease renewed ends lease_ms after now, unless
-- it already ended later (a renewal never shortens an expiry: the hold time
-- of a lease may exceed its length). Every id is either renewed or refused,
-- and a refused id changes nothing:
--   "notfound"  no reservation of this requester has the id (ids are scoped
--               per requester: another requester's reservation of the same
--               id is not looked at), or its record is gone after retention
--   "ended"     released or expired, or past its end on the broker's clock
--               and not yet ended by expire.lua (which ends it on its next
--               run): a renewal never brings a reservation back; a lease
--               live when the last broker outage began counts as ending no
--               earlier than a lease after it (clock.lua last_outage)
--   "notalease" a fixed-duration reservation (no lease_ms: v1, or no lease
--               asked for), never renewed
-- A renewal moves the lease's expiry score, its end while it is live (core.lua
-- with_live_end). Its record's expires_ms is written only when it would come
-- within half a lease of now (about every other renewal): the record's end
-- is then never past for a renewed lease, so a replica of an earlier
-- release, which judges renewals by the record, never refuses one as ended
-- during a rolling update.
-- No event is emitted per renewal: renewals are frequent (every lease, every
-- 30 s by default) and change nothing anyone acts on (the capacity, the
-- provider and the phase stay as they are); the provider acts on ended
-- reservations only, and Released/Expired events still tell it those.
--
-- A provider may renew, for a requester, the leases of that requester placed
-- on it: while the provider still hears the requester (a Lease the requester
-- renews in its tenant namespace there), a requester cut off from the broker
-- alone keeps its reservations, and the broker's books keep counting the
-- pods that still run. Any other reservation is "notfound" to it.
--
-- A requester's renewals usually name the same ids period after period
-- (its bound pods): given the digest of the ids, this script first checks
-- them against the requester's renewal set (lib/renew_set.lua), which then
-- renews them all at once; only when the ids changed are they renewed one
-- by one, each tagged with the set's new generation when one was opened,
-- which renew_commit.lua then makes the set.
--
-- KEYS[1]  prefix ("rb:{b}:"): every key touched derives from it (key layout: lib/*.lua; one hash slot)
-- ARGV[1]  requester cluster id
-- ARGV[2]  the provider renewing for the requester, or "" (the requester itself calls)
-- ARGV[3]  the digest of every id of the requester's renewal (store.renewalDigest),
--          given with its first chunk of ids; "" otherwise (a provider, a
--          later chunk, a renewal of more ids than a set takes)
-- ARGV[4]  the generation of the requester's renewal set to tag the renewed
--          leases with (the reply's gen for the first chunk), or "0"
-- ARGV[5..] reservation ids, as the requester chose them
-- Reply: {now_ms, lease_ms, 0, "same"}  the digest is the renewal set's: every
--          lease of it renewed (each lives at least lease_ms, the set's
--          shortest lease, from now), no id looked at
--        {now_ms, shortest_lease_ms, gen, "ids", status_1, remaining_ms_1, ...}
--          the shortest lease renewed (0: none), the generation to tag the
--          renewal's later chunks with (0: none), then one pair per id, in
--          order: status "renewed" | "notfound" | "ended" | "notalease", and
--          the reservation's remaining time after the call (ms, broker clock;
--          0 unless renewed)
-- @include renew_set
local prefix, requester, provider, digest = KEYS[1], ARGV[1], ARGV[2], ARGV[3]
local ek = prefix .. 'expiry'
local now = now_ms()
local from, to = last_outage(prefix, now)
-- tag: the generation to tag the renewed leases with, nil for none. One
-- renew_set just opened is pending; a later chunk's is, unless a newer full
-- renewal or an ended lease of the set cancelled it.
local tag = tonumber(ARGV[4])
if provider == '' and digest ~= '' then
  local outcome, n = renew_set(prefix, requester, digest, now)
  if outcome == 'same' then return {now, n, 0, 'same'} end
  tag = n
elseif tag > 0 and redis.call('HGET', prefix .. 'renewal:' .. requester, 'pending') ~= ARGV[4] then
  tag = 0
end
if provider ~= '' or tag == 0 then tag = nil end
local set = renewal_set(prefix, requester)

-- A live lease's end is its expiry score, or later if the requester's
-- renewal set covers it (core.lua with_live_end, covered_end). Per chunk
-- of ids, one ZMSCORE reads their scores and one HMGET of the requester's
-- leases hash their lease, their record's end and their set's generation
-- (core.lua); an id found in both is a live lease of the requester and is
-- judged from those alone. Any other id (a provider renewing, a lease of
-- an earlier release, not a lease, ended, unknown, or a broken invariant)
-- is judged from its record, and the leases hash is mended on the way. One
-- ZADD GT moves the ends of the chunk's renewed ids (GT: never an earlier
-- end, even for an id named twice), a parked lease (expire.lua) gets its own
-- score back (a provider renewing for a requester that stopped keeps it past
-- its set's end), one HSET the leases hash's entries that
-- changed, and an HSET of the record's end every other renewal or so
-- (above). Chunks of CHUNK ids keep each command's arguments within what
-- Lua's unpack takes.
local CHUNK = 1000
local lk = prefix .. 'leases:' .. requester
local reply = {now, 0, tag or 0, 'ids'}
local shortest
for first = 5, #ARGV, CHUNK do
  local last = math.min(#ARGV, first + CHUNK - 1)
  local qids = {}
  for i = first, last do qids[#qids + 1] = qualify(requester, ARGV[i]) end
  local ends = redis.call('ZMSCORE', ek, unpack(qids))
  local known = redis.call('HMGET', lk, unpack(qids))
  local raised, unparked, noted, stale = {}, {}, {}, {}
  for j, qid in ipairs(qids) do
    local status, remaining = 'renewed', 0
    -- lease, rec_end and gen: the lease's length, its record's expires_ms
    -- and its set's generation (lease nil: not a live lease, status says why).
    local lease, rec_end, gen
    if ends[j] then lease, rec_end, gen = lease_entry(known[j]) end
    local from_entry = lease ~= nil
    if lease and provider ~= '' then
      -- a provider names only the leases placed on it
      if redis.call('HGET', prefix .. 'resv:' .. qid, 'target') ~= provider then
        lease, status = nil, 'notfound'
      end
    elseif not lease then
      local v = redis.call('HMGET', prefix .. 'resv:' .. qid, 'phase', 'expires_ms', 'lease_ms', 'target')
      local gone = not v[1] or not is_live(v[1])
      if not v[1] or (provider ~= '' and v[4] ~= provider) then
        status = 'notfound'
      elseif gone then
        status = 'ended'
      else
        lease, rec_end, gen = tonumber(v[3] or '0'), tonumber(v[2] or '0'), 0
      end
      if known[j] and (gone or lease == 0) then
        stale[#stale + 1] = qid -- left by a replica of an earlier release, which ended it
        known[j] = nil
      end
    end
    if lease then
      -- A live reservation missing from expiry (a broken invariant) is
      -- judged by its record, and the ZADD below puts it back.
      local stored = covered_end(set, lease, gen, tonumber(ends[j] or rec_end))
      local expires = credited_end(stored, lease, from, to)
      if expires <= now then
        status = 'ended'
      elseif lease <= 0 then
        status = 'notalease'
      else
        expires = math.max(expires, now + lease)
        if tonumber(ends[j]) == PARKED then
          -- its own end again: this renewal's, past the set's
          unparked[#unparked + 1] = string.format('%d', expires)
          unparked[#unparked + 1] = qid
        elseif not ends[j] or expires > tonumber(ends[j]) then
          raised[#raised + 1] = string.format('%d', expires)
          raised[#raised + 1] = qid
        end
        -- The entry is written when it was missing or unreadable, when the
        -- record's end is, or when the lease is tagged with a new generation.
        local rewrite = not from_entry or (tag and tag ~= gen)
        if rec_end < now + lease / 2 then
          redis.call('HSET', prefix .. 'resv:' .. qid, 'expires_ms', string.format('%d', expires))
          rec_end, rewrite = expires, true
        end
        if rewrite then
          noted[#noted + 1] = qid
          noted[#noted + 1] = format_lease_entry(lease, rec_end, tag or gen)
        end
        remaining = expires - now
        shortest = math.min(shortest or lease, lease)
      end
    end
    reply[#reply + 1] = status
    reply[#reply + 1] = remaining
  end
  if #unparked > 0 then redis.call('ZADD', ek, unpack(unparked)) end
  if #raised > 0 then redis.call('ZADD', ek, 'GT', unpack(raised)) end
  if #noted > 0 then redis.call('HSET', lk, unpack(noted)) end
  if #stale > 0 then
    redis.call('HDEL', lk, unpack(stale))
    if redis.call('EXISTS', lk) == 0 then drop_renewal_set(prefix, requester) end
  end
end
reply[2] = shortest or 0
-- The requester's own renewal, for a provider's to know it is not needed
-- (store.RenewFor).
if provider == '' and shortest then
  redis.call('HSET', prefix .. 'renewal:' .. requester, 'called_ms', now, 'called_lease_ms', shortest)
end
return reply
