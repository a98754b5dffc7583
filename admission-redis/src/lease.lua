-- admission-redis: the one program behind every fleet transition (schema admission-event-v1).
--
-- Called by SHA (EVALSHA, reloaded on NOSCRIPT). ARGV[1] names the operation, ARGV[2] is the
-- caller's config fingerprint. Every key shares the cell's hash tag, so a transition stays in
-- one Redis Cluster slot. Time is the server's (TIME), never a client's.
--
-- KEYS: 1 cfg (hash)   2 occ (hash)     3 exp (zset: lease id -> expiry ms)
--       4 rec (hash: lease id -> "token|tenant|backend|footprint|operation")
--       5 token (string) 6 ovr (hash: tenant -> "bytes|transfers")  7 events (stream)
--       8 quota (hash: "r:<tenant>" / "b:<tenant>" -> "window|used")
--
-- Replies are flat arrays whose first element is a status word:
--   OK, FULL (not now), NEVER (never fits), LOST, STALE, OVER (quota), INVALID, NOCONFIG, MISMATCH.
-- Tenant and backend arguments are already SHA-256 hex digests: raw ids never reach Redis.

local cfg, occ, exp, rec, tok, ovr, events, quota =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local op, fingerprint = ARGV[1], ARGV[2]

-- The server's clock, plus a forward skew that only the test-util feature ever sets (it moves
-- the cell's time forward as a fake clock would; nothing else writes `skew_ms`).
local t = redis.call('TIME')
local skew = tonumber(redis.call('HGET', cfg, 'skew_ms') or '0')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + skew
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2]) + skew * 1000

if op == 'init' then
  -- ARGV: 3 service_bytes 4 service_transfers 5 tenant_bytes 6 tenant_transfers
  --       7 backend_transfers 8 events_max_len
  local stored = redis.call('HGET', cfg, 'fingerprint')
  if stored then
    if stored ~= fingerprint then return {'MISMATCH', stored} end
    return {'OK', redis.call('HGET', cfg, 'version')}
  end
  redis.call('HSET', cfg, 'fingerprint', fingerprint, 'sb', ARGV[3], 'st', ARGV[4],
    'tb', ARGV[5], 'tt', ARGV[6], 'bt', ARGV[7], 'maxlen', ARGV[8])
  -- A cell created afresh (first start, or a server that restarted empty) starts its policy
  -- version at the server's clock, so versions never go back across a restart either.
  local version = math.max(1, math.floor(now_ms))
  redis.call('HSET', cfg, 'version', version)
  return {'OK', tostring(version)}
end

local c = redis.call('HMGET', cfg, 'fingerprint', 'sb', 'st', 'tb', 'tt', 'bt', 'maxlen', 'version')
if not c[1] then return {'NOCONFIG'} end
if c[1] ~= fingerprint then return {'MISMATCH', c[1]} end
local S_B, S_T, T_B, T_T, B_T = tonumber(c[2]), tonumber(c[3]), tonumber(c[4]), tonumber(c[5]), tonumber(c[6])
local maxlen, version = c[7], c[8]

local function num(key, field)
  return tonumber(redis.call('HGET', key, field) or '0')
end

local function bump(field, by)
  local v = redis.call('HINCRBY', occ, field, by)
  if v <= 0 then redis.call('HDEL', occ, field) end
  return v
end

local function limits_of(tenant)
  local o = redis.call('HGET', ovr, tenant)
  if o then
    local sep = string.find(o, '|', 1, true)
    return tonumber(string.sub(o, 1, sep - 1)), tonumber(string.sub(o, sep + 1))
  end
  return T_B, T_T
end

local function occupancy(tenant, backend)
  return {
    num(occ, 'sb'), num(occ, 'st'),
    num(occ, 'tb:' .. tenant), num(occ, 'tt:' .. tenant), num(occ, 'bt:' .. backend)
  }
end

local function append(kind, lease, token, tenant, backend, footprint, operation, outcome)
  local o = occupancy(tenant, backend)
  return redis.call('XADD', events, 'MAXLEN', maxlen, '*',
    'v', 'admission-event-v1', 'kind', kind, 'time_ms', now_ms,
    'lease', lease, 'token', token, 'tenant', tenant, 'backend', backend,
    'footprint', footprint, 'operation', operation, 'outcome', outcome, 'policy', version,
    'service_bytes', o[1], 'service_transfers', o[2], 'tenant_bytes', o[3],
    'tenant_transfers', o[4], 'backend_transfers', o[5])
end

