-- lib.lua: helpers shared by the algorithm files. It is the first part of
-- every counting script (see scripts.go: lib.lua, the four algorithm files and
-- then a driver, check.lua or refund.lua, are concatenated into one script).
--
-- KEYS, ARGV: none (helpers only). Reply: none.
--
-- Lua numbers are IEEE doubles. Every quantity here is an integer below 2^53
-- (the Go side rejects limits whose products could exceed it), so sums,
-- differences and products are exact; quotients are corrected to the exact
-- integer floor/ceil by idiv and cdiv. Numbers are written to Redis with
-- fmt_int ('%d': Lua 5.1 converts to a C long, exact below 2^53 and about
-- twice as fast as '%.0f'), never with tostring (which prints 1e+15 style).

-- The library functions used on every call, kept as upvalues: reaching a
-- global is a table lookup (two for math.floor), an upvalue is not. A Redis
-- Function library cannot read the globals while it loads, so the driver
-- calls bind_globals at the start of every call; it assigns them once.
local floor, format, match, tonum, rcall

local function bind_globals()
  if not floor then
    floor, format, match, tonum, rcall = math.floor, string.format, string.match, tonumber, redis.call
  end
end

-- idiv returns floor(a/b) for integers a >= 0, b > 0.
local function idiv(a, b)
  local q = floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

-- cdiv returns ceil(a/b) for integers a >= 0, b > 0.
local function cdiv(a, b)
  local q = idiv(a, b)
  if q * b < a then
    q = q + 1
  end
  return q
end

-- ttl_slack (ms) is added to every expiry. It is 0 on Redis TIME; with an
-- injected clock (tests) the driver sets it from ARGV, because Redis expires
-- keys by its own clock, not by the injected one. A key that lives longer than
-- needed changes no decision: every algorithm recognises stale state by its
-- bucket number or timestamps.
local ttl_slack = 0

-- px formats an expiry of ms milliseconds (plus ttl_slack) for SET PX/PEXPIRE.
local function px(ms)
  return format('%d', ms + ttl_slack)
end

-- fmt_int formats an integral number without exponent or fraction.
local function fmt_int(x)
  return string.format('%d', x)
end

-- parse_state parses a stored counter, "<x> <y> <z>" (three decimal
-- integers; v is false when the key is absent), into the state table {x, y,
-- z}: {bucket, count, count of the bucket before} for the windows, {at,
-- debt, per} for a token bucket. An absent or unreadable value is the empty
-- counter {-1, 0, 0} (no bucket, no debt).
local function parse_state(v)
  if v then
    local b, n1, n2 = match(v, '^(%d+) (%d+) (%d+)$')
    if b then
      return {tonum(b), tonum(n1), tonum(n2)}
    end
  end
  return {-1, 0, 0}
end

-- store_windowed writes the windowed state s = {b, n, n2} to key, to expire
-- lifetime windows after bucket b starts, at (b+lifetime)·W. o is the state
-- as stored: when it is of the same bucket the key exists and already expires
-- then, and keeps its expiry (KEEPTTL is about a third of the cost of PX).
local function store_windowed(key, w, s, o, lifetime, now)
  local v = format('%d %d %d', s[1], s[2], s[3])
  if o[1] == s[1] then
    rcall('SET', key, v, 'KEEPTTL')
  else
    rcall('SET', key, v, 'PX', px((s[1] + lifetime) * w - now))
  end
end

-- refund_windowed takes back c hits admitted at now from the bucket of now of
-- a windowed counter (Cluster: another slot denied), never below 0, keeping
-- the key's expiry. A counter that moved on to a later bucket meanwhile is
-- left alone.
local function refund_windowed(key, w, c, now)
  local v = redis.call('GET', key)
  if not v then
    return
  end
  local s = parse_state(v)
  if s[1] == idiv(now, w) then
    redis.call('SET', key, string.format('%d %d %d', s[1], math.max(0, s[2] - c), s[3]), 'KEEPTTL')
  end
end
