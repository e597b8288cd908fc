package descriptors

import (
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/envoy-rls/envoy-rls/pkg/limiter"
)

const fixtures = "../../testdata/descriptors"

// compileFixture compiles one fixture file on its own.
func compileFixture(t *testing.T, path string) (*Config, error) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return compile([]srcFile{{name: path, data: b}}, Options{})
}

// badCases lists every file of testdata/descriptors/bad with the position
// ("line:col", or "line" when the YAML parser gives no column) and a part
// of the message of the error it must produce.
var badCases = []struct{ file, at, msg string }{
	{"ambiguous_id", "9:9", `rule ID "a=b.c=d" is ambiguous`},
	{"burst_not_token_bucket", "7:7", "burst applies only to algorithm token_bucket (this limit uses sliding_window)"},
	{"burst_zero", "8:14", "burst must be a positive integer, got 0"},
	{"descriptor_not_mapping", "3:5", `a descriptor must be a mapping with key`},
	{"descriptors_not_list", "3:3", "descriptors must be a list, got a mapping"},
	{"duplicate_descriptor", "6:5", `duplicate descriptor key "database" value "users": already defined at ` + fixtures + "/bad/duplicate_descriptor.yaml:3:5"},
	{"duplicate_key_only", "7:9", `duplicate descriptor key "user": already defined at`},
	{"duplicate_wildcard", "6:5", `duplicate descriptor key "path" value "/api/*"`},
	{"empty_domain", "1:9", "domain is empty"},
	{"empty_file", "1:1", "file is empty"},
	{"empty_key", "3:10", "key is empty"},
	{"control_character", "4:13", "invalid YAML: control characters are not allowed"},
	{"invalid_syntax", "4", "invalid YAML: did not find expected ',' or '}'"},
	{"key_list", "3:10", "key must be a string, got a list"},
	{"key_mapping", "3:10", "key must be a string, got a mapping"},
	{"many_errors", "5:24", `unknown unit "fortnight"`},
	{"missing_domain", "1:1", "missing domain"},
	{"missing_key", "3:5", "descriptor has no key"},
	{"no_unit_no_window", "5:7", "rate_limit needs a unit (second, minute, hour, day, week, month, year) or a window"},
	{"not_utf8", "4:15", "invalid YAML: incomplete UTF-8 octet sequence"},
	{"nonstring_mapping_key", "4:7", "mapping keys must be strings, got a list"},
	{"rate_limit_and_rate_limits", "5:5", "rate_limit and rate_limits are mutually exclusive"},
	{"rate_limit_not_mapping", "4:17", `rate_limit must be a mapping with unit and requests_per_unit, got the string "10/second"`},
	{"rate_limits_empty", "4:18", "rate_limits is empty"},
	{"replaces_empty_name", "6:17", "a replaces entry has an empty name"},
	{"replaces_self", "7:17", `replaces names this descriptor's own rate limit "specific_limit"`},
	{"requests_float", "6:26", "requests_per_unit must be an integer, 0 (blocks) or more, got the number 10.5"},
	{"requests_negative", "6:26", "requests_per_unit must be an integer, 0 (blocks) or more, got -5"},
	{"requests_string", "6:26", `requests_per_unit must be an integer, 0 (blocks) or more, got the string "ten"`},
	{"requests_too_large", "6:26", "requests_per_unit 9007199254740992 is too large (maximum 9007199254740991"},
	{"root_list", "1:1", "a descriptor file must be a mapping with domain and descriptors, got a list"},
	{"share_threshold_not_wildcard", "5:5", "share_threshold needs a wildcard value"},
	{"shadow_mode_not_bool", "5:18", `shadow_mode must be true or false, got the string "maybe"`},
	{"sliding_log_too_long", "5:7", "sliding_log requests 10000 × window 946080000000ms exceeds 9007199254740991"},
	{"sliding_log_too_many", "7:26", "requests_per_unit 10001 is too large for sliding_log (maximum 10000)"},
	{"token_bucket_too_precise", "5:7", "token_bucket burst 1000000000 × window 31536000000ms exceeds"},
	{"unit_and_window", "6:7", "rate_limit has both unit and window: use one"},
	{"unknown_algorithm", "7:18", `unknown algorithm "leaky_bucket"`},
	{"unknown_failure_mode", "7:21", `unknown failure_mode "open"`},
	{"unknown_key_descriptor", "4:5", `unknown key "vaule" in descriptor`},
	{"unknown_key_rate_limit", "6:7", `unknown key "requests_per_second" in rate_limit`},
	{"unknown_key_root", "2:1", `unknown key "descriptor" in the top level of the file`},
	{"unknown_unit", "5:13", `unknown unit "minutes" (want second, minute, hour, day, week, month or year)`},
	{"unlimited_in_rate_limits", "5:9", "unlimited is not allowed in rate_limits"},
	{"unlimited_with_unit", "6:7", "unit cannot be combined with unlimited: true"},
	{"value_without_key", "3:5", "descriptor has a value but no key"},
	{"window_negative", "5:15", "window must be positive, got -1m"},
	{"window_not_duration", "5:15", `window "60" is not a duration`},
	{"window_not_whole_ms", "5:15", "window 1500us is not a whole number of milliseconds"},
	{"yaml_bad_indent", "3", "invalid YAML: did not find expected '-' indicator"},
	{"yaml_error_first_line", "1", "invalid YAML: mapping values are not allowed in this context"},
	{"window_too_many", "6:26", "2251799813685248 requests per window is more than sliding_window counts exactly (2251799813685247, 2^51−1)"},
	{"window_zero", "5:15", "window must be positive, got 0s"},
}

