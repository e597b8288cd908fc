-- lib.lua: helpers shared by the algorithm files. It is the first part of
-- every counting script (see scripts.go: lib.lua, the four algorithm files and
-- then a driver, check.lua or refund.lua, are concatenated into one script).
--
-- KEYS, ARGV: none (helpers only). Reply: none.
--
-- Lua numbers are IEEE doubles. Every quantity here is an integer below 2^53
-- (the Go side rejects limits whose products could exceed it), so sums,
-- differences and products are exact; quotients are corrected to the exact
-- integer floor/ceil by idiv and cdiv. Counters are written packed (see
-- state_format); numbers written as text (expiries, log scores) go through
-- px and fmt_int ('%d': Lua 5.1 converts to a C long, exact below 2^53 and
-- about twice as fast as '%.0f'), never tostring (which prints 1e+15 style).

-- The library functions used on every call, kept as upvalues: reaching a
-- global is a table lookup (two for math.floor), an upvalue is not. A Redis
-- Function library cannot read the globals while it loads, so the driver
-- calls bind_globals at the start of every call; it assigns them once.
local floor, ceil, format, match, tonum, rcall, pack, unpack_state, unpack_list, rep

local function bind_globals()
  if not floor then
    floor, ceil, format, match, tonum = math.floor, math.ceil, string.format, string.match, tonumber
    rcall, unpack_list, rep = redis.call, unpack, string.rep
    pack, unpack_state = struct.pack, struct.unpack
  end
end

-- zeros holds as many zeros as presized was asked for (up to 1024); as a
-- Function library it persists across calls.
local zeros = {}

-- presized returns a table whose array part has room for n elements (all
-- 0), allocated at once: a constructor with a vararg sizes its array for
-- every value. Up to 1024; above, an empty table.
local function presized(n)
  if n > 1024 or n < 1 then
    return {}
  end
  for i = #zeros + 1, n do
    zeros[i] = 0
  end
  return {unpack_list(zeros, 1, n)}
end

-- int_formats caches the struct formats of k integers (k <= 512).
local int_formats = {}

-- pack_some packs t[i..j] (at most 512 integers, well within the Lua stack
-- that unpack fills).
local function pack_some(t, i, j)
  local k = j - i + 1
  local f = int_formats[k]
  if not f then
    f = '<' .. rep('i8', k)
    int_formats[k] = f
  end
  return pack(f, unpack_list(t, i, j))
end

-- pack_ints returns the integers t[1..n] (n defaults to #t) as one string
-- of little-endian 64-bit integers. A script's reply as one string costs
-- Redis a small fraction of what an array of integers does (each element of
-- an array is converted and written on its own).
local function pack_ints(t, n)
  n = n or #t
  if n <= 512 then
    return pack_some(t, 1, n)
  end
  local parts = {}
  for i = 1, n, 512 do
    parts[#parts + 1] = pack_some(t, i, math.min(i + 511, n))
  end
  return table.concat(parts)
end

-- refigure rewrites a request's part of check.lua's reply in t, its
-- decision at t[y] and its reset after it, with the remaining rem and reset
-- of the figures without consumption, keeping the decision's sign (a
-- denial stays one and keeps its retry), and returns the index after the
-- part. Only a vetoed group's requests are rewritten: a function call is
-- affordable there.
local function refigure(t, y, rem, reset)
  t[y + 1] = reset
  if t[y] >= 0 then
    t[y] = rem
    return y + 2
  end
  t[y] = -1 - rem
  return y + 3
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

-- time_ms returns Redis TIME in ms since the Unix epoch, sec·1000 +
-- floor(usec/1000). The arithmetic converts TIME's two strings (Lua coerces
-- a numeric string in arithmetic) and x - x % 1 is the floor, which spares
-- three calls of C functions (tonumber twice, math.floor). The floor comes
-- before the sum: sec·1000 is about 2^41, where a double keeps no
-- thousandths.
local function time_ms()
  local t = rcall('TIME')
  local ms = t[2] / 1000
  return t[1] * 1000 + (ms - ms % 1)
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
  return format('%d', x)
end

-- A counter of the windows or a token bucket is stored as three integers,
-- packed as little-endian 64-bit integers (state_format, 24 bytes): parsing
-- text with a pattern and tonumber cost about eight times as much as
-- struct.unpack. The state table is {x, y, z}: {bucket, count, count of the
-- bucket before} for the windows, {at, debt, per} for a token bucket. The
-- driver hands the algorithms the tables to fill (load's and decide's into)
-- and reuses them, from call to call as a Function (as a script, within one
-- call): a new table of three costs Redis about 1,100 instructions, and more
-- to collect.
local state_format = '<i8i8i8'

-- exact is 2^53: below it a double holds every integer, so the scripts'
-- arithmetic is exact.
local exact = 9007199254740992

-- mul_div_floor returns floor(a·b/m) exactly for integers 0 <= a < 2^53, 0
-- <= b < m and 0 < m < 2^44 (a window in ms), where a·b may exceed 2^53 (a
-- double would round it): a sliding window's weight when count·W >= 2^53 (a
-- monthly limit of millions). Long division in base d = floor(2^52/m), in
-- which every partial value rem·d + digit·b stays below 2^53; at most seven
-- digits. Called only off the hot path's exact case.
local function mul_div_floor(a, b, m)
  if a * b < exact then
    return idiv(a * b, m)
  end
  local d = floor(4503599627370496 / m)
  local digits, n = {}, 0
  while a > 0 do
    local q = idiv(a, d)
    n = n + 1
    digits[n] = a - q * d
    a = q
  end
  local q, rem = 0, 0
  for i = n, 1, -1 do
    local v = rem * d + digits[i] * b
    local qi = idiv(v, m)
    q = q * d + qi
    rem = v - qi * m
  end
  return q
