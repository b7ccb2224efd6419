-- preempt: reserve for a request that fits nowhere by taking the capacity of
-- live reservations of lower priority, in one atomic step: choose the
-- victims, end them, and reserve their capacity for the request.
--
-- Only when preemption is the only way: a request that fits somewhere now is
-- answered "fits" (reserve it normally), and one that capacity already on
-- its way back would hold is answered "wait" (nothing preempted): a node
-- whose free capacity plus the fixed-duration reservations (no lease)
-- expiring within the grace period holds it.
--
-- Victims, per node of each candidate provider (live, not the requester,
-- matching the selector; a provider without nodes is one node): the live
-- reservations placed there of strictly lower priority. If the node's free
-- capacity plus all of them holds the request (and so do the provider's
-- totals), the victims are all of them, then each is spared again, highest
-- priority (then the smallest) first, while the others still make room: the
-- lowest priorities go first and none is taken that is not needed. The node
-- chosen has the fewest victims, then the lowest highest victim priority,
-- then the lowest sum of priorities, then provider id and node name. As
-- kube-scheduler's DefaultPreemption, the search stops once it has found
-- nodes that could make room on max(100, 10% of the candidates) nodes,
-- starting at an offset that moves with the clock (so that the same
-- providers are not always the first victims); the fit and wait checks
-- cover the nodes it read.
--
-- A reservation its requester's agent reports protected (P.."protected:"..
-- requester, protect.lua: its pod's PodDisruptionBudget allows no disruption
-- now) is never a victim.
--
-- Moving the capacity: each victim ends (phase Released, field preempted_by
-- naming the request; reservations.lua end_reservation gives its capacity back and
-- sends Released to its requester and provider), a Preempted event tells
-- both who took it and why, and a victim whose pod the provider's last
-- advertisement listed on the node (its pod counted in the node's used
-- figures, nodes.lua node-listed) has those figures lowered by its amounts:
-- the provider evicts the pod, and its next advertisement says so. Then the
-- request is reserved on the node as reserve.lua would record it. The audit
-- entry (outcome preempted) names the victims, their priorities and why.
--
-- KEYS[1]  prefix ("rb:{b}:"); reads and writes P.."idx:live", P.."idx:alloc:cpu",
--          P.."idx:labels", P.."idx:rec" and the other index entries of the
--          provider chosen (index.lua index_free), P.."cluster:"..id,
--          P.."nodes:"..id, P.."node-resv:"..id, P.."node-listed:"..id,
--          P.."by-target:"..id, P.."by-requester:"..id, P.."resv:"..qid,
--          P.."expiry", P.."usage", P.."spread:"..requester.."/"..group,
--          P.."protected:"..requester, P.."ended:"..requester, P.."ended-requesters",
--          P.."events:"..id, P.."audit" (layout: lib/*.lua)
-- ARGV[1]  stale threshold (ms)
-- ARGV[2]  event stream max length   ARGV[3]  audit stream max length
-- ARGV[4]  event stream TTL (ms)     ARGV[5]  retention of ended reservations (ms)
-- ARGV[6]  grace (ms): capacity expiring within it is waited for, not preempted
-- ARGV[7]  reservation id   ARGV[8]  requester cluster id
-- ARGV[9..12] cpu (millicores), memory (bytes), gpu (count), storage (bytes)
-- ARGV[13] duration (ms)    ARGV[14] lease (ms; 0: fixed duration)
-- ARGV[15] label selector JSON or ""   ARGV[16] owner   ARGV[17] priority
-- ARGV[18] how many ended reservations of one requester to keep at most (ended.lua)
-- Reply: {outcome, reservation, victims_json, detail_json, now_ms}
--   outcome      "preempted", "replay", "conflict", "fits", "wait", "nofit"
--   reservation  flat field/value array of the reservation hash ({} unless preempted or replay;
--                a replay of a granted one adds its pair's sealed access: grants.lua with_access)
--   victims      JSON array of {reservation, requester, provider, node, priority, cpu, mem, gpu, sto}
--   detail       JSON object: wait: {provider, node}; nofit: {candidates, lower_priority}
-- @include reservations
local prefix = KEYS[1]
local stale_ms = tonumber(ARGV[1])
local so, audit_max = stream_opts(ARGV[2], ARGV[4]), ARGV[3]
local eo, grace = ended_opts(ARGV[5], ARGV[18]), tonumber(ARGV[6])
local id, requester = ARGV[7], ARGV[8]
local str = {cpu = ARGV[9], mem = ARGV[10], gpu = ARGV[11], sto = ARGV[12]}
local duration, lease, selector_json, owner, priority_str = ARGV[13], ARGV[14], ARGV[15], ARGV[16], ARGV[17]
local priority = tonumber(priority_str)
local req = {}
for _, res in ipairs(RESOURCES) do req[res] = tonumber(str[res]) end
local qid = qualify(requester, id)
local rk = prefix .. 'resv:' .. qid
local now = now_ms()
local cut = now - stale_ms

local existing = redis.call('HGETALL', rk)
if #existing > 0 then
  local r = to_map(existing)
  if r.cpu ~= str.cpu or r.mem ~= str.mem or r.gpu ~= str.gpu or r.sto ~= str.sto then
    return {'conflict', {}, '[]', '{}', now}
  end
  with_live_end(prefix, qid, r, existing)
  with_access(prefix, r, existing)
  return {'replay', existing, '[]', '{}', now}
end

-- holds tells whether free (a table of the 4 resources) holds the request (nodes.lua).
local function holds_req(free) return holds(free, req) end

-- The candidates: live providers with at least the request's cpu allocatable.
local matching = clusters_with_labels(prefix, selector_json)
local cands = {}
for _, cid in ipairs(redis.call('ZRANGEBYSCORE', prefix .. 'idx:alloc:cpu', str.cpu, '+inf')) do
  local seen = redis.call('ZSCORE', prefix .. 'idx:live', cid)
  if cid ~= requester and seen and tonumber(seen) >= cut and (not matching or matching[cid]) then
    cands[#cands + 1] = cid
  end
end

-- Fits as it is: the providers with its cpu free, on a node (as reserve.lua judges them).
local in_cands = {}
for _, cid in ipairs(cands) do in_cands[cid] = true end
for _, cid in ipairs(redis.call('ZRANGEBYSCORE', prefix .. 'idx:free:' .. (req.cpu > 0 and 'cpu' or 'mem'),
    req.cpu > 0 and str.cpu or str.mem, '+inf')) do
  if in_cands[cid] then
    local raw = redis.call('HGET', prefix .. 'idx:rec', cid)
    local rec = raw and read_rec(raw)
    if rec and holds_req(free_of(rec)) then
      local nodes = node_list(prefix, cid)
      if not nodes then return {'fits', {}, '[]', cjson.encode({provider = cid, node = ''}), now} end
      for _, n in ipairs(nodes) do
        if holds_req(n) then return {'fits', {}, '[]', cjson.encode({provider = cid, node = n.name}), now} end
      end
    end
  end
end

-- @include preempt_victims

-- Search the candidates, from an offset that moves with the clock, until
-- enough nodes could make room (header).
local search = {best = nil, lower_seen = 0, feasible = 0, protected_seen = 0}
local enough = math.max(100, math.ceil(#cands / 10))
local start = #cands > 0 and (now % #cands) or 0
for k = 1, #cands do
  if search.feasible >= enough then break end
  local cid = cands[(start + k - 1) % #cands + 1]
  local answer = search_provider(search, cid)
  if answer then return answer end
end
local best, lower_seen, protected_seen = search.best, search.lower_seen, search.protected_seen

if not best then
  return {'nofit', {}, '[]', cjson.encode({candidates = #cands, lower_priority = lower_seen,
    protected = protected_seen}), now}
end

-- Move the capacity: end the victims, then reserve.
local cid, node = best.cid, best.node
local report = {}
for _, v in ipairs(best.victims) do
  local r = to_map(redis.call('HGETALL', prefix .. 'resv:' .. v.qid))
  if node ~= '' and redis.call('SISMEMBER', prefix .. 'node-listed:' .. cid, v.qid) == 1 then
    -- Its pod is in the node's used figures: they go down with it.
    local nk = prefix .. 'nodes:' .. cid
    local a = parse_amounts(redis.call('HGET', nk, node))
    for _, res in ipairs(RESOURCES) do a['used_' .. res] = math.max(0, (a['used_' .. res] or 0) - v[res]) end
    local parts = {}
    for _, res in ipairs(RESOURCES) do
      parts[#parts + 1] = string.format('alloc_%s=%d', res, a['alloc_' .. res] or 0)
      parts[#parts + 1] = string.format('used_%s=%d', res, a['used_' .. res])
    end
    redis.call('HSET', nk, node, table.concat(parts, ' '))
  end
  end_reservation(prefix, v.qid, r, 'Released', now, so, eo)
  redis.call('HSET', prefix .. 'resv:' .. v.qid, 'preempted_by', qid)
  local ev = event_fields('Preempted', bare_id(v.qid), r, now)
  for _, x in ipairs({'by', id, 'by_requester', requester, 'by_priority', priority_str, 'priority', tostring(v.priority)}) do
    ev[#ev + 1] = x
  end
  emit(prefix, r.requester, so, ev)
  emit(prefix, r.target, so, ev)
  report[#report + 1] = {reservation = bare_id(v.qid), requester = r.requester, provider = cid, node = node,
    priority = v.priority, cpu = v.cpu, mem = v.mem, gpu = v.gpu, sto = v.sto}
end

local ck = prefix .. 'cluster:' .. cid
for _, res in ipairs(RESOURCES) do
  if req[res] > 0 then redis.call('HINCRBY', ck, 'resv_' .. res, str[res]) end
end
if node ~= '' then node_debit(prefix, cid, node, str, 1) end
index_free(prefix, cid, RESOURCES)
local prices = redis.call('HMGET', ck, 'price_cpu', 'price_mem', 'price_gpu')
local price = price_of(req, tonumber(prices[1] or '0'), tonumber(prices[2] or '0'), tonumber(prices[3] or '0'))
local hash, r = new_reservation({requester = requester, target = cid,
  cpu = str.cpu, mem = str.mem, gpu = str.gpu, sto = str.sto, duration = duration, lease = lease,
  score = '0', price = price, owner = owner, priority = priority_str, selector = selector_json,
  node = node ~= '' and node or nil, extra = {'preempted', tostring(#report)}}, now)
redis.call('HSET', rk, unpack(hash))
note_lease(prefix, qid, r)
redis.call('ZADD', prefix .. 'expiry', r.expires_ms, qid)
redis.call('SADD', prefix .. 'by-target:' .. cid, qid)
redis.call('SADD', prefix .. 'by-requester:' .. requester, qid)
local u = read_usage(prefix, requester)
add_usage(u, 1, req)
write_usage(prefix, requester, u)
local ev = event_fields('Reserved', id, r, now)
emit(prefix, requester, so, ev)
emit(prefix, cid, so, ev)
stop_waiting(prefix, qid)

local victims_json = cjson.encode(report)
local why = string.format('fits on no provider; took %d reservation(s) of priority below %s on %s%s: the fewest, lowest priority first',
  #report, priority_str, cid, node ~= '' and ('/' .. node) or '')
redis.call('XADD', prefix .. 'audit', 'MAXLEN', '~', audit_max, '*',
  'reservation', id, 'requester', requester, 'outcome', 'preempted', 'winner', cid, 'node', node,
  'method', 'preempt', 'priority', priority_str, 'victims', victims_json, 'reason', why,
  'request', cjson.encode({cpu = str.cpu, mem = str.mem, gpu = str.gpu, sto = str.sto, selector = selector_json, owner = owner}),
  'ts_ms', now)
return {'preempted', hash, victims_json, cjson.encode({reason = why}), now}
