package descriptors

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// This file holds a slow, independent model of matching that the tests and
// FuzzMatch compare Config.Match against: the YAML decoded into plain
// structs by yaml.v3 itself, a linear scan of the siblings at each level and
// a backtracking glob.

type refNode struct {
	Key         string    `yaml:"key"`
	Value       *string   `yaml:"value"`
	RateLimit   any       `yaml:"rate_limit"`
	RateLimits  any       `yaml:"rate_limits"`
	Descriptors []refNode `yaml:"descriptors"`
}

type refFile struct {
	Domain      string    `yaml:"domain"`
	Descriptors []refNode `yaml:"descriptors"`
}

// refConfig maps a domain to its top-level descriptors.
type refConfig map[string][]refNode

func loadRef(t testing.TB, paths ...string) refConfig {
	t.Helper()
	ref := refConfig{}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		var f refFile
		if err := yaml.Unmarshal(b, &f); err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		ref[f.Domain] = append(ref[f.Domain], f.Descriptors...)
	}
	return ref
}

// globRef is a backtracking glob: '*' matches any run of bytes.
func globRef(p, s string) bool {
	if p == "" {
		return s == ""
	}
	if p[0] == '*' {
		for i := 0; i <= len(s); i++ {
			if globRef(p[1:], s[i:]) {
				return true
			}
		}
		return false
	}
	return s != "" && s[0] == p[0] && globRef(p[1:], s[1:])
}

// match returns the ID of the rule the reference model selects, or "".
func (r refConfig) match(domain string, entries []Entry) string {
	level, ok := r[domain]
	if !ok || len(entries) == 0 {
		return ""
	}
	var path []string
	var cur *refNode
	for _, e := range entries {
		cur = nil
		for i := range level { // exact
			n := &level[i]
			if n.Key == e.Key && n.Value != nil && !strings.Contains(*n.Value, "*") && *n.Value == e.Value {
				cur = n
				break
			}
		}
		for i := range level { // wildcards in file order
			n := &level[i]
			if cur == nil && n.Key == e.Key && n.Value != nil && strings.Contains(*n.Value, "*") && globRef(*n.Value, e.Value) {
				cur = n
			}
		}
		for i := range level { // key only
			n := &level[i]
			if cur == nil && n.Key == e.Key && n.Value == nil {
				cur = n
			}
		}
		if cur == nil {
			return ""
		}
		seg := cur.Key
		if cur.Value != nil {
			seg += "=" + *cur.Value
		}
		path = append(path, seg)
		level = cur.Descriptors
	}
	if cur.RateLimit == nil && cur.RateLimits == nil {
		return ""
	}
	return strings.Join(path, ".")
}

// vocabulary returns the keys and values (wildcards instantiated a few
// ways) that appear in the reference config, to build request entries from.
func (r refConfig) vocabulary() (keys, values []string) {
	seenK, seenV := map[string]bool{}, map[string]bool{}
	addV := func(v string) {
		if !seenV[v] {
			seenV[v] = true
			values = append(values, v)
		}
	}
	var walk func([]refNode)
	walk = func(ns []refNode) {
		for _, n := range ns {
			if !seenK[n.Key] {
				seenK[n.Key] = true
				keys = append(keys, n.Key)
			}
			if n.Value != nil {
				addV(*n.Value)
				for _, fill := range []string{"", "x", "/admin/", "a.b"} {
					addV(strings.ReplaceAll(*n.Value, "*", fill))
				}
			}
			walk(n.Descriptors)
		}
	}
	for _, ns := range r {
		walk(ns)
	}
	return keys, values
}

func goodFiles(t testing.TB) []string {
	t.Helper()
	var out []string
	for _, pat := range []string{"*.yaml", "*.yml"} {
		m, err := filepath.Glob(filepath.Join(fixtures, "good", pat))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, m...)
	}
	if len(out) == 0 {
		t.Fatal("no good fixtures found")
	}
	return out
}
