package descriptors

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Options tunes loading. The zero value is the default.
type Options struct {
	// MergeDomains lets several files declare the same domain; their
	// top-level descriptor lists are concatenated (a descriptor defined in
	// two files is still a duplicate). Off by default: a duplicate domain is
	// an error, as in envoyproxy/ratelimit without MERGE_DOMAIN_CONFIG.
	MergeDomains bool
}

// Config is a compiled, immutable set of domains. All methods are safe for
// concurrent use. The Rules it returns are shared and must not be modified.
type Config struct {
	domains  map[string]*domain
	names    []string // sorted
	digest   string
	warnings ErrorList
}

// Warnings returns what loaded but has no effect, sorted by position:
// what envoyproxy/ratelimit accepts and ignores (a key out of place, a
// second YAML document, a replaces entry naming no limit, requests_per_unit
// beside unlimited), reads oddly (a missing requests_per_unit, which
// blocks; a key given twice) or reads where envoy-rls does not (a subfolder
// holding YAML files).
func (c *Config) Warnings() []*Error { return c.warnings }

// domain is one compiled domain.
type domain struct {
	name   string
	files  []string
	root   *level
	rules  []*Rule // file order
	limits int
}

// level is one list of sibling descriptors, indexed for Match.
type level struct {
	keys map[string]*keyGroup
}

// keyGroup holds the siblings that share a key.
type keyGroup struct {
	exact map[string]*node // by literal value
	wild  []*node          // wildcard values, in file order
	any   *node            // the key-only node
}

// node is one configured descriptor.
type node struct {
	key, value string
	wildcard   bool
	glob       glob
	pos        Position
	rule       *Rule  // nil when the node has no rate limit
	children   *level // nil when the node has no nested descriptors
}

func newLevel() *level { return &level{keys: map[string]*keyGroup{}} }

// add inserts n (valued tells whether it has a value) and returns the
// sibling it duplicates, if any, without inserting.
func (l *level) add(n *node, valued bool) *node {
	g := l.keys[n.key]
	if g == nil {
		g = &keyGroup{}
		l.keys[n.key] = g
	}
	switch {
	case !valued:
		if g.any != nil {
			return g.any
		}
		g.any = n
	case n.wildcard:
		for _, w := range g.wild {
			if w.value == n.value {
				return w
			}
		}
		g.wild = append(g.wild, n)
	default:
		if prev := g.exact[n.value]; prev != nil {
			return prev
		}
		if g.exact == nil {
			g.exact = map[string]*node{}
		}
		g.exact[n.value] = n
	}
	return nil
}

// lookup returns the node e selects among l's siblings: the exact key+value
// node, else the first wildcard node (file order) whose pattern matches,
// else the key-only node.
func (l *level) lookup(e Entry) *node {
	g := l.keys[e.Key]
	if g == nil {
		return nil
	}
	if n := g.exact[e.Value]; n != nil {
		return n
	}
	for _, n := range g.wild {
		if n.glob.match(e.Value) {
			return n
		}
	}
	return g.any
}

func newConfig(builds []*domainBuild, digest string) *Config {
	c := &Config{domains: make(map[string]*domain, len(builds)), digest: digest}
	for _, b := range builds {
		c.domains[b.name] = &domain{name: b.name, files: b.files, root: b.root, rules: b.rules, limits: b.limits}
		c.names = append(c.names, b.name)
	}
	slices.Sort(c.names)
	return c
}

// Load reads every *.yaml and *.yml file directly in dir (not recursive;
// names starting with "." are skipped, so Kubernetes ConfigMap volumes, whose
// files are symlinks through a hidden ..data directory, load as the files
// they show; symlinks are followed), then parses, validates and compiles
// them, in name order. Each file declares one domain.
//
// When the configuration is invalid the error is an ErrorList naming every
// problem found with its file:line:col. A folder that cannot be read, or
// that holds no configuration file, is an error too.
func Load(dir string, opts Options) (*Config, error) {
	files, err := readDir(dir)
	if err != nil {
		return nil, err
	}
	return compile(files, opts)
}

// LoadFiles is Load for an explicit list of files (any names, in the order
// given), e.g. for `envoy-rls check-config file.yaml`. Errors name the
// paths as given.
func LoadFiles(paths []string, opts Options) (*Config, error) {
	if len(paths) == 0 {
		return nil, errors.New("descriptors: no configuration files given")
	}
	files := make([]srcFile, 0, len(paths))
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("descriptors: %w", err)
		}
		files = append(files, srcFile{name: p, data: data})
	}
	return compile(files, opts)
}

// maxReads bounds how many times readDir reads a folder that keeps
// changing.
const maxReads = 5

// readDir reads the configuration files of dir, sorted by name, as one
// generation. A Kubernetes ConfigMap volume is read whole by one read (see
// readDirOnce). A plain folder is read again until two reads in a row agree
// (at most maxReads), so that an update between the reads of two files (a
// rule moved from one file to another with --config.merge-domains, a file
// rewritten in place) is not loaded half done; two reads that agree can
// still both be a mix of two edits that alternate between the same
// contents.
func readDir(dir string) ([]srcFile, error) {
	files, whole, err := readDirOnce(dir)
	if err != nil || whole {
		return files, err
	}
	return settle(dir, files)
}

