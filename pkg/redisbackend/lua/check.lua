-- check.lua: decides one batch of limit checks atomically. The script sent to
-- Redis is lib.lua, sliding_window.lua, fixed_window.lua, token_bucket.lua,
-- sliding_log.lua and this driver, concatenated (scripts.go).
--
-- KEYS[i]  the key base "<prefix>{<id>}" of request i (i = 1..n). The
--          algorithm appends its suffix (":<bucket>", ":tb", ":log"); the
--          suffixed keys share the {<id>} hash tag and so the slot of the
--          declared base key.
-- ARGV[1]  now in ms since the Unix epoch, or "" to use Redis TIME
--          (sec·1000 + floor(usec/1000)).
-- ARGV[2]  "<alt> <slack>": alt "1" appends the no-consumption figures to
--          every request (see the reply), "0" does not; slack is added to
--          every expiry in ms (0 on Redis TIME; see ttl_slack in lib.lua).
-- ARGV[2+i] request i: "<alg> <window_ms> <limit> <capacity> <hits> <shadow>",
--          six decimal integers separated by one space: alg 0 sliding_window,
--          1 fixed_window, 2 token_bucket, 3 sliding_log; capacity is the
--          burst for a token bucket (the limit otherwise); hits 0 checks
--          without consuming; shadow 1 marks a shadow request.
--
-- Reply: a flat array of integers:
--   [1] now (the clock the batch was decided at)
--   [2] 1 if the batch consumed (no non-shadow request was denied), else 0
--   then per request i, in order: allowed (0/1), remaining, reset_ms,
--   retry_ms, and with alt = 1 also remaining0, reset0: remaining and
--   reset as they are without this batch's consumption (the Cluster driver
--   needs them when another slot vetoed the batch and this one is refunded).
--
-- Semantics (COMMON.md "Batches"): requests are decided in order; a request
-- sees the tentative consumption of earlier requests on the same counter
-- (same key base). If a non-shadow request is denied nothing is written and
-- every request reports remaining and reset on the stored state. Otherwise
-- every admitted request with hits > 0 consumes, and remaining and reset are
-- those right after its own decision. Every written key gets its expiry here.

local now
if ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local alt_flag, slack = string.match(ARGV[2], '^([01]) (%d+)$')
if not alt_flag then
  return redis.error_reply('ERR envoy-rls check: malformed ARGV[2]')
end
local alt = alt_flag == '1'
ttl_slack = tonumber(slack)

local algs = {[0] = sliding_window, [1] = fixed_window, [2] = token_bucket, [3] = sliding_log}

local n = #KEYS
local orig = {}   -- base -> state as stored
local cur = {}    -- base -> tentative state within this batch
local dirty = {}  -- list of {base, module, window} to write, first use order
local seen = {}   -- base -> true once in dirty
local req = {}    -- per request: {module, base, w, l, cap, c}
local out = {now, 0}
local veto = false

for i = 1, n do
  local a, w, l, cap, h, sh = string.match(ARGV[2 + i], '^(%d) (%d+) (%d+) (%d+) (%d+) ([01])$')
  if not a then
    return redis.error_reply('ERR envoy-rls check: malformed request ' .. i)
  end
  local m = algs[tonumber(a)]
  if not m then
    return redis.error_reply('ERR envoy-rls check: unknown algorithm ' .. a)
  end
  w, l, cap, h = tonumber(w), tonumber(l), tonumber(cap), tonumber(h)
  local base = KEYS[i]
  local s = cur[base]
  if s == nil then
    s = m.load(base, w, now)
    orig[base] = s
    cur[base] = s
  end
  local c, consume = h, h > 0
  if h == 0 then
    c = 1
  end
  local ok, rem, reset, retry, ns = m.decide(s, now, w, l, cap, c, consume)
  if ok and consume then
    cur[base] = ns
    if not seen[base] then
      seen[base] = true
      dirty[#dirty + 1] = {base, m, w}
    end
  end
  if not ok and sh == '0' then
    veto = true
  end
  req[i] = {m, base, w, l, cap}
  local allowed = 0
  if ok then
    allowed = 1
  end
  local j = #out
  out[j + 1], out[j + 2], out[j + 3], out[j + 4] = allowed, rem, reset, retry
  if alt then
    out[j + 5], out[j + 6] = rem, reset
  end
end

local stride = 4
if alt then
  stride = 6
end

if veto or alt then
  -- Figures without consumption: a check of one hit on the stored state.
  for i = 1, n do
    local r = req[i]
    local _, rem, reset = r[1].decide(orig[r[2]], now, r[3], r[4], r[5], 1, false)
    local j = 2 + (i - 1) * stride
    if veto then
      out[j + 2], out[j + 3] = rem, reset
    end
    if alt then
      out[j + 5], out[j + 6] = rem, reset
    end
  end
end

if not veto then
  for _, d in ipairs(dirty) do
    d[2].store(d[1], d[3], cur[d[1]], now)
  end
  out[2] = 1
end
return out
