-- core: what every script shares: the resources, the Redis clock, ids and
-- small codecs. Every script touches only keys derived from the hash-tagged
-- prefix P in KEYS[1] (one hash slot); each include documents the keys it
-- owns, this one those of clusters, reservations and their streams.
--
-- Reservation ids are scoped per requester: two requesters may use the same
-- id and get two reservations. Every key and member that names a reservation
-- uses its qualified id, qid = requester.."/"..id (cluster ids are DNS labels
-- and ids DNS subdomains, so the first "/" splits them); events and the API
-- carry the bare id and the requester apart.
--
-- Key layout (prefix P = KEYS[1], e.g. "rb:{b}:"):
--   P.."cluster:"..id       hash    advertised fields + broker-owned resv_*
--   P.."clusters"           zset    cluster id -> seen_ms (liveness index)
--   P.."resv:"..qid         hash    one reservation: requester, target, phase, cpu, mem, gpu,
--                                   sto, created_ms, expires_ms (the end as decided; while live
--                                   the expiry score is the end: with_live_end), duration_ms (the hold time),
--                                   lease_ms (absent: a fixed duration, never renewed), score,
--                                   price, owner, priority, selector, candidates, node, granted_ms,
--                                   grant_gen, place_node, place_class (its share of the pair's
--                                   access and its placement: grants.lua), ended_ms; a record of
--                                   the previous release may hold grant (its own sealed grant,
--                                   store.GrantKeys; removed when the reservation ends); an ended one
--                                   expires after the retention, or goes earlier beyond its
--                                   requester's cap (ended.lua)
--   P.."expiry"             zset    live reservation qid -> its end (ms): what renewals move;
--                                   +inf (PARKED) for a lease parked under its requester's
--                                   renewal set (expire.lua), which set-ends stands for
--   P.."set-ends"           zset    requester -> its renewal set's end (at_ms + lease_ms) while
--                                   any of its leases is parked (expire.lua unparks them when
--                                   it passes; renew_set.lua moves it); goes with the set
--   P.."by-target:"..id     set     live reservation qids provided by a cluster
--   P.."by-requester:"..id  set     live reservation qids requested by a cluster
--   P.."leases:"..id        hash    live lease qid of a requester -> "<lease_ms> <expires_ms of
--                                   its record>[ <gen>]": what a renewal reads, a chunk of ids per
--                                   HMGET (renew.lua); gen: the generation of the requester's
--                                   renewal set that renewed it last (lease_entry); a lease made
--                                   by an earlier release is absent until its first renewal
--   P.."renewal:"..id       hash    the requester's renewal set (lib/renew_set.lua): digest (of the
--                                   ids its last full renewal named; absent: none to repeat),
--                                   gen, at_ms (the set's last renewal), lease_ms (its shortest
--                                   lease), renewed (1: renewed at once since its ends were last
--                                   written to expiry), pending (the generation of a full renewal
--                                   under way), candidate (the digest of the ids the last
--                                   renewal named, when not the set's);
--                                   it goes with the requester's last lease (end_reservation)
--   P.."events:"..id        stream  notifications for one cluster, capped near the events max
--                                   length (MAXLEN ~); it expires (PEXPIRE) once no event was added
--                                   for the events TTL
--   P.."audit"              stream  every reserve decision, capped near the audit max length
--                                   (MAXLEN ~); expire.lua trims what is older than the audit
--                                   retention (XTRIM MINID ~)

-- RESOURCES are the resource suffixes used in every hash: cpu in millicores,
-- mem and sto in bytes, gpu as a count.
local RESOURCES = {'cpu', 'mem', 'gpu', 'sto'}

-- now_us and now_ms read the Redis server clock: one clock for every broker replica.
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local function now_ms()
  return math.floor(now_us() / 1000)
end

-- num formats a number for ZADD without losing precision (tostring keeps 14 digits).
local function num(x)
  return string.format('%.17g', x)
end

-- price_micros rounds a request's price per hour (micro-units) to the
-- integer written in its reservation, its candidates and the audit, at most
-- MAX_PRICE: tostring and cjson write 14 significant digits, so a larger
-- integer would come out as 1e+14, which no reader takes for an integer.
-- Only what is written saturates; decisions compare the exact prices.
local MAX_PRICE = 1e14 - 1
local function price_micros(x)
  return math.min(math.floor(x + 0.5), MAX_PRICE)
end

local function decode_labels(s)
  if s and s ~= '' then return cjson.decode(s) end
  return {}
end

-- parse_amounts reads "k=v k=v ..." (the node hashes' values) into a table of numbers.
local function parse_amounts(s)
  local t = {}
  if s then
    for k, v in string.gmatch(s, '([%w_]+)=(%-?%d+)') do t[k] = tonumber(v) end
  end
  return t
end

local function to_map(flat)
  local m = {}
  for i = 1, #flat, 2 do m[flat[i]] = flat[i + 1] end
  return m
end

-- qualify and bare_id convert between a reservation's id and its qualified id (header).
local function qualify(requester, id)
  return requester .. '/' .. id
end
local function bare_id(qid)
  return string.match(qid, '^[^/]*/(.*)$') or qid
end

-- requester_of is the requester of a qualified id.
local function requester_of(qid)
  return string.match(qid, '^([^/]+)/')
end

local function is_live(phase)
  return phase == 'Reserved' or phase == 'Active'
end

-- lease_entry parses an entry of a leases hash: the lease's length, its
-- record's expires_ms and the generation of its requester's renewal set
-- that renewed it last (0: none); nil when absent or not of this layout.
local function lease_entry(v)
  local lease, rec_end, gen = string.match(v or '', '^(%d+) (%d+) ?(%d*)$')
  if not lease then return nil end
  return tonumber(lease), tonumber(rec_end), tonumber(gen) or 0
end

local function format_lease_entry(lease, rec_end, gen)
  if gen and gen > 0 then return string.format('%d %d %d', lease, rec_end, gen) end
  return string.format('%d %d', lease, rec_end)
end

-- renewal_set reads what decides the ends of a requester's leases covered
-- by its renewal set: its generation, its last renewal and its shortest
-- lease (0: none committed).
local function renewal_set(prefix, requester)
  local v = redis.call('HMGET', prefix .. 'renewal:' .. requester, 'gen', 'at_ms', 'lease_ms')
  return {gen = tonumber(v[1] or '0'), at = tonumber(v[2] or '0'), lease = tonumber(v[3] or '0')}
end

-- drop_renewal_set removes a requester's renewal set (its last lease went),
-- and its entry in P.."set-ends" with it.
local function drop_renewal_set(prefix, requester)
  redis.call('DEL', prefix .. 'renewal:' .. requester)
  redis.call('ZREM', prefix .. 'set-ends', requester)
end

-- digest_move moves a renewal set's digest (store.renewalDigest: "<a>:<b>",
-- for each id the first 96 bits of its SHA-1 as two 48-bit numbers, summed
-- modulo 2^48 lane by lane) by one id, added (sign 1) or taken out (-1):
-- a sum rather than a hash of the sorted ids, so that a lease joining or
-- leaving the set moves the digest without the other ids. nil when digest
-- is not of that form (a set committed by an earlier release).
local function digest_move(digest, id, sign)
  local a, b = string.match(digest or '', '^(%d+):(%d+)$')
  if not a then return nil end
  local h = redis.sha1hex(id)
  local lane = 2 ^ 48
  a = (tonumber(a) + sign * tonumber(string.sub(h, 1, 12), 16)) % lane
  b = (tonumber(b) + sign * tonumber(string.sub(h, 13, 24), 16)) % lane
  return string.format('%d:%d', a, b)
end

-- PARKED is the expiry score of a lease parked under its requester's
-- renewal set (expire.lua): +inf, so that no expiry run reads it; the set's
-- entry in P.."set-ends" stands for it, and expire.lua writes its end back
-- when the set passes it, renew_set.lua when a new generation replaces the
-- set, renew.lua when a renewal names it.
local PARKED = math.huge

-- covered_end is the end of a live lease whose expiry score is score: a
-- lease its requester's renewal set covers (the entry's generation is the
-- set's: renew_set.lua) lives a lease after the set's last renewal, which
-- moves no score (expire.lua parks it when it comes near). A parked lease is
-- always covered (CheckInvariant); were it not, it would end as if it were.
local function covered_end(set, lease, gen, score)
  if score == PARKED then return set.at + lease end
  if gen > 0 and gen == set.gen then return math.max(score, set.at + lease) end
  return score
end

-- write_covered_ends writes into expiry the ends a renewal set whose last
-- renewal was at gave the live leases qids (of lease lengths lengths) it
-- covered: a lease after at, unless a score is later; a parked lease gets
-- its end back (XX: a lease that ended is not brought back). parked_only:
-- parked leases only. Returns how many were parked.
local function write_covered_ends(prefix, qids, lengths, at, parked_only)
  local ek, parked = prefix .. 'expiry', 0
  for first = 1, #qids, 1000 do
    local chunk = {unpack(qids, first, math.min(#qids, first + 999))}
    local scores = redis.call('ZMSCORE', ek, unpack(chunk))
    local ends = {}
    for j, qid in ipairs(chunk) do
      local covered = at + lengths[first + j - 1]
      local score = tonumber(scores[j] or '0')
      if score == PARKED then parked = parked + 1 end
      if scores[j] and (score == PARKED or (score < covered and not parked_only)) then
        ends[#ends + 1] = string.format('%d', covered)
        ends[#ends + 1] = qid
      end
    end
    if #ends > 0 then redis.call('ZADD', ek, 'XX', unpack(ends)) end
  end
  return parked
end

-- with_live_end reads a live reservation's end into its map r and, when
-- given, its flat HGETALL array: while it is live its end is its expiry
-- score (renew.lua and expire.lua's outage credit move only the score), or
-- later if its requester's renewal set covers it (covered_end); its record's
-- expires_ms is the end as decided, rewritten when it ends
-- (reservations.lua end_reservation).
local function with_live_end(prefix, qid, r, flat)
  if not is_live(r.phase) then return end
  local score = redis.call('ZSCORE', prefix .. 'expiry', qid)
  if not score then return end
  local requester = requester_of(qid)
  local lease, _, gen = lease_entry(redis.call('HGET', prefix .. 'leases:' .. requester, qid))
  local parked = tonumber(score) == PARKED
  if not lease and parked then return end -- no entry: a broken invariant; the record's end stands
  if lease and (gen > 0 or parked) then
    score = string.format('%d', covered_end(renewal_set(prefix, requester), lease, gen, tonumber(score)))
  end
  r.expires_ms = score
  for i = 1, #(flat or {}) - 1, 2 do
    if flat[i] == 'expires_ms' then flat[i + 1] = score end
  end
end