func TestBadFixtures(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(fixtures, "bad", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for _, c := range badCases {
		listed[c.file] = true
	}
	for _, f := range files {
		if name := strings.TrimSuffix(filepath.Base(f), ".yaml"); !listed[name] {
			t.Errorf("fixture %s is not in badCases", f)
		}
	}
	if len(badCases) < 25 {
		t.Errorf("only %d bad fixtures", len(badCases))
	}
	for _, c := range badCases {
		t.Run(c.file, func(t *testing.T) {
			path := filepath.Join(fixtures, "bad", c.file+".yaml")
			cfg, err := compileFixture(t, path)
			if cfg != nil || err == nil {
				t.Fatalf("compiled without error")
			}
			var list ErrorList
			if !errors.As(err, &list) || len(list) == 0 {
				t.Fatalf("error %T %v is not a non-empty ErrorList", err, err)
			}
			want := path + ":" + c.at + ": "
			found := false
			for _, e := range list {
				if e.Pos.File != path || e.Pos.Line <= 0 {
					t.Errorf("error without a position in the file: %v", e)
				}
				if strings.HasPrefix(e.Error(), want) && strings.Contains(e.Msg, c.msg) {
					found = true
				}
			}
			if !found {
				t.Errorf("want an error %q…%q, got:\n%v", want, c.msg, err)
			}
		})
	}
}

// warnCases lists every file of testdata/descriptors/warn: what
// envoyproxy/ratelimit loads, so envoy-rls loads it too, with a warning at
// "line:col" containing msg; check tests what the file means.
var warnCases = []struct {
	file, at, msg string
	check         func(t *testing.T, cfg *Config)
}{
	{"duplicate_yaml_key", "5:5", `key "key" is given twice (first at line 3): the last one counts`, func(t *testing.T, cfg *Config) {
		if r := cfg.Match("edge", []Entry{{"path", "/x"}}); r == nil || cfg.Match("edge", []Entry{{"user", "u"}}) != nil {
			t.Errorf("the first key counted, not the last")
		}
	}},
	{"empty_name", "4:24", "name is empty: the limit has no name, as if name were absent", func(t *testing.T, cfg *Config) {
		if r := cfg.Match("edge", []Entry{{"user", "u"}}); r == nil || len(r.Limits) != 1 || r.Limits[0].Named {
			t.Errorf("rule %+v: want one unnamed limit", r)
		}
	}},
	{"misplaced_shadow_mode", "7:7", `key "shadow_mode" is ignored in rate_limit, as envoyproxy/ratelimit ignores it: it belongs in a descriptor`, func(t *testing.T, cfg *Config) {
		if r := cfg.Match("edge", []Entry{{"path", "/x"}}); r == nil || r.ShadowMode {
			t.Errorf("rule %+v: want a rule not in shadow mode", r)
		}
	}},
	{"replaces_unknown", "11:17", `replaces names "specific_limt", but no rate_limit in domain "example7" has that name: it replaces nothing`, nil},
	{"requests_missing", "5:7", "rate_limit has no requests_per_unit: 0, which blocks every request", func(t *testing.T, cfg *Config) {
		if r := cfg.Match("edge", []Entry{{"user", "u"}}); r == nil || !r.Limits[0].Blocked() {
			t.Errorf("rule %+v: want a blocking limit", r)
		}
	}},
	{"second_document", "4:1", "a second YAML document is ignored", func(t *testing.T, cfg *Config) {
		if d := cfg.Domains(); len(d) != 1 || d[0].Domain != "edge" {
			t.Errorf("domains %+v: want edge alone", d)
		}
	}},
	{"second_document_not_yaml", "6", "what follows the first YAML document is ignored, as envoyproxy/ratelimit ignores it, and is not YAML", func(t *testing.T, cfg *Config) {
		if r := cfg.Match("edge", []Entry{{"user", "u"}}); r == nil || r.Limits[0].Limit.Requests != 5 {
			t.Errorf("rule %+v: want the first document's", r)
		}
	}},
	{"unlimited_with_empty_unit", "6:7", `unit "" is ignored: the limit is unlimited`, func(t *testing.T, cfg *Config) {
		if r := cfg.Match("internal", []Entry{{"ldap", "x"}}); r == nil || !r.Unlimited {
			t.Errorf("rule %+v: want unlimited", r)
		}
	}},
	{"unlimited_with_requests", "6:7", "requests_per_unit is ignored: the limit is unlimited", func(t *testing.T, cfg *Config) {
		if r := cfg.Match("internal", []Entry{{"ldap", "x"}}); r == nil || !r.Unlimited {
			t.Errorf("rule %+v: want unlimited", r)
		}
	}},
}

func TestWarnFixtures(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(fixtures, "warn", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for _, c := range warnCases {
		listed[c.file] = true
	}
	for _, f := range files {
		if name := strings.TrimSuffix(filepath.Base(f), ".yaml"); !listed[name] {
			t.Errorf("fixture %s is not in warnCases", f)
		}
	}
	for _, c := range warnCases {
		t.Run(c.file, func(t *testing.T) {
			path := filepath.Join(fixtures, "warn", c.file+".yaml")
			cfg, err := compileFixture(t, path)
			if err != nil {
				t.Fatalf("not loaded: %v", err)
			}
			ws := cfg.Warnings()
			if len(ws) != 1 || !strings.HasPrefix(ws[0].Error(), path+":"+c.at+": ") || !strings.Contains(ws[0].Msg, c.msg) {
				t.Errorf("warnings %v, want one at %s containing %q", ws, c.at, c.msg)
			}
			if c.check != nil {
				c.check(t, cfg)
			}
		})
	}
}

// TestIncumbentKeys checks the descriptor keys of envoyproxy/ratelimit
// that envoy-rls has no use of its own for, and null values: they load
// with the incumbent's meaning and no warning.
func TestIncumbentKeys(t *testing.T) {
	cfg, err := compile([]srcFile{{name: "k.yaml", data: []byte(`domain: edge
descriptors:
  - key: user
    value: ""
    rate_limit: {unit: minute, requests_per_unit: 5, name: }
    value_to_metric: true
    shadow_mode:
  - key: tenant
    value:
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: route
    rate_limit:
    descriptors:
`)}}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if w := cfg.Warnings(); len(w) != 0 {
		t.Errorf("warnings: %v", w)
	}
	// value "" and value null are key-only: they match every value.
	user := cfg.Match("edge", []Entry{{"user", "bob"}})
	if user == nil || user.ID != "user" || user.ShadowMode || user.Limits[0].Named {
		t.Errorf("user: %+v, want the key-only rule, not in shadow mode, unnamed", user)
	}
	tenant := cfg.Match("edge", []Entry{{"tenant", "acme"}})
	if tenant == nil || tenant.ID != "tenant" || !tenant.ShadowMode {
		t.Errorf("tenant: %+v, want the key-only rule in shadow mode (quota_mode)", tenant)
	}
	if r := cfg.Match("edge", []Entry{{"route", "r"}}); r != nil {
		t.Errorf("route with a null rate_limit matched %+v", r)
	}
}

// TestShareThreshold checks share_threshold: every value a wildcard matches
// counts as the wildcard, at its level and in the rules below it.
func TestShareThreshold(t *testing.T) {
	cfg, err := compile([]srcFile{{name: "s.yaml", data: []byte(`domain: edge
descriptors:
  - key: path
    value: /files/*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 5}
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 5}
  - key: path
    value: /api/*
    rate_limit: {unit: minute, requests_per_unit: 5}
`)}}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	shared := cfg.Match("edge", []Entry{{"path", "/files/a"}})
	if shared == nil || shared.CounterValue(0, "/files/a") != "/files/*" {
		t.Fatalf("shared rule %+v", shared)
	}
	nested := cfg.Match("edge", []Entry{{"path", "/files/b"}, {"user", "u"}})
	if nested == nil || nested.CounterValue(0, "/files/b") != "/files/*" || nested.CounterValue(1, "u") != "u" {
		t.Errorf("nested rule %+v: the path shares, the user does not", nested)
	}
	apart := cfg.Match("edge", []Entry{{"path", "/api/a"}})
	if apart == nil || apart.Shared != nil || apart.CounterValue(0, "/api/a") != "/api/a" {
		t.Errorf("rule without share_threshold %+v", apart)
	}
}

// TestAllErrorsReported checks that a load reports every problem, sorted.
func TestAllErrorsReported(t *testing.T) {
	path := filepath.Join(fixtures, "bad", "many_errors.yaml")
	_, err := compileFixture(t, path)
	var list ErrorList
	if !errors.As(err, &list) {
		t.Fatalf("got %v", err)
	}
	want := []string{
		`5:24: unknown unit "fortnight"`,
		"7:51: requests_per_unit must be an integer, 0 (blocks) or more, got -1",
		"10:9: descriptor has a value but no key",
		"12:56: burst applies only to algorithm token_bucket",
	}
	if len(list) != len(want) {
		t.Fatalf("got %d errors, want %d:\n%v", len(list), len(want), err)
	}
	lines := strings.Split(err.Error(), "\n")
	for i, w := range want {
		if !strings.HasPrefix(lines[i], path+":"+w) {
			t.Errorf("error %d = %q, want prefix %q", i, lines[i], path+":"+w)
		}
	}
}

// TestErrorsAcrossFiles checks that problems of several files are reported
// together and that a duplicate domain needs MergeDomains.
func TestErrorsAcrossFiles(t *testing.T) {
	dir := filepath.Join(fixtures, "bad", "duplicate_domain")
	_, err := Load(dir, Options{})
	want := filepath.Join(dir, "b.yaml") + `:2:9: duplicate domain "edge": already defined at ` + filepath.Join(dir, "a.yaml") + ":1:9"
	if err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("got %v\nwant %s…", err, want)
	}
	cfg, err := Load(dir, Options{MergeDomains: true})
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Domains(); len(got) != 1 || !strings.Contains(got[0].File, "a.yaml") || !strings.Contains(got[0].File, "b.yaml") {
		t.Errorf("merged domains = %+v", got)
	}

	tmp := t.TempDir()
	write(t, tmp, "a.yaml", "domain: a\ndescriptors:\n  - key: x\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n")
	write(t, tmp, "b.yaml", "domain: b\nbogus: 1\n")
	_, err = Load(tmp, Options{})
	var list ErrorList
	if !errors.As(err, &list) || len(list) != 2 || list[0].Pos.File != filepath.Join(tmp, "a.yaml") || list[1].Pos.File != filepath.Join(tmp, "b.yaml") {
		t.Errorf("want one error in each file, got %v", err)
	}
}

func TestMergeDomains(t *testing.T) {
	dir := filepath.Join(fixtures, "good", "merge")
	if _, err := Load(dir, Options{}); err == nil {
		t.Fatal("duplicate domain accepted without MergeDomains")
	}
	cfg, err := Load(dir, Options{MergeDomains: true})
	if err != nil {
		t.Fatal(err)
	}
	r := cfg.Match("shared", []Entry{{"team", "b"}})
	if r == nil || !slices.Equal(r.Replaces, []string{"team_a"}) {
		t.Fatalf("team=b: %+v", r)
	}
	if r := cfg.Match("shared", []Entry{{"team", "a"}}); r == nil || r.Name != "team_a" {
		t.Fatalf("team=a: %+v", r)
	}

	// A descriptor defined in two files of a merged domain is a duplicate.
	tmp := t.TempDir()
	write(t, tmp, "a.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 1}\n")
	write(t, tmp, "b.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 2}\n")
	_, err = Load(tmp, Options{MergeDomains: true})
	if err == nil || !strings.Contains(err.Error(), `b.yaml:3:5: duplicate descriptor key "k"`) {
		t.Errorf("got %v", err)
	}
}

func write(t *testing.T, dir, name, content string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func loadGood(t testing.TB) *Config {
	t.Helper()
	cfg, err := Load(filepath.Join(fixtures, "good"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestGoodFixturesLoad(t *testing.T) {
	cfg := loadGood(t)
	var domains []string
	for _, f := range goodFiles(t) {
		c, err := compileFixture(t, f)
		if err != nil {
			t.Errorf("%s: %v", f, err)
			continue
		}
		domains = append(domains, c.names...)
	}
	slices.Sort(domains)
	var got []string
	for _, d := range cfg.Domains() {
		got = append(got, d.Domain)
		if !cfg.HasDomain(d.Domain) {
			t.Errorf("HasDomain(%q) = false", d.Domain)
		}
	}
	if !slices.Equal(got, domains) {
		t.Errorf("Domains() = %v, want %v", got, domains)
	}
	if cfg.HasDomain("nope") {
		t.Error("HasDomain(nope) = true")
	}
}

func TestSummary(t *testing.T) {
	cfg := loadGood(t)
	lines := cfg.Summary()
	sums := cfg.Domains()
	if len(lines) != len(sums) {
		t.Fatalf("%d lines for %d domains", len(lines), len(sums))
	}
	for i, s := range sums {
		rules := cfg.Rules(s.Domain)
		limits := 0
		for _, r := range rules {
			limits += len(r.Limits)
		}
		if s.Rules != len(rules) || s.Limits != limits {
			t.Errorf("%s: summary %+v, counted %d rules %d limits", s.Domain, s, len(rules), limits)
		}
		want := fmt.Sprintf("%s: %s, %s (%s)", s.Domain, plural(len(rules), "rule"), plural(limits, "limit"), s.File)
		if lines[i] != want {
			t.Errorf("line %q, want %q", lines[i], want)
		}
	}
	// The example of the brief, on the design's edge domain.
	want := "edge: 3 rules, 4 limits (" + filepath.Join(fixtures, "good", "edge.yaml") + ")"
	if !slices.Contains(lines, want) {
		t.Errorf("Summary() = %q, want a line %q", lines, want)
	}
	if got := plural(1, "rule"); got != "1 rule" {
		t.Errorf("plural(1) = %q", got)
	}
}

// e builds entries from "key=value" strings.
func e(kvs ...string) []Entry {
	out := make([]Entry, len(kvs))
	for i, kv := range kvs {
		k, v, _ := strings.Cut(kv, "=")
		out[i] = Entry{Key: k, Value: v}
	}
	return out
}

// TestMatch shows, on the good fixtures, which rule each request
// descriptor selects; "" means none. Every case is also checked against the
// reference model.
func TestMatch(t *testing.T) {
	cfg := loadGood(t)
	ref := loadRef(t, goodFiles(t)...)
	cases := []struct {
		domain  string
		entries []Entry
		want    string
	}{
		// envoyproxy/ratelimit README examples.
		{"incumbent", e("database=users"), "database=users"},
		{"incumbent", e("database=other"), ""}, // no key-only database rule
		{"incumbent", e("Database=users"), ""}, // case-sensitive
		{"incumbent", e("message_type=marketing", "to_number=2061111111"), "message_type=marketing.to_number"},
		{"incumbent", e("message_type=marketing"), ""}, // a placeholder without a limit
		{"incumbent", e("to_number=2061111111"), "to_number"},
		{"incumbent", e("remote_address=50.0.0.1"), "remote_address"},
		{"incumbent", e("remote_address=50.0.0.1", "path=/"), ""}, // deeper than the tree
		{"incumbent", e("ldap=cn=admin"), "ldap"},
		{"incumbent", e("service=auth", "user=user-a"), "service.user=user-a"},
		{"incumbent", e("service=auth", "user=user-c"), ""},
		{"incumbent", e("key_1=value_1", "user=bkthomps"), "key_1=value_1.user=bkthomps"},
		{"incumbent", e("key1=value1"), "key1=value1"},
		{"incumbent", e("key1=unspecified"), "key1"},
		{"incumbent", e("key9=value_1"), "key9=value*"},
		{"incumbent", e("key9=value"), "key9=value*"},
		{"incumbent", e("key9=valu"), ""},
		// Matching order: exact, wildcards in file order, key only.
		{"wildcards", e("path=/login"), "path=/login"},
		{"wildcards", e("path=/login/sso"), "path=/login*"},
		{"wildcards", e("path=/login/admin/x"), "path=/login*"}, // earlier wildcard wins
		{"wildcards", e("path=/x/admin/"), "path=*/admin/*"},
		{"wildcards", e("path=/api/v1/users/7.json"), "path=/api/*/users/*.json"},
		{"wildcards", e("path=/api/v1/users/7.xml"), "path=*"},
		{"wildcards", e("path="), "path=*"}, // '*' matches the empty string
		{"wildcards", e("host=a.example.com"), "host=*.example.com"},
		{"wildcards", e("host=static.example.com"), "host=static.example.com"},
		{"wildcards", e("host=example.com"), "host"},
		// Extensions.
		{"edge", e("tenant=acme", "user=bob"), "tenant.user"},
		{"edge", e("tenant=acme"), ""},
		{"edge", e("path=/login"), "path=/login*"},
		{"limits", e("api_key=k"), "api_key"},
		{"compat", e("port=8080"), "port=8080"},
		{"compat", e("tls=true"), "tls=true"},
		// Nothing to match.
		{"nope", e("database=users"), ""},
		{"incumbent", nil, ""},
	}
	for _, c := range cases {
		name := fmt.Sprintf("%s/%v", c.domain, c.entries)
		r := cfg.Match(c.domain, c.entries)
		got := ""
		if r != nil {
			got = r.ID
			if r.Domain != c.domain {
				t.Errorf("%s: rule of domain %q", name, r.Domain)
			}
		}
		if got != c.want {
			t.Errorf("%s: matched %q, want %q", name, got, c.want)
		}
		if refGot := ref.match(c.domain, c.entries); refGot != c.want {
			t.Errorf("%s: reference model matched %q, want %q", name, refGot, c.want)
		}
	}
	var nilCfg *Config
	if nilCfg.Match("edge", e("a=b")) != nil || nilCfg.HasDomain("edge") {
		t.Error("nil Config matched")
	}
}

// TestMatchAgainstReference compares Match with the reference model on
// random requests built from the fixtures' own keys and values, and on every
// configured path.
func TestMatchAgainstReference(t *testing.T) {
	cfg := loadGood(t)
	ref := loadRef(t, goodFiles(t)...)
	keys, values := ref.vocabulary()
	keys = append(keys, "unknown")
	values = append(values, "", "unknown", "*")
	rng := rand.New(rand.NewPCG(1, 2))
	matched := 0
	for _, d := range cfg.Domains() {
		for range 20000 {
			n := 1 + rng.IntN(3)
			entries := make([]Entry, n)
			for i := range entries {
				entries[i] = Entry{Key: keys[rng.IntN(len(keys))], Value: values[rng.IntN(len(values))]}
			}
			got := ""
			if r := cfg.Match(d.Domain, entries); r != nil {
				got = r.ID
				matched++
			}
			if want := ref.match(d.Domain, entries); got != want {
				t.Fatalf("%s %v: Match %q, reference %q", d.Domain, entries, got, want)
			}
		}
	}
	// Every configured rule is reachable through its own path, and the
	// rules are exactly the reference tree's descriptors with a limit.
	for domain, top := range ref {
		var ids []string
		var walk func(ns []refNode, prefix []string, entries []Entry)
		walk = func(ns []refNode, prefix []string, entries []Entry) {
			for _, n := range ns {
				seg, v := n.Key, "any-value"
				if n.Value != nil {
					seg += "=" + *n.Value
					v = strings.ReplaceAll(*n.Value, "*", "")
				}
				path := append(slices.Clone(prefix), seg)
				es := append(slices.Clone(entries), Entry{Key: n.Key, Value: v})
				if n.RateLimit != nil || n.RateLimits != nil {
					id := strings.Join(path, ".")
					ids = append(ids, id)
					got := cfg.Match(domain, es)
					if got == nil || got.ID != ref.match(domain, es) {
						t.Errorf("%s: its path %v matched %v", id, es, got)
					} else if !strings.Contains(id, "*") && got.ID != id {
						t.Errorf("%s: its path %v matched %s", id, es, got.ID)
					}
				}
				walk(n.Descriptors, path, es)
			}
		}
		walk(top, nil, nil)
		var got []string
		for _, r := range cfg.Rules(domain) {
			got = append(got, r.ID)
		}
		slices.Sort(ids)
		slices.Sort(got)
		if !slices.Equal(got, ids) {
			t.Errorf("%s: rules %v, reference %v", domain, got, ids)
		}
	}
	if matched < 100 {
		t.Errorf("only %d random requests matched a rule: the test explores too little", matched)
	}
}

func TestRuleFields(t *testing.T) {
	cfg := loadGood(t)
	get := func(domain string, entries []Entry) *Rule {
		t.Helper()
		r := cfg.Match(domain, entries)
		if r == nil {
			t.Fatalf("%s %v: no rule", domain, entries)
		}
		return r
	}
	// Units are fixed lengths (month = 30 days, year = 365 days).
	day := 24 * time.Hour
	for unit, want := range map[string]time.Duration{
		"hourly": time.Hour, "weekly": 7 * day, "monthly": 30 * day, "yearly": 365 * day,
	} {
		r := get("incumbent", e("period="+unit))
		if len(r.Limits) != 1 || r.Limits[0].Limit.Window != want {
			t.Errorf("period=%s: %+v, want window %v", unit, r.Limits, want)
		}
	}
	for _, u := range []string{"second", "minute", "hour", "day", "week", "month", "year"} {
		if w, ok := unitWindow(u); !ok || w <= 0 || w%time.Second != 0 {
			t.Errorf("unit %s: %v %v", u, w, ok)
		}
	}
	if r := get("incumbent", e("database=users")); r.Limits[0].Unit != "second" || r.Limits[0].Limit.Requests != 500 ||
		r.Limits[0].Limit.Algorithm != limiter.SlidingWindow || r.Limits[0].FailureMode != limiter.FailFallback {
		t.Errorf("defaults: %+v", r.Limits[0])
	}
	if r := get("incumbent", e("ldap=x")); !r.Unlimited || len(r.Limits) != 0 {
		t.Errorf("ldap: %+v", r)
	}
	if r := get("incumbent", e("service=s", "user=user-a")); !r.ShadowMode {
		t.Errorf("user-a not in shadow mode")
	}
	if r := get("incumbent", e("key1=x")); !r.DetailedMetric {
		t.Errorf("key1 without detailed_metric")
	}
	if r := get("incumbent", e("key_1=value_1", "user=bkthomps")); r.Name != "specific_limit" || r.Limits[0].Name != "specific_limit" {
		t.Errorf("named rule: %+v", r)
	}
	if r := get("incumbent", e("key_2=value_2", "user=bkthomps")); !slices.Equal(r.Replaces, []string{"specific_limit"}) || r.Name != r.ID {
		t.Errorf("replacing rule: %+v", r)
	}

	// Several limits: IDs get "#<index>", names default to the rule's.
	r := get("limits", e("tenant=t", "user=u"))
	wantIDs := []string{"tenant.user#0", "tenant.user#1", "tenant.user#2"}
	wantNames := []string{"per_second", "tenant.user", "tenant.user"}
	for i, l := range r.Limits {
		if l.ID != wantIDs[i] || l.Name != wantNames[i] {
			t.Errorf("limit %d: ID %q name %q", i, l.ID, l.Name)
		}
		if err := l.Limit.Validate(); err != nil {
			t.Errorf("limit %d: %v", i, err)
		}
	}
	if len(r.Limits) != 3 || r.Limits[0].Limit != (limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 10, Window: time.Second, Burst: 40}) ||
		r.Limits[1].FailureMode != limiter.FailAllow || r.Limits[1].Unit != "" ||
		r.Limits[2].Limit.Algorithm != limiter.FixedWindow || r.Limits[2].FailureMode != limiter.FailDeny {
		t.Errorf("tenant.user limits: %+v", r.Limits)
	}
	if r := get("limits", e("api_key=k")); r.Limits[0].ID != "api_key" || r.Limits[0].Limit.Window != 90*time.Second {
		t.Errorf("single rate_limits entry: %+v", r.Limits)
	}
	if r := get("limits", e("login=x")); r.Limits[0].Limit.Window != 90*time.Minute || r.Limits[0].Limit.Algorithm != limiter.SlidingLog {
		t.Errorf("login: %+v", r.Limits)
	}
	if r := get("limits", e("burst=x")); r.Limits[0].Limit.Burst != 1 || r.Limits[0].Limit.Window != 250*time.Millisecond {
		t.Errorf("burst: %+v", r.Limits)
	}
	if r := get("limits", e("upper=x")); r.Limits[0].Unit != "minute" {
		t.Errorf("upper-case unit: %+v", r.Limits)
	}
	// YAML 1.1 booleans, non-string values, anchors and merge keys.
	if r := get("compat", e("port=8080")); !r.ShadowMode || r.DetailedMetric || r.Limits[0].Limit.Requests != 16 {
		t.Errorf("compat port: %+v", r)
	}
	if r := get("compat", e("tls=true")); r.Limits[0].Limit.Requests != 16 {
		t.Errorf("compat alias: %+v", r)
	}
	if r := get("compat", e("region=eu")); r.Limits[0].Limit.Requests != 1000 || r.Limits[0].Unit != "second" {
		t.Errorf("compat merge key: %+v", r)
	}
	// Positions point into the files.
	for _, d := range cfg.Domains() {
		for _, r := range cfg.Rules(d.Domain) {
			if r.Pos.Line <= 0 || !strings.HasPrefix(r.Pos.File, fixtures) {
				t.Errorf("%s: position %v", r.ID, r.Pos)
			}
			for _, l := range r.Limits {
				if l.Pos.Line <= 0 || l.Pos.File != r.Pos.File {
					t.Errorf("%s: limit position %v", l.ID, l.Pos)
				}
			}
		}
	}
	if cfg.Rules("nope") != nil {
		t.Error("rules of an unknown domain")
	}
}

func TestLoadFolder(t *testing.T) {
	dir := t.TempDir()
	rule := "domain: %s\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"
	write(t, dir, "a.yaml", fmt.Sprintf(rule, "a"))
	write(t, dir, "b.yml", fmt.Sprintf(rule, "b"))
	write(t, dir, ".hidden.yaml", "not: [valid")
	write(t, dir, "notes.txt", "not: [valid")
	if err := os.Mkdir(filepath.Join(dir, "sub.yaml"), 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "sub.yaml"), "c.yaml", fmt.Sprintf(rule, "c"))
	if err := os.Mkdir(filepath.Join(dir, ".git"), 0o755); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(t.TempDir(), "linked.yaml")
	if err := os.WriteFile(target, []byte(fmt.Sprintf(rule, "d")), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, filepath.Join(dir, "d.yaml")); err != nil {
		t.Fatal(err)
	}
	cfg, err := Load(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, d := range cfg.Domains() {
		got = append(got, d.Domain)
	}
	if !slices.Equal(got, []string{"a", "b", "d"}) {
		t.Errorf("domains %v, want [a b d]", got)
	}
	if len(cfg.Digest()) != 64 {
		t.Errorf("digest %q", cfg.Digest())
	}
	again, err := Load(dir, Options{})
	if err != nil || again.Digest() != cfg.Digest() {
		t.Errorf("digest changed between identical loads: %v", err)
	}
	write(t, dir, "a.yaml", fmt.Sprintf(rule, "a")+"# edited\n")
	if edited, err := Load(dir, Options{}); err != nil || edited.Digest() == cfg.Digest() {
		t.Errorf("digest unchanged after an edit: %v", err)
	}

	if _, err := Load(t.TempDir(), Options{}); err == nil || !strings.Contains(err.Error(), "no configuration files") {
		t.Errorf("empty folder: %v", err)
	}
	if _, err := Load(filepath.Join(dir, "missing"), Options{}); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing folder: %v", err)
	}
}

func TestGlob(t *testing.T) {
	patterns := []string{"*", "**", "a*", "*a", "a*b", "*a*", "a*b*c", "*ab*ab*", "/api/*/users/*.json", "a**b", "*.*"}
	inputs := []string{"", "a", "b", "ab", "ba", "abc", "aXbYc", "abab", "ababab", "xaby", "/api/v1/users/1.json", "a.b", "acb"}
	for _, p := range patterns {
		g := compileGlob(p)
		for _, s := range inputs {
			if got, want := g.match(s), globRef(p, s); got != want {
				t.Errorf("glob %q on %q = %v, reference %v", p, s, got, want)
			}
		}
	}
}

func TestPositionString(t *testing.T) {
	for _, c := range []struct {
		p    Position
		want string
	}{
		{Position{"f.yaml", 3, 7}, "f.yaml:3:7"},
		{Position{"f.yaml", 3, 0}, "f.yaml:3"},
		{Position{"f.yaml", 0, 0}, "f.yaml"},
	} {
		if got := c.p.String(); got != c.want {
			t.Errorf("%#v: %q, want %q", c.p, got, c.want)
		}
	}
}

func TestMatchDoesNotAllocate(t *testing.T) {
	cfg := loadGood(t)
	for _, entries := range [][]Entry{
		e("database=users"), e("path=/api/v1/users/7.json"), e("host=example.com"),
		e("message_type=marketing", "to_number=2061111111"), e("remote_address=1.2.3.4", "x=y"), e("nope=x"),
	} {
		domain := "incumbent"
		if entries[0].Key == "path" || entries[0].Key == "host" {
			domain = "wildcards"
		}
		if n := testing.AllocsPerRun(100, func() { cfg.Match(domain, entries) }); n != 0 {
			t.Errorf("Match(%v) allocates %v times", entries, n)
		}
	}
}

func BenchmarkMatch(b *testing.B) {
	cfg := loadGood(b)
	for _, c := range []struct {
		name, domain string
		entries      []Entry
	}{
		{"exact", "incumbent", e("database=users")},
		{"nested", "incumbent", e("message_type=marketing", "to_number=2061111111")},
		{"wildcard", "wildcards", e("path=/api/v1/users/7.json")},
		{"key_only", "wildcards", e("host=example.com")},
		{"miss", "incumbent", e("remote_address=1.2.3.4", "x=y")},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if cfg.Match(c.domain, c.entries) == nil && c.name != "miss" {
					b.Fatal("no match")
				}
			}
		})
	}
}

// TestHostileYAML: self-referencing anchors, exponential aliases and merge
// keys end in errors, not in a hang, a stack overflow or a panic.
func TestHostileYAML(t *testing.T) {
	for _, c := range []struct{ yaml, msg string }{
		{"domain: d\ndescriptors:\n  - key: k\n    rate_limit: &a {<<: *a}\n", "merge keys (<<) nest more than 4 deep"},
		{"domain: d\ndescriptors:\n  - key: k\n    rate_limit: &a {<<: [*a, *a, *a, *a, *a, *a, *a, *a]}\n", "merge keys (<<) nest more than 4 deep"},
		{"domain: d\ndescriptors: &a\n  - key: k\n    descriptors: *a\n  - key: j\n    descriptors: *a\n", "more than 100000 descriptors"},
		{"domain: d\ndescriptors: &a\n  - key: k\n    descriptors: *a\n", "descriptors nest deeper than 64 levels"},
		{"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {<<: 5}\n", "a merge key (<<) needs a mapping or a list of mappings, got the integer 5"},
	} {
		_, err := compile([]srcFile{{name: "h.yaml", data: []byte(c.yaml)}}, Options{})
		if err == nil || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%q: got %v, want %q", c.yaml, err, c.msg)
		}
		var list ErrorList
		if errors.As(err, &list) && len(list) > maxErrors+1 {
			t.Errorf("%q: %d errors", c.yaml, len(list))
		}
	}
}

func TestLoadFiles(t *testing.T) {
	good := filepath.Join(fixtures, "good", "edge.yaml")
	cfg, err := LoadFiles([]string{good}, Options{})
	if err != nil || !cfg.HasDomain("edge") || len(cfg.Domains()) != 1 {
		t.Fatalf("LoadFiles(%s): %v", good, err)
	}
	bad := filepath.Join(fixtures, "bad", "unknown_unit.yaml")
	_, err = LoadFiles([]string{filepath.Join(fixtures, "good", "limits.yaml"), bad}, Options{})
	if err == nil || !strings.HasPrefix(err.Error(), bad+":5:13: unknown unit") {
		t.Errorf("LoadFiles with a bad file: %v", err)
	}
	if _, err := LoadFiles(nil, Options{}); err == nil {
		t.Error("LoadFiles(nil) succeeded")
	}
	if _, err := LoadFiles([]string{filepath.Join(fixtures, "missing.yaml")}, Options{}); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
}

func TestTooManyErrors(t *testing.T) {
	var b strings.Builder
	b.WriteString("domain: d\ndescriptors:\n")
	for i := range maxErrors + 5 {
		fmt.Fprintf(&b, "  - key: k%d\n    rate_limit: {unit: day, requests_per_unit: -1}\n", i)
	}
	_, err := compile([]srcFile{{name: "m.yaml", data: []byte(b.String())}}, Options{})
	var list ErrorList
	if !errors.As(err, &list) || len(list) != maxErrors+1 || list[maxErrors].Msg != "5 more errors not listed" {
		t.Fatalf("got %d errors, last %v", len(list), list[len(list)-1])
	}
}

func TestRequestsPerUnitZeroBlocks(t *testing.T) {
	cfg := loadGood(t)
	r := cfg.Match("blocked", []Entry{{"remote_address", "50.0.0.5"}})
	if r == nil || len(r.Limits) != 1 || !r.Limits[0].Blocked() || r.Limits[0].Limit.Window != time.Second {
		t.Fatalf("Match = %+v, want one blocked limit per second", r)
	}
	if r := cfg.Match("blocked", []Entry{{"remote_address", "50.0.0.6"}}); r != nil {
		t.Errorf("another address matched %+v", r)
	}
}

// TestSubfolderWarned checks that a subfolder holding YAML files is not read
// but warned about (envoyproxy/ratelimit reads subfolders), and that one
// without any, or a hidden one, is not.
func TestSubfolderWarned(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "a.yaml", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n")
	for _, sub := range []string{"teamb/deeper", "empty", ".hidden"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write(t, filepath.Join(dir, "teamb", "deeper"), "b.yaml", "domain: b\n")
	write(t, filepath.Join(dir, ".hidden"), "c.yaml", "domain: c\n")
	write(t, filepath.Join(dir, "empty"), "notes.txt", "x")
	cfg, err := Load(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if d := cfg.Domains(); len(d) != 1 || d[0].Domain != "a" {
		t.Errorf("domains %+v, want a alone", d)
	}
	ws := cfg.Warnings()
	if len(ws) != 1 || ws[0].Pos.File != filepath.Join(dir, "teamb") || !strings.Contains(ws[0].Msg, "folder not read") {
		t.Errorf("warnings %v, want one for teamb", ws)
	}
	// A folder of subfolders alone holds no configuration.
	only := t.TempDir()
	if err := os.MkdirAll(filepath.Join(only, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(only, "sub"), "x.yaml", "domain: x\n")
	if _, err := Load(only, Options{}); err == nil || !strings.Contains(err.Error(), "no configuration files") {
		t.Errorf("folder with a subfolder only: %v", err)
	}
}

// TestOtherFilesWarned checks that a file named .YAML or .Yml is read like
// .yaml, and that another file (a ConfigMap key without an extension, a
// note) is not read but warned about, since envoyproxy/ratelimit reads
// every file of its folder; a hidden file is neither.
func TestOtherFilesWarned(t *testing.T) {
	dir := t.TempDir()
	rule := "descriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n"
	write(t, dir, "a.yaml", "domain: a\n"+rule)
	write(t, dir, "b.YAML", "domain: b\n"+rule)
	write(t, dir, "c.Yml", "domain: c\n"+rule)
	write(t, dir, "ratelimit", "domain: legacy\n"+rule)
	write(t, dir, ".notes", "x")
	cfg, err := Load(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	var domains []string
	for _, d := range cfg.Domains() {
		domains = append(domains, d.Domain)
	}
	if !slices.Equal(domains, []string{"a", "b", "c"}) {
		t.Errorf("domains %v, want a, b and c", domains)
	}
	ws := cfg.Warnings()
	if len(ws) != 1 || ws[0].Pos.File != filepath.Join(dir, "ratelimit") || !strings.Contains(ws[0].Msg, "file not read") {
		t.Errorf("warnings %v, want one for ratelimit", ws)
	}
	// A folder of other files alone holds no configuration.
	only := t.TempDir()
	write(t, only, "ratelimit", "domain: legacy\n"+rule)
	if _, err := Load(only, Options{}); err == nil || !strings.Contains(err.Error(), "no configuration files") {
		t.Errorf("folder of other files only: %v", err)
	}
}

// TestVanished checks what a read of the folder passes over as removed
// since its listing (a file gone, a link gone) and what stays an error (a
// link to nothing, which would otherwise hide a domain), and that a folder
// holding a link to nothing named *.yaml is refused while one holding such
// a link under another name loads with that file warned about.
func TestVanished(t *testing.T) {
	dir := t.TempDir()
	gone := filepath.Join(dir, "gone.yaml")
	_, err := os.Stat(gone)
	if !vanished(err, gone) {
		t.Errorf("a removed file: not vanished (%v)", err)
	}
	dangling := filepath.Join(dir, "dangling.yaml")
	if err := os.Symlink(filepath.Join(dir, "nowhere"), dangling); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dangling); !errors.Is(err, fs.ErrNotExist) || vanished(err, dangling) {
		t.Errorf("a link to nothing: %v, vanished %v; want not vanished", err, vanished(err, dangling))
	}
	if vanished(errors.New("permission denied"), gone) {
		t.Error("another error taken for a vanished file")
	}
	write(t, dir, "a.yaml", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n")
	if _, err := Load(dir, Options{}); err == nil || !strings.Contains(err.Error(), "dangling.yaml") {
		t.Errorf("a folder with a *.yaml link to nothing: %v, want it refused naming the link", err)
	}
	if err := os.Rename(dangling, filepath.Join(dir, "dangling")); err != nil {
		t.Fatal(err)
	}
	cfg, err := Load(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if ws := cfg.Warnings(); len(ws) != 1 || !strings.Contains(ws[0].Msg, "file not read") {
		t.Errorf("warnings %v, want one: file not read", ws)
	}
}
