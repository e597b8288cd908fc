-- sliding_log.lua: a sorted set of admitted batches of hits, the Lua twin of
-- pkg/algorithm.SlidingLog. Part of check.lua / refund.lua (concatenated after
-- lib.lua).
--
-- Storage: the counter's key is a sorted set with one member per admitted
-- batch (a group's hits on the counter), whatever its hits: a request of
-- 10,000 hits is one member, not 10,000. Score: the time in ms the batch is
-- logged at. Member "<start>:<count>": count >= 1 is the batch's hits, and
-- start (16 zero-padded decimal digits) is a running total, the hits logged
-- on the key before the batch, so the batch holds hits start+1 .. start+count
-- and the batches' ranges follow one another without gap. A batch is logged
-- at max(now, the newest batch's time): times never decrease as the total
-- grows (after a clock step back the hits are logged at the newest time, and
-- count at least as long as at now, never shorter). Members of one score sort
-- by name, which the padding makes the order of start. Hence:
--   the live hits are the newest batch's end minus the start of the oldest
--   batch later than now−W (two reads of one member, O(log N) each);
--   the k-th oldest live hit is in the batch holding hit number start0 + k
--   (a search by rank, for a denial's retry; see sl_hit_time).
-- Batches at or before now−W are trimmed when the set is written; when none
-- is left the total starts again from 0. The key expires W after its newest
-- batch. KEYS, ARGV: none of its own; the driver passes the key. State table:
-- {key, n = stored live hits, added = tentative hits of this group, last =
-- the newest batch's end (0 if none), tlast = its time (false if none),
-- start0, t0 = the oldest live batch's start and time (when n > 0), foreign}.
--
-- A key holding what envoy-rls does not write (another type, a member not of
-- this form, a time not an integer within ahead_max of the clock, batches out
-- of order) counts as an empty log and is replaced by the next admitted
-- batch, as a foreign value in a string counter is (lib.lua): it must not fail
-- the call, which carries other callers' requests, nor reach the arithmetic.

-- The log is not a string: the driver does not read it with MGET (v is
-- always false here); load reads it.
local sliding_log = {string_state = false}

-- sl_total_max bounds the running total (and a batch's count): sums of two
-- stay exact, and 16 digits hold it. A key is renumbered from 0 before its
-- total would pass it (store), which takes 10^15 hits without the key once
-- being idle for a window.
local sl_total_max = 1e15

-- sl_pcall runs a sorted-set command on the log and returns its reply, or
-- nil when the key holds another type; any other error is raised as it is.
local function sl_pcall(...)
  local r = redis.pcall(...)
  if type(r) == 'table' and r.err then
    if string.sub(r.err, 1, 9) == 'WRONGTYPE' then
      return nil
    end
    error(r)
  end
  return r
end

-- sl_parse returns the start and count of member m, or nil if envoy-rls
-- does not write such a member.
local function sl_parse(m)
  local s, c = match(m or '', '^(%d+):(%d+)$')
  if not s or #s ~= 16 then
    return nil
  end
  s, c = tonum(s), tonum(c)
  if s >= sl_total_max or c < 1 or c > sl_total_max then
    return nil
  end
  return s, c
end

-- sl_time returns the score text v as a time, or nil if it is not an
-- integer in [0, now + ahead_max].
local function sl_time(v, now)
  local t = tonum(v)
  if t and t >= 0 and t <= now + ahead_max and t % 1 == 0 then
    return t
  end
  return nil
end

-- sl_member formats the member of a batch.
local function sl_member(start, count)
  return format('%016d:%d', start, count)
end

local function sl_empty(key, foreign)
  return {key = key, n = 0, added = 0, last = 0, tlast = false, foreign = foreign}
end

function sliding_log.load(key, w, now, v)
  local r = sl_pcall('ZRANGE', key, '-1', '-1', 'WITHSCORES')
  if not r then
    return sl_empty(key, true)
  end
  if not r[1] then
    return sl_empty(key, false)
  end
  local s, c = sl_parse(r[1])
  local t = sl_time(r[2], now)
  if not s or not t then
    return sl_empty(key, true)
  end
  local st = {key = key, n = 0, added = 0, last = s + c, tlast = t, foreign = false}
  local cutoff = now - w
  if t > cutoff then
    -- The newest batch is live, so the oldest live one exists.
    local o = rcall('ZRANGE', key, '(' .. fmt_int(cutoff), '+inf', 'BYSCORE', 'LIMIT', '0', '1', 'WITHSCORES')
    local s0, t0 = sl_parse(o[1]), sl_time(o[2], now)
    if not s0 or not t0 or s0 > s then
      return sl_empty(key, true)
    end
    st.n, st.start0, st.t0 = s + c - s0, s0, t0
  end
  return st
end

-- sl_hit_time returns the time of the k-th oldest stored live hit (1 <= k <=
-- s.n): the time of the batch holding hit start0 + k. It searches the ranks
-- of the live batches, keeping lo's start and hi's end around the hit, and
-- probes alternately where the hit would be if the batches in between held
-- equal hits (found at once when they do, as with one hit per request) and
-- at the middle (at most twice a binary search's probes however they are
-- spread). A probe reads the batch's start and count, so it recognises the
-- batch itself. A member envoy-rls did not write, or batches that do not
-- follow one another, give the newest batch's time, after which no stored
-- hit is left: later than the answer, never earlier.
local function sl_hit_time(s, cutoff, k, now)
  local key, target = s.key, s.start0 + k
  local lo = rcall('ZCOUNT', key, '-inf', fmt_int(cutoff)) -- the oldest live batch's rank
  local hi = rcall('ZCARD', key) - 1
  local slo, ehi, bisect = s.start0, s.last, false -- slo < target <= ehi
  while lo <= hi do
    local m
    if bisect then
      m = lo + floor((hi - lo) / 2)
    else
      m = lo + floor((target - 1 - slo) * (hi - lo + 1) / (ehi - slo))
      m = math.max(lo, math.min(hi, m))
    end
    bisect = not bisect
    local r = rcall('ZRANGE', key, fmt_int(m), fmt_int(m), 'WITHSCORES')
    local start, count = sl_parse(r[1])
    if not start then
      return s.tlast
    end
    if start >= target then
      hi, ehi = m - 1, start
    elseif start + count < target then
      lo, slo = m + 1, start + count
    else
      return sl_time(r[2], now) or s.tlast
    end
  end
  return s.tlast
end

-- decide returns allowed, remaining, reset_ms, retry_ms and the new state.
-- With no_retry (check.lua's figures without consumption, whose retry it
-- drops) a denial's retry is not searched.
function sliding_log.decide(s, now, w, l, cap, c, consume, no_retry)
  local added = s.added
  local n = s.n + added
  local ok, retry = false, 0
  if c > l then
    retry = w
  elseif n + c <= l then
    ok = true
    if consume then
      added = added + c
      n = n + c
    end
  else
    -- Enough hits must leave: the k-th oldest, k = n+c−L. The group's
    -- tentative hits are logged at max(now, the newest batch's time).
    local k = n + c - l
    local t = now
    if not no_retry then
      if k <= s.n then
        t = sl_hit_time(s, now - w, k, now)
      elseif s.tlast and s.tlast > t then
        t = s.tlast
      end
    end
    retry = t + w - now
  end
  local rem = 0
  if n < l then
    rem = l - n
  end
  local reset = w
  if s.n > 0 then
    reset = s.t0 + w - now
  end
  if added == s.added then
    return ok, rem, reset, retry, s -- nothing consumed: the state is unchanged
  end
  return ok, rem, reset, retry, {key = s.key, n = s.n, added = added, last = s.last, tlast = s.tlast,
    start0 = s.start0, t0 = s.t0, foreign = s.foreign}
end

-- sl_rewrite renumbers the batches from rank r on, oldest first: it takes up
-- to take hits from the earliest of them logged at or before take_until (a
-- batch left with none is removed) and moves each start down by shift plus
-- the hits taken before it, so the ranges still follow one another. It
-- returns false, changing nothing, if one of them is not a member envoy-rls
-- writes. The new members are added before the old ones are removed, so a
-- key that keeps a batch is never emptied on the way (which would drop its
-- expiry).
local function sl_rewrite(key, r, take, shift, take_until)
  local m = rcall('ZRANGE', key, fmt_int(r), '-1', 'WITHSCORES')
  local add, na, keep, d = {}, 0, {}, shift
  for i = 1, #m, 2 do
    local s, c = sl_parse(m[i])
    if not s or s < d then
      return false
    end
    local x = 0
    if take > 0 and tonum(m[i + 1]) <= take_until then
      x = math.min(c, take)
      take = take - x
    end
    if c > x then
      local name = sl_member(s - d, c - x)
      add[na + 1], add[na + 2] = m[i + 1], name
      na = na + 2
      keep[name] = true
    end
    d = d + x
  end
  for i = 1, na, 2000 do
    rcall('ZADD', key, unpack_list(add, i, math.min(i + 1999, na)))
  end
  local old = {}
  for i = 1, #m, 2 do
    if not keep[m[i]] then
      old[#old + 1] = m[i]
      if #old == 1000 then
        rcall('ZREM', key, unpack_list(old))
        old = {}
      end
    end
  end
  if old[1] then
    rcall('ZREM', key, unpack_list(old))
  end
  return true
end

function sliding_log.store(key, w, s, o, now)
  local base = s.last
  if s.foreign or s.n == 0 then
    -- A foreign value is replaced. With no live hit every batch has left
    -- (the newest is past the window): the total starts again, and a key
    -- that exists holds only dead members; a fresh key needs no call.
    if s.foreign or s.tlast then
      rcall('DEL', key)
    end
    base = 0
  else
    rcall('ZREMRANGEBYSCORE', key, '-inf', fmt_int(now - w))
    if base + s.added >= sl_total_max then
      -- Renumber the live batches from 0. Should one of them not be
      -- envoy-rls's, the log is replaced as a foreign one is.
      if sl_rewrite(key, 0, 0, s.start0, 0) then
        base = base - s.start0
      else
        rcall('DEL', key)
        base = 0
      end
    end
  end
  local t = now
  if s.tlast and s.tlast > t then
    t = s.tlast
  end
  rcall('ZADD', key, fmt_int(t), sl_member(base, s.added))
  rcall('PEXPIRE', key, px(t + w - now))
end

-- refund takes back c hits that a check admitted at now (Cluster: another
-- slot denied). That batch was logged at now, unless the clock had stepped
-- back behind the log's newest time (then at that time): the hits are taken
-- from batches logged at now, any of them (hits of one instant are
-- interchangeable), and the later batches renumbered. None there means the
-- batch has left the window or the key expired meanwhile (batches logged
-- since are others' hits), or the clock had stepped back: nothing is taken,
-- and the hits stay counted, an under-admission for one window at most. A
-- key of another type, or a member envoy-rls does not write, is left alone.
function sliding_log.refund(key, w, c, l, now)
  local t = fmt_int(now)
  local r = sl_pcall('ZCOUNT', key, '-inf', '(' .. t)
  if r and rcall('ZCOUNT', key, t, t) > 0 then
    sl_rewrite(key, r, c, 0, now)
  end
end
