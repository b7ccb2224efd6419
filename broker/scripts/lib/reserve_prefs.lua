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

-- decision_of decides request q: by its preferences when it has any, else
-- over every candidate.
local function decision_of(q)
  if q.prefs then return decide_preferred(q) end
  local d = new_decision(q)
  candidates(d)
  return d
end
