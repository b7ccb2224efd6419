-- reservations: what every script that places or ends a reservation shares
-- (core.lua P.."resv:"..qid and its sets).
--
-- Spread (reserve_group.lua):
--   P.."spread:"..requester.."/"..group  hash  provider id -> how many live reservations of
--                                   that spread group (an owner's replicas) it holds; the
--                                   reservations carry the group in their field spread
--
-- Preemption (preempt.lua, protect.lua):
--   P.."protected:"..requester  set  the requester's reservation ids whose pods a
--                                   PodDisruptionBudget protects now, as its agent reports them;
--                                   never preempted; expires unless reported again
-- @include index
-- @include limits
-- @include waiting
-- @include ended
-- @include grants

-- spread_count adds delta to the live reservations of a requester's spread
-- group on provider cid (P.."spread:" above); a count back at zero is removed.
local function spread_count(prefix, requester, group, cid, delta)
  local key = prefix .. 'spread:' .. requester .. '/' .. group
  if redis.call('HINCRBY', key, cid, delta) <= 0 then redis.call('HDEL', key, cid) end
end

-- new_reservation is the hash of a reservation placed now (flat, as HSET
-- takes it and the reply carries it) and the map event_fields reads. p:
-- requester, target, cpu, mem, gpu, sto (decimal strings), duration and
-- lease (ms; lease 0: a fixed duration), score, price, owner, priority,
-- selector, candidates (reserve_commit.lua candidates_of; nil: none), node
-- (nil: the target advertises no nodes) and extra, field/value pairs of the
-- script placing it (group, preempted).
--
-- Each candidate is a field of its own, cand_<i> = "<cluster> <score>
-- <resource_score> <cost_score> <price>", not one JSON array: a hash whose
-- values all fit in hash-max-listpack-value (64 bytes) stays a listpack,
-- about a third of the memory of a hash table (docs/redis.md).
local function new_reservation(p, now)
  local expires = tostring(now + tonumber(p.duration))
  local hash = {'requester', p.requester, 'target', p.target, 'phase', 'Reserved',
    'cpu', p.cpu, 'mem', p.mem, 'gpu', p.gpu, 'sto', p.sto,
    'created_ms', tostring(now), 'expires_ms', expires, 'duration_ms', p.duration,
    'score', p.score, 'price', tostring(price_micros(p.price)),
    'owner', p.owner, 'priority', p.priority, 'selector', p.selector}
  for i, c in ipairs(p.candidates or {}) do
    hash[#hash + 1] = 'cand_' .. i
    hash[#hash + 1] = string.format('%s %s %s %s %d', c.cluster, tostring(c.score),
      tostring(c.resource_score), tostring(c.cost_score), c.price)
  end
  for _, x in ipairs(p.extra or {}) do hash[#hash + 1] = x end
  if tonumber(p.lease) > 0 then
    hash[#hash + 1] = 'lease_ms'
    hash[#hash + 1] = p.lease
  end
  if p.node then
    hash[#hash + 1] = 'node'
    hash[#hash + 1] = p.node
  end
  local r = {requester = p.requester, target = p.target, phase = 'Reserved',
    cpu = p.cpu, mem = p.mem, gpu = p.gpu, sto = p.sto, expires_ms = expires, node = p.node,
    created_ms = tostring(now)}
  if tonumber(p.lease) > 0 then r.lease_ms = p.lease end
  return hash, r
end

-- note_lease enters a new reservation (qualified id qid, map r of
-- new_reservation) in its requester's leases hash if it is a lease: a
-- renewal then reads its lease and its record's end with the other ids of
-- its chunk, not from its record (renew.lua).
--
-- A new lease joins its requester's committed renewal set (lib/renew_set.lua):
-- the set's digest takes its id and its entry the set's generation, so the
-- requester's next renewal, naming it with the others, is the set's and
-- renews them all at once; a pod started does not cost two renewals id by
-- id. Until that renewal it ends at its own score (covered_end: the set's
-- last renewal plus its lease is no later). Not while a full renewal is
-- pending (its commit names the ids it renewed) nor for a set of an earlier
-- release's digest.
--
-- Placing a lease is also a call of its requester vouching for it, as a
-- renewal id by id is: called_ms and called_lease_ms say so, and a provider
-- asking which requesters went quiet (store.RequestersRenewing) does not
-- renew for one that only reserved and has not renewed yet.
local function note_lease(prefix, qid, r)
  if not r.lease_ms then return end
  local entry = r.lease_ms .. ' ' .. r.expires_ms
  local sk = prefix .. 'renewal:' .. r.requester
  local v = redis.call('HMGET', sk, 'digest', 'gen', 'pending', 'lease_ms')
  local digest = not v[3] and v[1] and digest_move(v[1], bare_id(qid), 1)
  local called = {'called_ms', r.created_ms, 'called_lease_ms', r.lease_ms}
  if digest then
    -- lease_ms: the set's shortest lease, what its renewal answers
    called[5], called[6] = 'digest', digest
    called[7], called[8] = 'lease_ms', math.min(tonumber(v[4] or r.lease_ms), tonumber(r.lease_ms))
    entry = entry .. ' ' .. v[2]
  end
  redis.call('HSET', sk, unpack(called))
  redis.call('HSET', prefix .. 'leases:' .. r.requester, qid, entry)
end

-- drop_lease takes an ended lease (qualified id qid) out of its requester's
-- leases hash. If its requester's renewal set covered it, it leaves the set:
-- its id leaves the digest, so the requester's next renewal, without it,
-- is still the set's, and one still naming it (the requester did not know
-- it ended) judges every id and tells the requester this one ended; a full
-- renewal under way does not commit (lib/renew_set.lua). A set of an
-- earlier release's digest loses its digest instead. The set's ends stay as
-- they are for the leases it still covers; the set goes with the last lease.
local function drop_lease(prefix, requester, qid)
  local lk = prefix .. 'leases:' .. requester
  local entry = redis.call('HGET', lk, qid)
  if not entry then return end
  redis.call('HDEL', lk, qid)
  local _, _, gen = lease_entry(entry)
  local sk = prefix .. 'renewal:' .. requester
  if redis.call('EXISTS', lk) == 0 then
    drop_renewal_set(prefix, requester)
  elseif gen and gen > 0 then
    local v = redis.call('HMGET', sk, 'gen', 'digest')
    if tonumber(v[1] or '0') == gen then
      local digest = v[2] and digest_move(v[2], bare_id(qid), -1)
      if digest then
        redis.call('HSET', sk, 'digest', digest)
      else
        redis.call('HDEL', sk, 'digest', 'pending')
      end
    end
  end
end

-- add_usage adds n reservations holding amounts (numbers) to usage u.
local function add_usage(u, n, amounts)
  u.n = u.n + n
  for _, res in ipairs(RESOURCES) do u[res] = u[res] + amounts[res] end
end

-- end_reservation moves a live reservation (qualified id qid, map r) to a final phase and gives
-- its capacity back to the target exactly once: the cluster's counters, and
-- the debit of its node unless the target's last advertisement listed it
-- (then the broker holds no debit for it), and to its requester's usage. Its
-- record gets its last end (the expiry score: core.lua with_live_end), its
-- share of the pair's access goes (grants.lua drop_share: the provider's
-- token is of no use to it any more; the last share takes the access with
-- it), as does the sealed grant of a record of the previous release, and the
-- record is kept as ended.lua keep_ended says (eo: ended_opts). r is the
-- whole record (HGETALL). Returns 1 when a counter had to be clamped at zero
-- (a broken invariant worth a metric), else 0.
local function end_reservation(prefix, qid, r, phase, now, so, eo)
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
    local debited -- the node whose debit goes (a listed reservation's went when it was listed)
    if r.node and r.node ~= '' and redis.call('SREM', prefix .. 'node-listed:' .. r.target, qid) == 0 then
      debited = r.node
      clamped = math.max(clamped, node_debit(prefix, r.target, r.node, r, -1))
    end
    if clamped == 0 then
      index_returned(prefix, r.target, r, debited)
    else -- a counter clamped: the index from the hashes
      index_free(prefix, r.target, RESOURCES)
    end
  elseif r.node and r.node ~= '' then
    redis.call('SREM', prefix .. 'node-listed:' .. r.target, qid)
  end
  if r.spread and r.spread ~= '' then spread_count(prefix, r.requester, r.spread, r.target, -1) end
  local u = read_usage(prefix, r.requester)
  u.n = u.n - 1
  for _, res in ipairs(RESOURCES) do
    u[res] = u[res] - tonumber(r[res] or '0')
    if u[res] < 0 or (u.n <= 0 and u[res] ~= 0) then
      u[res] = 0
      clamped = 1
    end
  end
  if u.n < 0 then clamped = 1 end
  write_usage(prefix, r.requester, u)
  local rk = prefix .. 'resv:' .. qid
  with_live_end(prefix, qid, r)
  r.phase = phase
  r.ended_ms = tostring(now)
  redis.call('HSET', rk, 'phase', phase, 'ended_ms', r.ended_ms, 'expires_ms', r.expires_ms)
  redis.call('HDEL', rk, 'grant')
  drop_share(prefix, rk, r)
  keep_ended(prefix, r.requester, qid, now, eo)
  redis.call('ZREM', prefix .. 'expiry', qid)
  redis.call('SREM', prefix .. 'by-target:' .. r.target, qid)
  redis.call('SREM', prefix .. 'by-requester:' .. r.requester, qid)
  drop_lease(prefix, r.requester, qid)
  local fields = event_fields(phase, bare_id(qid), r, now)
  emit(prefix, r.requester, so, fields)
  emit(prefix, r.target, so, fields)
  return clamped
end
