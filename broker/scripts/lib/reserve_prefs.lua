-- reserve_prefs: a request's preferences (reserve.lua header: Preferences):
-- the decision runs restricted to each term in turn, and the first term
-- with a fitting cluster decides; when none has one, the decision runs
-- without them. Expects candidates(d) (reserve_candidates.lua, or the
-- reference's full scan) above its directive.
-- @include reserve_score

-- term_query is request q restricted to preference term t: t's labels
-- merged into q's selector (labels), t's clusters the only candidates
-- (only). nil when a label of t conflicts with the selector: the term
-- matches nothing.
local function term_query(q, t)
  local tq = {}
  for k, v in pairs(q) do tq[k] = v end
  if t.labels then
    local labels = {}
    for k, v in pairs(q.labels or {}) do labels[k] = v end
    for k, v in pairs(t.labels) do
      if labels[k] ~= nil and labels[k] ~= v then return nil end
      labels[k] = v
    end
    tq.labels = labels
  end
  tq.only, tq.term = t.clusters, true
  return tq
end

-- decide_preferred decides request q by its terms (q.prefs, in the order to
-- try them, each with its index as given: store.prefsArg). d.pref records
-- the outcome: the winning term's index and weight, or term -1 (none had a
-- fitting cluster: d is the decision without preferences), and the terms
-- tried, in order.
local function decide_preferred(q)
  local tried = {}
  for _, t in ipairs(q.prefs) do
    tried[#tried + 1] = t.i
    local tq = term_query(q, t)
    if tq then
      local d = new_decision(tq)
      candidates(d)
      if #d.top > 0 then
        d.pref = {term = t.i, weight = t.w, tried = tried}
        return d
      end
    end
  end
  local d = new_decision(q)
  candidates(d)
  d.pref = {term = -1, tried = tried}
  return d
end

-- decide_hinted decides request q among the clusters of its hint (q.hint,
-- store/view.go): the best ones by the replica's view of the index, in
-- order, and the clusters setting the view's price range over the fitting
-- clusters (lo, hi; both among c), judged on the records as they are now.
-- The view, read just before the call, is the index but for what the other
-- replicas wrote since: the decision is the index's own unless that moved
-- the best clusters out of the hint. nil when the clusters setting the
-- range no longer fit (the range, which weighs every score, may have
-- moved): the caller then decides over every candidate.
local function decide_hinted(q)
  local h = q.hint
  local d = new_decision(q)
  d.method = 'hint'
  evaluate(d, h.c)
  local lo, hi = false, false
  for k = 1, d.fit_n do
    if d.fit_id[k] == h.lo then lo = true end
    if d.fit_id[k] == h.hi then hi = true end
  end
  if not (lo and hi) then return nil end
  d.min_price, d.max_price = d.fit_min, d.fit_max
  score_fits(d)
  count_rejections(d)
  local _, live = call_counts()
  d.considered = live
  return d
end

-- decision_of decides request q: by its preferences when it has any, else
-- among its hint's clusters when it has one, else over every candidate.
local function decision_of(q)
  if q.prefs then return decide_preferred(q) end
  if q.hint then
    local d = decide_hinted(q)
    if d then return d end
  end
  local d = new_decision(q)
  candidates(d)
  return d
end
