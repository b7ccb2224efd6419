-- reference scan: the test-only stand-in for reserve.lua's include
-- reserve_candidates (package scripts/reference composes reserve.lua with
-- it; the broker never loads it). It judges every live cluster from its
-- hashes rather than from the candidate index, so that the tests can check
-- the index against it and the benchmarks have a baseline; for a preference
-- term naming clusters (q.only), every live cluster it names. Same contract:
-- candidates(d) fills d.top, d.rejected, d.method and d.considered, and
-- d.nodes, the node tables it built by cluster id (the winner's is the one
-- reserve_commit.lua debits).
-- @include reserve_score

local function candidates(d)
  flush() -- the hashes must hold what the batch took
  d.method, d.nodes = 'scan', {}
  local with_labels = d.q.labels ~= nil
  local only = nil -- a preference term's clusters (reserve_prefs.lua)
  if d.q.only then
    only = {}
    for _, cid in ipairs(d.q.only) do only[cid] = true end
  end
  for _, cid in ipairs(redis.call('ZRANGEBYSCORE', prefix .. 'clusters', cut, '+inf')) do
    if only and not only[cid] then
      -- not a candidate of this term
    elseif cid == d.q.requester then
      d.rejected.requester = 1
    else
      local rec, nodes, labels = record_from_hash(prefix, cid)
      if nodes then d.nodes[cid] = table_of(nodes) end
      d.judge(cid, rec, with_labels and decode_labels(labels) or nil, d.nodes[cid])
    end
  end
  d.min_price, d.max_price = d.fit_min, d.fit_max
  score_fits(d)
  count_rejections(d)
  d.considered = d.examined + d.rejected.requester
end
