package main

import (
	"path/filepath"
	"strings"
	"testing"
)

func runCmd(args ...string) (code int, stdout, stderr string) {
	var o, e strings.Builder
	code = run(args, &o, &e, func(string) (string, bool) { return "", false })
	return code, o.String(), e.String()
}

func TestCheckConfigShippedExample(t *testing.T) {
	code, out, errOut := runCmd("check-config", "../../config")
	if code != 0 {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	if !strings.Contains(out, `domain "edge"`) {
		t.Errorf("summary %q lacks the edge domain", out)
	}
}

func TestCheckConfigReportsEveryErrorWithPosition(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "a.yaml"), "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: -1}\n  - kee: x\n")
	code, out, _ := runCmd("check-config", dir)
	if code != 1 {
		t.Fatalf("exit %d, want 1\n%s", code, out)
	}
	for _, want := range []string{"a.yaml:4:", "requests_per_unit", "a.yaml:5:", "kee"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestCheckConfigSingleFile(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "good.yaml"), "domain: g\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 3}\n")
	writeFile(t, filepath.Join(dir, "broken.yaml"), "domain: [\n")
	code, out, errOut := runCmd("check-config", filepath.Join(dir, "good.yaml"))
	if code != 0 || !strings.Contains(out, `domain "g"`) {
		t.Fatalf("exit %d: %s%s", code, out, errOut)
	}
}

func TestUsageErrorsExitTwo(t *testing.T) {
	for _, args := range [][]string{
		{"frobnicate"}, {"check-config"}, {"query"}, {"serve", "--no-such-flag"}, {"serve", "extra"},
		// Neither sends anything: a stray word would end the flags (and
		// drop --count), and hits_addend holds 32 bits.
		{"query", "--descriptor", "k=v", "extra", "--count", "3"},
		{"query", "--descriptor", "k=v", "--hits", "4294967296"},
	} {
		if code, _, _ := runCmd(args...); code != 2 {
			t.Errorf("%q: exit %d, want 2", args, code)
		}
	}
	if code, out, _ := runCmd("version"); code != 0 || !strings.HasPrefix(out, "envoy-rls ") {
		t.Errorf("version: %d %q", code, out)
	}
}

// TestCheckConfigPrintsWarnings checks that what loads with a warning
// passes check-config and the warning is printed with its position.
func TestCheckConfigPrintsWarnings(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "a.yaml"), "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 3, replaces: [{name: nobody}]}\n")
	code, out, errOut := runCmd("check-config", dir)
	want := filepath.Join(dir, "a.yaml") + `:4:72: warning: replaces names "nobody", but no rate_limit in domain "a" has that name: it replaces nothing`
	if code != 0 || !strings.Contains(out, want) {
		t.Errorf("exit %d, output lacks %q:\n%s%s", code, want, out, errOut)
	}
}
