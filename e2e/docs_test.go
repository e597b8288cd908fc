package e2e

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

var (
	// mdLink matches the target of an inline Markdown link: "](target)".
	mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	// mdHeading matches an ATX heading line.
	mdHeading = regexp.MustCompile(`(?m)^#{1,6}[ \t]+(.+?)[ \t]*$`)
	// notInAnchor is what GitHub drops from a heading to make its anchor.
	notInAnchor = regexp.MustCompile(`[^\p{L}\p{N}_\- ]`)
)

// headingAnchors returns the anchors GitHub gives the headings of a
// Markdown text: lower case, punctuation dropped, spaces as hyphens, and
// "-1", "-2"… after repeats. Headings inside fenced code blocks are not
// headings.
func headingAnchors(text string) map[string]bool {
	var prose strings.Builder
	fenced := false
	for line := range strings.Lines(text) {
		if strings.HasPrefix(line, "```") {
			fenced = !fenced
			continue
		}
		if !fenced {
			prose.WriteString(line)
		}
	}
	anchors, seen := map[string]bool{}, map[string]int{}
	for _, m := range mdHeading.FindAllStringSubmatch(prose.String(), -1) {
		a := strings.ReplaceAll(notInAnchor.ReplaceAllString(strings.ToLower(m[1]), ""), " ", "-")
		if n := seen[a]; n > 0 {
			anchors[a+"-"+strconv.Itoa(n)] = true
		} else {
			anchors[a] = true
		}
		seen[a]++
	}
	return anchors
}

// TestDocLinksResolve: every relative link of README.md and docs/*.md names
// a file inside the repository and, with a #fragment into a Markdown file, one
// of its headings, so that moving a section between the README and the
// performance notebook cannot leave a link pointing nowhere.
func TestDocLinksResolve(t *testing.T) {
	root := repoRoot(t)
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files := append([]string{filepath.Join(root, "README.md")}, docs...)
	links := 0
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, file)
		for _, m := range mdLink.FindAllStringSubmatch(string(b), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			links++
			path, frag, _ := strings.Cut(target, "#")
			dest := file
			if path != "" {
				dest = filepath.Join(filepath.Dir(file), filepath.FromSlash(path))
			}
			if r, err := filepath.Rel(root, dest); err != nil || r == ".." || strings.HasPrefix(r, ".."+string(filepath.Separator)) {
				// It may resolve on a developer's machine, never in a clone.
				t.Errorf("%s: link %q leaves the repository", rel, target)
				continue
			}
			db, err := os.ReadFile(dest)
			if err != nil {
				if _, statErr := os.Stat(dest); statErr == nil {
					continue // a directory
				}
				t.Errorf("%s: link %q: %v", rel, target, err)
				continue
			}
			if frag != "" && strings.HasSuffix(dest, ".md") && !headingAnchors(string(db))[frag] {
				t.Errorf("%s: link %q: no heading with anchor #%s in %s", rel, target, frag, filepath.Base(dest))
			}
		}
	}
	if links == 0 {
		t.Fatal("no relative links found: the pattern is wrong")
	}
}

// TestHeadingAnchors pins the anchor rules the link check relies on.
func TestHeadingAnchors(t *testing.T) {
	got := headingAnchors("# Performance notebook\n## Coalescing: slots and spares\n```sh\n# not a heading\n```\n### ≤ 25 µs of Redis CPU\n## Redis\n## Redis\n")
	for _, want := range []string{"performance-notebook", "coalescing-slots-and-spares", "-25-µs-of-redis-cpu", "redis", "redis-1"} {
		if !got[want] {
			t.Errorf("no anchor %q in %v", want, got)
		}
	}
	if got["not-a-heading"] {
		t.Error("a comment in a code block made an anchor")
	}
}