// settle is readDir after a first read, prev, that was not one whole
// generation: it reads dir until a read agrees with the one before.
func settle(dir string, prev []srcFile) ([]srcFile, error) {
	for range maxReads - 1 {
		files, _, err := readDirOnce(dir)
		if err != nil {
			return nil, err
		}
		if slices.EqualFunc(prev, files, func(a, b srcFile) bool { return a.name == b.name && bytes.Equal(a.data, b.data) }) {
			return files, nil
		}
		prev = files
	}
	return nil, fmt.Errorf("descriptors: the configuration files in %s changed between each of %d reads in a row; they are read again at the next check", dir, maxReads)
}

// readDirOnce reads the configuration files of dir, sorted by name.
//
// In a Kubernetes ConfigMap volume every file is a symlink "..data/<name>"
// and ..data a symlink to the generation's folder: an update swaps ..data
// at once, then adds the links of new files and removes those of dropped
// ones. Following each file's link on its own, a read that an update
// interleaves takes some files from one generation and the rest (or none)
// from the next. So readDirOnce resolves ..data first and takes the
// ConfigMap's files from that folder's own listing: one generation whole.
// Only the other entries of dir (plain files, other links) are read from
// dir. The kubelet removes a generation's folder as soon as ..data links to
// the next one, so a read during which ..data moved on may have listed or
// read that folder half removed (without error): it is made again, from
// the new generation. A read that ends with ..data still on its folder read
// it whole, since a generation never comes back. The files keep their
// names in dir in parse errors and digests; an I/O error names the path it
// failed on.
//
// whole reports that every file came from the ConfigMap's generation, which
// no later read needs to confirm.
func readDirOnce(dir string) (files []srcFile, whole bool, err error) {
	for range maxReads - 1 {
		gen := dataFolder(dir)
		read, own, readErr := readDirFrom(dir, gen)
		if gen != "" && dataFolder(dir) != gen {
			continue // ..data moved on during the read
		}
		return read, gen != "" && own == 0, readErr
	}
	return nil, false, fmt.Errorf("descriptors: the ConfigMap in %s changed during each of %d reads in a row; it is read again at the next check", dir, maxReads-1)
}

// dataFolder returns the folder dir/..data links to, or "" when it is no
// link (dir is not a ConfigMap volume).
func dataFolder(dir string) string {
	gen, err := os.Readlink(filepath.Join(dir, "..data"))
	switch {
	case err != nil:
		return ""
	case filepath.IsAbs(gen):
		return gen
	}
	return filepath.Join(dir, gen)
}

// readDirFrom is one read of readDirOnce, with the ConfigMap's files taken
// from the folder gen ("" when dir is no ConfigMap volume); own counts the
// files read from dir itself.
func readDirFrom(dir, gen string) (files []srcFile, own int, err error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, 0, fmt.Errorf("descriptors: read config folder: %w", err)
	}
	type source struct {
		name, from string
		dir        bool
	}
	var sources []source
	inDir := map[string]bool{} // names in dir that are not the ConfigMap's links
	for _, e := range entries {
		path := filepath.Join(dir, e.Name())
		if gen != "" && e.Type()&fs.ModeSymlink != 0 {
			t, err := os.Readlink(path)
			if errors.Is(err, fs.ErrNotExist) || err == nil && strings.HasPrefix(filepath.ToSlash(t), "..data/") {
				continue // the ConfigMap's (or a link it just dropped): from gen's listing below
			}
		}
		inDir[e.Name()] = true
		sources = append(sources, source{e.Name(), path, e.IsDir()})
	}
	if gen != "" {
		gens, err := os.ReadDir(gen)
		if err != nil {
			return nil, 0, fmt.Errorf("descriptors: read config folder: %w", err)
		}
		for _, e := range gens {
			if !inDir[e.Name()] {
				sources = append(sources, source{e.Name(), filepath.Join(gen, e.Name()), e.IsDir()})
			}
		}
		slices.SortFunc(sources, func(a, b source) int { return strings.Compare(a.name, b.name) })
	}
	configs := 0
	for _, src := range sources {
		if strings.HasPrefix(src.name, ".") {
			continue
		}
		if src.dir {
			if holdsYAML(src.from) {
				files = append(files, srcFile{name: filepath.Join(dir, src.name), folder: true})
			}
			continue
		}
		if !isYAMLName(src.name) {
			files = append(files, srcFile{name: filepath.Join(dir, src.name), other: true})
			continue
		}
		fi, err := os.Stat(src.from) // follows symlinks
		if vanished(err, src.from) {
			continue // removed since the listing: the next read (settle) confirms it
		}
		if err != nil {
			return nil, 0, fmt.Errorf("descriptors: %w", err)
		}
		if !fi.Mode().IsRegular() {
			continue
		}
		data, err := os.ReadFile(src.from)
		if vanished(err, src.from) {
			continue
		}
		if err != nil {
			return nil, 0, fmt.Errorf("descriptors: %w", err)
		}
		files = append(files, srcFile{name: filepath.Join(dir, src.name), data: data})
		configs++
		if inDir[src.name] {
			own++
		}
	}
	if configs == 0 {
		return nil, 0, fmt.Errorf("descriptors: no configuration files (*.yaml, *.yml) in %s", dir)
	}
	return files, own, nil
}

