-- `cargo xtask load`'s wrk script: `POST` the URL wrk is given, and count every answer by its
-- status and, for an admission refusal, its reason (the first word after "admission refused: "
-- in the body: `timed_out`, `shed`, ...), with the latency of each kind of answer.
--
-- xtask runs wrk with as many threads as connections, so each thread's Lua state drives exactly
-- one connection: `request` and `response` alternate, and the time between them is that
-- request's latency, read from CLOCK_MONOTONIC through LuaJIT's FFI. Latencies are counted in a
-- histogram per kind of answer with buckets 1 % wide (a percentile is its bucket's upper edge);
-- `done` merges the threads' histograms, and every refusal's and every success's, and prints
-- one line, `xtask-load {json}`, which xtask reads. A request still unanswered when wrk stops
-- is counted as cut.

local ffi = require("ffi")
ffi.cdef [[
  typedef struct { long tv_sec; long tv_nsec; } xtask_timespec;
  int clock_gettime(int clock_id, xtask_timespec *tp);
]]
local CLOCK_MONOTONIC = 1
local now_ts = ffi.new("xtask_timespec")

local function now_us()
  ffi.C.clock_gettime(CLOCK_MONOTONIC, now_ts)
  return tonumber(now_ts.tv_sec) * 1e6 + tonumber(now_ts.tv_nsec) / 1e3
end

-- Bucket `b` holds latencies in [1.01^b, 1.01^(b+1)) microseconds.
local SCALE = 1 / math.log(1.01)

local function bucket(us)
  if us < 1 then
    return 0
  end
  return math.floor(math.log(us) * SCALE)
end

wrk.method = "POST"

-- Per thread (one connection each), flat because wrk's `thread:get` crashes on nested tables:
-- "c|KIND" -> answers of that kind, "m|KIND" -> the longest latency (us), "b|KIND|B" -> the
-- answers in bucket B.
answers = {}
-- 1 while a request is sent and its answer not yet read.
in_flight = 0
local started = 0

function request()
  started = now_us()
  in_flight = 1
  return wrk.format()
end

function response(status, headers, body)
  local us = now_us() - started
  in_flight = 0
  local kind = tostring(status)
  local reason = body and string.match(body, "^admission refused: ([%w_]+)")
  if reason then
    kind = kind .. " " .. reason
  end
  answers["c|" .. kind] = (answers["c|" .. kind] or 0) + 1
  if us > (answers["m|" .. kind] or 0) then
    answers["m|" .. kind] = us
  end
  local b = "b|" .. kind .. "|" .. bucket(us)
  answers[b] = (answers[b] or 0) + 1
end

local threads = {}

function setup(thread)
  table.insert(threads, thread)
end

-- The latency (ms) below which `fraction` of the `total` answers of histogram `buckets` fall:
-- the upper edge of the bucket that reaches it, at most the longest latency `max_us`.
local function percentile(buckets, total, fraction, max_us)
  local keys = {}
  for b in pairs(buckets) do
    table.insert(keys, b)
  end
  table.sort(keys)
  local want = math.ceil(total * fraction)
  local seen = 0
  for _, b in ipairs(keys) do
    seen = seen + buckets[b]
    if seen >= want then
      return math.min(math.exp((b + 1) / SCALE), max_us) / 1e3
    end
  end
  return 0
end

function done(summary, latency, requests)
  -- kind -> {count, max, buckets = {b -> n}}
  local merged = {}
  local function of(kind)
    local m = merged[kind]
    if not m then
      m = { count = 0, max = 0, buckets = {} }
      merged[kind] = m
    end
    return m
  end
  local cut = 0
  for _, thread in ipairs(threads) do
    cut = cut + (thread:get("in_flight") or 0)
    for key, n in pairs(thread:get("answers") or {}) do
      local tag, kind, b = string.match(key, "^(%a)|([^|]+)|?(%-?%d*)$")
      local m = of(kind)
      if tag == "c" then
        m.count = m.count + n
      elseif tag == "m" then
        m.max = math.max(m.max, n)
      else
        b = tonumber(b)
        m.buckets[b] = (m.buckets[b] or 0) + n
      end
    end
  end
  -- Every refusal (a status other than 2xx) and every success, merged.
  local groups = { refused = { count = 0, max = 0, buckets = {} },
                   ok = { count = 0, max = 0, buckets = {} } }
  for kind, m in pairs(merged) do
    local g = string.match(kind, "^2") and groups.ok or groups.refused
    g.count = g.count + m.count
    g.max = math.max(g.max, m.max)
    for b, n in pairs(m.buckets) do
      g.buckets[b] = (g.buckets[b] or 0) + n
    end
  end
  local function figures(name, m)
    return string.format(
      '"%s": {"count": %d, "p50_ms": %.3f, "p99_ms": %.3f, "max_ms": %.3f}',
      name, m.count, percentile(m.buckets, m.count, 0.50, m.max),
      percentile(m.buckets, m.count, 0.99, m.max), m.max / 1e3)
  end
  local parts = {}
  for kind, m in pairs(merged) do
    table.insert(parts, figures(kind, m))
  end
  io.write(string.format(
    'xtask-load {"seconds": %.3f, "connections": %d, "cut": %d, "socket_errors": %d, '
      .. '"answers": {%s}, %s, %s}\n',
    summary.duration / 1e6, #threads, cut,
    summary.errors.connect + summary.errors.read + summary.errors.write,
    table.concat(parts, ", "), figures("refused", groups.refused), figures("ok", groups.ok)))
end
