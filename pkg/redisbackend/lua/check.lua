-- check.lua: decides one or more batches of limit checks, each atomically and
-- all of them in one call. It is the body of the check function of the
-- library (scripts.go): lib.lua, sliding_window.lua, fixed_window.lua,
-- token_bucket.lua, sliding_log.lua and algorithms.lua define the helpers
-- once, and this driver runs per call, either as a registered Redis Function
-- (FCALL) or, concatenated after them, as a script (EVALSHA).
--
-- A call carries G >= 1 groups; a group is the batch of one Check (one Envoy
-- request). Groups are decided one after the other, each seeing what the
-- groups before it wrote, exactly as if each had been a call of its own: the
-- Go side coalesces the Checks of concurrent callers into one call to spare
-- Redis a command, a TIME and a network read and write per Check.
--
-- KEYS     the keys "<prefix>{<id>}" of the counters of every request of
--          every group, in order (keys.go). A counter is one key, whatever
--          its algorithm (see the algorithm files).
-- ARGV[1]  "<alt> <slack>": alt "1" appends the no-consumption figures to
--          every request (see the reply), "0" does not; slack is added to
--          every expiry in ms (0 on Redis TIME; see ttl_slack in lib.lua).
-- then one entry per group, "<n>;<spec>;...;<spec>" or "<n> <now>;<spec>;...":
--          the group's n requests, decided at now ms since the Unix epoch,
--          or when absent at Redis TIME (sec·1000 + floor(usec/1000), read
--          once per call), then after each ';' a request spec "<alg>
--          <window_ms> <limit> <capacity> <hits> <shadow>", six decimal
--          integers separated by one space: alg 0 sliding_window, 1
--          fixed_window, 2 token_bucket, 3 sliding_log; capacity is the
--          burst for a token bucket (the limit otherwise); hits 0 checks
--          without consuming; shadow 1 marks a shadow request. A group's
--          text is parsed once and cached (parse_group in algorithms.lua).
--
-- Reply: one string of little-endian 64-bit integers (pack_ints in lib.lua),
-- per group in order:
--   now (the clock the group was decided at), then per request, in order:
--   decision, reset_ms, retry_ms only when the request was denied, and with
--   alt = 1 also remaining0, reset0: remaining and reset as they are
--   without this group's consumption (the Cluster driver needs them when
--   another slot vetoed the batch and this one is refunded). decision is
--   remaining when the request was allowed and -1 - remaining when it was
--   denied: one integer for two. An admission's retry is 0, so it is left
--   out, and whether the group consumed (no non-shadow request was denied)
--   is not sent: the Go side knows it from the decisions and its requests'
--   shadow flags. Each integer of the reply costs struct.pack about 470
--   instructions (docs/performance.md, "A leaner reply"). A denial's
--   retry_ms is at least 1; the Go side refuses a reply where it is not.
--
-- Semantics of a group (COMMON.md "Batches"): requests are decided in order;
-- a request sees the tentative consumption of earlier requests on the same
-- counter (same key). If a non-shadow request is denied nothing is
-- written and every request reports remaining and reset on the stored state.
-- Otherwise every admitted request with hits > 0 consumes, and remaining and
-- reset are those right after its own decision. Every written key gets its
-- expiry here. A malformed group fails the whole call before anything of it
-- or a later group is written (the Go side validates, so this is a bug
-- guard).
--
-- Three paths decide a call, each in these semantics: the lone group (one
-- Check of distinct string counters), the string counters' path (any other
-- call of string counters) and the general path (sliding logs, the Cluster's
-- figures), each described where it starts below.
--
-- The string counters (windows, token buckets) are read once per call, by
-- one MGET of every key before the first group, carried from group
-- to group as each committed group leaves them, and written once per key
-- after the last group: a key that k groups of the call touch costs one read
-- and one write instead of k of each. (A sliding log is read and written by
-- each group, as its own commands require.)

bind_globals()
local alt = false
if ARGV[1] == '0 0' then
  ttl_slack = 0 -- the production flags, without parsing
else
  local alt_flag, slack = string.match(ARGV[1], '^([01]) (%d+)$')
  if not alt_flag then
    return redis.error_reply('ERR envoy-rls check: malformed ARGV[1]')
  end
  alt = alt_flag == '1'
  ttl_slack = tonumber(slack)
end
local stride = 3
if alt then
  stride = 5
end

