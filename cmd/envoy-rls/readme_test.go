package main

import (
	"flag"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// readme returns the repository's README.md.
func readme(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestReadmeListsEveryFlag: every serve flag has a row in the README's flag
// table, with its environment variable.
func TestReadmeListsEveryFlag(t *testing.T) {
	doc := readme(t)
	var o serveOptions
	newServeFlags(&o, io.Discard).VisitAll(func(f *flag.Flag) {
		if !strings.Contains(doc, "| `--"+f.Name+"`") && !strings.Contains(doc, "`--"+f.Name+"`, ") && !strings.Contains(doc, ", `--"+f.Name+"`") {
			t.Errorf("README.md has no row for --%s", f.Name)
		}
	})
}

// TestReadmeListsEveryMetric: every metric family pkg/metrics defines is in
// the README's metrics table.
func TestReadmeListsEveryMetric(t *testing.T) {
	doc := readme(t)
	src, err := os.ReadFile(filepath.Join("..", "..", "pkg", "metrics", "metrics.go"))
	if err != nil {
		t.Fatal(err)
	}
	names := regexp.MustCompile(`Name:\s+"(envoy_rls_[a-z_]+)"`).FindAllStringSubmatch(string(src), -1)
	if len(names) < 10 {
		t.Fatalf("found only %d metric names in pkg/metrics/metrics.go", len(names))
	}
	for _, m := range names {
		if !strings.Contains(doc, "| `"+m[1]+"` |") {
			t.Errorf("README.md's metrics table has no row for %s", m[1])
		}
	}
}
