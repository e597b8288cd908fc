package descriptors

import "strings"

// glob is a precompiled wildcard pattern: '*' matches any run of
// characters, including none; every other byte matches itself. Matching
// never allocates.
type glob struct {
	prefix, suffix string
	middle         []string // non-empty literal parts between stars, in order
	minLen         int
}

// compileGlob compiles pattern, which contains at least one '*'.
func compileGlob(pattern string) glob {
	parts := strings.Split(pattern, "*")
	g := glob{prefix: parts[0], suffix: parts[len(parts)-1]}
	g.minLen = len(g.prefix) + len(g.suffix)
	for _, p := range parts[1 : len(parts)-1] {
		if p != "" {
			g.middle = append(g.middle, p)
			g.minLen += len(p)
		}
	}
	return g
}

// match reports whether s matches the pattern. Taking the leftmost
// occurrence of each literal part is enough: with '*' as the only
// metacharacter, an earlier match never excludes a later one.
func (g *glob) match(s string) bool {
	if len(s) < g.minLen || !strings.HasPrefix(s, g.prefix) || !strings.HasSuffix(s, g.suffix) {
		return false
	}
	s = s[len(g.prefix) : len(s)-len(g.suffix)]
	for _, m := range g.middle {
		i := strings.Index(s, m)
		if i < 0 {
			return false
		}
		s = s[i+len(m):]
	}
	return true
}
