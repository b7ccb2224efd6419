-- reserve_score: judging and scoring clusters for one request (reserve.lua
-- header: the score). A decision d holds what the stages after the gate
-- share: the fits found so far (parallel arrays, no table per cluster: this
-- runs for every cluster a decision reads), the rejections counted, the
-- best candidates in order (top) and how they were found (method).
-- Expects reserve.lua's w_res, w_cost and top_n above its directive.
-- @include reserve_batch

-- new_judge returns judge(cid, r, labels, nt), which decides whether one
-- cluster can take the request from its record r (records.lua), with a
-- selector its labels, and (the full scan) its node table nt. A fitting
-- cluster is appended to d's fits; a failing one is counted, per reason.
-- While d.deferred is a list, a cluster whose node summary cannot decide
-- and whose node record is not read yet goes there, judged again later.
local function new_judge(d)
  local q, rej = d.q, d.rej
  local req = q.req
  local rc, rm, rg, rst = req.cpu, req.mem, req.gpu, req.sto
  local n_requested, selector = #q.requested, q.labels
  local fit_id, fit_rs, fit_price = d.fit_id, d.fit_rs, d.fit_price
  -- The record's positions read for every cluster, as locals: an upvalue
  -- costs less than a lookup in REC.
  local AC, FC, AM, FM, AG, FG, AS, FS = ALLOC.cpu, FREE.cpu, ALLOC.mem, FREE.mem, ALLOC.gpu, FREE.gpu, ALLOC.sto, FREE.sto
  local NODES = REC.nodes
  return function(cid, r, labels, nt)
    d.examined = d.examined + 1
    -- Same order as the requested resources (cpu, mem, gpu, sto): the same
    -- sum to the last bit whatever path evaluates the cluster.
    local ok, sum = true, 0
    if rc > 0 then
      local f = r[FC]
      if f < rc then rej.cpu = rej.cpu + 1; ok = false else sum = sum + (f - rc) / r[AC] end
    end
    if rm > 0 then
      local f = r[FM]
      if f < rm then rej.mem = rej.mem + 1; ok = false elseif ok then sum = sum + (f - rm) / r[AM] end
    end
    if rg > 0 then
      local f = r[FG]
      if f < rg then rej.gpu = rej.gpu + 1; ok = false elseif ok then sum = sum + (f - rg) / r[AG] end
    end
    if rst > 0 then
      local f = r[FS]
      if f < rst then rej.sto = rej.sto + 1; ok = false elseif ok then sum = sum + (f - rst) / r[AS] end
    end
    if selector then
      for k, want in pairs(selector) do
        if labels[k] ~= want then
          rej.selector = rej.selector + 1
          ok = false
          break
        end
      end
    end
    if not ok then return end
    if r[NODES] > 0 then
      local fits = summary_fit(r, rc, rm, rg, rst)
      if fits == nil then
        if d.deferred and nodes_of[cid] == nil and nraw[cid] == nil then
          d.deferred[#d.deferred + 1] = cid
          d.examined = d.examined - 1 -- counted when judged again
          return
        end
        fits = node_scan(cid, nt, rc, rm, rg, rst)
      end
      if not fits then
        rej.node = rej.node + 1
        return
      end
    end
    local price = price_at(req, r)
    local n = d.fit_n + 1
    d.fit_n = n
    fit_id[n], fit_rs[n], fit_price[n] = cid, 100 * sum / n_requested, price
    if d.fit_min == nil or price < d.fit_min then d.fit_min = price end
    if d.fit_max == nil or price > d.fit_max then d.fit_max = price end
  end
end

-- new_decision is the state of deciding request q (reserve_gate.lua request_of).
local function new_decision(q)
  local d = {q = q, examined = 0, fit_n = 0, fit_id = {}, fit_rs = {}, fit_price = {}, scored = 0,
    rejected = {stale = 0, requester = 0, selector = 0},
    rej = {cpu = 0, mem = 0, gpu = 0, sto = 0, selector = 0, node = 0},
    seen = {}, top = {}}
  d.judge = new_judge(d)
  return d
end

-- evaluate judges clusters from their records; the requester is never a
-- candidate, and counts as a rejection when met. The node records of the
-- clusters whose totals hold the request but whose node summary cannot
-- decide are read together, then those clusters judged.
local function evaluate(d, ids)
  local requester, judge = d.q.requester, d.judge
  load_recs(ids, d.q.labels ~= nil)
  d.deferred = {}
  for _, cid in ipairs(ids) do
    local r = recs[cid]
    if cid == requester then
      d.rejected.requester = 1
    elseif r then
      judge(cid, r, labels_of[cid])
    end
  end
  local later = d.deferred
  d.deferred = nil
  if #later > 0 then
    read_missing(prefix .. 'idx:nrec', later, nraw, function(raw) return raw or false end)
    for _, cid in ipairs(later) do judge(cid, recs[cid], labels_of[cid]) end
  end
end

-- evaluate_unseen evaluates the clusters not met before (a walk meets a
-- cluster in several sorted sets).
local function evaluate_unseen(d, ids)
  local todo = {}
  for _, cid in ipairs(ids) do
    if not d.seen[cid] then
      d.seen[cid] = true
      todo[#todo + 1] = cid
    end
  end
  evaluate(d, todo)
end

-- offer scores fit k, at d's price range, and keeps the best top_n in
-- order (score, then cluster id).
local function offer(d, k)
  local price, rs, cid = d.fit_price[k], d.fit_rs[k], d.fit_id[k]
  local cs = 100
  if d.max_price > d.min_price then cs = 100 * (d.max_price - price) / (d.max_price - d.min_price) end
  local score = w_res * rs + w_cost * cs
  local top = d.top
  local pos = #top + 1
  while pos > 1 do
    local t = top[pos - 1]
    if score > t.score or (score == t.score and cid < t.cluster) then pos = pos - 1 else break end
  end
  if pos <= top_n then
    table.insert(top, pos, {cluster = cid, score = score, resource_score = rs, cost_score = cs, price = price})
    if #top > top_n then top[#top] = nil end
  end
end

-- score_fits offers the fits found since it last ran.
local function score_fits(d)
  for k = d.scored + 1, d.fit_n do offer(d, k) end
  d.scored = d.fit_n
end

-- decide_among judges ids, all the candidates there are, and scores the fits.
local function decide_among(d, ids)
  evaluate(d, ids)
  d.min_price, d.max_price = d.fit_min, d.fit_max
  score_fits(d)
end

-- count_rejections copies the rejections judge counted into the reply's
-- (complete when nothing fits: every cluster passing the other checks was
-- judged; the index recounts the others then).
local function count_rejections(d)
  for _, res in ipairs(d.q.requested) do d.rejected['insufficient_' .. res] = d.rej[res] end
  d.rejected.selector = d.rej.selector
  if d.rej.node > 0 then d.rejected.insufficient_node_fit = d.rej.node end
end