-- The lone group: a call of one group of at most lone_max requests, each
-- on a string counter (windows, token buckets) of its own key, without the
-- Cluster's figures, is decided here, by the algorithms' own load, decide
-- and store, without the bookkeeping the paths below keep for groups that
-- share counters (a moderate rate makes every Check a call of its own; this
-- path takes about a fifth off such a call's Redis instructions against the
-- general path, 7% against the string counters' path: docs/performance.md,
-- "The lone group"). The semantics are the general path's, in
-- its order: load every counter, decide each request on its counter, and
-- unless a non-shadow request was denied write every consumed one; if one
-- was, write nothing and report every request's figures on the stored state.
-- Anything else (several groups, a shared key, a sliding log, a malformed
-- spec) goes on to the paths below.
local lone_max = 8
if not alt and #ARGV == 2 and #KEYS <= lone_max then
  local grp = groups[ARGV[2]] or parse_group(ARGV[2])
  local lone = grp and grp.str and grp.n == #KEYS and grp.n >= 1
  if lone then
    -- A counter twice takes the general path's bookkeeping.
    for i = 2, grp.n do
      local key = KEYS[i]
      for k = 1, i - 1 do
        if KEYS[k] == key then
          lone = false
        end
      end
    end
  end
  if lone then
    local n, now = grp.n, grp.now
    local fs, fn, fw, fo = cs.fs, cs.fn, cs.fw, cs.fo
    local vals = rcall('MGET', unpack_list(KEYS))
    if not now then
      now = time_ms()
    end
    local veto = false
    fo[1] = now
    local x = 2 -- the next request's decision in fo
    for i = 1, n do
      local p = grp[i]
      local m, w = p[1], p[2]
      local s, into = fs[i], fn[i]
      if not s then
        s, into = {0, 0, 0, 0}, {0, 0, 0, 0}
        fs[i], fn[i] = s, into
      end
      m.load(KEYS[i], w, now, vals[i], s)
      local ok, rem, reset, retry = m.decide(s, now, w, p[3], p[4], p[8], p[9], false, into)
      fw[i] = ok and p[9]
      fo[x + 1] = reset
      if ok then
        fo[x] = rem
        x = x + 2
      else
        if not p[6] then
          veto = true
        end
        fo[x], fo[x + 2] = -1 - rem, retry
        x = x + 3
      end
    end
    if veto then
      -- As the general path: figures without consumption, on the stored
      -- state (which decide read but did not write).
      local y = 2
      for i = 1, n do
        local p = grp[i]
        local _, rem, reset = p[1].decide(fs[i], now, p[2], p[3], p[4], 1, false, true)
        y = refigure(fo, y, rem, reset)
      end
    else
      for i = 1, n do
        if fw[i] then
          local p = grp[i]
          p[1].store(KEYS[i], p[2], fn[i], fs[i][1], now)
        end
      end
    end
    return pack_some(fo, 1, x - 1)
  end
end

