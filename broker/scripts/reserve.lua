-- reserve: decide a batch of reservation requests, in order, exactly as one
-- call per request would: for each, choose the best live cluster, lock its
-- capacity and record the decision; idempotent by reservation id, scoped
-- per requester (the same id from two requesters is two reservations).
--
-- Candidates are live (seen within the stale threshold, broker clock), not the
-- requester, match the label selector, and fit: for every requested resource
-- free = alloc - used - resv >= request. Score in [0,100]:
--   w_res * resource_score + w_cost * cost_score
--   resource_score = 100 * mean over requested resources of (free - request) / alloc
--   cost_score     = 100 * (max_price - price) / (max_price - min_price), 100 if all equal
--   price          = the request priced at the cluster's hourly rates
-- Ties go to the smallest cluster id, so the decision is deterministic.
--
-- Per-node fit. A cluster that advertises nodes (nodes.lua nodes:<id>) is a
-- candidate only if one of them can hold the whole request: its free
-- capacity (advertised allocatable - used - the broker's debit) is at least
-- the request for every requested resource. The reservation takes the best
-- fit among those nodes (least free gpu, then cpu, memory, storage, then
-- name: GPU nodes stay for GPU requests, large nodes for large requests) and
-- debits it; the reply, the reservation (field node), the events and the
-- audit name it. Scoring is unchanged (the cluster's totals). A cluster that
-- advertises no nodes (v1, older agents) is judged on its totals alone. The
-- record's node summary (records.lua) decides most fits; the node record
-- (idx:nrec) is read only when it cannot.
--
-- Finding the best clusters does not read every cluster: the candidate index
-- (index.lua) yields them. When one requested resource (or the label selector)
-- leaves few candidates, those are evaluated directly ("direct"); otherwise a
-- threshold algorithm walks the index's sorted sets of free fraction
-- (descending), reading clusters in batches from idx:rec, and stops once the
-- top candidates score above the best any unread cluster could reach
-- ("threshold"). The min and max price over the fitting clusters, which
-- normalise the cost score, are found first by walking the price sets.
-- The test-only reference (package scripts/reference, never loaded by the
-- broker) composes this script with a full scan in place of the include
-- reserve_candidates: it evaluates every live cluster from its hashes
-- ("scan"), what the index is tested against and the baseline of the
-- benchmarks. All three give the same decision and candidates.
-- Rejections (reply and audit, counted only when nothing fits in index mode)
-- count, per reason, the live clusters that fail it; a cluster may count
-- under several reasons, except insufficient_node_fit, which counts the
-- clusters that pass every other check (totals, selector) but none of whose
-- nodes can hold the request (present only when not zero).
--
-- Batches. The broker sends together the requests that arrive while its
-- previous call is in flight (store.batcher), so a busy broker pays the
-- script's fixed costs (the prelude, the stale prune, the index records, read
-- once and kept decoded in `recs`, reserve_batch.lua) once per batch, and writes the keys no
-- later decision of the batch reads (capacity counters, index entries, the
-- expiry and by-* sets) once per key at the end (flush). A decision reads the
-- capacity the earlier ones took from `recs`; the index's sorted sets, not
-- yet rewritten, can only overstate free capacity, so what they yield is a
-- superset of the fitting clusters and their scores upper bounds: the walks
-- stay exact. Whatever reads the index or the hashes otherwise (the full
-- scan, the priority gate, the rejection counts) flushes first.
--
-- Fair share. Each request carries its requester's limits (the operator's,
-- broker/policy), checked before anything else and against what the earlier
-- requests of the batch took:
--   - reserve calls per second (with a burst), replays included: a generic
--     cell rate algorithm on P.."rate:"..requester (limits.lua). A call over the
--     rate is refused (outcome "limited", limit "rate") with the time until
--     the next one is allowed;
--   - live reservations and the cpu, memory and gpu they hold (P.."usage"): a
--     new reservation that would take its requester past one is refused
--     (outcome "limited", naming the limit) and never waits: it leaves the
--     waiting list if it was on it;
--   - a priority ceiling: a higher priority is clamped to it (the request is
--     decided, waits and is stored at the ceiling; the audit keeps the
--     priority asked). Clamped rather than refused: the request is still
--     served, in the order the operator allows.
-- A waiting request whose requester has since reached its limits cannot be
-- placed, so it defers nobody (fits_somewhere).
--
-- KEYS[1]  prefix ("rb:{b}:"): every key touched derives from it (key layout: lib/*.lua; one hash slot)
-- ARGV[1]  stale threshold (ms)
-- ARGV[2]  weight of resources    ARGV[3]  weight of cost (floats, sum 1)
-- ARGV[4]  how many candidates to report
-- ARGV[5]  event stream max length  ARGV[6]  audit stream max length
-- ARGV[7]  how long a request nothing fits stays on the waiting list without
--          a retry (ms; 0: no waiting list); each retry of the same request
--          renews it
-- ARGV[8]  event stream TTL (ms)
-- ARGV[9..] the requests, one JSON object each (store.reserveArg): id (the
--          reservation id), requester (cluster id), cpu (millicores), mem
--          (bytes), gpu (count), sto (ephemeral storage, bytes), duration
--          (ms, > 0), lease (ms; "0": a fixed duration. Otherwise the
--          reservation is a lease: it ends duration after the decision --
--          its hold time -- unless renewed, renew.lua), priority (integer):
--          decimal strings, as the reservation hash keeps them; selector
--          (the label selector as a JSON object of required labels, or ""),
--          owner (free text), wait (true: refused, it takes or keeps a place
--          on the waiting list; false: it never does, e.g. v1 requests,
--          whose seed agents never retry an id; both pass the priority gate
--          alike), and limits, the requester's (a field absent: no limit):
--          n (live reservations), cpu (millicores), mem (bytes), gpu
--          (count), priority (ceiling), rate (reserve calls per second, a
--          float), burst (calls, >= 1; with the rate); prefs (absent: none),
--          the preference terms in the order to try them (by weight,
--          highest first), each {i (its index in the request as given), w
--          (weight), labels (object, absent: none), clusters (array of
--          cluster ids, absent: any)}; hint (absent: none; never with
--          prefs), {c (cluster ids, best first), lo, hi (the two of c that
--          set the price range)}: the candidates a replica's view of the
--          index proposes (store/view.go), decided among when lo and hi
--          still fit (reserve_prefs.lua decide_hinted; audit method "hint")
-- Reply: per request, in order, {outcome, reservation, candidates_json, rejections_json, now_ms}
--   outcome     "reserved" (new), "replay" (id already decided: the first
--               answer), "conflict" (the requester decided this id before
--               for other amounts),
--               "nofit" (no reservation written: the request waits, by
--               priority, see waiting.lua, if its wait value is "1"; rejections {waiting_higher_priority=1}
--               when a waiting request of higher priority could be placed now),
--               "limited" (refused by its requester's limits, nothing written;
--               rejections {limit, max, used, asked, retry_after_ms}: limit
--               "rate" (retry_after_ms: when the next call is allowed),
--               "reservations", "cpu", "mem" or "gpu"),
--               "error" (the request raised an error, e.g. a malformed selector,
--               before writing anything; the batch's other requests are decided)
--   reservation flat field/value array of the reservation hash ({} if none);
--               field node names the node debited (absent: the target
--               advertises no nodes); a replay of a granted one adds its
--               pair's sealed access (grants.lua with_access)
--   candidates  JSON array of the best candidates {cluster, score, resource_score, cost_score, price}
--               (a replay: "[]" unless the record is of the layout that held them
--               as JSON; the reservation's cand_<i> fields hold them)
--   rejections  JSON object: how many clusters were excluded, by reason
--               (outcome "error": the error message instead)
--   now_ms      the Redis clock of the call (for the reservation's remaining time)
--
-- Preferences (reserve_prefs.lua). A request with preference terms is
-- decided first restricted to each term, in order: its labels merged into
-- the selector (a label the selector sets otherwise: the term matches
-- nothing), its clusters, when it names some, the only candidates. The
-- first term with a fitting cluster decides, by the usual score among its
-- fitting clusters (the price range too is theirs); none fitting, the
-- decision runs without preferences, as for a request without them, so
-- preferences never refuse or hold back a request. The reservation (field
-- preference, JSON {term, weight, tried}; term -1: none fitting) and the
-- audit (preference, preference_weight, preferences_tried) say which term
-- won. The gate, the waiting list and the priority gate ignore them.
--
-- A decision goes through four stages, one include each: the gate
-- (reserve_gate.lua: rate, replay, limits, priority), the candidates
-- (reserve_candidates.lua, judging and scoring in reserve_score.lua; the
-- preference terms in reserve_prefs.lua) and the commit (reserve_commit.lua).
-- @include reservations

local prefix = KEYS[1]
local stale_ms = tonumber(ARGV[1])
local w_res, w_cost, weights = tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[2] .. '/' .. ARGV[3]
local top_n = tonumber(ARGV[4])
local so, audit_max = stream_opts(ARGV[5], ARGV[8]), ARGV[6]
local wait_ttl = tonumber(ARGV[7])
local FIRST = 9 -- where the requests start in ARGV

local started_us = now_us()
local now = math.floor(started_us / 1000)
local cut = now - stale_ms

-- @include reserve_candidates
-- @include reserve_prefs
-- @include reserve_commit

-- decide answers the request raw; arrival_us orders it on the waiting list:
-- the call's time, plus its place in the batch.
local function decide(raw, arrival_us)
  local q = request_of(raw)
  local answered = gate(q, arrival_us)
  if answered then return answered end
  local d = decision_of(q)
  d.rejected.stale = call_counts()
  if #d.top == 0 then return no_fit(d, arrival_us) end
  return commit(d)
end

-- Keep the candidate index to live clusters: drop those gone stale since the last call.
for _, cid in ipairs(redis.call('ZRANGEBYSCORE', prefix .. 'idx:live', '-inf', '(' .. cut)) do
  unindex_cluster(prefix, cid)
end

-- A request that raises an error (bad input that got past the broker) gets
-- it as its reply; the others are still decided, and the capacity the batch
-- took is still written: a reservation is recorded only after its capacity
-- is taken, so nothing recorded goes unaccounted.
local replies = {}
for a = FIRST, #ARGV do
  local ok, reply = pcall(decide, ARGV[a], started_us + #replies)
  if not ok then reply = {'error', {}, '[]', tostring(reply), now} end
  replies[#replies + 1] = reply
end
flush()
return replies
