package descriptors

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzLoad compiles arbitrary bytes as a descriptor file. It must never
// panic; a success must yield valid limits, a failure an ErrorList whose
// entries all point into the file.
func FuzzLoad(f *testing.F) {
	for _, dir := range []string{"good", "bad", "good/merge", "bad/duplicate_domain"} {
		for _, pat := range []string{"*.yaml", "*.yml"} {
			m, _ := filepath.Glob(filepath.Join(fixtures, dir, pat))
			for _, p := range m {
				b, err := os.ReadFile(p)
				if err != nil {
					f.Fatal(err)
				}
				f.Add(b)
			}
		}
	}
	f.Add([]byte("domain: d\ndescriptors:\n  - &a {key: k, descriptors: [*a]}\n"))
	f.Add([]byte("a: &a [*a, *a]\n"))
	f.Add([]byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {<<: [{unit: day}, {requests_per_unit: 3}]}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		const name = "fuzz.yaml"
		cfg, err := compile([]srcFile{{name: name, data: data}}, Options{})
		if err != nil {
			var list ErrorList
			if cfg != nil || !errors.As(err, &list) || len(list) == 0 {
				t.Fatalf("error %T %v with config %v", err, err, cfg)
			}
			for _, e := range list {
				if e.Pos.File != name || e.Msg == "" || (e.Pos.Line <= 0 && !strings.HasPrefix(e.Msg, "invalid YAML")) {
					t.Fatalf("bad error entry %#v", e)
				}
			}
			return
		}
		for _, d := range cfg.Domains() {
			if d.Domain == "" || !cfg.HasDomain(d.Domain) {
				t.Fatalf("domain %q", d.Domain)
			}
			ids := map[string]bool{}
			for _, r := range cfg.Rules(d.Domain) {
				if r.Unlimited != (len(r.Limits) == 0) {
					t.Fatalf("rule %s: unlimited %v with %d limits", r.ID, r.Unlimited, len(r.Limits))
				}
				for _, l := range r.Limits {
					if err := l.Limit.Validate(); err != nil && !l.Blocked() {
						t.Fatalf("limit %s: %v", l.ID, err)
					}
					if ids[l.ID] {
						t.Fatalf("limit ID %s twice", l.ID)
					}
					ids[l.ID] = true
				}
			}
		}
	})
}

// FuzzMatch matches random request descriptors against the good fixtures
// and compares with the reference model.
func FuzzMatch(f *testing.F) {
	cfg := loadGood(f)
	ref := loadRef(f, goodFiles(f)...)
	domains := make([]string, 0, len(ref))
	for _, d := range cfg.Domains() {
		domains = append(domains, d.Domain)
	}
	f.Add(uint8(0), uint8(1), "database", "users", "", "", "", "")
	f.Add(uint8(1), uint8(2), "message_type", "marketing", "to_number", "2061111111", "", "")
	f.Add(uint8(4), uint8(1), "path", "/api/v1/users/7.json", "", "", "", "")
	f.Add(uint8(4), uint8(1), "host", "x.example.com", "", "", "", "")
	f.Add(uint8(2), uint8(3), "tenant", "a", "user", "b", "c", "d")
	f.Fuzz(func(t *testing.T, domain, n uint8, k1, v1, k2, v2, k3, v3 string) {
		all := []Entry{{k1, v1}, {k2, v2}, {k3, v3}}
		d := "unknown"
		if int(domain) < len(domains) {
			d = domains[domain]
		}
		entries := all[:int(n)%4]
		got := ""
		if r := cfg.Match(d, entries); r != nil {
			got = r.ID
		}
		if want := ref.match(d, entries); got != want {
			t.Fatalf("%s %v: Match %q, reference %q", d, entries, got, want)
		}
	})
}
