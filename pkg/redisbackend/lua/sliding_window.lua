-- sliding_window.lua: the two-counter sliding window (after Cloudflare), the
-- Lua twin of pkg/algorithm.SlidingWindow. Part of check.lua / refund.lua
-- (concatenated after lib.lua).
--
-- Storage: the counter's key holds b, count[b] and count[b-1] (three
-- integers, see state_format in lib.lua) for the bucket b = floor(now/W) of
-- its last write, and expires 2W after the start of bucket b, at (b+2)·W,
-- when neither count matters any more. KEYS, ARGV: none of its own; the
-- driver passes the key. State table: {b, count[b], count[b-1]}.

local sliding_window = {string_state = true} -- read with MGET

-- sw_weight is ceil(prev·(W−elapsed)/W): multiply then divide, in doubles,
-- exact while prev·W < 2^53; beyond, prev − floor(prev·elapsed/W) by long
-- division (mul_div_floor in lib.lua).
local function sw_weight(prev, elapsed, w)
  if prev == 0 then
    return 0
  end
  if prev * w < exact then
    return ceil(prev * (w - elapsed) / w)
  end
  return prev - mul_div_floor(prev, elapsed, w)
end

-- sw_admits is the predicate at t on the counts (cur, prev) of bucket b.
local function sw_admits(b, cur, prev, t, c, w, l)
  local bn = idiv(t, w)
  if bn == b + 1 then
    cur, prev = 0, cur
  elseif bn > b + 1 then
    cur, prev = 0, 0
  end
  return cur + sw_weight(prev, t - bn * w, w) + c <= l
end

-- sw_walk_max bounds the steps that correct sw_retry_at's estimate.
local sw_walk_max = 64

-- sw_retry_at is the earliest t > now at which sw_admits holds for the
-- unchanged counts: an analytic estimate, corrected with the predicate.
local function sw_retry_at(b, cur, prev, now, c, w, l)
  local t = (b + 2) * w
  local function earliest(pr, r)
    if pr == 0 then
      return 0
    end
    return w - idiv(r * w, pr)
  end
  -- In bucket b when the previous bucket's weight can fall far enough;
  -- else in bucket b+1, where cur becomes the previous bucket (with
  -- cur + c = l, at its very start). Without that fallthrough the walk
  -- below stepped down from (b+2)·W one ms at a time: W steps, seconds to
  -- minutes of a busy Redis for a window of an hour to a day.
  local in_this = false
  if cur + c <= l then
    local e = earliest(prev, l - cur - c)
    if e < w then
      t = b * w + math.max(e, 0)
      in_this = true
    end
  end
  if not in_this then
    local e = earliest(cur, l - c)
    if e < w then
      t = (b + 1) * w + math.max(e, 0)
    end
  end
  -- The estimate is exact but for a rounding of r·W beyond 2^53: a step
  -- or two of the predicate corrects it. More than sw_walk_max steps means
  -- a wrong estimate (a bug): the call fails, and its Checks get their
  -- failure mode, rather than Redis stay busy for up to W steps.
  t = math.max(t, now + 1)
  local steps = 0
  while t > now + 1 and sw_admits(b, cur, prev, t - 1, c, w, l) do
    t, steps = t - 1, steps + 1
    if steps > sw_walk_max then
      error('envoy-rls: sliding window retry estimate off by more than ' .. sw_walk_max .. ' ms')
    end
  end
  while not sw_admits(b, cur, prev, t, c, w, l) do
    t, steps = t + 1, steps + 1
    if steps > sw_walk_max then
      error('envoy-rls: sliding window retry estimate off by more than ' .. sw_walk_max .. ' ms')
    end
  end
  return t
end

-- load fills into with the state stored as v (the key's MGET value, false if
-- absent) and returns it.
sliding_window.load = load_windowed

-- decide returns allowed, remaining, reset_ms, retry_ms and, when it admitted
-- and consumed, the new state, written into into (which may be s: s is read
-- in full before into is written). idiv and sw_weight are written out
-- (see load_windowed in lib.lua). With no_retry (figures whose retry the
-- caller drops) a denial's retry is not searched. A state it returns in
-- the bucket of s carries s's bucket and count of the bucket before
-- unchanged, which windowed_store relies on to write only the count.
function sliding_window.decide(s, now, w, l, cap, c, consume, no_retry, into)
  local sb, step = s[1], 0
  if sb * w > now then
    -- The clock went back across a bucket edge since the counter was
    -- written: decide at the start of the stored bucket and add the step
    -- to reset and retry (pkg/algorithm.behind).
    step = sb * w - now
    now = sb * w
  end
  local b = now / w -- idiv(now, w); x - x % 1 is floor(x) without a call
  b = b - b % 1
  if b * w > now then
    b = b - 1
  elseif (b + 1) * w <= now then
    b = b + 1
  end
  local cur, prev = 0, 0
  if sb == b then
    cur, prev = s[2], s[3]
  elseif sb == b - 1 then
    prev = s[2]
  end
  -- pw is sw_weight(prev, now - b * w, w), written out but for counts
  -- beyond 2^53 / W.
  local pw = 0
  if prev ~= 0 then
    if prev * w < exact then
      local x = prev * (w - (now - b * w)) / w -- ceil, without a call
      pw = x - x % 1
      if pw < x then
        pw = pw + 1
      end
    else
      pw = prev - mul_div_floor(prev, now - b * w, w)
    end
  end
  local ok, retry = false, 0
  if c > l then
    retry = w
  elseif cur + pw + c <= l then
    ok = true
    if consume then
      cur = cur + c
    end
  elseif not no_retry then
    retry = sw_retry_at(b, cur, prev, now, c, w, l) - now
  end
  local rem = 0
  if cur + pw < l then
    rem = l - cur - pw
  end
  if retry > 0 then
    retry = retry + step
  end
  if ok and consume then
    into[1], into[2], into[3] = b, cur, prev
    return ok, rem, (b + 1) * w - now + step, retry, into
  end
  return ok, rem, (b + 1) * w - now + step, retry
end

-- store writes state s, decided at now, over a stored state of bucket ob; the
-- key expires 2W after its bucket starts.
sliding_window.store = windowed_store(2)

-- refund takes back c hits admitted at now (Cluster: another slot denied).
function sliding_window.refund(key, w, c, l, now)
  refund_windowed(key, w, c, now)
end
