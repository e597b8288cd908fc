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

// TestReadmeListsEverySubcommandFlag: every flag of the other subcommands,
// as their --help prints them, is in their usage in the README's "Other
// subcommands" paragraph.
func TestReadmeListsEverySubcommandFlag(t *testing.T) {
	doc := readme(t)
	at := strings.Index(doc, "Other subcommands: ")
	if at < 0 {
		t.Fatal(`README.md has no "Other subcommands" paragraph`)
	}
	// Markdown renders a line break inside a code span as a space.
	doc = strings.ReplaceAll(doc[at:], "\n", " ")
	flagLine := regexp.MustCompile(`(?m)^  -([a-z][a-z0-9.-]*)`)
	for _, cmd := range []string{"top", "check-config", "query"} {
		_, _, stderr := runCmd(cmd, "--help")
		names := flagLine.FindAllStringSubmatch(stderr, -1)
		if len(names) == 0 {
			t.Fatalf("envoy-rls %s --help printed no flags:\n%s", cmd, stderr)
		}
		// The usage line: from "envoy-rls <cmd> " to the next backquote.
		i := strings.Index(doc, "`envoy-rls "+cmd+" ")
		if i < 0 {
			t.Fatalf("README.md's Other subcommands paragraph shows no usage of envoy-rls %s", cmd)
		}
		usage := doc[i+1:]
		usage = usage[:strings.IndexByte(usage, '`')]
		for _, m := range names {
			if !strings.Contains(usage, "--"+m[1]+" ") && !strings.Contains(usage, "--"+m[1]+"]") {
				t.Errorf("README.md's usage of envoy-rls %s (%q) has no --%s", cmd, usage, m[1])
			}
		}
	}
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
