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

-- idiv returns floor(a/b) for integers a >= 0, b > 0.
local function idiv(a, b)
  local q = math.floor(a / b)
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
  return string.format('%d', ms + ttl_slack)
end

-- fmt_int formats an integral number without exponent or fraction.
local function fmt_int(x)
  return string.format('%d', x)
end

-- num_of is the integer a counter key holds, from its GET/MGET value (false
-- when the key is absent: 0).
local function num_of(v)
  if not v then
    return 0
  end
  return tonumber(v)
end

-- bucket_key is the key of bucket b of a windowed counter: <base>:<b>.
local function bucket_key(base, b)
  return base .. ':' .. fmt_int(b)
end

-- store_bucket writes count n of bucket b of a windowed counter; key is the
-- bucket's key (nil: computed here). The key expires lifetime windows after
-- the bucket starts, at (b+lifetime)·W. stored is the count loaded for that
-- bucket in this script (0 when the key was absent, nil if not loaded): a
-- counter that exists only grows, by INCRBY, which keeps its expiry and is
-- the cheapest write; a new one is created with SET PX.
local function store_bucket(base, w, b, key, n, stored, lifetime, now)
  key = key or bucket_key(base, b)
  if stored and stored > 0 then
    if n > stored then
      redis.call('INCRBY', key, n - stored)
    end
    return
  end
  redis.call('SET', key, fmt_int(n), 'PX', px((b + lifetime) * w - now))
end

-- refund_bucket takes back c hits admitted at now from the current bucket of
-- a windowed counter (Cluster: another slot denied), never below 0, keeping
-- the key's expiry.
local function refund_bucket(base, w, c, now)
  local key = bucket_key(base, idiv(now, w))
  local v = redis.call('GET', key)
  if v then
    redis.call('SET', key, fmt_int(math.max(0, tonumber(v) - c)), 'KEEPTTL')
  end
end
