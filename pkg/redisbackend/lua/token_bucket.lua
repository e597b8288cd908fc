-- token_bucket.lua: GCRA in exact integer ticks, the Lua twin of
-- pkg/algorithm.TokenBucket. Part of check.lua / refund.lua (concatenated after
-- lib.lua).
--
-- Time is counted in ticks of 1/L ms, so one hit costs W ticks and the
-- tolerance is tau = B·W ticks. The theoretical arrival time is At + Debt/Per
-- ms, where Per is the limit L the debt was counted with (L is not part of the
-- counter's identity; a changed L rescales the debt, rounding up).
--
-- Storage: <base>:tb holds "<At> <Debt> <Per>" (three decimal integers) and
-- expires when the bucket is full again, ceil(Debt/Per) ms after At; a full
-- bucket is deleted. KEYS, ARGV: none of its own; the driver passes the key
-- base <prefix>{<id>}. State table: {at, debt, per}.
--
-- Exactness: B·W < 2^53 (checked in Go). Rescaling after a change of L is
-- exact while (Debt mod Per)·L < 2^53.

local token_bucket = {}

local function tb_key(base)
  return base .. ':tb'
end

-- tb_debt is the debt at now in ticks of 1/l ms.
local function tb_debt(s, now, l)
  if s.debt == 0 then
    return 0
  end
  local debt = s.debt
  if s.per ~= l and s.per ~= 0 then
    local q = idiv(debt, s.per)
    debt = q * l + cdiv((debt - q * s.per) * l, s.per)
  end
  if now < s.at then
    return debt + (s.at - now) * l
  end
  local paid = (now - s.at) * l
  if paid >= debt then
    return 0
  end
  return debt - paid
end

-- tb_state parses the stored value v (false when the key is absent).
local function tb_state(v)
  if not v then
    return {at = 0, debt = 0, per = 0}
  end
  local at, debt, per = string.match(v, '^(%d+) (%d+) (%d+)$')
  if not at then
    return {at = 0, debt = 0, per = 0}
  end
  return {at = tonumber(at), debt = tonumber(debt), per = tonumber(per)}
end

-- keys and load: as sliding_window's, with the one key <base>:tb.
function token_bucket.keys(base, w, now, ks)
  ks[#ks + 1] = tb_key(base)
end

function token_bucket.load(base, w, now, ks, vals, i)
  return tb_state(vals[i])
end

-- decide returns allowed, remaining, reset_ms, retry_ms and the new state.
function token_bucket.decide(s, now, w, l, cap, c, consume)
  local tau = cap * w
  local rel = tb_debt(s, now, l)
  local ok, retry = false, 0
  if c > cap then
    retry = w
  elseif rel <= tau and c * w <= tau - rel then
    ok = true
    if consume then
      rel = rel + c * w
    end
  else
    retry = cdiv(rel + c * w - tau, l)
  end
  local rem = 0
  if rel < tau then
    rem = idiv(tau - rel, w)
  end
  local ns = {at = 0, debt = 0, per = 0}
  if rel ~= 0 then
    ns = {at = now, debt = rel, per = l}
  end
  return ok, rem, cdiv(rel, l), retry, ns
end

function token_bucket.store(base, w, s, now)
  if s.debt == 0 then
    redis.call('DEL', tb_key(base))
    return
  end
  local ms = s.at + cdiv(s.debt, s.per) - now
  if ms <= 0 then
    redis.call('DEL', tb_key(base))
    return
  end
  redis.call('SET', tb_key(base), string.format('%d %d %d', s.at, s.debt, s.per), 'PX', px(ms))
end

-- refund takes back c hits admitted at now with limit l (Cluster: another
-- slot denied): c·W ticks of 1/l ms, converted to the stored unit rounding
-- down, so a refund never returns more than was taken.
function token_bucket.refund(base, w, c, l, now)
  local s = tb_state(redis.call('GET', tb_key(base)))
  if s.debt == 0 or s.per == 0 then
    return
  end
  local ticks = c * w
  if s.per ~= l then
    ticks = idiv(ticks * s.per, l)
  end
  local debt = math.max(0, s.debt - ticks)
  if debt == 0 then
    redis.call('DEL', tb_key(base))
  else
    redis.call('SET', tb_key(base), string.format('%d %d %d', s.at, debt, s.per), 'KEEPTTL')
  end
end
