-- algorithms.lua: the algorithm modules by the number the drivers receive
-- (check.lua and refund.lua: 0 sliding_window, 1 fixed_window, 2 token_bucket,
-- 3 sliding_log), the parser of check.lua's request specs, and check.lua's
-- scratch tables. Concatenated after the four algorithm files. KEYS, ARGV:
-- none. Reply: none.

local algs = {[0] = sliding_window, [1] = fixed_window, [2] = token_bucket, [3] = sliding_log}

-- parse_spec returns the parsed request spec "<alg> <window_ms> <limit>
-- <capacity> <hits> <shadow>" as {module, window, limit, capacity, hits,
-- shadow, string_state (the module's, looked up once), c, consume}, or nil
-- if it is malformed or names an unknown algorithm. c and consume are what
-- decide is given: the hits, or 1 for a check without consumption (hits 0),
-- and whether the request consumes (hits > 0), worked out here once rather
-- than for every request. Parsing costs a pattern match and five strtod
-- calls, more than a limit's own arithmetic: it runs only when a group's
-- text is not in the cache below.
local function parse_spec(text)
  local a, w, l, cap, h, sh = string.match(text, '^(%d) (%d+) (%d+) (%d+) (%d+) ([01])$')
  if not a then
    return nil
  end
  local m = algs[tonumber(a)]
  if not m then
    return nil
  end
  h = tonumber(h)
  local c = h
  if h == 0 then
    c = 1
  end
  return {m, tonumber(w), tonumber(l), tonumber(cap), h, sh == '1', m.string_state == true, c, h > 0}
end

-- groups caches parsed groups by their text, check.lua's ARGV[2..]:
-- "<n>;<spec>;...;<spec>", a group's count and its n request specs, or
-- "<n> <now>;..." with the caller's clock (tests), which is parsed at every
-- call and not cached. A group's text depends only on its rules and hits, so
-- few distinct ones recur; a hit spares the parse of the count and every
-- spec, and one ARGV entry per group instead of 1 + n spares Redis a Lua
-- string and an array slot per spec (docs/performance.md, "One ARGV entry
-- per group"). As a Redis Function the library's locals live as long as the
-- library, so the cache persists across calls (as a script it lives for one
-- call). The entry is {p1, ..., pn} (the parsed specs) with n, now (nil on
-- Redis TIME) and str (every spec's algorithm keeps a string state). The
-- table is shared: callers must not modify it. Emptied at group_cache_max
-- entries, which bounds its memory.
local groups, group_count, group_cache_max = {}, 0, 4096

-- parse_group returns the parsed group of text, or nil and what is
-- malformed: 'header' (the count, the clock, or a count that is not the
-- number of specs) or 'spec'.
local function parse_group(text)
  local g = groups[text]
  if g then
    return g
  end
  local n, now, rest = string.match(text, '^(%d+) ?(%d*)(.*)$')
  if not n or (rest ~= '' and string.sub(rest, 1, 1) ~= ';') then
    return nil, 'header'
  end
  g = {n = tonumber(n), str = true}
  local i = 0
  for part in string.gmatch(rest, ';([^;]*)') do
    local p = parse_spec(part)
    if not p then
      return nil, 'spec'
    end
    i = i + 1
    g[i] = p
    g.str = g.str and p[7]
  end
  if i ~= g.n then
    return nil, 'header'
  end
  if now ~= '' then
    g.now = tonumber(now)
    return g
  end
  if group_count >= group_cache_max then
    groups, group_count = {}, 0
  end
  groups[text] = g
  group_count = group_count + 1
  return g
end

-- cs is check.lua's scratch (described there): tables reused by every call
-- of a Function, instead of built and grown per call. n is the number of
-- distinct keys of the last call, whose cs.pos entries the next call clears.
local cs = {
  n = 0, pos = {}, key = {}, raw = {}, st = {}, sb0 = {}, slot = {},
  wspec = {}, wnow = {}, wlist = {}, idx = {},
  first = {}, orig = {}, cur = {}, kst = {}, sst = {},
  -- The lone group's path (check.lua): by position, the state as loaded,
  -- decide's scratch, whether it is written.
  fs = {}, fn = {}, fw = {},
  -- The string counters' path (check.lua): the call's parsed groups by
  -- their index in ARGV (gs), the last numbers given to a group (g) and to
  -- a call (calls), then the tables by a key's first position and the
  -- lists. fo: the reply's integers, of both paths.
  gs = {},
  g = 0, calls = 0, lst = {}, lsc = {}, ltag = {}, lsb0 = {},
  lspec = {}, lwnow = {}, lwcall = {}, ltouch = {}, lwrit = {}, fo = {},
}