end

-- ahead_max (ms, 366 days) is how far a stored counter's time (the start of
-- its bucket, a token bucket's last write) may lie ahead of the clock deciding
-- on it. Instances' and Redis' clocks disagree by seconds and a clock may step
-- back (both are handled: see the windows' decide); a year is no clock error
-- but a value envoy-rls did not write.
local ahead_max = 366 * 86400000

-- window_max caches floor(exact / w) - 2 by window w: the largest bucket of
-- a window counter whose products with w stay exact (see load_windowed).
-- Windows come from the configured rules, so few recur; it is emptied at
-- 1024 entries, which bounds its memory. As a Redis Function the library's
-- locals outlive the call (as a script, one call).
local window_max, window_max_count = {}, 0

-- count_max (2^51) bounds a window counter's counts: three of them (the
-- count, the previous bucket's weight and the hits) add up below 2^53. The
-- Go side refuses windows of more requests (limiter.MaxWindowRequests).
local count_max = 2251799813685248

-- load_windowed is the load of the window counters (key, w, now, v, into):
-- it fills the table into with the state stored as v (the key's MGET value,
-- false if absent), read at now for a window of w ms, and returns into, if v
-- is 24 bytes of three integers within a window's bounds: the bucket no more
-- than ahead_max ahead of now and small enough that (b+2)·W is exact, and
-- the counts at most count_max, so that sums of counts stay exact. Anything
-- else (absent, of another length, or holding a negative or too large
-- integer: a value envoy-rls never writes, from another program sharing the
-- prefix or a corrupted key) is the empty state {-1, 0, 0} (no bucket), and
-- the next admitted hit overwrites it. Such values must never reach the
-- arithmetic: beyond 2^53 t + 1 == t, and sw_retry_at would search for an
-- instant forever, holding Redis BUSY for every client.
--
-- It runs for every counter of every call, so it is written out (as
-- helpers are in the windows' decide and store), and its bounds take
-- no division: a Lua function call, math.floor's included, costs Redis
-- several hundred instructions, more than the arithmetic
-- (docs/performance.md, "Redis instructions").
local function load_windowed(key, w, now, v, into)
  if v and #v == 24 then
    local x, y, z = unpack_state(state_format, v)
    local max = window_max[w]
    if not max then
      if window_max_count >= 1024 then
        window_max, window_max_count = {}, 0
      end
      max = floor(exact / w) - 2
      window_max[w], window_max_count = max, window_max_count + 1
    end
    -- x <= max makes x·w exact, so x·w <= now + ahead_max is exactly
    -- x <= idiv(now + ahead_max, w), without the division.
    if x >= 0 and y >= 0 and z >= 0 and x <= max and y <= count_max and z <= count_max and x * w <= now + ahead_max then
      into[1], into[2], into[3] = x, y, z
      return into
    end
  end
  into[1], into[2], into[3] = -1, 0, 0
  return into
end

-- pack_state returns the stored form of state s.
local function pack_state(s)
  return pack(state_format, s[1], s[2], s[3])
end

-- windowed_store returns the store of a window counter whose key expires
-- lifetime windows after its bucket starts, at (b+lifetime)·W:
-- store(key, w, s, ob, now) writes the state s = {b, n, n2} decided at now
-- over a stored state of bucket ob.
--
-- When ob is b, the key exists, holds 24 bytes (load_windowed accepts
-- nothing else) of bucket b and already expires when it should, and of the
-- three integers only the count can have changed: decide keeps a state's
-- bucket and its third integer within the bucket (the sliding window's count
-- of the bucket before; the fixed window's is 0 and never read), and a
-- bucket never moves back (a clock behind it decides at its start), so a
-- state of the stored bucket carries the stored integers however many
-- requests of the call led to it. So the count's 8 bytes are overwritten in
-- place (SETRANGE at offset 8), which leaves the expiry as it is. Against
-- SET of the whole value with KEEPTTL that spares Redis 2,200 (a Check
-- alone) to 3,000 (in calls of 10) instructions per write: the integer reply
-- reaches Lua as a number where SET's status becomes a table, no option is
-- parsed, the value's allocation is reused, and one integer is packed
-- instead of three (docs/performance.md, "Counters rewritten in place"). The
-- offset is the string '8': a Lua number would be formatted at every call.
--
-- Any other key (new, expired, of an earlier bucket, foreign) is written
-- whole with its expiry (SET PX): SETRANGE would create a missing key
-- without one. pack_state and px are written out (see load_windowed).
local function windowed_store(lifetime)
  return function(key, w, s, ob, now)
    local b = s[1]
    if ob == b then
      rcall('SETRANGE', key, '8', pack('<i8', s[2]))
    else
      rcall('SET', key, pack(state_format, b, s[2], s[3]), 'PX', format('%d', (b + lifetime) * w - now + ttl_slack))
    end
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
  local s = load_windowed(key, w, now, v, {})
  if s[1] == idiv(now, w) then
    redis.call('SET', key, pack_state({s[1], math.max(0, s[2] - c), s[3]}), 'KEEPTTL')
  end
end