// vanished reports whether err says that path is gone, and path itself (not
// only what a symlink at path names) no longer exists: a file an editor or
// a deploy removed between the folder's listing and its read. A dangling
// symlink is not vanished, and stays an error.
func vanished(err error, path string) bool {
	if !errors.Is(err, fs.ErrNotExist) {
		return false
	}
	_, lerr := os.Lstat(path)
	return errors.Is(lerr, fs.ErrNotExist)
}

// isYAMLName reports whether a file's name ends in .yaml or .yml, in any
// case.
func isYAMLName(name string) bool {
	ext := filepath.Ext(name)
	return strings.EqualFold(ext, ".yaml") || strings.EqualFold(ext, ".yml")
}

// holdsYAML reports whether folder dir, or a folder below it, holds a
// *.yaml or *.yml file (names starting with "." left out).
func holdsYAML(dir string) bool {
	found := false
	filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return nil // unreadable: nothing to report
		case path != dir && strings.HasPrefix(d.Name(), "."):
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		case !d.IsDir() && isYAMLName(path):
			found = true
			return filepath.SkipAll
		}
		return nil
	})
	return found
}

// digest is the hex SHA-256 of the names and contents of files.
func digest(files []srcFile) string {
	h := sha256.New()
	var n [binary.MaxVarintLen64]byte
	for _, f := range files {
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(f.name)))])
		h.Write([]byte(f.name))
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(f.data)))])
		h.Write(f.data)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Match returns the rule for one request descriptor in domain, or nil.
//
// It follows envoyproxy/ratelimit: the entries are walked level by level
// from the domain root; at each level the sibling with the same key and
// value is taken first, then the first wildcard-valued sibling (in file
// order) whose pattern matches the value, then the key-only sibling; when
// none fits, nothing matches. The result is the rule of the node reached
// by the last entry: nil when that node has no rate_limit, and nil when the
// request has more entries than the tree is deep ("request depth does not
// match config depth"). A rule that is Unlimited is returned too.
//
// A key-only or wildcard rule gives every distinct value its own counter:
// that is the caller's business (the storage key holds the request's
// entries), Match only selects the rule.
//
// Match does not allocate.
func (c *Config) Match(domain string, entries []Entry) *Rule {
	if c == nil || len(entries) == 0 {
		return nil
	}
	d := c.domains[domain]
	if d == nil {
		return nil
	}
	lvl := d.root
	var n *node
	for _, e := range entries {
		if lvl == nil {
			return nil
		}
		if n = lvl.lookup(e); n == nil {
			return nil
		}
		lvl = n.children
	}
	return n.rule
}

// HasDomain reports whether domain is configured.
func (c *Config) HasDomain(domain string) bool {
	if c == nil {
		return false
	}
	_, ok := c.domains[domain]
	return ok
}

// Domains summarises the loaded domains, sorted by name. File lists every
// file of the domain, comma-separated, when domains were merged.
func (c *Config) Domains() []DomainSummary {
	if c == nil {
		return nil
	}
	out := make([]DomainSummary, 0, len(c.names))
	for _, name := range c.names {
		d := c.domains[name]
		out = append(out, DomainSummary{
			Domain: name,
			File:   strings.Join(d.files, ", "),
			Rules:  len(d.rules),
			Limits: d.limits,
		})
	}
	return out
}

// Rules returns every rule of domain in file order (nil for an unknown
// domain), e.g. for /debug/config. The slice is the caller's; the Rules are
// shared and must not be modified.
func (c *Config) Rules(domain string) []*Rule {
	if c == nil {
		return nil
	}
	d := c.domains[domain]
	if d == nil {
		return nil
	}
	return slices.Clone(d.rules)
}

// Summary returns one line per domain, sorted by domain, for
// `envoy-rls check-config`, e.g. "edge: 4 rules, 5 limits (config/edge.yaml)".
func (c *Config) Summary() []string {
	var out []string
	for _, s := range c.Domains() {
		out = append(out, fmt.Sprintf("%s: %s, %s (%s)", s.Domain, plural(s.Rules, "rule"), plural(s.Limits, "limit"), s.File))
	}
	return out
}

// Digest is the hex SHA-256 of the names and contents of the files the
// Config was compiled from; equal digests mean identical input.
func (c *Config) Digest() string {
	if c == nil {
		return ""
	}
	return c.digest
}

func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return fmt.Sprintf("%d %ss", n, word)
}
