-- reserve_commit: the last stage of a reserve decision: record the outcome
-- in the audit stream and, for a winner, choose its node, take the capacity
-- and record the reservation (reserve.lua header). Expects reserve.lua's
-- prefix, now, so, audit_max and weights above its directive.
-- @include reserve_gate
-- @include reserve_score

-- audit appends decision d's entry to the audit stream.
-- With preferences (d.pref, reserve_prefs.lua) it says which term won
-- (preference: its index, or "none"; preference_weight) and which were tried.
local function audit(d, outcome, winner, score, candidates_json, node)
  local q = d.q
  local fields = {'reservation', q.id, 'requester', q.requester, 'outcome', outcome,
    'winner', winner, 'node', node, 'score', score,
    'request', cjson.encode({cpu = q.cpu, mem = q.mem, gpu = q.gpu, sto = q.sto,
      selector = q.selector, priority = q.priority, priority_asked = q.priority_asked, owner = q.owner,
      prefs = q.prefs}),
    'weights', weights,
    'considered', d.considered, 'examined', d.examined, 'method', d.method,
    'candidates', candidates_json, 'rejected', cjson.encode(d.rejected), 'ts_ms', now}
  local pref = d.pref
  if pref then
    if pref.term >= 0 then
      fields[#fields + 1] = 'preference'
      fields[#fields + 1] = tostring(pref.term)
      fields[#fields + 1] = 'preference_weight'
      fields[#fields + 1] = tostring(pref.weight)
    else
      fields[#fields + 1] = 'preference'
      fields[#fields + 1] = 'none'
    end
    fields[#fields + 1] = 'preferences_tried'
    fields[#fields + 1] = table.concat(pref.tried, ',')
  end
  redis.call('XADD', prefix .. 'audit', 'MAXLEN', '~', audit_max, '*', unpack(fields))
end

-- no_fit answers a request nothing can take: it waits (reserve_gate.lua).
local function no_fit(d, arrival_us)
  wait(d.q, arrival_us)
  audit(d, 'nofit', '', '', '[]', '')
  return {'nofit', {}, '[]', cjson.encode(d.rejected), now}
end

-- candidates_of is the best candidates (top) as the API shows them,
-- scores rounded to hundredths: the list new_reservation records.
local function candidates_of(top)
  local function round2(x) return math.floor(x * 100 + 0.5) / 100 end
  local out = {}
  for i, c in ipairs(top) do
    out[i] = {cluster = c.cluster, score = round2(c.score), resource_score = round2(c.resource_score),
      cost_score = round2(c.cost_score), price = price_micros(c.price)}
  end
  return out
end

-- report is the candidates JSON of the reply and the audit.
local function report(top)
  return cjson.encode(candidates_of(top))
end

-- winner_node names the node the winner's reservation takes (nodes.lua
-- best_fit_in), nil on a cluster that advertises no nodes.
local function winner_node(d, cid)
  local nt = nil
  if d.nodes then
    nt = d.nodes[cid] -- the full scan built it from the hashes
  elseif recs[cid][REC.nodes] > 0 then
    nt = node_table(cid)
  end
  if not nt then return nil end
  local i = best_fit_in(nt, d.q.req)
  return i and node_names(nt)[i]
end

-- commit reserves d's winner: its capacity is taken (written at flush), the
-- reservation recorded, both clusters notified, the decision audited.
local function commit(d)
  local q, win = d.q, d.top[1]
  local candidates = candidates_of(d.top)
  local candidates_json = cjson.encode(candidates)
  local score = string.format('%.2f', win.score)
  local node = winner_node(d, win.cluster)
  take(win.cluster, q.req, node)
  local u = usage(q.requester)
  add_usage(u, 1, q.req)
  usage_dirty[q.requester] = true
  local hash, r = new_reservation({requester = q.requester, target = win.cluster,
    cpu = q.cpu, mem = q.mem, gpu = q.gpu, sto = q.sto, duration = q.duration, lease = q.lease,
    score = score, price = win.price, owner = q.owner, priority = q.priority, selector = q.selector,
    candidates = candidates, node = node, extra = d.pref and {'preference', cjson.encode(d.pref)}}, now)
  redis.call('HSET', q.rk, unpack(hash))
  note_lease(prefix, q.qid, r)
  expiry_add[#expiry_add + 1] = r.expires_ms
  expiry_add[#expiry_add + 1] = q.qid
  add_to_set(prefix .. 'by-target:' .. win.cluster, q.qid)
  add_to_set(prefix .. 'by-requester:' .. q.requester, q.qid)
  local ev = event_fields('Reserved', q.id, r, now)
  emit(prefix, q.requester, so, ev)
  emit(prefix, win.cluster, so, ev)
  audit(d, 'reserved', win.cluster, score, candidates_json, node or '')
  -- A waiting request placed at last: the next ones may now pass the priority gate.
  if stop_waiting(prefix, q.qid) then notify_waiters(prefix, so) end
  return {'reserved', hash, candidates_json, cjson.encode(d.rejected), now}
end
