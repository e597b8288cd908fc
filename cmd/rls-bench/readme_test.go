package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/envoy-rls/envoy-rls/internal/testenv"
)

// TestReadmeListsEveryFlag: every flag of every subcommand, as its --help
// prints them, is in the README's Performance section.
func TestReadmeListsEveryFlag(t *testing.T) {
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	start := strings.Index(doc, "\n## Performance\n")
	if start < 0 {
		t.Fatal("README.md has no Performance section")
	}
	section := doc[start+1:]
	if end := strings.Index(section, "\n## "); end >= 0 {
		section = section[:end]
	}
	flagLine := regexp.MustCompile(`(?m)^  -([a-z][a-z0-9.-]*)`)
	for _, args := range [][]string{{"--help"}, {"serve-noop", "--help"}, {"report", "--help"}} {
		cmd := strings.Join(append([]string{"rls-bench"}, args[:len(args)-1]...), " ")
		var stdout, stderr bytes.Buffer
		if code := run(context.Background(), args, &stdout, &stderr); code != 0 {
			t.Fatalf("%s --help: exit code %d\n%s", cmd, code, stderr.String())
		}
		names := flagLine.FindAllStringSubmatch(stderr.String(), -1)
		if len(names) == 0 {
			t.Fatalf("%s --help printed no flags:\n%s", cmd, stderr.String())
		}
		for _, m := range names {
			if !strings.Contains(section, "`--"+m[1]+"`") && !strings.Contains(section, "[--"+m[1]) {
				t.Errorf("README.md's Performance section does not document %s --%s", cmd, m[1])
			}
		}
	}
}
