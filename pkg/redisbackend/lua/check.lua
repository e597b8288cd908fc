-- check.lua: decides one batch of limit checks atomically. It is the body of
-- the check function of the library (scripts.go): lib.lua, sliding_window.lua,
-- fixed_window.lua, token_bucket.lua, sliding_log.lua and algorithms.lua
-- define the helpers once, and this driver runs per call, either as a
-- registered Redis Function (FCALL) or, concatenated after them, as a script
-- (EVALSHA).
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
local alt = false
if ARGV[2] == '0 0' then
  ttl_slack = 0 -- the production flags, without parsing
else
  local alt_flag, slack = string.match(ARGV[2], '^([01]) (%d+)$')
  if not alt_flag then
    return redis.error_reply('ERR envoy-rls check: malformed ARGV[2]')
  end
  alt = alt_flag == '1'
  ttl_slack = tonumber(slack)
end

local n = #KEYS
local orig = {}   -- base -> state as stored
local cur = {}    -- base -> tentative state within this batch
local dirty = {}  -- base, module, window of each counter to write, flat, first use order
-- The reply, sized in its constructor for up to four requests without the
-- alt figures (a table that grows is rehashed at every power of two).
local out
if alt or n > 4 then
  out = {now, 0}
elseif n == 1 then
  out = {now, 0, 0, 0, 0, 0}
elseif n == 2 then
  out = {now, 0, 0, 0, 0, 0, 0, 0, 0, 0}
elseif n == 3 then
  out = {now, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
else
  out = {now, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
end
local veto = false
local stride = 4
if alt then
  stride = 6
end

for i = 1, n do
  local p = parse_spec(ARGV[2 + i])
  if not p then
    return redis.error_reply('ERR envoy-rls check: malformed request ' .. i)
  end
  local m, w, l, cap, h = p[1], p[2], p[3], p[4], p[5]
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
    if cur[base] == orig[base] then
      local d = #dirty
      dirty[d + 1], dirty[d + 2], dirty[d + 3] = base, m, w
    end
    cur[base] = ns
  end
  if not ok and not p[6] then
    veto = true
  end
  local allowed = 0
  if ok then
    allowed = 1
  end
  local j = 2 + (i - 1) * stride
  out[j + 1], out[j + 2], out[j + 3], out[j + 4] = allowed, rem, reset, retry
  if alt then
    out[j + 5], out[j + 6] = rem, reset
  end
end

if veto or alt then
  -- Figures without consumption: a check of one hit on the stored state.
  for i = 1, n do
    local p = parse_spec(ARGV[2 + i])
    local _, rem, reset = p[1].decide(orig[KEYS[i]], now, p[2], p[3], p[4], 1, false)
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
  for d = 1, #dirty, 3 do
    local base = dirty[d]
    dirty[d + 1].store(base, dirty[d + 2], cur[base], now, orig[base])
  end
  out[2] = 1
end
return out
