-- admission-redis: the one program behind every fleet transition (schema admission-event-v1).
--
-- Called by SHA (EVALSHA, reloaded on NOSCRIPT). ARGV[1] names the operation, ARGV[2] is the
-- caller's config fingerprint. Every key shares the cell's hash tag, so a transition stays in
-- one Redis Cluster slot. Time is the server's (TIME), never a client's.
--
-- KEYS: 1 cfg (hash: ceilings, fingerprint, policy version, tenant overrides `o:<tenant>`)
--       2 occ (hash: counters sb, st, tb:<tenant>, tt:<tenant>, bt:<backend>; lease records
--              r:<id> = "token|tenant|backend|footprint|operation"; the last token, tok)
--       3 exp (sorted set: lease id -> expiry, server milliseconds)
--       4 events (stream)   5 quota (hash: "r:<tenant>" / "b:<tenant>" -> "window|used")
-- A transition reads and writes each hash once: the lease path is seven calls in all.
--
-- Replies are flat arrays whose first element is a status word:
--   OK, FULL (not now), NEVER (never fits), LOST, STALE, OVER (quota), INVALID, NOCONFIG, MISMATCH.
-- Tenant and backend arguments are already SHA-256 hex digests: raw ids never reach Redis.

local cfg, occ, exp, events, quota = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local op, fingerprint = ARGV[1], ARGV[2]

-- The config, the asking tenant's override, and the server's clock plus a forward skew that only
-- the test-util feature ever sets (it moves the cell's time as a fake clock would).
local asking = (op == 'acquire' and ARGV[4]) or (op == 'snapshot' and ARGV[3]) or ''
local c = redis.call('HMGET', cfg, 'fingerprint', 'sb', 'st', 'tb', 'tt', 'bt', 'maxlen',
  'version', 'skew_ms', 'o:' .. asking)
local t = redis.call('TIME')
local skew = tonumber(c[9] or '0')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + skew
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2]) + skew * 1000

local function int(n) return string.format('%.0f', n) end

if op == 'init' then
  -- ARGV: 3 service_bytes 4 service_transfers 5 tenant_bytes 6 tenant_transfers
  --       7 backend_transfers 8 events_max_len
  if c[1] then
    if c[1] ~= fingerprint then return {'MISMATCH', c[1]} end
    return {'OK', c[8]}
  end
  -- A cell created afresh (first start, or a server that restarted empty) starts its policy
  -- version at the server's clock, so versions never go back across a restart either.
  local version = int(math.max(1, math.floor(now_ms)))
  redis.call('HSET', cfg, 'fingerprint', fingerprint, 'sb', ARGV[3], 'st', ARGV[4],
    'tb', ARGV[5], 'tt', ARGV[6], 'bt', ARGV[7], 'maxlen', ARGV[8], 'version', version)
  return {'OK', version}
end

if not c[1] then return {'NOCONFIG'} end
if c[1] ~= fingerprint then return {'MISMATCH', c[1]} end
local S_B, S_T, T_B, T_T, B_T = tonumber(c[2]), tonumber(c[3]), tonumber(c[4]), tonumber(c[5]), tonumber(c[6])
local maxlen, version = c[7], c[8]

-- The asking tenant's ceilings: its override, or the defaults.
local function limits(override)
  if override then
    local sep = string.find(override, '|', 1, true)
    return tonumber(string.sub(override, 1, sep - 1)), tonumber(string.sub(override, sep + 1))
  end
  return T_B, T_T
end

