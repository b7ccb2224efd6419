-- reserve_group: decide a gang, all or nothing. One call places every member
-- of a group (the pods of a scheduler-plugins PodGroup) across one or
-- several live providers, each member on one node that holds it (per-node
-- fit, as reserve.lua), and reserves them only if at least min_member of
-- them are placed; otherwise it writes nothing (but the audit entry).
-- Each placed member becomes an ordinary reservation (core.lua resv:<qid>,
-- with the field group): renew, grant, release and expiry treat it as any
-- other. Idempotent: a call whose members all exist already, with the same
-- group and amounts, replays them.
--
-- Placement, first fit decreasing: the members, largest first (cpu, then
-- memory, gpu, storage, then id), each go to the first provider that holds
-- them, trying the providers the group already uses before any other, and
-- the others by most free cpu (then id): the group stays on as few providers
-- as it can. On a provider that advertises nodes the member takes the best
-- fit node (least free gpu, then cpu, memory, storage, then name), and its
-- totals must hold it too; a provider without nodes is judged on its totals.
-- Candidates are live (seen within the stale threshold), not the requester,
-- match the selector, and have at least the smallest member's cpu free.
--
-- Spread (with a spread group: the replicas of one owner, e.g. the pods
-- matching one topologySpreadConstraint). The group's live reservations per
-- provider are counted (P.."spread:"..requester.."/"..spread group, kept by
-- reservations.lua end_reservation). With a topology key, providers are grouped into
-- domains by the value of that advertised label, and each member goes to a
-- domain of fewest replicas first (then most free cpu); with
-- whenUnsatisfiable DoNotSchedule, only to a domain whose count after it
-- exceeds the smallest count of any domain (every live provider matching
-- the selector and carrying the key is a domain, with room or not) by at
-- most max_skew, and never to a provider without the key; ScheduleAnyway
-- only prefers. The broker's share policy (max_share > 0) prefers the
-- providers that would hold at most max(1, ceil(max_share * replicas)) of
-- the group after it. The audit entry's spread field says what the first
-- fit alone would have chosen and what spread chose instead.
--
-- Fair share: the requester's limits on live reservations and on the cpu,
-- memory and gpu they hold are checked against the members placed together;
-- the priority ceiling clamps the priority. A group call takes no place on
-- the waiting list (its requester retries it) and is not held back by
-- waiting single requests.
--
-- KEYS[1]  prefix ("rb:{b}:"); reads and writes P.."idx:live", P.."idx:rec",
--          P.."idx:free:cpu", P.."idx:label:*", P.."nodes:"..id,
--          P.."node-resv:"..id, P.."cluster:"..id and the other index entries
--          of the providers taken from (index.lua index_free), P.."resv:"..qid,
--          P.."expiry", P.."by-target:"..id, P.."by-requester:"..id,
--          P.."usage", P.."events:"..id, P.."audit" (layout: lib/*.lua),
--          P.."idx:labels" and P.."spread:"..requester.."/"..group (spread)
-- ARGV[1]  stale threshold (ms)
-- ARGV[2]  event stream max length   ARGV[3]  audit stream max length
-- ARGV[4]  event stream TTL (ms)
-- ARGV[5]  the request, one JSON object (store.groupArg), its fields named
--          as reserve.lua's requests where they overlap: group (unique per
--          requester, e.g. namespace/podgroup; "": one request with a
--          spread), requester (cluster id), selector (the label selector as
--          a JSON object of required labels, or ""), owner (free text),
--          priority (integer), duration (ms, > 0), lease (ms; "0": a fixed
--          duration): decimal strings, as the reservation hash keeps them;
--          min_member (how many members must be placed, 1..members);
--          limits, the requester's, as reserve.lua's (a field absent: no
--          limit): n, cpu, mem, gpu, priority (ceiling), rate, burst;
--          spread (absent: none): group (the spread group), key (the
--          topology key, "": none), max_skew, when (whenUnsatisfiable:
--          DoNotSchedule | ScheduleAnyway), max_share (of the spread group
--          per provider; 0: no policy); members, each {id (reservation id),
--          cpu (millicores), mem (bytes), gpu (count), sto (ephemeral
--          storage, bytes)}, the amounts decimal strings
-- Reply: {outcome, members, rejections_json, now_ms}
--   outcome     "reserved", "replay", "conflict" (a member id is taken by
--               another group or for other amounts, or only some members
--               exist), "nofit" (fewer than min_member placed: nothing
--               written), "limited" (rejections {limit, max, used, asked})
--   members     per member, in order, the flat field/value array of its
--               reservation hash ({}: not placed; always {} unless reserved
--               or replay; a replay of a granted one adds its pair's sealed
--               access: grants.lua with_access)
--   rejections  JSON object: members, min_member, placeable (how many the
--               providers could hold together), and, per reason, how many
--               live providers were excluded (stale, requester, selector,
--               insufficient_cpu)
-- @include reservations
local prefix = KEYS[1]
local stale_ms = tonumber(ARGV[1])
local so, audit_max = stream_opts(ARGV[2], ARGV[4]), ARGV[3]
local q = cjson.decode(ARGV[5])
local group, requester, selector_json, owner = q.group, q.requester, q.selector, q.owner
local priority_str, duration, lease = q.priority, q.duration, q.lease
local min_member, lim = q.min_member, q.limits or {}
local sp = q.spread or {}
local spread_group, spread_key = sp.group or '', sp.key or ''
local max_skew, when, max_share = sp.max_skew or 1, sp.when or '', sp.max_share or 0

local now = now_ms()
local cut = now - stale_ms

local members = {}
for i, raw in ipairs(q.members) do
  local m = {id = raw.id, qid = qualify(requester, raw.id),
    str = {cpu = raw.cpu, mem = raw.mem, gpu = raw.gpu, sto = raw.sto}}
  for _, res in ipairs(RESOURCES) do m[res] = tonumber(m.str[res]) end
  members[i] = m
end

-- The requester's rate (limits.lua gcra_step), before anything else: a group
-- call is a reserve call, replays included, as in reserve.lua.
if lim.rate then
  local rate_key = prefix .. 'rate:' .. requester
  local tat, wait = gcra_step(tonumber(redis.call('GET', rate_key) or '0'), now, lim.rate, lim.burst)
  if wait then
    return {'limited', {}, cjson.encode({limit = 'rate', max = lim.rate, retry_after_ms = wait}), now}
  end
  redis.call('SET', rate_key, num(tat), 'PX', math.max(1, math.ceil(tat - now)))
end

-- Replay: every member exists, from this group and for the same amounts.
local existing, found = {}, 0
for i, m in ipairs(members) do
  local flat = redis.call('HGETALL', prefix .. 'resv:' .. m.qid)
  existing[i] = flat
  if #flat > 0 then
    local r = to_map(flat)
    if (r.group or '') ~= group or r.cpu ~= m.str.cpu or r.mem ~= m.str.mem or r.gpu ~= m.str.gpu or r.sto ~= m.str.sto then
      return {'conflict', {}, '{}', now}
    end
    with_live_end(prefix, m.qid, r, flat)
    with_access(prefix, r, flat)
    found = found + 1
  end
end
if found > 0 then
  -- Those not placed the first time have no reservation: a replay as long as min_member exist.
  if found >= min_member then return {'replay', existing, '{}', now} end
  return {'conflict', {}, '{}', now}
end

-- The priority ceiling clamps the priority.
local priority = tonumber(priority_str)
local asked_priority = nil
if lim.priority and priority > lim.priority then
  asked_priority = priority_str
  priority_str = string.format('%d', lim.priority)
end

-- @include group_place
-- @include group_spread

for _, i in ipairs(order) do
  local m = members[i]
  if spread then
    -- What the first fit alone would choose, for the audit (nothing taken).
    local saved = {used_list = {unpack(used_list)}, used = copy(used)}
    local c0 = first_fit(m)
    used_list, used = saved.used_list, saved.used
    spread.unconstrained[#spread.unconstrained + 1] = c0 and c0.id or ''
    local c, node = spread_fit(m)
    if c then
      take(m, c, node)
      spread.per[c.id] = (spread.per[c.id] or 0) + 1
      spread.total = spread.total + 1
      local d = spread.domain_of[c.id]
      if d then spread.count[d] = spread.count[d] + 1 end
    end
    spread.chosen[#spread.chosen + 1] = c and c.id or ''
  else
    local c, node = first_fit(m)
    if c then take(m, c, node) end
  end
end
rejected.placeable = placed

local request_json = cjson.encode({selector = selector_json, priority = priority_str,
  priority_asked = asked_priority, owner = owner, min_member = min_member})
local function audit(outcome, placement_json, extra)
  local name, method = group, 'group'
  if group == '' then name, method = members[1].id, 'spread' end
  local fields = {'reservation', name, 'requester', requester, 'outcome', outcome, 'group', group,
    'method', method, 'request', request_json, 'placement', placement_json,
    'considered', live, 'examined', #clusters, 'rejected', cjson.encode(rejected), 'ts_ms', now}
  for _, x in ipairs(extra or {}) do fields[#fields + 1] = x end
  if spread then
    -- How spread changed the choice: per member (largest first), the first
    -- fit's provider and spread's, and the domains' counts after.
    local counts = spread.count
    if next(counts) == nil then counts = nil end
    fields[#fields + 1] = 'spread'
    fields[#fields + 1] = cjson.encode({group = spread_group, topology_key = spread_key, max_skew = max_skew,
      when_unsatisfiable = when, max_share = max_share, domains = counts,
      first_fit = spread.unconstrained, chosen = spread.chosen})
  end
  redis.call('XADD', prefix .. 'audit', 'MAXLEN', '~', audit_max, '*', unpack(fields))
end

if placed < min_member then
  count_rejections()
  audit('nofit', '[]')
  return {'nofit', {}, cjson.encode(rejected), now}
end

-- Limits on what the placed members hold together.
local u = read_usage(prefix, requester)
local want = {n = 0, cpu = 0, mem = 0, gpu = 0, sto = 0}
for _, m in ipairs(members) do
  if m.cluster then
    want.n = want.n + 1
    for _, res in ipairs(RESOURCES) do want[res] = want[res] + m[res] end
  end
end
for _, k in ipairs({'n', 'cpu', 'mem', 'gpu'}) do
  if lim[k] and want[k] > 0 and u[k] + want[k] > lim[k] then
    local name = k
    if k == 'n' then name = 'reservations' end
    local l = {limit = name, max = lim[k], used = u[k], asked = want[k]}
    return {'limited', {}, cjson.encode(l), now}
  end
end

-- Write: the capacity, the reservations, their indexes and events.
local replies, placement = {}, {}
for i, m in ipairs(members) do
  replies[i] = {}
  local c = m.cluster
  if c then
    local ck = prefix .. 'cluster:' .. c.id
    for _, res in ipairs(RESOURCES) do
      if m[res] > 0 then redis.call('HINCRBY', ck, 'resv_' .. res, m.str[res]) end
    end
    if m.node then node_debit(prefix, c.id, m.node, m.str, 1) end
    local extra = {}
    if group ~= '' then extra = {'group', group} end
    if spread_group ~= '' then
      extra[#extra + 1] = 'spread'
      extra[#extra + 1] = spread_group
      spread_count(prefix, requester, spread_group, c.id, 1)
    end
    local hash, r = new_reservation({requester = requester, target = c.id,
      cpu = m.str.cpu, mem = m.str.mem, gpu = m.str.gpu, sto = m.str.sto, duration = duration, lease = lease,
      score = '0', price = price_at(m, c.rec), owner = owner, priority = priority_str, selector = selector_json,
      node = m.node, extra = extra}, now)
    redis.call('HSET', prefix .. 'resv:' .. m.qid, unpack(hash))
    note_lease(prefix, m.qid, r)
    redis.call('ZADD', prefix .. 'expiry', r.expires_ms, m.qid)
    redis.call('SADD', prefix .. 'by-target:' .. c.id, m.qid)
    redis.call('SADD', prefix .. 'by-requester:' .. requester, m.qid)
    local ev = event_fields('Reserved', m.id, r, now)
    if group ~= '' then
      ev[#ev + 1] = 'group'
      ev[#ev + 1] = group
    end
    emit(prefix, requester, so, ev)
    emit(prefix, c.id, so, ev)
    stop_waiting(prefix, m.qid) -- a member once asked for alone no longer waits
    replies[i] = hash
    placement[#placement + 1] = {reservation = m.id, cluster = c.id, node = m.node or ''}
  end
end
for _, c in ipairs(used_list) do index_free(prefix, c.id, RESOURCES) end
add_usage(u, want.n, want)
write_usage(prefix, requester, u)
local providers = {}
for _, c in ipairs(used_list) do providers[#providers + 1] = c.id end
audit('reserved', cjson.encode(placement), {'winner', table.concat(providers, ',')})
return {'reserved', replies, cjson.encode(rejected), now}
