-- reference_scan: the test-only full scan of reserve.lua (package
-- scripts/reference puts this function in place of reserve.lua's
-- "local reference_scan = nil"; the broker never loads it). It judges every
-- live cluster from its hashes rather than from the candidate index, so that
-- the tests can check the index against it and the benchmarks have a
-- baseline.
--
-- Keys (under prefix P, all in P's hash slot): P.."clusters",
-- P.."cluster:"<id>, and through lib.lua's node_list P.."nodes:"<id>.
-- Arguments: the prefix, the live cut (ms), the requester (never a
-- candidate: counted in rejected.requester), the rejection counts, whether
-- the request has a label selector (labels are decoded only then), and
-- reserve.lua's judge(cid, record, labels, node_table).
-- Returns the node tables it built, by cluster id (the winner's is the one
-- reserve.lua debits).
local function reference_scan(prefix, cut, requester, rejected, with_labels, judge)
  local fields = {'price_cpu', 'price_mem', 'price_gpu', 'labels', 'nodes'}
  for _, res in ipairs(RESOURCES) do
    fields[#fields + 1] = 'alloc_' .. res
    fields[#fields + 1] = 'used_' .. res
    fields[#fields + 1] = 'resv_' .. res
  end
  local tables = {}
  for _, cid in ipairs(redis.call('ZRANGEBYSCORE', prefix .. 'clusters', cut, '+inf')) do
    if cid == requester then
      rejected.requester = 1
    else
      local v = redis.call('HMGET', prefix .. 'cluster:' .. cid, unpack(fields))
      local al, fr = {}, {}
      for i = 1, 4 do
        al[i] = tonumber(v[3 * i + 3] or '0')
        fr[i] = al[i] - tonumber(v[3 * i + 4] or '0') - tonumber(v[3 * i + 5] or '0')
      end
      local labels = nil
      if with_labels then labels = decode_labels(v[4]) end
      -- The record layout of lib.lua's idx:rec: alloc and free per resource,
      -- the three prices, then the node summary.
      local r = {al[1], fr[1], al[2], fr[2], al[3], fr[3], al[4], fr[4],
        tonumber(v[1] or '0'), tonumber(v[2] or '0'), tonumber(v[3] or '0')}
      local nodes = nil
      if tonumber(v[5] or '0') > 0 then nodes = node_list(prefix, cid) end
      for _, x in ipairs(node_summary(nodes)) do r[#r + 1] = x end
      local nt = nil
      if nodes then
        nt = table_of(nodes)
        tables[cid] = nt
      end
      judge(cid, r, labels, nt)
    end
  end
  return tables
end