-- The string counters' path: any other call whose requests are all on
-- string counters (the windows, token buckets), without the Cluster's
-- figures (calls of several groups under load, a repeated key, more than
-- lone_max keys), is decided here with less bookkeeping per request than
-- the general path below spends (a table read or write costs Redis about
-- 150 instructions, more than most of the arithmetic; this path takes
-- 12-15% off a Check in calls of 4 and 10: docs/performance.md, "The
-- string counters' path"). Anything else (a sliding log, alt, a malformed
-- group, more than lean_max keys) goes on to the general path, which finds
-- everything as it was: the groups are checked before anything is read,
-- and this path writes nothing before every group is decided, so it can
-- still give up at a group with more requests than keys are left. The
-- semantics are the general path's: each group is decided in order on the
-- counters as the groups before it left them, a request sees the tentative
-- consumption of the group's earlier requests on its key, a denied
-- non-shadow request vetoes the group (nothing of it is written, and every
-- request reports its figures on the state the group found), and every
-- counter is read once (one MGET of KEYS, a repeated key included) and
-- written once, after the last group.
--
-- A counter is known by the position j of its first request in KEYS, found
-- by scanning KEYS in a call of up to lean_scan keys and through pos[key]
-- = j above that. By j: lst the state as committed so far, lsc the scratch
-- decide writes a tentative state into (a committing group swaps the two), ltag
-- the group whose tentative state lsc[j] holds (groups are numbered across
-- calls, cs.g, so the tag needs no reset), lsb0 the first integer of the
-- state as stored (store keeps a window's expiry within its bucket), lspec
-- the spec of the first request on the key (its module and window are part
-- of the key), lwnow the clock of the key's last committed write and
-- lwcall the call (cs.calls) it was made in. ltouch lists the keys a group
-- consumed, lwrit those the call's groups committed. The last group is not
-- committed but written from its scratch, at its clock fin.
local lean_max = 1000 -- keys that one MGET reads (unpack's stack)
local lean_scan = 8 -- keys up to which scanning KEYS costs less than pos
local strings = not alt and #KEYS >= 1 and #KEYS <= lean_max
local gs = cs.gs -- the call's parsed groups, by their index in ARGV
if strings then
  -- Every group must parse and be of string counters: a call with a
  -- sliding log goes to the general path before this one reads anything
  -- (it read every counter with an MGET of its own and gave up at the
  -- log's group, about a tenth of a lone log Check).
  for a = 2, #ARGV do
    local grp = groups[ARGV[a]] or parse_group(ARGV[a])
    if not grp or not grp.str then
      strings = false
      break
    end
    gs[a] = grp
  end
end
if strings then
  local nk, na = #KEYS, #ARGV
  -- pos and ckey are the general path's (cs.pos, cs.key), emptied the same
  -- way: at the start of a call, of the keys the last call entered. cs.n
  -- is set to nk at once, so a call that fails half-way leaves its keys to
  -- the next call's emptying (an index beyond those entered names a key an
  -- earlier call entered, whose entry is gone or goes now, or none).
  local pos, ckey, nd = cs.pos, cs.key, 0
  local scan = nk <= lean_scan
  if not scan then
    for j = 1, cs.n do
      local key = ckey[j]
      if key then
        pos[key] = nil
      end
    end
    cs.n = nk
  end
  local lst, lsc, ltag, lsb0 = cs.lst, cs.lsc, cs.ltag, cs.lsb0
  local lspec, lwnow, ltouch, lwrit, fo = cs.lspec, cs.lwnow, cs.ltouch, cs.lwrit, cs.fo
  local vals = rcall('MGET', unpack_list(KEYS))
  -- The call's number and its groups' are taken before anything else can
  -- fail: a call that fails half-way leaves tags no later call reads as
  -- its own (a call has fewer groups than ARGV entries).
  local lwcall, call, g = cs.lwcall, cs.calls + 1, cs.g
  cs.calls, cs.g = call, g + na
  local o, a, k0, nw, nt = 0, 2, 0, 0, 0
  local lean, tnow, fin = true, nil, nil
  while a <= na do
    local grp = gs[a]
    if k0 + grp.n > nk then
      lean = false
      break
    end
    local n, now = grp.n, grp.now
    if not now then
      if not tnow then
        tnow = time_ms()
      end
      now = tnow
    end
    g = g + 1
    local veto = false
    nt = 0
    fo[o + 1] = now
    local x = o + 2 -- the next request's decision in fo
    for i = 1, n do
      local p = grp[i]
      local m, w, k = p[1], p[2], k0 + i
      local key = KEYS[k]
      local j = k
      if scan then
        for q = 1, k - 1 do
          if KEYS[q] == key then
            j = q
            break
          end
        end
      else
        local f = pos[key]
        if f then
          j = f
        else
          pos[key] = k
          nd = nd + 1
          ckey[nd] = key
        end
      end
      local s
      if j < k then
        if ltag[j] == g then
          s = lsc[j]
        else
          s = lst[j]
        end
      else
        s = lst[k]
        if not s then
          s = {0, 0, 0, 0}
          lst[k] = s
        end
        m.load(key, w, now, vals[k], s)
        lsb0[k], lspec[k] = s[1], p
      end
      local into = lsc[j]
      if not into then
        into = {0, 0, 0, 0}
        lsc[j] = into
      end
      local ok, rem, reset, retry = m.decide(s, now, w, p[3], p[4], p[8], p[9], false, into)
      fo[x + 1] = reset
      if ok then
        if p[9] and (j == k or ltag[j] ~= g) then
          ltag[j] = g
          nt = nt + 1
          ltouch[nt] = j
        end
        fo[x] = rem
        x = x + 2
      else
        fo[x], fo[x + 2] = -1 - rem, retry
        x = x + 3
        if not p[6] then
          veto = true
        end
      end
    end
    if veto then
      -- Figures without consumption, on the state the group found, as the
      -- general path reports them.
      local y = o + 2
      for i = 1, n do
        local p = grp[i]
        local key = KEYS[k0 + i]
        local j
        if scan then
          for q = 1, k0 + i do
            if KEYS[q] == key then
              j = q
              break
            end
          end
        else
          j = pos[key]
        end
        local _, rem, reset = p[1].decide(lst[j], now, p[2], p[3], p[4], 1, false, true)
        y = refigure(fo, y, rem, reset)
      end
    elseif a == na then
      -- The last group's consumption is written from the scratch
      -- (below), not committed first.
      fin = now
    else
      for y = 1, nt do
        local j = ltouch[y]
        lst[j], lsc[j] = lsc[j], lst[j]
        if lwcall[j] ~= call then
          lwcall[j] = call
          nw = nw + 1
          lwrit[nw] = j
        end
        lwnow[j] = now
      end
    end
    o = x - 1
    a = a + 1
    k0 = k0 + n
  end
  if lean and k0 == nk then
    for y = 1, nw do
      local j = lwrit[y]
      if not fin or ltag[j] ~= g then -- else the last group writes it
        local p = lspec[j]
        p[1].store(KEYS[j], p[2], lst[j], lsb0[j], lwnow[j])
      end
    end
    if fin then
      for y = 1, nt do
        local j = ltouch[y]
        local p = lspec[j]
        p[1].store(KEYS[j], p[2], lsc[j], lsb0[j], fin)
      end
    end
    return pack_ints(fo, o)
  end
end

local time_now = nil -- Redis TIME in ms, read at most once per call
-- The reply has 1 integer per group and at most stride per request: the
-- groups are the ARGV entries after ARGV[1]. Built in a table of that size
-- from the start (a table that grows is reallocated at every power of two).
local out = presized(#ARGV - 1 + stride * #KEYS)
local o = 0 -- the last index written in out
local a = 2 -- the index in ARGV of the next group header
local k0 = 0 -- the index in KEYS before the next group's first key
-- Scratch (cs, algorithms.lua) that outlives the call as a Function. The
-- call's distinct keys get an index j: cs.pos[key] = j, cs.key[j] = key.
-- By j: raw the MGET value (false if absent), st the state as the groups
-- committed so far leave it (false until a group reads it), sb0 the first
-- integer of the state as stored (a window's bucket: it decides whether the
-- final write keeps the key's expiry), slot the position in the current
-- group of its first request on the key (false outside it), and wspec, wnow
-- the parsed spec (its module and window: they are part of the key) and the
-- clock of the key's last committed write (wspec false while unwritten).
-- wlist[1..nw] are the written keys' indexes. By position in KEYS: idx, the
-- key's j. By position i in the current group (whose parsed specs are
-- grp[i]): first the position of the group's first request on the same
-- counter, orig the state
-- the group found, cur the group's tentative state (false while untouched).
-- Every entry of these is written before it is read in a call; cs.pos, the
-- one table looked up by key, is emptied first (a call that failed left it
-- full).
--
-- The string counters' state tables are reused too, as a Function from call
-- to call (their contents are not: load and decide fill them before they are
-- read), each with room for four entries (a token bucket's decide writes a
-- fourth); there are as many as the largest call had distinct keys and
-- requests, which --redis.max-batch bounds (256 limits by default; a larger
-- Check is a call of its own, bounded by the request's descriptors and their
-- rules' limits). kst[j] is key j's
-- (load fills it; st[j] is it once loaded), and sst[i] is position i's
-- scratch, which decide fills with the tentative state (cur[i] is it once
-- filled). A group that commits swaps the two, so the key's table holds its
-- new state and the position gets the old one to fill next time; the
-- tables stay distinct, so no state is written over while it is read but
-- by decide, which reads its state in full before it writes.
local pos, ckey, raw, st, sb0, kslot = cs.pos, cs.key, cs.raw, cs.st, cs.sb0, cs.slot
local wspec, wnow, wlist, idx = cs.wspec, cs.wnow, cs.wlist, cs.idx
local first, orig, cur = cs.first, cs.orig, cs.cur
local kst, sst = cs.kst, cs.sst
local nw = 0
do
  for j = 1, cs.n do
    local key = ckey[j]
    if key then -- (the string counters' path may count more than it entered)
      pos[key] = nil
    end
  end
  local nd = 0
  for i = 1, #KEYS do
    local key = KEYS[i]
    local j = pos[key]
    if not j then
      nd = nd + 1
      j = nd
      pos[key], ckey[j] = j, key
      st[j], kslot[j], wspec[j] = false, false, false
    end
    idx[i] = j
  end
  cs.n = nd
  for i = 1, nd, 1000 do
    local e = math.min(i + 999, nd)
    local vals = rcall('MGET', unpack_list(ckey, i, e))
    for j = i, e do
      raw[j] = vals[j - i + 1]
    end
  end
end

while a <= #ARGV do
  -- The group: "<n>;<spec>;...", on Redis TIME, or "<n> <now>;...".
  local grp, bad = groups[ARGV[a]], nil
  if not grp then
    grp, bad = parse_group(ARGV[a])
  end
  if not grp then
    return redis.error_reply('ERR envoy-rls check: malformed ' .. (bad == 'spec' and 'request spec' or 'group header') .. ' in ARGV[' .. a .. ']')
  end
  local n, now = grp.n, grp.now
  if k0 + n > #KEYS then
    return redis.error_reply('ERR envoy-rls check: group at ARGV[' .. a .. '] has more requests than keys are left')
  end
  if not now then
    if not time_now then
      time_now = time_ms()
    end
    now = time_now
  end

  -- Parse the specs; find each request's counter, the first request of
  -- the group on the same key (the counter's slot: first[i]), and its state
  -- as the groups before left it.
  for i = 1, n do
    local p = grp[i]
    local j = idx[k0 + i]
    local f = kslot[j]
    if not f then
      f = i
      kslot[j] = i
      cur[i] = false
      local m = p[1]
      if m.string_state then
        local s = st[j]
        if not s then
          s = kst[j]
          if not s then
            s = {0, 0, 0, 0}
            kst[j] = s
          end
          m.load(ckey[j], p[2], now, raw[j], s)
          st[j], sb0[j] = s, s[1]
        end
        orig[i] = s
      else
        orig[i] = m.load(ckey[j], p[2], now, false)
      end
    end
    first[i] = f
  end

  local veto = false
  out[o + 1] = now
  local x = o + 2 -- the next request's decision in out
  for i = 1, n do
    local p, f = grp[i], first[i]
    local s = cur[f] or orig[f]
    local into = sst[f]
    if not into then
      into = {0, 0, 0, 0}
      sst[f] = into
    end
    local ok, rem, reset, retry, ns = p[1].decide(s, now, p[2], p[3], p[4], p[8], p[9], false, into)
    if ok and p[9] then
      cur[f] = ns
    end
    out[x + 1] = reset
    if ok then
      out[x] = rem
      x = x + 2
    else
      if not p[6] then
        veto = true
      end
      out[x], out[x + 2] = -1 - rem, retry
      x = x + 3
    end
    if alt then
      x = x + 2 -- remaining0, reset0: written below
    end
  end

  if veto or alt then
    -- Figures without consumption: a check of one hit on the stored state.
    -- Its retry is dropped, so no_retry spares the algorithms whose retry
    -- is a search (sliding window, sliding log) the search.
    local y = o + 2
    for i = 1, n do
      local p = grp[i]
      local _, rem, reset = p[1].decide(orig[first[i]], now, p[2], p[3], p[4], 1, false, true)
      local z = y + 2 -- after the decision and reset, and the retry if any
      if veto then
        z = refigure(out, y, rem, reset)
      elseif out[y] < 0 then
        z = z + 1
      end
      if alt then
        out[z], out[z + 1] = rem, reset
        z = z + 2
      end
      y = z
    end
  end

  for i = 1, n do
    local j = idx[k0 + i]
    if not veto and first[i] == i and cur[i] then
      local p = grp[i]
      local m = p[1]
      if m.string_state then
        local s = cur[i]
        kst[j], sst[i], st[j] = s, st[j], s
        if not wspec[j] then
          nw = nw + 1
          wlist[nw] = j
        end
        wspec[j], wnow[j] = p, now
      else
        m.store(ckey[j], p[2], cur[i], orig[i], now)
      end
    end
    kslot[j] = false
  end
  o = x - 1
  a = a + 1
  k0 = k0 + n
end
if k0 ~= #KEYS then
  return redis.error_reply('ERR envoy-rls check: ' .. #KEYS .. ' keys for ' .. k0 .. ' requests')
end
for x = 1, nw do
  local j = wlist[x]
  local p = wspec[j]
  p[1].store(ckey[j], p[2], st[j], sb0[j], wnow[j])
end
return pack_ints(out, o)
