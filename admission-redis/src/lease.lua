#!lua name=__LIBRARY__
-- admission-redis: the function library behind every fleet transition (schema admission-event-v1).
--
-- Loaded with FUNCTION LOAD under a name that carries a digest of this text (__LIBRARY__ is
-- replaced by it), called with FCALL; the client loads it again when a server does not have it.
-- ARGV[1] names the operation, ARGV[2] is the caller's config fingerprint. Every key shares the
-- cell's hash tag, so a transition stays in one Redis Cluster slot. Time is the server's (TIME),
-- never a client's.
--
-- KEYS: 1 cfg (hash: ceilings, fingerprint, policy version, tenant overrides `o:<tenant>`)
--       2 occ (hash: counters sb, st, tb:<tenant>, tt:<tenant>, bt:<backend>; lease records
--              r:<id> = "token|tenant|backend|footprint|operation|requests|nonce"; the last
--              token, tok; in a fair line whose levels reserve a rate, each such level's spent
--              counter there while the line is busy, sp:<level>:<dimension>, see "Dips")
--       3 exp (sorted set: lease id -> expiry, server milliseconds)
--       4 events (stream)   5 quota (hash: "r:<tenant>" / "b:<tenant>" -> "window|used")
--       6 line (sorted set: waiting lease id -> ticket; in a fair line, see below, every score
--              is 0 and the member is the waiter's place: level, start tag, ticket, id)
--       7 live (sorted set: waiting id -> liveness expiry, server ms)
--       8 fair (sorted set: "<level>:<epoch>:<tenant>" -> the tenant's finish tag at that level
--              in the level's current busy period)
-- Waiters are recorded in occ as q:<id> = "ticket|tenant|backend|footprint|operation|requests|nonce|
-- instance|latest|place" (instance '-' for none; latest, the server ms after which the waiter's
-- caller no longer waits, 0 for no bound; place, its member of the line in a fair line only); a
-- lease record carries the nonce of the acquisition that
-- took it last. `requests` is
-- what the lease spends of the requests per minute (1 for a call; more for a slice). The nonce is
-- the caller's, chosen before its first call: only the same call may ask again as that waiter,
-- claim a grant made to it (read-only, so a claim whose reply was lost can be claimed again) or
-- withdraw it; another acquisition with the same lease id is a duplicate.
-- A grant the hand-off makes to a waiter is written, besides the events stream, to the notices of
-- the waiter's instance (the provider that queued it): the stream `<tag>:to:<instance>`, outside
-- KEYS because no caller but the hand-off knows which instances wait, yet in the cell's slot
-- (same hash tag). Each instance reads only its own notices, so the cost of a wake does not grow
-- with the number of instances. A notice lives one lease TTL: its grant is void after that.
-- A transition reads and writes each hash once: the lease path is seven calls in all.
--
-- Replies are flat arrays whose first element is a status word:
--   OK, FULL (not now), NEVER (never fits), LOST, STALE, OVER (quota), INVALID, NOCONFIG, MISMATCH.
-- Tenant and backend arguments are already SHA-256 hex digests: raw ids never reach Redis.

-- What this library knows of the server process it runs in, kept for the life of that process
-- (a library's state does not outlive it: a restarted server, or a replica promoted to master,
-- starts with none). Read at the first call, and the replication part again where a decision
-- needs it; server milliseconds on the server's own clock (`TIME`), never a test skew. See
-- "Recovery" below and in the fleet guide.
--   me       the process's run id (`INFO server`)
--   born_ms  the earlier of the library's first call and the process's start rounded up to the
--            next whole second (`server_time_usec` less `uptime_in_seconds`, both whole seconds
--            of one cached clock, plus one): every write an earlier process of this server
--            acknowledged was acknowledged before `born_ms`
--   lineage  the replication id the process serves under (`master_replid`), and `since`, when
--            this library first saw it: a promotion gives a new one, so the promotion came no
--            later than `since`
--   promoted the process was promoted from a replica (`second_repl_offset` is not -1)
--   served   cfg key -> the server ms until which the cell vanishing would matter: its last call
--            here plus one lease TTL (a lease renewed at that call may run until then). Pruned
--            one entry a call, so it holds about the cells called within the last TTL.
local me, born_ms, lineage, since, promoted
local served, cursor = {}, nil

local function replication(real)
  local info = redis.call('INFO', 'replication')
  local id = string.match(info, 'master_replid:(%w+)')
  promoted = string.match(info, 'second_repl_offset:(-?%d+)') ~= '-1'
  if id ~= lineage then lineage, since = id, real end
end

local function first_call(real)
  local info = redis.call('INFO', 'server')
  me = string.match(info, 'run_id:(%w+)')
  local usec = tonumber(string.match(info, 'server_time_usec:(%d+)') or '0')
  local up = tonumber(string.match(info, 'uptime_in_seconds:(%d+)') or '0')
  born_ms = math.min(real, (math.floor(usec / 1000000) - up + 1) * 1000)
  replication(real)
end

-- Drops one entry of `served` whose time has passed, walking the table one step a call.
local function prune(real)
  local ok, key, until_ms = pcall(next, served, cursor)
  if not ok then key, until_ms = next(served) end
  cursor = key
  if key and until_ms <= real then served[key] = nil end
end

local function call(KEYS, ARGV)
  local cfg, occ, exp, events, quota, line, live =
    KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
  local op, fingerprint = ARGV[1], ARGV[2]

  -- The config, the asking tenant's override, and the server's clock. A build with the test-util
  -- feature adds a forward skew to it (the lines between the test-util markers, which the
  -- production script does not contain: nothing in production can move the cell's time).
  local asking = (op == 'acquire' and ARGV[4]) or (op == 'snapshot' and ARGV[3]) or ''
  local function read_cfg()
    return redis.call('HMGET', cfg, 'fingerprint', 'sb', 'st', 'tb', 'tt', 'bt', 'maxlen',
      'version', 'skew_ms', 'o:' .. asking, 'ttl', 'nq', 'idle', 'touched', 'ne', 'rid', 'rec',
      'rt', 'rr', 'thr', 'rh', 'rm', 'rbt', 'rbq', 'dur', 'fw', 'w:' .. asking, 'lv')
  end
  local c = read_cfg()
  local t = redis.call('TIME')
  local skew = 0
  -- test-util begin
  skew = tonumber(c[9] or '0')
  -- test-util end
  local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + skew
  local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2]) + skew * 1000
  -- The server's own clock, without a test skew: what the library's facts are counted in.
  local real = now_ms - skew
  if not me then first_call(real) end

  -- A number as Redis stores it. Numbers handed to `redis.call` or returned need no conversion
  -- (Redis writes them with 17 digits, exact below 2^53); Lua's own `..` writes 14, so a number
  -- joined into a string (a token, a byte count) goes through here or `string.format` first.
  local function int(n) return string.format('%.0f', n) end

  -- Every key of the cell expires after `idle` milliseconds without a call, so a fleet that
  -- crashed, or stopped using a cell, leaves nothing behind for good. A call refreshes the expiry of
  -- every key (last thing, so a key emptied and re-created during the call is covered too) when the
  -- last refresh (`touched`, server ms) is older than a tenth of the idle time, at most a minute:
  -- seven calls a minute rather than seven a call, and a cell expires between nine tenths of its
  -- idle time and the whole of it after its last call. A key a call creates gets its expiry at once
  -- (`born`), so no key of a cell is ever without one.
  local function touch(idle, reply)
    if idle and idle > 0 and now_ms - tonumber(c[14] or '0') >= math.min(idle / 10, 60000) then
      for i = 1, #KEYS do redis.call('PEXPIRE', KEYS[i], idle) end
      redis.call('HSET', KEYS[1], 'touched', int(now_ms))
    end
    return reply
  end

  -- A cell created afresh (first start, or a server that restarted empty) starts its policy
  -- version at the server's clock, so versions never go back across a restart either.
  -- ARGV of init: 3 service_bytes 4 service_transfers 5 tenant_bytes 6 tenant_transfers
  --   7 backend_transfers 8 events_max_len 9 lease ttl ms (a waiter's grant lives this long)
  --   10 idle ms (every key expires after this long without a call; 0: never)
  --   11 recover ('1': a cell created afresh recovers when it may have lost leases, see below;
  --      '0': never)
  --   12 tokens per minute 13 requests per minute (the rates, see below; '0': none)
  --   14 the rates' minute, ms (60000; shorter for a simulation running faster than real time)
  --   15 16 the rates' burst, tokens and requests ('0': a whole minute's worth, see below)
  --   17 what the server promises of an acknowledged write: 'f' every write is synced to the
  --      append-only file before the answer, 'r' every call waits for the replicas ('' none)
  --   18 the fair line ('' none; else the default weight of a tenant, '0' for arrival order
  --      within each level: see "The fair line" below) 19 its levels' reserves and exemptions
  --      ('' none; else `rank:dimension:amount` and `rank:e` joined by commas), then pairs of a
  --      tenant (a digest) and its weight
  local created = false
  if op == 'init' and not c[1] then
    redis.call('HSET', cfg, 'fingerprint', fingerprint, 'sb', ARGV[3], 'st', ARGV[4],
      'tb', ARGV[5], 'tt', ARGV[6], 'bt', ARGV[7], 'maxlen', ARGV[8],
      'version', int(math.max(1, math.floor(now_ms))), 'ttl', ARGV[9], 'idle', ARGV[10],
      'nq', redis.call('ZCARD', line), 'rid', me, 'rec', 0, 'dur', ARGV[17] or '')
    if (ARGV[18] or '') ~= '' then
      redis.call('HSET', cfg, 'fw', ARGV[18], 'lv', ARGV[19] or '')
      for i = 20, #ARGV - 1, 2 do redis.call('HSET', cfg, 'w:' .. ARGV[i], ARGV[i + 1]) end
    end
    if tonumber(ARGV[12] or '0') > 0 then
      redis.call('HSET', cfg, 'rt', ARGV[12], 'rr', ARGV[13], 'thr', 0, 'rm', ARGV[14] or 60000,
        'rbt', ARGV[15] or 0, 'rbq', ARGV[16] or 0)
    end
    c = read_cfg()
    created = true
  end

  if not c[1] then return {'NOCONFIG'} end
  if c[1] ~= fingerprint then return {'MISMATCH', c[1]} end
  local S_B, S_T, T_B, T_T, B_T = tonumber(c[2]), tonumber(c[3]), tonumber(c[4]), tonumber(c[5]), tonumber(c[6])
  local maxlen, version, TTL, IDLE = c[7], c[8], tonumber(c[11]), tonumber(c[13])
  -- No lease expires before `NE` (server ms; `ne` in cfg): the reap looks at the expiries only
  -- from then on. It is a lower bound, kept by the reap (the earliest expiry left, or `NONE` when
  -- nothing is held) and lowered by a grant that expires sooner; a renewal or a release only raises
  -- the true earliest expiry, so neither needs to touch it. Missing (a new cell): look now.
  local NONE = 9007199254740991
  local NE = tonumber(c[15] or '0')
  -- Until `REC` (server ms) the cell recovers: see below.
  local REC = tonumber(c[17] or '0')
  local recovering = now_ms < REC

  -- A key this call has just created expires as the cell does (see `touch`).
  local function born(key)
    if IDLE and IDLE > 0 then redis.call('PEXPIRE', key, IDLE) end
  end
  -- How many wait in the line: with none (the usual case) the line is never read.
  local queued = tonumber(c[12] or '0')

  -- The fair line (a cell configured with fair shares or levels: `fw` in cfg). A waiter's place
  -- in the line is the member `LLSSSSSSSSSSSSSSSS.SSSSSSSSTTTTTTTTTTTTTTTT<id>`, every score 0,
  -- so the line is in the order of its level (two digits, 0 the highest), then its start tag
  -- (fixed point), then its ticket (arrival): a higher level's waiter goes before every lower
  -- level's (strict priority), and within a level tenants share by start-time fair queuing.
  -- A tenant's start tag at a level is the later of the level's virtual time and the tenant's
  -- finish tag there; its finish tag becomes the start tag plus the lease's cost, its footprint
  -- in units of 2^-20 of the service bytes divided by the tenant's weight (`w:<tenant>` in cfg,
  -- else `FW`). FW 0: no weights, every start tag 0 (arrival order within a level). The virtual
  -- time of a level is the start tag of its first waiter, the smallest of its level's, so no
  -- newcomer of a level goes before the first waiter of its own level (its place, the head's
  -- reservation, is kept), and a grant out of turn (a backfill) does not move it. A tenant that was idle starts at the virtual time: no credit is banked. Costs are
  -- charged only while the asker's level has a waiter (a grant beside an idle level costs
  -- nothing), each busy period of a level is an epoch of its own (the first waiter of an idle
  -- level starts it at virtual time 0, and tags of earlier epochs count for nothing), and
  -- everything is forgotten when the line empties; each call drops the lowest finish tag if its
  -- epoch is over or it is no later than its level's virtual time, so `fair` holds about the
  -- tenants that are ahead of their share.
  local FW = tonumber(c[26] or '-1')
  local FAIR = FW >= 0
  local fair = KEYS[8]
  local PLACE = 43
  local function place_of(rank, start, ticket, id)
    return string.format('%02d%025.8f%016.0f', rank, start, ticket) .. id
  end
  local function id_of(member)
    if FAIR then return string.sub(member, PLACE + 1) end
    return member
  end
  -- The level of a waiter's record `w` in a fair line (nil in another, or for no record).
  local function level_of(w)
    return FAIR and w and w[10] and tonumber(string.sub(w[10], 1, 2)) or nil
  end
  -- The virtual time of level `rank`: the start tag of its first waiter, the smallest of its
  -- level's (nil when nobody of the level waits).
  local function vtime(rank)
    local lead = redis.call('ZRANGEBYLEX', line, '[' .. string.format('%02d', rank),
      '(' .. string.format('%02d', rank + 1), 'LIMIT', 0, 1)[1]
    return lead and tonumber(string.sub(lead, 3, 27))
  end
  -- The levels' reserves (`lv` in cfg): `RES[rank][dimension]`, on service bytes (1), service
  -- transfers (2), tokens (6) and requests (7) per minute, and the exempt ranks. Every other
  -- level's waiter leaves a level's reserve aside: always on the rates, which refill with time
  -- (it costs them burst, never rate); on bytes and transfers, which come back when released,
  -- only while that level has a waiter in the line (they borrow it otherwise). An exempt level
  -- leaves nothing aside.
  local RES, EXEMPT, LENDS = {}, {}, {}
  for rank, dim, amount in string.gmatch(c[28] or '', '(%d+):(%d+):(%d+)') do
    rank, dim = tonumber(rank), tonumber(dim)
    RES[rank] = RES[rank] or {}
    RES[rank][dim] = tonumber(amount)
    if dim <= 2 then LENDS[rank] = true end
  end
  for rank in string.gmatch(c[28] or '', '(%d+):e') do EXEMPT[tonumber(rank)] = true end
  -- The ranks that reserve each rate (`DIPPERS[6]` tokens, `DIPPERS[7]` requests), whose spent
  -- counters the dips keep (see "Dips" below), and those counters as this call read them
  -- (`spent`, by field; nil until first needed).
  local DIPPERS, spent = { [6] = {}, [7] = {} }, nil
  for rank = 0, 15 do
    for d = 6, 7 do
      if RES[rank] and (RES[rank][d] or 0) > 0 then DIPPERS[d][#DIPPERS[d] + 1] = rank end
    end
  end
  -- Waiters in the line by rank, for the levels that lend (counted when first needed), and
  -- whether a lending level's last waiter left during this call (`relent`: the line is asked
  -- again, since waiters it held may borrow now).
  local parked, relent = {}, false
  local function waiting_at(rank)
    if parked[rank] == nil then
      parked[rank] = redis.call('ZLEXCOUNT', line, '[' .. string.format('%02d', rank),
        '(' .. string.format('%02d', rank + 1))
    end
    return parked[rank]
  end
  -- What a waiter of `rank` leaves aside for the other levels, by dimension (`kept_only`: only
  -- what it always leaves, on the rates).
  local function aside(rank, kept_only)
    local a = { 0, 0, 0, 0, 0, 0, 0 }
    if not FAIR or EXEMPT[rank] then return a end
    for other, res in pairs(RES) do
      if other ~= rank then
        for dim, amount in pairs(res) do
          if dim >= 6 or (not kept_only and waiting_at(other) > 0) then a[dim] = a[dim] + amount end
        end
      end
    end
    return a
  end
  local function plus(r, a)
    local sum = {}
    for i = 1, 7 do sum[i] = r[i] + a[i] end
    return sum
  end

  local function forget()
    redis.call('DEL', fair)
    local fields = {}
    for i = 0, 15 do fields[#fields + 1] = 'e:' .. i end
    -- The levels' spent counters on the rates too (a cell with no level reserving a rate has
    -- none): a busy period of the line is over.
    for d = 6, 7 do
      for _, rank in ipairs(DIPPERS[d]) do fields[#fields + 1] = 'sp:' .. rank .. ':' .. d end
    end
    redis.call('HDEL', occ, unpack(fields))
    spent = {}
  end
  local DIMS = { 'service_bytes', 'service_transfers', 'tenant_bytes', 'tenant_transfers', 'backend_transfers',
    'tokens_per_minute', 'requests_per_minute' }

  -- The rates (a cell configured with them): tokens and requests per minute (`rt`, `rr`). Each is
  -- a level that holds at most its capacity (CT, CR) and refills continuously on the server's
  -- clock at FT (FR) per minute / (1 + throttle), the throttle counted in tenths (`thr`) as the
  -- local token bucket counts it. Without a burst (`rbt`, `rbq` 0) the capacity and the refill
  -- are the whole budget, as a provider's bucket is: a full level and a minute's refill let up to
  -- twice the budget through in one rolling minute. With a burst the capacity is the burst (at
  -- most half the budget, whatever budget the headers set) and the refill the rest of the
  -- budget: capacity + refill never exceed the budget, so no rolling minute of the server's clock
  -- spends more than it. The levels live in occ (`lt`,
  -- `lr`, and `la`, the server ms they were settled at) and enter the counters as dimensions 6
  -- and 7, counted as what is spent (capacity - level), so the rules of the in-flight dimensions
  -- (fit, the head's reservation, the hand-off) apply to them unchanged. A lease spends its
  -- footprint in tokens and its requests (one for a call) when it is granted; a release may give
  -- back what it did not use. `rh` in cfg is the head last told when the rates will serve it.
  local RT, RR, THR = tonumber(c[18] or '0'), tonumber(c[19] or '0'), tonumber(c[20] or '0')
  local RM = tonumber(c[22] or '60000')
  local RBT, RBQ = tonumber(c[23] or '0'), tonumber(c[24] or '0')
  local RATED = RT > 0
  local NDIM = RATED and 7 or 5
  local PER_MS = 10 / (10 + THR) / RM
  local CT, CR, FT, FR
  local function capacities()
    if RBT > 0 then
      CT, CR = math.min(RBT, RT / 2), math.min(RBQ, RR / 2)
      FT, FR = RT - CT, RR - CR
    else
      CT, CR, FT, FR = RT, RR, RT, RR
    end
  end
  capacities()

  -- Dips. A level that reserves R of a rate (dimension 6 or 7, capacity C: CT or CR, whole
  -- units, the ceiling `validate` checks reserves against) has a spent counter there, `sp:<rank>:
  -- <dimension>` in occ, in units of 2^-16 (ONE a whole token or request; absent: 0). A waiter of
  -- that level behind a head of another level short on the rate (the head claims it) may take
  -- its amount x there not leaving the head's amount aside, only the other levels' reserves kept
  -- always, while spent + x * ONE <= R * ONE: a *dip*, which adds x * ONE to spent. Every other
  -- grant of g of the rate, to a level m, takes floor(g * R * ONE / (C - R)) off the spent
  -- counter of every other level reserving R of it (not below 0; all of it when C <= R): while
  -- the levels keep demand, a level gets R / C of the rate's grants, and its reserve is whole
  -- again once the others were granted C - R. The counters are forgotten with the fair tags,
  -- when the line empties. While a head waits on a rate only dippers and a higher level's
  -- newcomers take from it, so the head waits at most for its amount, the reserves it leaves
  -- aside, each other level's reserve once and those levels' share of the higher levels' grants.
  -- (A cell with such a level pays for them only while its line is busy: one more read of occ a
  -- call, a write a grant that moves them, and, behind a head short on the rate while a waiter
  -- of such a level is in the line, a hand-off that walks on past the head, up to its limit.)
  local ONE = 65536
  local DIPS = RATED and (#DIPPERS[6] > 0 or #DIPPERS[7] > 0)
  -- The spent counters, read once a call when first needed (none while nobody waits: they are
  -- forgotten when the line empties, and only a waiter dips).
  local function spent_counters()
    if spent then return spent end
    spent = {}
    if queued <= 0 then return spent end
    local fields = {}
    for d = 6, 7 do
      for _, rank in ipairs(DIPPERS[d]) do fields[#fields + 1] = 'sp:' .. rank .. ':' .. d end
    end
    local v = redis.call('HMGET', occ, unpack(fields))
    for i, field in ipairs(fields) do spent[field] = tonumber(v[i] or '0') end
    return spent
  end
  -- Whether a waiter of `rank` asking `x` of rate `d` behind `head` may dip there.
  local function may_dip(head, rank, d, x)
    local reserve = RES[rank] and RES[rank][d] or 0
    if not DIPS or not head or not head.short[d] or head.rank == rank or reserve <= 0 then
      return false
    end
    return (spent_counters()['sp:' .. rank .. ':' .. d] or 0) + x * ONE <= reserve * ONE
  end
  -- Whether a level behind a head of `rank` short on rate `d` may dip there at all: it has a
  -- waiter in the line and some of its reserve left (else nobody behind that head can take from
  -- the rate, and the hand-off stops at it).
  local function dippable(rank, d)
    if not DIPS then return false end
    for _, other in ipairs(DIPPERS[d]) do
      if other > rank and (spent_counters()['sp:' .. other .. ':' .. d] or 0) < RES[other][d] * ONE
        and waiting_at(other) > 0 then
        return true
      end
    end
    return false
  end
  -- The dips of a waiter of `rank` asking `need` behind `head`, its reservation `r` and the
  -- dimensions `blocked` (from `set_aside`) changed to match: on a rate it dips, it neither
  -- leaves the head's amount aside nor is kept from the rate. Nil when it dips nowhere.
  local function dip(head, rank, need, r, blocked)
    if not DIPS or not head then return nil end
    local dips
    for d = 6, 7 do
      if may_dip(head, rank, d, need[d]) then
        r[d], blocked[d] = 0, false
        dips = dips or {}
        dips[d] = true
      end
    end
    return dips
  end
  -- Books a grant of `need` to a waiter or asker of `rank` on the spent counters: what it took
  -- in a dip (`dips`) adds to its level's; what it took otherwise earns every other reserving
  -- level its share back. Exact while g * R stays below 2^53. True when a level earned anything
  -- back (a waiter of it may dip now).
  local function book(rank, need, dips)
    if not DIPS then return false end
    local earned_any = false
    local s = spent_counters()
    local set, drop = {}, {}
    for d = 6, 7 do
      local field = 'sp:' .. rank .. ':' .. d
      if dips and dips[d] then
        s[field] = (s[field] or 0) + need[d] * ONE
        set[#set + 1] = field
        set[#set + 1] = int(s[field])
      else
        local capacity = math.floor(d == 6 and CT or CR)
        for _, other in ipairs(DIPPERS[d]) do
          local f = 'sp:' .. other .. ':' .. d
          if other ~= rank and (s[f] or 0) > 0 then
            local rest, n = capacity - RES[other][d], need[d] * RES[other][d]
            local earned = s[f]
            if rest > 0 then
              local rem = math.fmod(n, rest)
              earned = (n - rem) / rest * ONE + math.floor(rem * ONE / rest)
            end
            s[f] = math.max(0, s[f] - earned)
            if earned > 0 then earned_any = true end
            if s[f] > 0 then
              set[#set + 1] = f
              set[#set + 1] = int(s[f])
            else
              drop[#drop + 1] = f
            end
          end
        end
      end
    end
    if #set > 0 then redis.call('HSET', occ, unpack(set)) end
    if #drop > 0 then redis.call('HDEL', occ, unpack(drop)) end
    return earned_any
  end

  -- The asking tenant's ceilings: its override, or the defaults.
  local function limits(override)
    if override then
      local sep = string.find(override, '|', 1, true)
      return tonumber(string.sub(override, 1, sep - 1)), tonumber(string.sub(override, sep + 1))
    end
    return T_B, T_T
  end

  -- The five counters of one tenant and one backend, plus `extra` fields, in one read.
  -- With rates, the levels too (read last, after the extras), refilled up to now.
  local function read(tenant, backend, ...)
    local fields = { 'sb', 'st', 'tb:' .. tenant, 'tt:' .. tenant, 'bt:' .. backend, ... }
    local n = #fields
    if RATED then fields[n + 1], fields[n + 2], fields[n + 3] = 'lt', 'lr', 'la' end
    local v = redis.call('HMGET', occ, unpack(fields))
    local o = { tonumber(v[1] or '0'), tonumber(v[2] or '0'), tonumber(v[3] or '0'),
      tonumber(v[4] or '0'), tonumber(v[5] or '0') }
    if RATED then
      local lt, lr = tonumber(v[n + 1] or CT), tonumber(v[n + 2] or CR)
      local dt = math.max(0, now_ms - tonumber(v[n + 3] or now_ms))
      o[6] = CT - math.min(CT, lt + dt * FT * PER_MS)
      o[7] = CR - math.min(CR, lr + dt * FR * PER_MS)
    end
    return o, v
  end

  -- Writes the five counters back with `extra` field/value pairs in one call, and drops counters
  -- back at zero (and `gone` fields) in one more, so the hash holds only what is held.
  local function write(o, tenant, backend, extra, gone)
    local fields = { 'sb', 'st', 'tb:' .. tenant, 'tt:' .. tenant, 'bt:' .. backend }
    local set, drop = extra or {}, gone or {}
    for i = 1, 5 do
      if o[i] > 0 then
        set[#set + 1] = fields[i]
        set[#set + 1] = o[i]
      else
        drop[#drop + 1] = fields[i]
      end
    end
    if RATED then
      local n = #set
      set[n + 1], set[n + 2], set[n + 3], set[n + 4] = 'lt', CT - o[6], 'lr', CR - o[7]
      set[n + 5], set[n + 6] = 'la', now_ms
    end
    if #set > 0 then redis.call('HSET', occ, unpack(set)) end
    if #drop > 0 then redis.call('HDEL', occ, unpack(drop)) end
  end

  -- `seq` numbers the records: a reader that sees a gap knows trimming dropped some. A caller
  -- that already wrote the counter (in the same HSET as the occupancy) passes it.
  -- A waiter's or an asker's level (`level`, in a fair line) is the record's `level` field.
  local function append(kind, lease, token, tenant, backend, footprint, operation, outcome, o, seq,
    level)
    seq = seq or redis.call('HINCRBY', occ, 'seq', 1)
    local fields = { 'v', 'admission-event-v1', 'seq', seq, 'kind', kind, 'time_ms', now_ms,
      'lease', lease, 'token', token, 'tenant', tenant, 'backend', backend,
      'footprint', footprint, 'operation', operation, 'outcome', outcome, 'policy', version,
      'occupancy', string.format('%.0f %.0f %.0f %.0f %.0f', o[1], o[2], o[3], o[4], o[5]) }
    if level then
      fields[#fields + 1] = 'level'
      fields[#fields + 1] = level
    end
    local id = redis.call('XADD', events, 'MAXLEN', '~', maxlen, '*', unpack(fields))
    -- The cell's first record creates the stream; `seq` lives in occ, which a call creates only
    -- on its way to its first record (a grant, a waiter, a policy change), so occ is born here too.
    if tonumber(seq) == 1 then
      born(events)
      born(occ)
    end
    return id
  end

  local function parse(r)
    local f = {}
    for part in string.gmatch(r, '[^|]+') do f[#f + 1] = part end
    return f -- token (or ticket), tenant, backend, footprint, operation, requests, nonce, instance
    -- ('-': none), latest (server ms; 0: none)
  end

  -- Tells instance `to` that the hand-off granted lease `id` to its acquisition `nonce` (see the
  -- notices at the top), with the counters `o` after the grant.
  local function notify(to, id, nonce, token, expiry, o)
    local key = string.sub(events, 1, -8) .. ':to:' .. to
    redis.call('XADD', key, 'MAXLEN', '~', maxlen, '*', 'lease', id, 'nonce', nonce,
      'token', token, 'policy', version, 'time_ms', now_ms, 'expiry', expiry,
      'occupancy', string.format('%.0f %.0f %.0f %.0f %.0f', o[1], o[2], o[3], o[4], o[5]))
    redis.call('PEXPIRE', key, TTL)
  end

  -- Tells instance `to` that its waiter `id` (acquisition `nonce`), now the head of the line, is
  -- short only of rate until server ms `at`: it asks again then (nobody else's call would grant it
  -- at that instant). Told once per head and instant (`rh` in cfg).
  local function tell_ready(to, id, nonce, at)
    local told = id .. '@' .. int(at)
    if c[21] == told then return end
    c[21] = told
    redis.call('HSET', cfg, 'rh', told)
    if not to then return end
    local key = string.sub(events, 1, -8) .. ':to:' .. to
    redis.call('XADD', key, 'MAXLEN', '~', maxlen, '*', 'lease', id, 'nonce', nonce,
      'at', int(at), 'time_ms', now_ms)
    redis.call('PEXPIRE', key, TTL)
  end

  -- Gives back what lease `id` holds (its record `r`), and to the rates the `unused` tokens of
  -- its footprint (at most the footprint) and the `unused_requests` of its requests (at most
  -- those), then lowers the token level to `left` if it is above it (what the upstream said it
  -- had left), and records why.
  local function settle(id, r, kind, unused, left, unused_requests)
    local f = parse(r)
    local footprint = tonumber(f[4])
    local o, v = read(f[2], f[3], 'seq')
    local seq = tonumber(v[6] or '0') + 1
    o[1], o[2], o[3], o[4], o[5] = o[1] - footprint, o[2] - 1, o[3] - footprint, o[4] - 1, o[5] - 1
    if RATED and unused and unused > 0 then o[6] = math.max(0, o[6] - math.min(unused, footprint)) end
    if RATED and unused_requests and unused_requests > 0 then
      o[7] = math.max(0, o[7] - math.min(unused_requests, tonumber(f[6]) or 0))
    end
    if RATED and left then o[6] = math.max(o[6], CT - left) end
    write(o, f[2], f[3], { 'seq', seq }, { 'r:' .. id })
    redis.call('ZREM', exp, id)
    append(kind, id, f[1], f[2], f[3], f[4], f[5], kind, o, seq)
    return o
  end

  -- Takes waiter `id` (its record parsed, `w`) out of the line.
  local function unqueue(id, w)
    redis.call('ZREM', line, (FAIR and w and w[10]) or id)
    redis.call('ZREM', live, id)
    if redis.call('HDEL', occ, 'q:' .. id) == 1 then
      queued = redis.call('HINCRBY', cfg, 'nq', -1)
      if FAIR and queued <= 0 then forget() end
      local rank = FAIR and w and w[10] and tonumber(string.sub(w[10], 1, 2))
      if rank and parked[rank] then
        parked[rank] = parked[rank] - 1
        if parked[rank] == 0 and LENDS[rank] then relent = true end
      end
    end
  end

  -- The first dimension on which `need` (five amounts) does not fit `o` with `r` set aside, or
  -- which `blocked` forbids; nil when it fits.
  local function short_on(o, need, tb_max, tt_max, r, blocked)
    local max = { S_B, S_T, tb_max, tt_max, B_T, CT, CR }
    for i = 1, NDIM do
      if blocked[i] or o[i] + r[i] + need[i] > max[i] then return i end
    end
    return nil
  end

  -- The head of the line as the waiters behind it see it: its demand, and the dimensions it is
  -- short on, from its record `w`, its counters `o` and its byte and transfer ceilings.
  -- In a fair line with reserves (the head of level `rank`), it is short on a dimension only
  -- beside what its level always leaves aside (`kept`, on the rates): a dimension it lacks only
  -- for a reserve a waiting level may lend (`lent`) is left to the waiters behind, and a waiter
  -- of a level whose reserve holds the head back leaves aside only the part of the head's demand
  -- beyond that reserve (`lend_to`): the reserve is that level's, and else its waiters and the
  -- head would wait for each other.
  local function head_of(w, o, tb_max, tt_max, rank)
    local f, q = tonumber(w[4]) or 0, tonumber(w[6]) or 1
    local need, max, short = { f, 1, f, 1, 1, f, q }, { S_B, S_T, tb_max, tt_max, B_T, CT, CR }, {}
    local kept, all, lent = aside(rank or 0, true), aside(rank or 0), {}
    for i = 1, NDIM do
      short[i] = o[i] + kept[i] + need[i] > max[i]
      lent[i] = not short[i] and o[i] + all[i] + need[i] > max[i]
    end
    return { tenant = w[2], backend = w[3], need = need, short = short, lent = lent, kept = kept,
      all = all, rank = rank or 0 }
  end

  -- What a waiter of `rank` leaves aside for `head` (`r`, from `set_aside`), less, on a
  -- dimension the head lacks only for lendable reserves, what its own level reserves there.
  local function lend_to(r, head, rank)
    if not head or not RES[rank] or rank == head.rank then return r end
    for i = 1, 2 do
      local mine = RES[rank][i] or 0
      if head.lent[i] and mine > 0 then r[i] = math.max(0, r[i] - mine) end
    end
    return r
  end

  -- The head's reservation (EASY backfilling): what anyone behind `head` of `tenant` on `backend`
  -- must leave for it on every dimension they share, and the dimensions it may not take from at
  -- all (those the head is short on). Nothing without a head.
  local function set_aside(head, tenant, backend)
    local r, blocked = { 0, 0, 0, 0, 0, 0, 0 }, {}
    if head then
      local shares = { true, true, head.tenant == tenant, head.tenant == tenant, head.backend == backend,
        true, true }
      for i = 1, NDIM do
        if shares[i] then
          r[i] = head.need[i]
          blocked[i] = head.short[i]
        end
      end
    end
    return r, blocked
  end

  -- When the rates will have room for `need` beside the reservation `r` (server ms), or -1 when
  -- they have room now or the cell has none. A later throttle makes it later, a raised budget or
  -- a refund sooner; a waiter told an instant asks again then and learns the new one.
  local function rate_ready(o, need, r)
    if not RATED then return -1 end
    local capacity, refill, wait = { [6] = CT, [7] = CR }, { [6] = FT, [7] = FR }, 0
    for i = 6, 7 do
      local over = o[i] + r[i] + need[i] - capacity[i]
      if over > 0 then wait = math.max(wait, over / (refill[i] * PER_MS)) end
    end
    if wait <= 0 then return -1 end
    return math.ceil(now_ms + wait)
  end

  -- Grants lease `id` to the acquisition `nonce` with counters `o` (read before the grant).
  local function grant(id, tenant, backend, footprint, requests, operation, ttl, o, nonce, outcome,
    last, seq, level)
    local f = tonumber(footprint)
    if not last then
      local v = redis.call('HMGET', occ, 'tok', 'seq')
      last, seq = v[1], v[2]
    end
    seq = tonumber(seq or '0') + 1
    local token = math.max(tonumber(last or '0') + 1, now_us)
    local expiry = now_ms + ttl
    redis.call('ZADD', exp, expiry, id)
    -- No lease held before this one: the expiries are new.
    local first = o[2] == 0
    o[1], o[2], o[3], o[4], o[5] = o[1] + f, o[2] + 1, o[3] + f, o[4] + 1, o[5] + 1
    if RATED then o[6], o[7] = o[6] + f, o[7] + tonumber(requests) end
    local record = string.format('%.0f|%s|%s|%s|%s|%s|%s', token, tenant, backend, footprint, operation,
      requests, nonce)
    write(o, tenant, backend, { 'tok', token, 'r:' .. id, record, 'seq', seq })
    if first then born(exp) end
    if expiry < NE then
      NE = expiry
      redis.call('HSET', cfg, 'ne', NE)
    end
    append('admitted', id, token, tenant, backend, footprint, operation, outcome, o, seq, level)
    return token, expiry
  end

  -- The hand-off: walks the line from its head (at most `limit` waiters) and grants every waiter
  -- that fits, the first that does not becoming the head whose amounts are set aside (EASY
  -- backfilling, as the monitor does): a follower goes only if it fits beside the head's demand on
  -- every dimension they share, and never takes from a dimension the head is short on (but for
  -- a dip, see "Dips": a head short on a rate stops the walk only when no lower level may dip
  -- there).
  -- In a fair line with reserves each waiter also leaves the other levels' reserves aside, and
  -- when the last waiter of a level that lends leaves during a walk, the line is walked again
  -- (those it held may borrow now). In a fair line with weights, each waiter behind the head
  -- short on the footprint's dimensions (service bytes, tokens) keeps its turn there: its
  -- amount (less the reserves of waiting levels that lend it) is left aside by every waiter
  -- after it (`turn`), as the head's is, so the line's order holds among those the footprint
  -- waits on, as a monitor's does on the accounts its cost counts. A head short on nothing but
  -- reserves a waiting level lends (`lent`) borrows them when that level's waiters walked after
  -- it all lack room there too (none could use the reserve): the line is walked again, the
  -- waiters before a head leaving aside only what is kept always (`borrow`). Else the head and
  -- a waiter asking more than its level's reserve would wait for each other in an idle cell.
  local function handoff(limit)
    if queued <= 0 or recovering then return 0 end
    local granted, again, walks, head, borrow, dipped = 0, true, 0, nil, nil, false
    while again and walks <= 16 and queued > 0 do
    -- `borrow`: the id of the head the walk before let borrow; only it, asked as the head.
    local borrowing, in_use, broke, granted_before, rewalk = borrow, false, false, granted, false
    dipped = false
    again, walks, head, relent, borrow = false, walks + 1, nil, false, nil
    local turn = { 0, 0, 0, 0, 0, 0, 0 }
    local waiting = redis.call('ZRANGE', line, 0, limit - 1)
    for _, member in ipairs(waiting) do
      local id = id_of(member)
      local q = redis.call('HGET', occ, 'q:' .. id)
      local live_until = tonumber(redis.call('ZSCORE', live, id) or '0')
      local alive = live_until >= now_ms
      local w = q and parse(q) -- ticket, tenant, backend, footprint, operation, requests, nonce, instance, latest
      local late = w and tonumber(w[9] or '0') > 0 and now_ms > tonumber(w[9])
      if not q then
        redis.call('ZREM', line, member)
        redis.call('ZREM', live, id)
      elseif not alive or late then
        -- Its liveness ran out and the bounded reap has not come to it yet, or its caller has
        -- stopped waiting: never grant the dead or the late.
        unqueue(id, w)
        append('timed_out', id, '0', w[2], w[3], w[4], w[5], late and 'late' or 'abandoned',
          (read(w[2], w[3])), nil, level_of(w))
      else
        local f = tonumber(w[4])
        local tb_max, tt_max = limits(redis.call('HGET', cfg, 'o:' .. w[2]))
        local o = read(w[2], w[3])
        local rank = FAIR and tonumber(string.sub(member, 1, 2)) or 0
        local need = { f, 1, f, 1, 1, f, tonumber(w[6]) }
        local r, blocked = set_aside(head, w[2], w[3])
        local dips = dip(head, rank, need, r, blocked)
        local held_for_head = lend_to(r, head, rank)
        r = plus(plus(held_for_head, aside(rank, borrowing == id and not head)), turn)
        if not short_on(o, need, tb_max, tt_max, r, blocked) then
          unqueue(id, w)
          -- The grant lives no longer than its waiter's liveness: a waiter that died in the
          -- line holds nothing past it (its process would never renew the lease), and a live
          -- one, which renews its liveness every renew_every, renews the lease in time.
          local token, expiry = grant(id, w[2], w[3], w[4], w[6], w[5],
            math.min(TTL, live_until - now_ms), o, w[7], 'handoff', nil, nil, level_of(w))
          book(rank, need, dips)
          if dips then dipped = true end
          if w[8] and w[8] ~= '-' then notify(w[8], id, w[7], token, expiry, o) end
          granted = granted + 1
          -- Behind a head that reserved all its bytes or transfers: if it now lacks them only
          -- for lendable reserves, it claims less from those behind than this walk's head says.
          if head then
            local max = { S_B, S_T }
            for i = 1, 2 do
              if not head.short[i] and not head.lent[i]
                and o[i] + head.all[i] + head.need[i] > max[i] then rewalk = true end
            end
          end
        elseif not head then
          head = head_of(w, o, tb_max, tt_max, rank)
          head.id, head.nonce, head.to, head.o = id, w[7], w[8] ~= '-' and w[8] or nil, o
          -- Every waiter needs service bytes and a service transfer: when the head is short on
          -- either, or nothing is left of them beside its reservation, nobody behind can go.
          -- So too when it waits for the rates, which every lease spends.
          if borrowing == id then head.lent = {} end
          -- (Not when it lacks bytes or transfers only for lendable reserves: a waiter of the
          -- lending level may have room, and else the head borrows them.)
          local lends = head.lent[1] or head.lent[2]
          -- (On a rate, not while a lower level may dip there: see "Dips".)
          if head.short[1] or head.short[2]
            or (head.short[6] and not dippable(rank, 6))
            or (head.short[7] and not dippable(rank, 7))
            or (not lends and (o[1] + f + 1 > S_B or o[2] + 2 > S_T)) then broke = true break end
        else
          local max = { S_B, S_T, tb_max, tt_max, B_T, CT, CR }
          -- A waiter of a level that lends what holds the head back, with room there: its
          -- level may use its reserve, so the head does not borrow it.
          -- (Not one held back elsewhere by the head's own amounts: else each would wait for the
          -- other.)
          local room = false
          for i = 1, 2 do
            if head.lent[i] and rank ~= head.rank and RES[rank] and (RES[rank][i] or 0) > 0
              and o[i] + r[i] + need[i] <= max[i] then room = true end
          end
          if room then
            for j = 1, NDIM do
              if (blocked[j] or o[j] + r[j] + need[j] > max[j])
                and o[j] + r[j] - held_for_head[j] + need[j] <= max[j] then room = false end
            end
          end
          if room then in_use = true end
          if FW > 0 then
            for _, i in ipairs({ 1, 6 }) do
              if i <= NDIM and not blocked[i] and o[i] + r[i] + need[i] > max[i] then
                local lendable = aside(rank)[i] - aside(rank, true)[i]
                turn[i] = turn[i] + math.max(0, need[i] - lendable)
              end
            end
          end
        end
      end
    end
    -- A lending level's last waiter left (granted, late or dead): walk again.
    again = relent or rewalk
    -- A head short only for reserves its lenders cannot use: walk again, the head borrowing.
    -- A lender that had room when asked may have none after the grants behind it: a walk that
    -- granted anyone walks again before it concludes the reserve is in use.
    if not again and not broke and head and (not in_use or granted > granted_before) then
      local lent_only = false
      for i = 1, NDIM do
        if head.short[i] then lent_only = false break end
        if head.lent[i] then lent_only = true end
      end
      if lent_only then
        again = true
        if not in_use then borrow = head.id end
      end
    end
    end
    if head and RATED then
      -- Dips behind the head took from the rates after it was read: read them again.
      if dipped then head.o = read(head.tenant, head.backend) end
      local at = rate_ready(head.o, head.need, head.kept)
      if at > 0 then tell_ready(head.to, head.id, head.nonce, at) end
    end
    return granted
  end

  -- Bounded reaping on every call: at most `limit` leases whose expiry passed on server time, and
  -- at most `limit` waiters whose liveness ran out (a crashed waiter cannot hold the head); the
  -- hand-off follows when anything was reaped. The expiries are read only once `NE` has passed.
  local function reap(limit)
    local due = {}
    if now_ms >= NE then
      due = redis.call('ZRANGEBYSCORE', exp, '-inf', now_ms, 'LIMIT', 0, limit)
      for _, id in ipairs(due) do
        local r = redis.call('HGET', occ, 'r:' .. id)
        if r then settle(id, r, 'expired') else redis.call('ZREM', exp, id) end
      end
      local left = redis.call('ZRANGE', exp, 0, 0, 'WITHSCORES')
      local earliest = (#left == 0 and NONE) or tonumber(left[2])
      if earliest ~= NE then
        NE = earliest
        redis.call('HSET', cfg, 'ne', NE)
      end
    end
    local dead = {}
    if queued > 0 then dead = redis.call('ZRANGEBYSCORE', live, '-inf', now_ms, 'LIMIT', 0, limit) end
    for _, id in ipairs(dead) do
      local q = redis.call('HGET', occ, 'q:' .. id)
      local w = q and parse(q)
      unqueue(id, w)
      if q then
        append('timed_out', id, '0', w[2], w[3], w[4], w[5], 'abandoned', (read(w[2], w[3])), nil,
          level_of(w))
      end
    end
    if #due + #dead > 0 then handoff(limit) end
    return #due
  end

  -- Recovery. A lease granted or renewed by a write this server no longer has may still run,
  -- with no record here or with an older expiry than its holder's, and new grants could then
  -- exceed a ceiling. A call that finds the cell last written by another server process (`rid`
  -- in cfg), or that creates it, asks whether such a write can exist and until when it can
  -- matter: a holder stops at its own deadline, never later than its last acknowledged renewal
  -- plus the TTL, so a write lost at time L matters until L + TTL. Until then (`REC`) the cell
  -- admits nothing new, the line included, and a renewal brings back what the cell lost
  -- (`rejoin`) or renews what it would have expired. The bound, in server ms:
  --   - a process promoted from a replica: nothing, when every call waited for the replicas
  --     ('r'); else the promotion (the old master acknowledged nothing after it), no later than
  --     `since` (the promoted process serves under a new replication id from then on);
  --   - any other process: nothing, when every write was synced to the append-only file before
  --     it was acknowledged ('f') and the server runs from that file; else its start, no later
  --     than `born_ms` (an earlier process of this server acknowledged nothing after it died). A
  --     cell that moved here from another master (a planned slot migration) keeps every write
  --     it had, so a process older than one TTL starts no recovery for it.
  --   - for a cell created here, besides: its last call on this process, if this library served
  --     it within the last TTL and it vanished (deleted, flushed, evicted).
  -- The bound passed, nothing can still run from before it: the call goes on as usual.
  local function lost_until(dur)
    replication(real)
    if promoted then
      if string.find(dur, 'r', 1, true) then return 0 end
      return since + TTL
    end
    if string.find(dur, 'f', 1, true)
      and string.find(redis.call('INFO', 'persistence'), 'aof_enabled:1', 1, true) then
      return 0
    end
    return born_ms + TTL
  end
  local reason, bound
  if created then
    if ARGV[11] == '1' then
      bound = math.max(lost_until(c[25] or ''), served[cfg] or 0)
      reason = 'created'
    end
  elseif c[16] ~= me then
    bound = lost_until(c[25] or '')
    reason = promoted and 'promoted' or 'restarted'
    redis.call('HSET', cfg, 'rid', me)
  end
  -- A recovery already under way (begun by an earlier process) runs to its end all the same.
  if reason and bound + skew > math.max(now_ms, REC) then
    REC = bound + skew
    recovering = true
    redis.call('HSET', cfg, 'rec', int(REC))
    append('recovering', '', '0', '', '', '0', 'recovery', reason, (read('', '')))
  end
  served[cfg] = real + TTL
  prune(real)
  -- A promise of replicas: every call writes, so that the `WAIT` sent after it covers every
  -- earlier write of the cell, another instance's grant it claims included.
  if string.find(c[25] or '', 'r', 1, true) then redis.call('HSET', cfg, 'ack', int(now_ms)) end
  if op == 'init' then return touch(IDLE, {'OK', version, int(now_ms)}) end

  -- Brings back lease `id`, which the cell lost (see recovery): its record, expiry and counters,
  -- whatever the ceilings say (it was admitted under them). The record has no nonce: no later
  -- acquisition can claim it.
  local function rejoin(id, token, tenant, backend, footprint, operation, expiry)
    local f = tonumber(footprint)
    local o, v = read(tenant, backend, 'seq', 'tok')
    local first = o[2] == 0
    local seq = tonumber(v[6] or '0') + 1
    o[1], o[2], o[3], o[4], o[5] = o[1] + f, o[2] + 1, o[3] + f, o[4] + 1, o[5] + 1
    write(o, tenant, backend, { 'seq', seq, 'tok', math.max(tonumber(v[7] or '0'), tonumber(token)),
      'r:' .. id, table.concat({ token, tenant, backend, footprint, operation, '0', '' }, '|') })
    redis.call('ZADD', exp, expiry, id)
    if first then born(exp) end
    if expiry < NE then
      NE = expiry
      redis.call('HSET', cfg, 'ne', NE)
    end
    append('rejoined', id, token, tenant, backend, footprint, operation, 'rejoined', o, seq)
  end

  local function earliest_expiry()
    local first = redis.call('ZRANGE', exp, 0, 0, 'WITHSCORES')
    if #first == 0 then return -1 end
    return tonumber(first[2])
  end

  -- The levels as `read` settled them, written back at now (before the throttle or a budget
  -- changes, so what was refilled counts at the rate in force until then).
  local function settle_rates(o)
    local fresh = redis.call('EXISTS', occ) == 0
    redis.call('HSET', occ, 'lt', CT - o[6], 'lr', CR - o[7], 'la', now_ms)
    if fresh then born(occ) end
  end

  -- The rates' throttle, shared by the fleet, by the local bucket's rule: +0.5 per backpressure
  -- increment (a 429 is one) up to 9.0; a success (`inc` 0) takes 0.2 off every third time, or
  -- 0.5 every time once five minutes have passed without backpressure. The levels must be settled
  -- at the old throttle before (`settle_rates`, or a `write` in the same call). Returns true when
  -- the throttle fell (the head may be served sooner than it was told).
  local function throttle(inc)
    local t = redis.call('HMGET', cfg, 'ts', 'tbp')
    local successes, last = tonumber(t[1] or '0'), tonumber(t[2] or '0')
    local before = THR
    if inc > 0 then
      THR, successes, last = math.min(90, THR + 5 * inc), 0, math.max(last, now_ms)
    elseif THR > 0 then
      if now_ms - last >= 300000 then
        THR, successes = math.max(0, THR - 5), 0
      else
        successes = successes + 1
        if successes >= 3 then THR, successes = math.max(0, THR - 2), 0 end
      end
    else
      return false
    end
    redis.call('HSET', cfg, 'thr', THR, 'ts', successes, 'tbp', last)
    PER_MS = 10 / (10 + THR) / RM
    if THR < before then
      c[21] = nil
      return true
    end
    return false
  end

  if op == 'acquire' then
    -- ARGV: 3 lease id 4 tenant 5 backend 6 footprint 7 operation 8 ttl ms 9 reap limit
    --       10 wait flag (1: join the line, with a `queued` event, when it does not fit now)
    --       11 the acquisition's nonce (the same on every call of one acquisition)
    --       12 the asking instance, where the hand-off's notice of a grant goes ('': none)
    --       13 the requests the lease spends of the rates (1 for a call)
    --       14 the latest server ms at which the acquisition may take effect: its caller stops
    --          waiting then ('0': no bound). A call that reaches the server later (held up in a
    --          stalled server or network) changes nothing; a ticket is never granted later.
    --       15 the acquisition's level in a fair line (0 the highest; ignored in another)
    local latest = tonumber(ARGV[14] or '0') or 0
    if latest > 0 and now_ms > latest then return {'LATE', int(now_ms), int(latest)} end
    local id, tenant, backend, operation = ARGV[3], ARGV[4], ARGV[5], ARGV[7]
    local footprint, ttl, nonce = tonumber(ARGV[6]), tonumber(ARGV[8]), ARGV[11]
    local requests = tonumber(ARGV[13] or '1')
    -- Only what a key name may carry: an instance is hex, at most 32 digits.
    local instance = string.match(ARGV[12] or '', '^%x+$') or ''
    if #instance > 32 then instance = '' end
    reap(tonumber(ARGV[9]))
    if not footprint or footprint <= 0 then return touch(IDLE, {'NEVER', 'footprint', ARGV[6], '1'}) end
    local tb_max, tt_max = limits(c[10])
    if footprint > S_B then return touch(IDLE, {'NEVER', 'service_bytes', ARGV[6], int(S_B)}) end
    if footprint > tb_max then return touch(IDLE, {'NEVER', 'tenant_bytes', ARGV[6], int(tb_max)}) end
    if not requests or requests < 1 or requests ~= math.floor(requests) then
      return touch(IDLE, {'NEVER', 'requests', ARGV[13], '1'})
    end
    if RATED and footprint > CT then
      return touch(IDLE, {'NEVER', 'tokens_per_minute', ARGV[6], int(math.floor(CT))})
    end
    if RATED and requests > CR then
      return touch(IDLE, {'NEVER', 'requests_per_minute', ARGV[13], int(math.floor(CR))})
    end
    local o, v = read(tenant, backend, 'r:' .. id, 'q:' .. id, 'tok', 'seq', 'tick')
    if v[6] then
      -- Held: this acquisition's own lease (granted from the line, or by a call whose reply was
      -- lost), claimed as it is; or a duplicate.
      local f = parse(v[6])
      if f[7] ~= nonce then return touch(IDLE, {'NEVER', 'lease_id', id, '0'}) end
      local expiry = tonumber(redis.call('ZSCORE', exp, id) or '0')
      if expiry > now_ms then
        return touch(IDLE, {'OK', f[1], version, o[1], o[2], o[3], o[4],
          o[5], expiry, now_ms})
      end
      -- Its grant expired before this acquisition could claim it (a reply lost for a whole TTL),
      -- and the bounded reap has not come to it yet: it is over. Settle it as expired, let the
      -- line have what it frees, and ask afresh.
      settle(id, v[6], 'expired')
      handoff(tonumber(ARGV[9]))
      o, v = read(tenant, backend, 'r:' .. id, 'q:' .. id, 'tok', 'seq', 'tick')
    end
    local waiting, mine
    if v[7] then
      local w = parse(v[7])
      -- Another acquisition waits under this id: a duplicate, not this one asking again.
      if w[7] ~= nonce then return touch(IDLE, {'NEVER', 'lease_id', id, '0'}) end
      waiting, mine = w[1], w
    end
    -- In a fair line, the asker's place: a waiter's own, or the one a newcomer would take (its
    -- level, its start tag, the next ticket).
    -- A level's busy period (it has a waiter) is its epoch (`e:<level>` in occ): a tenant's
    -- finish tag counts only in the epoch it was charged in (`fair` members are
    -- `<level>:<epoch>:<tenant>`), so nothing carries over from a level's earlier busy period.
    local rank, start, place, busy, epoch = 0, 0, id, false, 0
    if FAIR then
      rank = math.max(0, math.min(15, math.floor(tonumber(ARGV[15] or '0') or 0)))
      if mine then
        place = mine[10] or id
      else
        if FW > 0 then
          epoch = tonumber(redis.call('HGET', occ, 'e:' .. rank) or '0')
          local v0 = queued > 0 and vtime(rank)
          if v0 then
            busy = true
            start = math.max(v0, tonumber(redis.call('ZSCORE', fair,
              rank .. ':' .. epoch .. ':' .. tenant) or '0'))
          end
          -- The lowest finish tag counts for nothing once its level's virtual time reached it,
          -- nor once its level's epoch is over.
          local low = queued > 0 and redis.call('ZRANGE', fair, 0, 0, 'WITHSCORES')
          if low and low[1] then
            local r0, e0 = string.match(low[1], '^(%d+):(%d+):')
            r0 = tonumber(r0 or '0')
            local v = vtime(r0)
            if tonumber(e0 or '-1') ~= tonumber(redis.call('HGET', occ, 'e:' .. r0) or '0')
              or not v or tonumber(low[2]) <= v then
              redis.call('ZREM', fair, low[1])
            end
          end
        end
        place = place_of(rank, start, tonumber(v[10] or '0') + 1, id)
      end
    end
    -- Never beside what the other levels always keep on the rates.
    if FAIR and RATED then
      local kept = aside(rank, true)
      if footprint + kept[6] > CT then
        return touch(IDLE, {'NEVER', 'tokens_per_minute', ARGV[6], int(math.max(0, math.floor(CT - kept[6])))})
      end
      if requests + kept[7] > CR then
        return touch(IDLE, {'NEVER', 'requests_per_minute', ARGV[13], int(math.max(0, math.floor(CR - kept[7])))})
      end
    end
    -- The asker's tenant pays for the lease at its level (fair line, weights): when it joins the
    -- line (the first of an idle level begins the level's next epoch, at virtual time 0), or
    -- when it is granted at once while its level is busy.
    local function charge(joining)
      if FW <= 0 or not (joining or busy) then return end
      if not busy then
        epoch = redis.call('HINCRBY', occ, 'e:' .. rank, 1)
      end
      local weight = tonumber(c[27] or '') or FW
      redis.call('ZADD', fair, start + footprint * 1048576 / S_B / weight,
        rank .. ':' .. epoch .. ':' .. tenant)
      born(fair)
    end
    if waiting then
      -- A waiter asking again: still waiting (the hand-off grants it when it fits); its liveness
      -- is renewed.
      redis.call('ZADD', live, now_ms + ttl, id)
    end
    -- Who is first? A newcomer goes before the line only beside the head's reserved demand (in
    -- a fair line, a newcomer of a higher level than the head's goes first).
    local head
    local first = queued > 0 and redis.call('ZRANGE', line, 0, 0)[1]
    if first and first ~= place and not (FAIR and place < first) then
      local h = parse(redis.call('HGET', occ, 'q:' .. id_of(first)) or '0|||0|')
      local htb, htt = limits(redis.call('HGET', cfg, 'o:' .. (h[2] or '')))
      local hrank = FAIR and tonumber(string.sub(first, 1, 2)) or 0
      head = head_of(h, (read(h[2] or '', h[3] or '')), htb, htt, hrank)
    end
    local need = { footprint, 1, footprint, 1, 1, footprint, requests }
    local r, blocked = set_aside(head, tenant, backend)
    local dips = dip(head, rank, need, r, blocked)
    r = plus(lend_to(r, head, rank), aside(rank))
    local dim = short_on(o, need, tb_max, tt_max, r, blocked)
    -- The first in line (or a newcomer with nobody waiting) learns when the rates serve it; those
    -- behind wait for the hand-off.
    local ready = (not head) and rate_ready(o, need, r) or -1
    -- So does one that dips, short only on the rates it may take from (its own call grants it
    -- then, nobody else's would), though it is not told again by the hand-off.
    if head and dips and (dim == 6 or dim == 7) and not blocked[6] and not blocked[7] then
      ready = rate_ready(o, need, r)
    end
    -- Recovering: nothing new until it ends, when a waiter asks again (the refusal's earliest
    -- expiry is the end).
    if recovering then dim = 0 end
    -- The refusal: the dimension without room, what it holds and its ceiling.
    local function full(ticket)
      if dim == 0 then return touch(IDLE, {'FULL', 'recovering', 0, 0, REC, now_ms, ticket, -1}) end
      -- A head in the line told its instant here needs no notice of it.
      if ticket ~= '' and ready > 0 and not head then tell_ready(nil, id, nonce, ready) end
      local max = { S_B, S_T, tb_max, tt_max, B_T, CT, CR }
      return touch(IDLE, {'FULL', DIMS[dim], int(math.ceil(o[dim] + r[dim])), int(max[dim]),
        earliest_expiry(), now_ms, ticket, ready})
    end
    if dim and not waiting and ARGV[10] == '1' then
      waiting = int(redis.call('HINCRBY', occ, 'tick', 1))
      charge(true)
      queued = redis.call('HINCRBY', cfg, 'nq', 1)
      if FAIR then redis.call('ZADD', line, 0, place) else redis.call('ZADD', line, waiting, id) end
      redis.call('ZADD', live, now_ms + ttl, id)
      redis.call('HSET', occ, 'q:' .. id,
        waiting .. '|' .. tenant .. '|' .. backend .. '|' .. ARGV[6] .. '|' .. operation .. '|'
        .. int(requests) .. '|' .. nonce .. '|' .. (instance ~= '' and instance or '-') .. '|'
        .. int(latest) .. (FAIR and ('|' .. place) or ''))
      -- The line's first waiter creates the line and its liveness set.
      if queued == 1 then
        born(line)
        born(live)
      end
      append('queued', id, '0', tenant, backend, ARGV[6], operation, 'queued', o, nil,
        FAIR and rank or nil)
      return full(waiting)
    end
    if dim then return full(waiting or '') end
    local at = waiting and FW > 0 and first ~= place and redis.call('ZRANK', line, place)
    if at and at < tonumber(ARGV[9]) then
      -- A waiter behind the head that fits beside it asks again in a weighted fair line: the
      -- waiters before it may keep their turns on the footprint (see `handoff`), which only a
      -- walk from the head knows, so the hand-off decides, this waiter granted by it or not.
      -- (One further back than a hand-off walks is granted at once, as before.)
      handoff(tonumber(ARGV[9]))
      local granted = redis.call('HGET', occ, 'r:' .. id)
      if granted then
        local f = parse(granted)
        o = read(tenant, backend)
        return touch(IDLE, {'OK', f[1], version, o[1], o[2], o[3], o[4], o[5],
          tonumber(redis.call('ZSCORE', exp, id) or '0'), now_ms})
      end
      dim = RATED and 6 or 1
      return full(waiting)
    end
    if waiting then
      -- Counted before it leaves, so that a lending level's last waiter leaving is seen.
      if LENDS[rank] then waiting_at(rank) end
      unqueue(id, mine)
    else
      charge(false)
    end
    local token, expiry = grant(id, tenant, backend, ARGV[6], int(requests), operation, ttl, o, nonce,
      'admitted', v[8] or '0', v[9], FAIR and rank or nil)
    local earned = book(rank, need, dips)
    -- A head served by the rates at its instant asks itself: those behind it may fit now, and
    -- the next head must learn its own instant.
    -- So too a lending level's last waiter, served at its own call: those it held may borrow.
    -- And a grant that earned a level back part of its reserve: its waiters may dip now.
    if (waiting and (RATED or relent)) or (earned and queued > 0) then
      handoff(tonumber(ARGV[9]))
    end
    return touch(IDLE, {'OK', token, version, o[1], o[2], o[3], o[4], o[5],
      expiry, now_ms})
  end

  if op == 'withdraw' then
    -- ARGV: 3 lease id 4 nonce 5 reap limit. An acquisition that gives up (timeout,
    -- cancellation): out of the line with a `timed_out` event, or, if it was granted meanwhile
    -- (by the hand-off, or by a call whose reply it never read), its lease, for the caller to keep
    -- or release.
    local id, nonce = ARGV[3], ARGV[4]
    reap(tonumber(ARGV[5]))
    local v = redis.call('HMGET', occ, 'q:' .. id, 'r:' .. id)
    if v[1] then
      local w = parse(v[1])
      if w[7] == nonce then
        unqueue(id, w)
        append('timed_out', id, '0', w[2], w[3], w[4], w[5], 'timed_out', (read(w[2], w[3])), nil,
          level_of(w))
        handoff(tonumber(ARGV[5]))
        return touch(IDLE, {'WITHDRAWN'})
      end
    end
    if v[2] then
      local f = parse(v[2])
      if f[7] == nonce then
        local o = read(f[2], f[3])
        local expiry = redis.call('ZSCORE', exp, id)
        return touch(IDLE, {'OK', f[1], version, o[1], o[2], o[3], o[4], o[5],
          tonumber(expiry), now_ms})
      end
    end
    return touch(IDLE, {'GONE'})
  end

  if op == 'renew' then
    -- ARGV: 3 ttl ms 4 reap limit 5 the latest server ms at which the renewal may take effect
    -- (the earliest of its leases' local deadlines, past which their holders count them lost;
    -- '0': no bound), then for every lease due, in one call: id, token, tenant, backend,
    -- footprint, operation (the last four bring the lease back while the cell recovers).
    -- Reply: OK, server ms, new expiry, then one word per lease: OK, LOST or STALE:<current>;
    -- or LATE, server ms, the bound, when it came too late to renew anything.
    local latest = tonumber(ARGV[5] or '0') or 0
    if latest > 0 and now_ms > latest then return {'LATE', int(now_ms), int(latest)} end
    reap(tonumber(ARGV[4]))
    local expiry = now_ms + tonumber(ARGV[3])
    local reply = {'OK', now_ms, expiry}
    local expired = 0
    for i = 6, #ARGV, 6 do
      local id, token = ARGV[i], ARGV[i + 1]
      local r = redis.call('HGET', occ, 'r:' .. id)
      local current = r and string.sub(r, 1, string.find(r, '|', 1, true) - 1)
      if not r and recovering then
        rejoin(id, token, ARGV[i + 2], ARGV[i + 3], ARGV[i + 4], ARGV[i + 5], expiry)
        reply[#reply + 1] = 'OK'
      elseif not r then
        reply[#reply + 1] = 'LOST'
      elseif current ~= token then
        reply[#reply + 1] = 'STALE:' .. current
      elseif not recovering and tonumber(redis.call('ZSCORE', exp, id) or '0') <= now_ms then
        -- Expired on server time, and the bounded reap has not come to it yet: a renewal never
        -- brings it back (its capacity may be promised to a waiter already). While the cell
        -- recovers nothing is promised, and the expiry may be one a lost renewal would have moved.
        settle(id, r, 'expired')
        expired = expired + 1
        reply[#reply + 1] = 'LOST'
      else
        redis.call('ZADD', exp, expiry, id)
        reply[#reply + 1] = 'OK'
      end
    end
    if expired > 0 then handoff(tonumber(ARGV[4])) end
    return touch(IDLE, reply)
  end

  if op == 'release' then
    -- ARGV: 3 lease id 4 token 5 outcome (completed, failed, interrupted) 6 reap limit
    --       7 tokens of the footprint not used (given back to the rates; '0': none)
    --       8 what the call under the lease said of the upstream's load, for the rates'
    --         throttle ('': nothing, '0': a success, n: n backpressure increments)
    --       9 the tokens the upstream said it had left ('': it did not say): a token level
    --         above it comes down to it (someone outside the fleet spends the same budget)
    --       10 requests of the lease not used (given back to the rates; '0': none)
    local id, token = ARGV[3], ARGV[4]
    reap(tonumber(ARGV[6]))
    local r = redis.call('HGET', occ, 'r:' .. id)
    -- While the cell recovers, a lease it does not know may be one it lost that was not renewed
    -- back yet: its holder is done with it, and nothing is left to give back.
    if not r and recovering then return touch(IDLE, {'OK', now_ms}) end
    if not r then return touch(IDLE, {'LOST'}) end
    local current = string.sub(r, 1, string.find(r, '|', 1, true) - 1)
    if current ~= token then return touch(IDLE, {'STALE', current}) end
    settle(id, r, ARGV[5], tonumber(ARGV[7] or '0'), tonumber(ARGV[9] or ''), tonumber(ARGV[10] or '0'))
    -- `settle` wrote the levels at now: the throttle may change after it.
    if RATED and (ARGV[8] or '') ~= '' then throttle(tonumber(ARGV[8]) or 0) end
    handoff(tonumber(ARGV[6]))
    return touch(IDLE, {'OK', now_ms})
  end

  -- test-util begin
  if op == 'skew' then
    -- ARGV: 3 milliseconds to move the cell's clock forward (test-util only)
    redis.call('HINCRBY', cfg, 'skew_ms', tonumber(ARGV[3]))
    return touch(IDLE, {'OK', int(now_ms + tonumber(ARGV[3]))})
  end
  -- test-util end

  if op == 'snapshot' then
    -- ARGV: 3 tenant 4 backend 5 reap limit. Reply: OK, the policy version, the five counters,
    -- leases held, the tenant's two ceilings, server ms, leases reaped, the last token, the
    -- stream's length, the rates' five figures (-1 without rates), and the end of the cell's
    -- recovery (server ms; 0 when it is not recovering).
    local reaped = reap(tonumber(ARGV[5]))
    local o, v = read(ARGV[3], ARGV[4], 'tok')
    local tb_max, tt_max = limits(c[10])
    -- With rates: the levels (whole tokens and requests left), the budgets and the throttle.
    local rates = { -1, -1, -1, -1, -1 }
    if RATED then rates = { math.floor(CT - o[6]), math.floor(CR - o[7]), RT, RR, THR } end
    return touch(IDLE, {'OK', version, o[1], o[2], o[3], o[4], o[5],
      o[2], int(tb_max), int(tt_max), int(now_ms), int(reaped), v[6] or '0',
      int(redis.call('XLEN', events)), rates[1], rates[2], rates[3], rates[4], rates[5],
      int(recovering and REC or 0)})
  end

  if op == 'feedback' then
    -- ARGV: 3 backpressure increments (0: a success) 4 reap limit. The rates' throttle, shared by
    -- the fleet, by the local bucket's rule: +0.5 per increment (a 429 is one) up to 9.0; a
    -- success takes 0.2 off every third time, or 0.5 every time once five minutes have passed
    -- without backpressure. Reply: OK, the throttle in tenths.
    if not RATED then return touch(IDLE, {'OK', 0}) end
    local inc = tonumber(ARGV[3]) or 0
    if inc > 0 or THR > 0 then settle_rates((read('', ''))) end
    if throttle(inc) then handoff(tonumber(ARGV[4])) end
    return touch(IDLE, {'OK', THR})
  end

  if op == 'rates' then
    -- ARGV: 3 tokens per minute 4 requests per minute 5 reap limit: new budgets for every member
    -- (a provider's rate-limit headers, say). The levels are settled at the old budgets first; a
    -- budget that shrank lowers its level to it; the same budgets again change nothing. Reply:
    -- OK, the policy version (a new one when anything changed).
    if not RATED then return touch(IDLE, {'INVALID', 'rates', '', '0'}) end
    local t, q = tonumber(ARGV[3]), tonumber(ARGV[4])
    if not t or t < 1 then return touch(IDLE, {'INVALID', 'tokens_per_minute', ARGV[3], '1'}) end
    if not q or q < 1 then return touch(IDLE, {'INVALID', 'requests_per_minute', ARGV[4], '1'}) end
    if t == RT and q == RR then return touch(IDLE, {'OK', version}) end
    reap(tonumber(ARGV[5]))
    local o = read('', '')
    local lt, lr = CT - o[6], CR - o[7]
    RT, RR = t, q
    capacities()
    lt, lr = math.min(lt, CT), math.min(lr, CR)
    o[6], o[7] = CT - lt, CR - lr
    settle_rates(o)
    redis.call('HSET', cfg, 'rt', RT, 'rr', RR)
    version = int(redis.call('HINCRBY', cfg, 'version', 1))
    c[21] = nil
    handoff(tonumber(ARGV[5]))
    append('policy_changed', '', '0', '', '', '0', 'rates', 'rates', (read('', '')))
    return touch(IDLE, {'OK', version})
  end

  if op == 'policy' then
    -- ARGV: 3 tenant 4 bytes ('' clears) 5 transfers 6 reap limit
    reap(tonumber(ARGV[6]))
    local tenant = ARGV[3]
    if ARGV[4] == '' then
      redis.call('HDEL', cfg, 'o:' .. tenant)
    else
      local b, n = tonumber(ARGV[4]), tonumber(ARGV[5])
      if not b or b < 1 or b > S_B then return touch(IDLE, {'INVALID', 'bytes', ARGV[4], int(S_B)}) end
      if not n or n < 1 or n > S_T then return touch(IDLE, {'INVALID', 'transfers', ARGV[5], int(S_T)}) end
      redis.call('HSET', cfg, 'o:' .. tenant, ARGV[4] .. '|' .. ARGV[5])
    end
    version = int(redis.call('HINCRBY', cfg, 'version', 1))
    handoff(tonumber(ARGV[6]))
    append('policy_changed', '', '0', tenant, '', '0', 'policy', ARGV[4] == '' and 'cleared' or 'set',
      (read(tenant, '')))
    return touch(IDLE, {'OK', version})
  end

  if op == 'quota' then
    -- ARGV: 3 kind ('r' requests, 'b' bytes) 4 tenant 5 amount 6 limit 7 window ms
    local field = ARGV[3] .. ':' .. ARGV[4]
    local amount, limit, window_ms = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
    local window = math.floor(now_ms / window_ms)
    local used = 0
    local stored = redis.call('HGET', quota, field)
    if stored then
      local sep = string.find(stored, '|', 1, true)
      if tonumber(string.sub(stored, 1, sep - 1)) == window then used = tonumber(string.sub(stored, sep + 1)) end
    end
    local left_ms = (window + 1) * window_ms - now_ms
    if used + amount > limit then
      return touch(IDLE, {'OVER', int(used), int(limit), int(left_ms)})
    end
    used = used + amount
    redis.call('HSET', quota, field, int(window) .. '|' .. int(used))
    if not stored then born(quota) end
    return touch(IDLE, {'OK', int(used), int(limit), int(left_ms)})
  end

  return redis.error_reply('admission-redis: unknown operation ' .. tostring(op))
end

redis.register_function('__LIBRARY__', call)
