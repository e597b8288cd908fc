-- token_bucket.lua: GCRA in exact integer ticks, the Lua twin of
-- pkg/algorithm.TokenBucket. Part of check.lua / refund.lua (concatenated after
-- lib.lua).
--
-- Time is counted in ticks of 1/L ms, so one hit costs W ticks and the
-- tolerance is tau = B·W ticks. The theoretical arrival time is At + Debt/Per
-- ms, where Per is the limit L the debt was counted with (L is not part of the
-- counter's identity; a changed L rescales the debt, rounding up).
--
-- Storage: the counter's key holds At, Debt and Per (three integers, see
-- state_format in lib.lua) and expires when the bucket is full again,
-- ceil(Debt/Per) ms after At; a refund that empties it deletes it. KEYS,
-- ARGV: none of its own; the driver passes the key. State table (filled in
-- a table the driver passes, see state_format in lib.lua): {at, debt, per},
-- and in a state decide made, its reset (ceil(Debt/Per), At being the
-- instant it decided at) as a fourth entry, which store uses as the expiry.
--
-- Exactness: B·W < 2^53 (checked in Go). Rescaling after a change of L is
-- exact while (Debt mod Per)·L < 2^53; beyond it (limits near 2^53 per
-- window), it takes 2 ticks more than the exact debt, so it may deny where
-- pkg/algorithm admits by those 2 ticks but never admits where it denies.
-- Every figure is exact while the debt at now (rel, in ticks) is below
-- 2^53, which it always is but after the clock stepped back (rel = Debt +
-- (At − now)·L) or L grew; beyond it, the decision still is (rel > B·W:
-- denied), Reset and Retry-After may be a millisecond off (pkg/algorithm
-- computes them at full width).

local token_bucket = {string_state = true} -- read with MGET

-- tb_debt is the debt at now in ticks of 1/l ms.
local function tb_debt(s, now, l)
  local at, debt, per = s[1], s[2], s[3]
  if debt == 0 then
    return 0
  end
  if per ~= l and per ~= 0 then
    local q = idiv(debt, per)
    local p = (debt - q * per) * l
    debt = q * l + cdiv(p, per)
    if p >= exact then
      -- p is rounded (a limit near 2^53 per window, changed): cdiv's result
      -- may be up to 2 ticks short of ceil(Debt·L/Per), which
      -- pkg/algorithm computes exactly. 2 more keep the debt at least the
      -- exact one: a rounding may deny a tick early, never admit one.
      debt = debt + 2
    end
  end
  if now < at then
    return debt + (at - now) * l
  end
  local paid = (now - at) * l
  if paid >= debt then
    return 0
  end
  return debt - paid
end

-- load fills into with the state stored as v (the key's MGET value, false if
-- absent) and returns it, if its last write is no more than ahead_max ahead
-- of now and its debt and rate are exact, else with the empty state {-1, 0,
-- 0} (a foreign value: see load_windowed in lib.lua). Load, decide and store
-- run for every token bucket of every call, so they write out their helpers
-- (idiv, cdiv, tb_debt but for a changed limit, pack_state, px), as the
-- windows do: a Lua function call costs Redis more than the arithmetic (see
-- load_windowed in lib.lua).
function token_bucket.load(key, w, now, v, into)
  if v and #v == 24 then
    local x, y, z = unpack_state(state_format, v)
    if x >= 0 and y >= 0 and z >= 0 and x <= now + ahead_max and y < exact and z < exact then
      into[1], into[2], into[3] = x, y, z
      return into
    end
  end
  into[1], into[2], into[3] = -1, 0, 0
  return into
end

-- decide returns allowed, remaining, reset_ms, retry_ms and, when it admitted
-- and consumed, the new state, written into into (which may be s: s is read
-- in full before into is written).
function token_bucket.decide(s, now, w, l, cap, c, consume, no_retry, into)
  local tau, cw = cap * w, c * w
  -- rel = tb_debt(s, now, l), written out when the debt was counted with l.
  local rel, debt = 0, s[2]
  if debt ~= 0 then
    if s[3] ~= l then
      rel = tb_debt(s, now, l)
    elseif now < s[1] then
      rel = debt + (s[1] - now) * l
    else
      rel = debt - (now - s[1]) * l
      if rel < 0 then
        rel = 0
      end
    end
  end
  local ok, retry = false, 0
  if c > cap then
    retry = w
  elseif rel <= tau and cw <= tau - rel then
    ok = true
    if consume then
      rel = rel + cw
    end
  else
    -- ceil((rel + cw - tau) / l), with tau - rel first: rel + cw may pass
    -- 2^53 and round (B·W just below it), tau - rel and the difference
    -- (at most max(cw, rel)) are exact while rel is.
    retry = cdiv(cw - (tau - rel), l)
  end
  local rem = 0
  if rel < tau then
    local d = tau - rel -- rem = idiv(d, w); x - x % 1 is floor(x) without a call
    rem = d / w
    rem = rem - rem % 1
    if rem * w > d then
      rem = rem - 1
    elseif (rem + 1) * w <= d then
      rem = rem + 1
    end
  end
  local reset = 0
  if rel > 0 then -- reset = cdiv(rel, l)
    reset = rel / l
    reset = reset - reset % 1
    if reset * l > rel then
      reset = reset - 1
    elseif (reset + 1) * l <= rel then
      reset = reset + 1
    end
    if reset * l < rel then
      reset = reset + 1
    end
  end
  if ok and consume then
    into[1], into[2], into[3], into[4] = now, rel, l, reset
    return ok, rem, reset, retry, into
  end
  return ok, rem, reset, retry
end

-- store writes state s, which decide made at now (the stored state's first
-- integer, ob, is not needed): the key expires when the bucket is full
-- again, s[4] ms from now (at least 1, since decide consumed).
function token_bucket.store(key, w, s, ob, now)
  rcall('SET', key, pack(state_format, s[1], s[2], s[3]), 'PX', format('%d', s[4] + ttl_slack))
end

-- refund takes back c hits admitted at now with limit l (Cluster: another
-- slot denied): c·W ticks of 1/l ms, converted to the stored unit rounding
-- down, less what the bucket has refilled since now. The stored debt is that
-- of its last write at At; if At is later than now, the refill of At − now
-- ms may already have paid off part or all of those hits' debt (the key may
-- even have expired and been written anew), and taking them back in full
-- would erase hits admitted since: the bucket would then admit its burst
-- plus that refill. Without the refill's part the debt stays at least what
-- every other admitted hit left, so a refund never returns more than was
-- taken: under-admission for a moment at worst, never over-admission.
function token_bucket.refund(key, w, c, l, now)
  local s = token_bucket.load(key, w, now, redis.call('GET', key), {})
  local at, debt, per = s[1], s[2], s[3]
  if debt == 0 or per == 0 then
    return
  end
  local ticks = c * w
  if per ~= l then
    ticks = idiv(ticks * per, l)
  end
  if at > now then
    ticks = ticks - (at - now) * per
    if ticks <= 0 then
      return
    end
  end
  debt = math.max(0, debt - ticks)
  if debt == 0 then
    redis.call('DEL', key)
  else
    redis.call('SET', key, pack_state({at, debt, per}), 'KEEPTTL')
  end
end
