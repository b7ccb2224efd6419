-- reindex: build the candidate index (lib.lua) from the cluster hashes: live
-- clusters are indexed, stale ones removed. The broker runs it at start-up
-- when the index is missing (a Redis written by an older broker); advertise,
-- reserve, release and expire keep it up to date afterwards.
--
-- KEYS[1]  prefix ("rb:{b}:")
-- ARGV[1]  stale threshold (ms)
-- ARGV[2]  "force" to rebuild even if idx:version says the index exists
-- Reply: number of live clusters indexed, or -1 when the index already existed
local prefix = KEYS[1]
if ARGV[2] ~= 'force' and redis.call('GET', prefix .. 'idx:version') == INDEX_VERSION then return -1 end
local cut = now_ms() - tonumber(ARGV[1])
local indexed = 0
local all = redis.call('ZRANGE', prefix .. 'clusters', 0, -1, 'WITHSCORES')
for i = 1, #all, 2 do
  local cid, seen = all[i], tonumber(all[i + 1])
  unindex_cluster(prefix, cid)
  if seen >= cut then
    index_cluster(prefix, cid, seen, nil)
    indexed = indexed + 1
  end
end
redis.call('SET', prefix .. 'idx:version', INDEX_VERSION)
return indexed
