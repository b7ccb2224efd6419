-- view: what a replica's view of the candidate index (store/view.go) reads
-- to catch up: the clusters whose record or labels changed, or that left
-- the index, since the change it last saw (index.lua mark_changed), or the
-- whole index when it has none yet or the numbering started again.
--
-- KEYS[1]  prefix ("rb:{b}:"): every key read derives from it (index.lua)
-- ARGV[1]  the epoch of the numbering the view holds ("" when the index had
--          none yet, "-" when the view holds nothing: read all)
-- ARGV[2]  the last change it saw (idx:feed seq)
-- ARGV[3]  the most clusters to return when catching up
-- Reply:   {epoch, seq, whole, ids, records, labels}: the numbering's epoch
--          and the last change the reply covers; whole 1 when ids are every
--          cluster of the index (the view starts again from them), 0 when
--          they are the clusters changed since ARGV[2] (up to ARGV[3] of
--          them: the view asks again from seq until it has them all); for
--          each id its idx:rec and idx:labels values (false: it left the index)
local prefix = KEYS[1]
local feed = redis.call('HMGET', prefix .. 'idx:feed', 'epoch', 'seq')
local epoch, seq = feed[1] or '', tonumber(feed[2] or '0')
local since = tonumber(ARGV[2])

local ids, recs, labels = {}, {}, {}
if ARGV[1] == epoch and since <= seq then
  local r = redis.call('ZRANGE', prefix .. 'idx:changes', '(' .. since, '+inf', 'BYSCORE', 'LIMIT', 0, tonumber(ARGV[3]), 'WITHSCORES')
  for i = 1, #r, 2 do ids[#ids + 1] = r[i] end
  seq = since
  if #r > 0 then seq = tonumber(r[#r]) end
  for first = 1, #ids, 512 do
    local last = math.min(first + 511, #ids)
    local rr = redis.call('HMGET', prefix .. 'idx:rec', unpack(ids, first, last))
    local ll = redis.call('HMGET', prefix .. 'idx:labels', unpack(ids, first, last))
    for i = 1, last - first + 1 do
      recs[#recs + 1] = rr[i]
      labels[#labels + 1] = ll[i]
    end
  end
  return {epoch, seq, 0, ids, recs, labels}
end

local all = redis.call('HGETALL', prefix .. 'idx:rec')
local label_of = {}
local l = redis.call('HGETALL', prefix .. 'idx:labels')
for i = 1, #l, 2 do label_of[l[i]] = l[i + 1] end
for i = 1, #all, 2 do
  ids[#ids + 1] = all[i]
  recs[#recs + 1] = all[i + 1]
  labels[#labels + 1] = label_of[all[i]] or false
end
return {epoch, seq, 1, ids, recs, labels}