local function parse(r)
  local f = {}
  for part in string.gmatch(r, '[^|]+') do f[#f + 1] = part end
  return f -- token, tenant, backend, footprint, operation
end

-- Give back what lease `id` holds and record why. `r` is its record.
local function settle(id, r, kind, outcome)
  local f = parse(r)
  local footprint = tonumber(f[4])
  bump('sb', -footprint)
  bump('st', -1)
  bump('tb:' .. f[2], -footprint)
  bump('tt:' .. f[2], -1)
  bump('bt:' .. f[3], -1)
  redis.call('HDEL', rec, id)
  redis.call('ZREM', exp, id)
  append(kind, id, f[1], f[2], f[3], f[4], f[5], outcome)
  return f
end

-- Bounded reaping on every call: at most `limit` leases whose expiry has passed on server time.
local function reap(limit)
  local due = redis.call('ZRANGEBYSCORE', exp, '-inf', now_ms, 'LIMIT', 0, limit)
  for _, id in ipairs(due) do
    local r = redis.call('HGET', rec, id)
    if r then settle(id, r, 'expired', 'expired') else redis.call('ZREM', exp, id) end
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
  local tb_max, tt_max = limits_of(tenant)
  if not footprint or footprint <= 0 then return {'NEVER', 'footprint', tostring(footprint), '1'} end
  if redis.call('HEXISTS', rec, id) == 1 then return {'NEVER', 'lease_id', id, '0'} end
  if footprint > S_B then return {'NEVER', 'service_bytes', tostring(footprint), tostring(S_B)} end
  if footprint > tb_max then return {'NEVER', 'tenant_bytes', tostring(footprint), tostring(tb_max)} end
  local o = occupancy(tenant, backend)
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
      last = append('queued', id, '0', tenant, backend, ARGV[6], operation, 'queued')
    else
      last = last_event_id()
    end
    return {'FULL', dim, tostring(held), tostring(max), last, tostring(earliest_expiry()), tostring(now_ms)}
  end
  local token = math.max(tonumber(redis.call('GET', tok) or '0') + 1, now_us)
  redis.call('SET', tok, string.format('%.0f', token))
  local token_s = string.format('%.0f', token)
  redis.call('HSET', rec, id, token_s .. '|' .. tenant .. '|' .. backend .. '|' .. ARGV[6] .. '|' .. operation)
  local expiry = now_ms + ttl
  redis.call('ZADD', exp, expiry, id)
  bump('sb', footprint)
  bump('st', 1)
  bump('tb:' .. tenant, footprint)
  bump('tt:' .. tenant, 1)
  bump('bt:' .. backend, 1)
  append('admitted', id, token_s, tenant, backend, ARGV[6], operation, 'admitted')
  o = occupancy(tenant, backend)
  return {'OK', token_s, version, tostring(o[1]), tostring(o[2]), tostring(o[3]), tostring(o[4]),
    tostring(o[5]), tostring(expiry), tostring(now_ms)}
end

if op == 'renew' or op == 'release' then
  -- ARGV: 3 lease id 4 token 5 ttl ms (renew) or outcome (release) 6 reap limit
  local id, token = ARGV[3], ARGV[4]
  reap(tonumber(ARGV[6]))
  local r = redis.call('HGET', rec, id)
  if not r then return {'LOST'} end
  local f = parse(r)
  if f[1] ~= token then return {'STALE', f[1]} end
  if op == 'renew' then
    local expiry = now_ms + tonumber(ARGV[5])
    redis.call('ZADD', exp, expiry, id)
    return {'OK', tostring(expiry), tostring(now_ms)}
  end
  local outcome = ARGV[5]
  settle(id, r, outcome, outcome)
  return {'OK', tostring(now_ms)}
end

if op == 'skew' then
  -- ARGV: 3 milliseconds to move the cell's clock forward (test-util only)
  redis.call('HINCRBY', cfg, 'skew_ms', tonumber(ARGV[3]))
  return {'OK', tostring(now_ms + tonumber(ARGV[3]))}
end

if op == 'gave_up' then
  -- ARGV: 3 lease id 4 tenant 5 backend 6 footprint 7 operation 8 reap limit
  reap(tonumber(ARGV[8]))
  append('timed_out', ARGV[3], '0', ARGV[4], ARGV[5], ARGV[6], ARGV[7], 'timed_out')
  return {'OK'}
end

if op == 'snapshot' then
  -- ARGV: 3 tenant 4 backend 5 reap limit
  local reaped = reap(tonumber(ARGV[5]))
  local o = occupancy(ARGV[3], ARGV[4])
  local tb_max, tt_max = limits_of(ARGV[3])
  return {'OK', version, tostring(o[1]), tostring(o[2]), tostring(o[3]), tostring(o[4]), tostring(o[5]),
    tostring(redis.call('HLEN', rec)), tostring(tb_max), tostring(tt_max), tostring(now_ms),
    tostring(reaped), redis.call('GET', tok) or '0', tostring(redis.call('XLEN', events))}
end

if op == 'policy' then
  -- ARGV: 3 tenant 4 bytes ('' clears) 5 transfers 6 reap limit
  reap(tonumber(ARGV[6]))
  local tenant = ARGV[3]
  if ARGV[4] == '' then
    redis.call('HDEL', ovr, tenant)
  else
    local b, n = tonumber(ARGV[4]), tonumber(ARGV[5])
    if not b or b < 1 or b > S_B then return {'INVALID', 'bytes', ARGV[4], tostring(S_B)} end
    if not n or n < 1 or n > S_T then return {'INVALID', 'transfers', ARGV[5], tostring(S_T)} end
    redis.call('HSET', ovr, tenant, ARGV[4] .. '|' .. ARGV[5])
  end
  version = tostring(redis.call('HINCRBY', cfg, 'version', 1))
  append('policy_changed', '', '0', tenant, '', '0', 'policy', ARGV[4] == '' and 'cleared' or 'set')
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
    return {'OVER', string.format('%.0f', used), tostring(limit), tostring(left_ms)}
  end
  used = used + amount
  redis.call('HSET', quota, field, string.format('%.0f', window) .. '|' .. string.format('%.0f', used))
  return {'OK', string.format('%.0f', used), tostring(limit), tostring(left_ms)}
end

return redis.error_reply('admission-redis: unknown operation ' .. tostring(op))