-- The five counters of one tenant and one backend, plus `extra` fields, in one read.
local function read(tenant, backend, ...)
  local v = redis.call('HMGET', occ, 'sb', 'st', 'tb:' .. tenant, 'tt:' .. tenant, 'bt:' .. backend, ...)
  local o = { tonumber(v[1] or '0'), tonumber(v[2] or '0'), tonumber(v[3] or '0'),
    tonumber(v[4] or '0'), tonumber(v[5] or '0') }
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
      set[#set + 1] = int(o[i])
    else
      drop[#drop + 1] = fields[i]
    end
  end
  if #set > 0 then redis.call('HSET', occ, unpack(set)) end
  if #drop > 0 then redis.call('HDEL', occ, unpack(drop)) end
end

local function append(kind, lease, token, tenant, backend, footprint, operation, outcome, o)
  return redis.call('XADD', events, 'MAXLEN', maxlen, '*',
    'v', 'admission-event-v1', 'kind', kind, 'time_ms', int(now_ms),
    'lease', lease, 'token', token, 'tenant', tenant, 'backend', backend,
    'footprint', footprint, 'operation', operation, 'outcome', outcome, 'policy', version,
    'occupancy', int(o[1]) .. ' ' .. int(o[2]) .. ' ' .. int(o[3]) .. ' ' .. int(o[4]) .. ' ' .. int(o[5]))
end

local function parse(r)
  local f = {}
  for part in string.gmatch(r, '[^|]+') do f[#f + 1] = part end
  return f -- token, tenant, backend, footprint, operation
end

-- Gives back what lease `id` holds (its record `r`) and records why.
local function settle(id, r, kind)
  local f = parse(r)
  local footprint = tonumber(f[4])
  local o = read(f[2], f[3])
  o[1], o[2], o[3], o[4], o[5] = o[1] - footprint, o[2] - 1, o[3] - footprint, o[4] - 1, o[5] - 1
  write(o, f[2], f[3], nil, { 'r:' .. id })
  redis.call('ZREM', exp, id)
  append(kind, id, f[1], f[2], f[3], f[4], f[5], kind, o)
  return o
end

-- Bounded reaping on every call: at most `limit` leases whose expiry passed on server time.
local function reap(limit)
  local due = redis.call('ZRANGEBYSCORE', exp, '-inf', now_ms, 'LIMIT', 0, limit)
  for _, id in ipairs(due) do
    local r = redis.call('HGET', occ, 'r:' .. id)
    if r then settle(id, r, 'expired') else redis.call('ZREM', exp, id) end
  end
  return #due
end

local function last_event_id()
  local last = redis.call('XREVRANGE', events, '+', '-', 'COUNT', 1)
  if #last == 0 then return '0-0' end
  return last[1][1]
end

local function earliest_expiry()
  local first = redis.call('ZRANGE', exp, 0, 0, 'WITHSCORES')
  if #first == 0 then return -1 end
  return tonumber(first[2])
end

if op == 'acquire' then
  -- ARGV: 3 lease id 4 tenant 5 backend 6 footprint 7 operation 8 ttl ms 9 reap limit
  --       10 queued flag (1: append a `queued` event when it does not fit now)
  local id, tenant, backend, operation = ARGV[3], ARGV[4], ARGV[5], ARGV[7]
  local footprint, ttl = tonumber(ARGV[6]), tonumber(ARGV[8])
  reap(tonumber(ARGV[9]))
  if not footprint or footprint <= 0 then return {'NEVER', 'footprint', ARGV[6], '1'} end
  local tb_max, tt_max = limits(c[10])
  if footprint > S_B then return {'NEVER', 'service_bytes', ARGV[6], int(S_B)} end
  if footprint > tb_max then return {'NEVER', 'tenant_bytes', ARGV[6], int(tb_max)} end
  local o, v = read(tenant, backend, 'r:' .. id, 'tok')
  if v[6] then return {'NEVER', 'lease_id', id, '0'} end
  local dim, held, max
  if o[1] + footprint > S_B then dim, held, max = 'service_bytes', o[1], S_B
  elseif o[2] + 1 > S_T then dim, held, max = 'service_transfers', o[2], S_T
  elseif o[3] + footprint > tb_max then dim, held, max = 'tenant_bytes', o[3], tb_max
  elseif o[4] + 1 > tt_max then dim, held, max = 'tenant_transfers', o[4], tt_max
  elseif o[5] + 1 > B_T then dim, held, max = 'backend_transfers', o[5], B_T
  end
  if dim then
    local last
    if ARGV[10] == '1' then
      last = append('queued', id, '0', tenant, backend, ARGV[6], operation, 'queued', o)
    else
      last = last_event_id()
    end
    return {'FULL', dim, int(held), int(max), last, int(earliest_expiry()), int(now_ms)}
  end
  -- Fencing: one more than the last token, and never behind the server's clock in microseconds,
  -- so a cell that lost its counter (a restart, a failover) still issues greater tokens.
  local token = int(math.max(tonumber(v[7] or '0') + 1, now_us))
  local expiry = now_ms + ttl
  redis.call('ZADD', exp, expiry, id)
  o[1], o[2], o[3], o[4], o[5] = o[1] + footprint, o[2] + 1, o[3] + footprint, o[4] + 1, o[5] + 1
  write(o, tenant, backend, { 'tok', token,
    'r:' .. id, token .. '|' .. tenant .. '|' .. backend .. '|' .. ARGV[6] .. '|' .. operation })
  append('admitted', id, token, tenant, backend, ARGV[6], operation, 'admitted', o)
  return {'OK', token, version, int(o[1]), int(o[2]), int(o[3]), int(o[4]), int(o[5]),
    int(expiry), int(now_ms)}
end

if op == 'renew' then
  -- ARGV: 3 ttl ms 4 reap limit, then (lease id, token) pairs: every lease due, in one call.
  -- Reply: OK, server ms, new expiry, then one word per lease: OK, LOST or STALE:<current>.
  reap(tonumber(ARGV[4]))
  local expiry = now_ms + tonumber(ARGV[3])
  local reply = {'OK', int(now_ms), int(expiry)}
  for i = 5, #ARGV, 2 do
    local id, token = ARGV[i], ARGV[i + 1]
    local r = redis.call('HGET', occ, 'r:' .. id)
    if not r then
      reply[#reply + 1] = 'LOST'
    else
      local current = string.sub(r, 1, string.find(r, '|', 1, true) - 1)
      if current ~= token then
        reply[#reply + 1] = 'STALE:' .. current
      else
        redis.call('ZADD', exp, expiry, id)
        reply[#reply + 1] = 'OK'
      end
    end
  end
  return reply
end

if op == 'release' then
  -- ARGV: 3 lease id 4 token 5 outcome (completed, failed, interrupted) 6 reap limit
  local id, token = ARGV[3], ARGV[4]
  reap(tonumber(ARGV[6]))
  local r = redis.call('HGET', occ, 'r:' .. id)
  if not r then return {'LOST'} end
  local current = string.sub(r, 1, string.find(r, '|', 1, true) - 1)
  if current ~= token then return {'STALE', current} end
  settle(id, r, ARGV[5])
  return {'OK', int(now_ms)}
end

if op == 'skew' then
  -- ARGV: 3 milliseconds to move the cell's clock forward (test-util only)
  redis.call('HINCRBY', cfg, 'skew_ms', tonumber(ARGV[3]))
  return {'OK', int(now_ms + tonumber(ARGV[3]))}
end

if op == 'gave_up' then
  -- ARGV: 3 lease id 4 tenant 5 backend 6 footprint 7 operation 8 reap limit
  reap(tonumber(ARGV[8]))
  append('timed_out', ARGV[3], '0', ARGV[4], ARGV[5], ARGV[6], ARGV[7], 'timed_out',
    read(ARGV[4], ARGV[5]))
  return {'OK'}
end

if op == 'snapshot' then
  -- ARGV: 3 tenant 4 backend 5 reap limit
  local reaped = reap(tonumber(ARGV[5]))
  local o, v = read(ARGV[3], ARGV[4], 'tok')
  local tb_max, tt_max = limits(c[10])
  return {'OK', version, int(o[1]), int(o[2]), int(o[3]), int(o[4]), int(o[5]),
    int(o[2]), int(tb_max), int(tt_max), int(now_ms), int(reaped), v[6] or '0',
    int(redis.call('XLEN', events))}
end

if op == 'policy' then
  -- ARGV: 3 tenant 4 bytes ('' clears) 5 transfers 6 reap limit
  reap(tonumber(ARGV[6]))
  local tenant = ARGV[3]
  if ARGV[4] == '' then
    redis.call('HDEL', cfg, 'o:' .. tenant)
  else
    local b, n = tonumber(ARGV[4]), tonumber(ARGV[5])
    if not b or b < 1 or b > S_B then return {'INVALID', 'bytes', ARGV[4], int(S_B)} end
    if not n or n < 1 or n > S_T then return {'INVALID', 'transfers', ARGV[5], int(S_T)} end
    redis.call('HSET', cfg, 'o:' .. tenant, ARGV[4] .. '|' .. ARGV[5])
  end
  version = int(redis.call('HINCRBY', cfg, 'version', 1))
  append('policy_changed', '', '0', tenant, '', '0', 'policy', ARGV[4] == '' and 'cleared' or 'set',
    read(tenant, ''))
  return {'OK', version}
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
    return {'OVER', int(used), int(limit), int(left_ms)}
  end
  used = used + amount
  redis.call('HSET', quota, field, int(window) .. '|' .. int(used))
  return {'OK', int(used), int(limit), int(left_ms)}
end

return redis.error_reply('admission-redis: unknown operation ' .. tostring(op))
