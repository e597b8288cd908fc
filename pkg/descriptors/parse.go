package descriptors

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"gopkg.in/yaml.v3"

	"github.com/envoy-rls/envoy-rls/pkg/limiter"
)

// Limits of the schema, documented in doc.go.
const (
	// MaxSlidingLogRequests caps requests_per_unit for algorithm sliding_log,
	// which stores one entry per admitted hit.
	MaxSlidingLogRequests = 10000
	// MaxRequests caps requests_per_unit and burst: 2^53−1, the largest
	// integer that Redis's Lua numbers (IEEE doubles) hold exactly. Sliding
	// and fixed windows are capped lower (Countable).
	MaxRequests = limiter.MaxExact
	// MaxDepth caps how deeply descriptors nest.
	MaxDepth = 64
	// MaxDescriptors caps the number of descriptors of one load (it also
	// bounds what YAML aliases can expand to).
	MaxDescriptors = 100_000
)

// srcFile is one configuration file as read from disk.
type srcFile struct {
	name string // path as reported in errors
	data []byte
	// folder: a subfolder of the configuration folder that holds YAML
	// files, which are not read; compile warns about it.
	folder bool
	// other: a file whose name does not end in .yaml or .yml, which is not
	// read; compile warns about it.
	other bool
}

// unitWindow returns the window of a rate_limit unit (lower case). Month
// and year are fixed lengths, as in envoyproxy/ratelimit: 30 and 365 days.
func unitWindow(unit string) (time.Duration, bool) {
	const day = 24 * time.Hour
	switch unit {
	case "second":
		return time.Second, true
	case "minute":
		return time.Minute, true
	case "hour":
		return time.Hour, true
	case "day":
		return day, true
	case "week":
		return 7 * day, true
	case "month":
		return 30 * day, true
	case "year":
		return 365 * day, true
	}
	return 0, false
}

// domainBuild collects one domain while files are compiled.
type domainBuild struct {
	name     string
	files    []string
	pos      Position
	root     *level
	rules    []*Rule
	ids      map[string]*Rule
	names    map[string]bool // configured rate_limit names
	replaces []replaceRef
	limits   int
}

type replaceRef struct {
	name string
	pos  Position
}

func newDomainBuild(name string, pos Position) *domainBuild {
	return &domainBuild{
		name:  name,
		files: []string{pos.File},
		pos:   pos,
		root:  newLevel(),
		ids:   map[string]*Rule{},
		names: map[string]bool{},
	}
}

// compiler turns files into a Config, collecting every error.
type compiler struct {
	opts Options
	errs ErrorList
	// warns are what envoyproxy/ratelimit loads and envoy-rls loads too,
	// but the operator should hear about: something that has no effect.
	warns     ErrorList
	domains   map[string]*domainBuild
	order     []*domainBuild
	nodes     int
	tooMany   bool
	pairCount int
	seenErr   map[Error]bool
	// errors beyond maxErrors are counted, not listed
	dropped      int
	firstDropped Position
	fileName     string
}

// maxErrors bounds the errors of one load; more are summarized.
const maxErrors = 1000

func (c *compiler) errorf(pos Position, format string, args ...any) {
	e := &Error{Pos: pos, Msg: fmt.Sprintf(format, args...)}
	if c.seenErr == nil {
		c.seenErr = map[Error]bool{}
	}
	if c.seenErr[*e] { // aliases repeat nodes, and their errors
		return
	}
	c.seenErr[*e] = true
	if len(c.errs) == maxErrors {
		if c.dropped == 0 {
			c.firstDropped = pos
		}
		c.dropped++
		return
	}
	c.errs = append(c.errs, e)
}

// warnf records a warning: the configuration loads, and the warning is
// logged with it and printed by check-config.
func (c *compiler) warnf(pos Position, format string, args ...any) {
	if len(c.warns) < maxErrors {
		c.warns = append(c.warns, &Error{Pos: pos, Msg: fmt.Sprintf(format, args...)})
	}
}

// compile parses, validates and compiles files (in order) into a Config.
// The error is an ErrorList.
func compile(files []srcFile, opts Options) (*Config, error) {
	c := &compiler{opts: opts, domains: map[string]*domainBuild{}}
	for _, f := range files {
		if f.folder {
			c.warnf(Position{File: f.name}, "folder not read: envoy-rls reads the *.yaml and *.yml files directly in the configuration folder, not in its subfolders (envoyproxy/ratelimit reads those too): move its files up")
			continue
		}
		if f.other {
			c.warnf(Position{File: f.name}, "file not read: envoy-rls reads the files whose names end in .yaml or .yml (envoyproxy/ratelimit reads every file): rename it if it holds descriptors")
			continue
		}
		c.file(f)
	}
	for _, d := range c.order {
		for _, r := range d.replaces {
			if !d.names[r.name] {
				c.warnf(r.pos, "replaces names %q, but no rate_limit in domain %q has that name: it replaces nothing", r.name, d.name)
			}
		}
	}
	if len(c.errs) > 0 {
		c.errs.sort()
		if c.dropped > 0 {
			c.errs = append(c.errs, &Error{Pos: c.firstDropped, Msg: fmt.Sprintf("%d more errors not listed", c.dropped)})
		}
		return nil, c.errs
	}
	c.warns.sort()
	cfg := newConfig(c.order, digest(files))
	cfg.warnings = c.warns
	return cfg, nil
}

var yamlLineRE = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// yamlParserProblems are the messages of yaml.v3's parser (parserc.go), as
// against its scanner's and its reader's: for these it reports the line of
// its mark 0-based (v3.0.1, decode.go's fail adds 1 for the scanner only).
var yamlParserProblems = []string{
	"did not find expected",
	"found duplicate %YAML directive",
	"found duplicate %TAG directive",
	"found incompatible YAML document",
	"found undefined tag handle",
}

// yamlReaderProblems are the messages of yaml.v3's reader (readerc.go),
// which names no line at all: the input is not UTF-8 text YAML allows.
var yamlReaderProblems = []string{
	"invalid leading UTF-8 octet",
	"invalid trailing UTF-8 octet",
	"incomplete UTF-8 octet sequence",
	"invalid length of a UTF-8 sequence",
	"invalid Unicode character",
	"control characters are not allowed",
}

// yamlPosition is where in data the YAML error err is: yaml.v3 gives a
// line at most (no column), 0-based for a parser's error and none at all
// when it is the first line, and none for a reader's error, whose byte is
// found here. The message is err's without its "yaml: line N:".
func yamlPosition(err error, data []byte) (line, col int, msg string) {
	msg = strings.TrimPrefix(err.Error(), "yaml: ")
	if m := yamlLineRE.FindStringSubmatch(err.Error()); m != nil {
		line, _ = strconv.Atoi(m[1])
		msg = m[2]
	}
	has := func(problems []string) bool {
		return slices.ContainsFunc(problems, func(p string) bool { return strings.HasPrefix(msg, p) })
	}
	switch {
	case has(yamlReaderProblems):
		line, col = badTextAt(data)
		return line, col, msg
	case has(yamlParserProblems):
		return line + 1, 0, msg
	case line == 0 && !strings.HasPrefix(msg, "unmarshal errors"):
		return 1, 0, msg // a scanner's error on the first line
	}
	return line, 0, msg
}

// badTextAt returns the line and column (in bytes, 1-based) of the first
// byte of data that is not UTF-8 or is a character YAML does not allow
// (YAML 1.2 §5.1: tab, line breaks and the printable characters), and
// 0, 0 when there is none.
func badTextAt(data []byte) (line, col int) {
	line, start := 1, 0
	for i := 0; i < len(data); {
		r, n := utf8.DecodeRune(data[i:])
		switch {
		case r == utf8.RuneError && n <= 1,
			r < 0x20 && r != '\t' && r != '\n' && r != '\r',
			r >= 0x7F && r < 0xA0 && r != 0x85,
			r == 0xFFFE || r == 0xFFFF:
			return line, i - start + 1
		case r == '\n':
			line, start = line+1, i+1
		}
		i += n
	}
	return 0, 0
}

// yamlError converts an error of the YAML parser reading data into an
// Error at the line (and for a bad byte the column) it is at.
func (c *compiler) yamlError(err error, data []byte) {
	line, col, msg := yamlPosition(err, data)
	c.errorf(Position{File: c.fileName, Line: line, Column: col}, "invalid YAML: %s", msg)
}

func (c *compiler) file(f srcFile) {
	c.fileName = f.name
	dec := yaml.NewDecoder(bytes.NewReader(f.data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			c.errorf(Position{File: f.name, Line: 1, Column: 1}, "file is empty: want a mapping with domain and descriptors")
			return
		}
		c.yamlError(err, f.data)
		return
	}
	var extra yaml.Node
	switch err := dec.Decode(&extra); {
	case err == nil:
		if len(extra.Content) > 0 && !isNull(extra.Content[0]) {
			c.warnf(c.pos(extra.Content[0]), "a second YAML document is ignored, as envoyproxy/ratelimit ignores it: a file holds one domain")
		}
	case !errors.Is(err, io.EOF):
		// envoyproxy/ratelimit does not read past the first document,
		// so what follows it need not even be YAML.
		line, col, msg := yamlPosition(err, f.data)
		c.warnf(Position{File: f.name, Line: line, Column: col}, "what follows the first YAML document is ignored, as envoyproxy/ratelimit ignores it, and is not YAML: %s", msg)
	}
	if len(doc.Content) == 0 || isNull(doc.Content[0]) {
		c.errorf(Position{File: f.name, Line: 1, Column: 1}, "file is empty: want a mapping with domain and descriptors")
		return
	}
	c.root(resolve(doc.Content[0]))
}

func (c *compiler) pos(n *yaml.Node) Position {
	return Position{File: c.fileName, Line: n.Line, Column: n.Column}
}

// resolve follows aliases to the node they name.
func resolve(n *yaml.Node) *yaml.Node {
	for i := 0; n.Kind == yaml.AliasNode && n.Alias != nil && i < 100; i++ {
		n = n.Alias
	}
	return n
}

func isNull(n *yaml.Node) bool {
	n = resolve(n)
	return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		if isNull(n) {
			return "null"
		}
		switch n.ShortTag() {
		case "!!int":
			return "the integer " + n.Value
		case "!!float":
			return "the number " + n.Value
		case "!!bool":
			return "the boolean " + n.Value
		}
		return fmt.Sprintf("the string %q", n.Value)
	case yaml.AliasNode:
		return "an alias"
	}
	return "a document"
}

// pair is one key of a mapping, after merge keys (<<) are expanded.
type pair struct {
	key  string
	k, v *yaml.Node // v is resolved
}

// maxPairs bounds the mapping keys one load may visit, so that merge keys
// and aliases cannot make the work grow exponentially with the input.
const maxPairs = 2_000_000

// pairs returns the keys of mapping n in order, expanding YAML merge keys
// (explicit keys win over merged ones) and reporting non-string keys. As in
// envoyproxy/ratelimit, whose YAML library decodes into zero values, a key
// whose value is null is left out (it is as if absent), and of a key given
// twice the last counts (with a warning).
func (c *compiler) pairs(n *yaml.Node) []pair { return c.pairsAt(n, 0) }

func (c *compiler) pairsAt(n *yaml.Node, depth int) []pair {
	var out []pair
	seen := map[string]int{} // index in out
	var merged []pair
	for i := 0; i+1 < len(n.Content); i += 2 {
		if c.pairCount++; c.pairCount > maxPairs {
			if c.pairCount == maxPairs+1 {
				c.errorf(c.pos(n), "the file expands to more than %d mapping keys (aliases or merge keys)", maxPairs)
			}
			return out
		}
		k, v := n.Content[i], resolve(n.Content[i+1])
		if k.Kind == yaml.ScalarNode && k.ShortTag() == "!!merge" {
			merged = append(merged, c.mergeSource(v, depth)...)
			continue
		}
		if k = resolve(k); k.Kind != yaml.ScalarNode {
			c.errorf(c.pos(k), "mapping keys must be strings, got %s", kindName(k))
			continue
		}
		p := pair{key: k.Value, k: k, v: v}
		if i, dup := seen[k.Value]; dup {
			c.warnf(c.pos(k), "key %q is given twice (first at line %d): the last one counts, as in envoyproxy/ratelimit", k.Value, out[i].k.Line)
			out[i] = p
			continue
		}
		seen[k.Value] = len(out)
		out = append(out, p)
	}
	for _, p := range merged {
		if _, dup := seen[p.key]; !dup {
			seen[p.key] = len(out)
			out = append(out, p)
		}
	}
	return slices.DeleteFunc(out, func(p pair) bool { return isNull(p.v) })
}

// mergeSource returns the pairs a merge key's value contributes.
func (c *compiler) mergeSource(v *yaml.Node, depth int) []pair {
	if depth >= 4 {
		c.errorf(c.pos(v), "merge keys (<<) nest more than 4 deep")
		return nil
	}
	switch v.Kind {
	case yaml.MappingNode:
		return c.pairsAt(v, depth+1)
	case yaml.SequenceNode:
		var out []pair
		for _, e := range v.Content {
			if e = resolve(e); e.Kind != yaml.MappingNode {
				c.errorf(c.pos(e), "a merge key (<<) needs a mapping or a list of mappings, got %s", kindName(e))
				continue
			}
			out = append(out, c.pairsAt(e, depth+1)...)
		}
		return out
	}
	c.errorf(c.pos(v), "a merge key (<<) needs a mapping or a list of mappings, got %s", kindName(v))
	return nil
}

// incumbentKeys are the keys envoyproxy/ratelimit knows. It checks them
// against one flat list, wherever they are, and ignores one out of place.
var incumbentKeys = map[string]bool{
	"domain": true, "key": true, "value": true, "descriptors": true, "rate_limit": true,
	"unit": true, "requests_per_unit": true, "unlimited": true, "shadow_mode": true,
	"quota_mode": true, "name": true, "replaces": true, "detailed_metric": true,
	"value_to_metric": true, "share_threshold": true,
}

// unknownKey reports key p, which is not valid in a mapping of kind what.
// One of envoyproxy/ratelimit's keys out of place is ignored with a
// warning, as that service ignores it (so its files load unchanged);
// anything else is an error, reported true.
func (c *compiler) unknownKey(p pair, what, want string) bool {
	var home string
	switch p.key {
	case "domain":
		home = "the top level of the file"
	case "descriptors", "key", "value", "rate_limit", "rate_limits", "shadow_mode", "detailed_metric",
		"quota_mode", "value_to_metric", "share_threshold":
		home = "a descriptor"
	case "unit", "requests_per_unit", "unlimited", "name", "replaces", "algorithm", "window", "burst", "failure_mode":
		home = "a rate_limit"
	}
	switch {
	case incumbentKeys[p.key]:
		c.warnf(c.pos(p.k), "key %q is ignored in %s, as envoyproxy/ratelimit ignores it: it belongs in %s", p.key, what, home)
		return false
	case home != "":
		c.errorf(c.pos(p.k), "unknown key %q in %s: it belongs in %s", p.key, what, home)
	default:
		c.errorf(c.pos(p.k), "unknown key %q in %s (want %s)", p.key, what, want)
	}
	return true
}

// str returns the text of scalar n (any scalar, like envoyproxy/ratelimit's
// YAML decoding into strings; null is ""). ok is false after an error.
func (c *compiler) str(n *yaml.Node, field string) (s string, ok bool) {
	if n.Kind != yaml.ScalarNode {
		c.errorf(c.pos(n), "%s must be a string, got %s", field, kindName(n))
		return "", false
	}
	if isNull(n) {
		return "", true
	}
	return n.Value, true
}

// boolean returns the value of a boolean field. Besides YAML 1.2's
// true/false it accepts YAML 1.1's yes/no/on/off/y/n, which
// envoyproxy/ratelimit's YAML library reads as booleans.
func (c *compiler) boolean(n *yaml.Node, field string) (bool, bool) {
	if n.Kind == yaml.ScalarNode {
		if n.ShortTag() == "!!bool" {
			var b bool
			if err := n.Decode(&b); err == nil {
				return b, true
			}
		}
		if n.Style == 0 {
			switch n.Value {
			case "y", "Y", "yes", "Yes", "YES", "on", "On", "ON":
				return true, true
			case "n", "N", "no", "No", "NO", "off", "Off", "OFF":
				return false, true
			}
		}
	}
	c.errorf(c.pos(n), "%s must be true or false, got %s", field, kindName(n))
	return false, false
}

// positive returns the value of a positive integer field (at most
// MaxRequests).
func (c *compiler) positive(n *yaml.Node, field string) (uint64, bool) {
	// requests_per_unit may be 0 (it blocks); the message says so.
	want := "a positive integer"
	if field == "requests_per_unit" {
		want = "an integer, 0 (blocks) or more"
	}
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" {
		c.errorf(c.pos(n), "%s must be %s, got %s", field, want, kindName(n))
		return 0, false
	}
	var v int64
	if err := n.Decode(&v); err != nil {
		if strings.HasPrefix(strings.TrimSpace(n.Value), "-") {
			c.errorf(c.pos(n), "%s must be %s, got %s", field, want, n.Value)
		} else {
			c.errorf(c.pos(n), "%s %s is too large (maximum %d)", field, n.Value, int64(MaxRequests))
		}
		return 0, false
	}
	switch {
	case v == 0 && field == "requests_per_unit":
		// envoyproxy/ratelimit's way to block a value: every request is
		// over the limit (see Limit.Blocked).
		return 0, true
	case v <= 0:
		c.errorf(c.pos(n), "%s must be %s, got %d", field, want, v)
		return 0, false
	case v > MaxRequests:
		c.errorf(c.pos(n), "%s %d is too large (maximum %d, the largest integer Redis's Lua numbers hold exactly)", field, v, int64(MaxRequests))
		return 0, false
	}
	return uint64(v), true
}

func (c *compiler) root(n *yaml.Node) {
	if n.Kind != yaml.MappingNode {
		c.errorf(c.pos(n), "a descriptor file must be a mapping with domain and descriptors, got %s", kindName(n))
		return
	}
	var (
		name      string
		domainPos = c.pos(n)
		hasDomain bool
		nameOK    bool
		descs     *yaml.Node
	)
	for _, p := range c.pairs(n) {
		switch p.key {
		case "domain":
			hasDomain = true
			domainPos = c.pos(p.v)
			name, nameOK = c.str(p.v, "domain")
		case "descriptors":
			descs = p.v
		default:
			c.unknownKey(p, "the top level of the file", "domain, descriptors")
		}
	}
	var d *domainBuild
	switch {
	case !hasDomain:
		c.errorf(c.pos(n), "missing domain")
	case nameOK && name == "":
		c.errorf(domainPos, "domain is empty")
	case nameOK:
		if prev := c.domains[name]; prev != nil {
			if c.opts.MergeDomains {
				prev.files = append(prev.files, c.fileName)
				d = prev
			} else {
				c.errorf(domainPos, "duplicate domain %q: already defined at %s (several files may share a domain only when domain merging is enabled)", name, prev.pos)
			}
		} else {
			d = newDomainBuild(name, domainPos)
			c.domains[name] = d
			c.order = append(c.order, d)
		}
	}
	if d == nil { // still report the errors of the descriptors
		d = newDomainBuild(name, domainPos)
	}
	if descs != nil {
		c.descriptors(descs, d, d.root, "", nil)
	}
}

// descriptors compiles the list n at the level below prefix. shared holds,
// for each level above, the wildcard value its matches share a counter of
// (share_threshold), or "".
func (c *compiler) descriptors(n *yaml.Node, d *domainBuild, lvl *level, prefix string, shared []string) {
	depth := len(shared) + 1
	if isNull(n) {
		return
	}
	if n.Kind != yaml.SequenceNode {
		c.errorf(c.pos(n), "descriptors must be a list, got %s", kindName(n))
		return
	}
	if depth > MaxDepth {
		c.nodes++ // aliases can make this point recur exponentially often
		c.errorf(c.pos(n), "descriptors nest deeper than %d levels", MaxDepth)
		return
	}
	for _, item := range n.Content {
		c.descriptor(resolve(item), d, lvl, prefix, shared)
	}
}

func (c *compiler) descriptor(n *yaml.Node, d *domainBuild, lvl *level, prefix string, shared []string) {
	if c.nodes++; c.nodes > MaxDescriptors {
		if !c.tooMany {
			c.tooMany = true
			c.errorf(c.pos(n), "more than %d descriptors", MaxDescriptors)
		}
		return
	}
	if n.Kind != yaml.MappingNode {
		c.errorf(c.pos(n), "a descriptor must be a mapping with key (and optionally value, rate_limit, descriptors), got %s", kindName(n))
		return
	}
	var (
		key, value                string
		hasKey, hasValue          bool
		keyOK, valueOK            = true, true
		keyNode                   *yaml.Node
		rl, rls, children, rlsKey *yaml.Node
		shadow, quota, detailed   bool
		share                     bool       // share_threshold
		shareKey                  *yaml.Node // its key, for the error
	)
	for _, p := range c.pairs(n) {
		switch p.key {
		case "key":
			hasKey, keyNode = true, p.v
			key, keyOK = c.str(p.v, "key")
		case "value":
			hasValue = true
			value, valueOK = c.str(p.v, "value")
		case "rate_limit":
			rl = p.v
		case "rate_limits":
			rls, rlsKey = p.v, p.k
		case "descriptors":
			children = p.v
		case "shadow_mode":
			shadow, _ = c.boolean(p.v, "shadow_mode")
		case "quota_mode":
			quota, _ = c.boolean(p.v, "quota_mode")
		case "detailed_metric":
			detailed, _ = c.boolean(p.v, "detailed_metric")
		case "value_to_metric":
			c.boolean(p.v, "value_to_metric") // metrics never carry values
		case "share_threshold":
			share, _ = c.boolean(p.v, "share_threshold")
			shareKey = p.k
		default:
			c.unknownKey(p, "descriptor", "key, value, rate_limit, rate_limits, descriptors, shadow_mode, quota_mode, detailed_metric, value_to_metric, share_threshold")
		}
	}
	pos := c.pos(n)
	valid := keyOK && valueOK
	switch {
	case !hasKey && hasValue:
		c.errorf(pos, "descriptor has a value but no key")
		valid = false
	case !hasKey:
		c.errorf(pos, "descriptor has no key")
		valid = false
	case keyOK && key == "":
		c.errorf(c.pos(keyNode), "key is empty")
		valid = false
	}
	if hasValue && valueOK && value == "" {
		hasValue = false // envoyproxy/ratelimit's key-only descriptor
	}
	seg := key
	if hasValue {
		seg += "=" + value
	}
	id := seg
	if prefix != "" {
		id = prefix + "." + seg
	}
	nd := &node{key: key, value: value, pos: pos}
	if hasValue && strings.Contains(value, "*") {
		nd.wildcard = true
		nd.glob = compileGlob(value)
	}
	// share_threshold: every value the wildcard matches counts as the
	// wildcard itself, at this level and in the rules below it.
	here := append(slices.Clip(shared), "")
	if share {
		if nd.wildcard {
			here[len(shared)] = value
		} else {
			c.errorf(c.pos(shareKey), "share_threshold needs a wildcard value (with '*'), as in envoyproxy/ratelimit: every value it matches then shares one counter")
			valid = false
		}
	}
	if valid {
		if prev := lvl.add(nd, hasValue); prev != nil {
			what := fmt.Sprintf("key %q", key)
			if hasValue {
				what += fmt.Sprintf(" value %q", value)
			}
			c.errorf(pos, "duplicate descriptor %s: already defined at %s", what, prev.pos)
			valid = false
		}
	}

	var rule *Rule
	switch {
	case rl != nil && rls != nil:
		c.errorf(c.pos(rlsKey), "rate_limit and rate_limits are mutually exclusive: put every limit in rate_limits")
	case rl != nil:
		rule = c.rule(d, id, pos, []*yaml.Node{rl}, false)
	case rls != nil:
		switch {
		case rls.Kind != yaml.SequenceNode:
			c.errorf(c.pos(rls), "rate_limits must be a list of rate limits, got %s", kindName(rls))
		case len(rls.Content) == 0:
			c.errorf(c.pos(rls), "rate_limits is empty")
		default:
			items := make([]*yaml.Node, len(rls.Content))
			for i, it := range rls.Content {
				items[i] = resolve(it)
			}
			rule = c.rule(d, id, pos, items, true)
		}
	}
	if rule != nil && valid {
		// quota_mode: over the limit is reported and counted, never
		// denied, as shadow_mode.
		rule.ShadowMode = shadow || quota
		rule.DetailedMetric = detailed
		if slices.ContainsFunc(here, func(v string) bool { return v != "" }) {
			rule.Shared = here
		}
		if prev := d.ids[rule.ID]; prev != nil {
			c.errorf(pos, "rule ID %q is ambiguous: the rule at %s has the same ID (a key or value contains '.' or '=')", rule.ID, prev.Pos)
		} else {
			d.ids[rule.ID] = rule
			d.rules = append(d.rules, rule)
			d.limits += len(rule.Limits)
			nd.rule = rule
		}
	}
	if children != nil && !isNull(children) {
		nd.children = newLevel()
		c.descriptors(children, d, nd.children, id, here)
	}
}

// parsedLimit is one rate_limit object.
type parsedLimit struct {
	limit     Limit
	name      string
	unlimited bool
	replaces  []replaceRef
	ok        bool
}

// rule compiles the rate limit objects of one descriptor. multi is true for
// rate_limits.
func (c *compiler) rule(d *domainBuild, id string, pos Position, items []*yaml.Node, multi bool) *Rule {
	r := &Rule{Domain: d.name, ID: id, Name: id, Pos: pos}
	parsed := make([]parsedLimit, len(items))
	ok := true
	for i, it := range items {
		parsed[i] = c.limit(it, multi)
		ok = ok && parsed[i].ok
	}
	own := map[string]bool{}
	for _, p := range parsed {
		if p.name != "" {
			own[p.name] = true
			d.names[p.name] = true
		}
	}
	seen := map[string]bool{}
	for _, p := range parsed {
		for _, ref := range p.replaces {
			if own[ref.name] {
				c.errorf(ref.pos, "replaces names this descriptor's own rate limit %q", ref.name)
				ok = false
				continue
			}
			d.replaces = append(d.replaces, ref)
			if !seen[ref.name] {
				seen[ref.name] = true
				r.Replaces = append(r.Replaces, ref.name)
			}
		}
	}
	if !ok {
		return nil
	}
	if !multi {
		p := parsed[0]
		if p.name != "" {
			r.Name = p.name
		}
		if p.unlimited {
			r.Unlimited = true
			return r
		}
	}
	r.Limits = make([]Limit, len(parsed))
	for i, p := range parsed {
		l := p.limit
		l.ID = id
		if len(parsed) > 1 {
			l.ID = fmt.Sprintf("%s#%d", id, i)
		}
		l.Name = r.Name
		if p.name != "" {
			l.Name, l.Named = p.name, true
		}
		r.Limits[i] = l
	}
	return r
}

// limit parses one rate_limit object.
func (c *compiler) limit(n *yaml.Node, multi bool) parsedLimit {
	what := "rate_limit"
	if multi {
		what = "rate_limits entry"
	}
	out := parsedLimit{limit: Limit{Pos: c.pos(n)}}
	if n.Kind != yaml.MappingNode {
		c.errorf(c.pos(n), "%s must be a mapping with unit and requests_per_unit, got %s", what, kindName(n))
		return out
	}
	ok := true
	fields := map[string]pair{}
	for _, p := range c.pairs(n) {
		switch p.key {
		case "unit", "window", "requests_per_unit", "unlimited", "name", "replaces", "algorithm", "burst", "failure_mode":
			fields[p.key] = p
		default:
			if c.unknownKey(p, what, "unit or window, requests_per_unit, algorithm, burst, failure_mode, name, replaces, unlimited") {
				ok = false
			}
		}
	}
	fail := func(p pair, format string, args ...any) {
		c.errorf(c.pos(p.v), format, args...)
		ok = false
	}
	if p, has := fields["name"]; has {
		if s, good := c.str(p.v, "name"); !good {
			ok = false
		} else if s == "" {
			// envoyproxy/ratelimit loads it: an empty name is no name.
			c.warnf(c.pos(p.v), "name is empty: the limit has no name, as if name were absent")
		} else {
			out.name = s
		}
	}
	if p, has := fields["replaces"]; has {
		refs, good := c.replaces(p.v)
		out.replaces, ok = refs, ok && good
	}
	if p, has := fields["unlimited"]; has {
		b, good := c.boolean(p.v, "unlimited")
		ok = ok && good
		out.unlimited = b
	}
	if out.unlimited {
		if multi {
			c.errorf(c.pos(fields["unlimited"].k), "unlimited is not allowed in rate_limits: use rate_limit: {unlimited: true}")
			ok = false
		}
		if p, has := fields["unit"]; has {
			// envoyproxy/ratelimit refuses a unit it knows beside
			// unlimited, and loads any other (an empty one, a typo).
			if u, good := c.str(p.v, "unit"); !good {
				ok = false
			} else if _, known := unitWindow(strings.ToLower(u)); known {
				c.errorf(c.pos(p.k), "unit cannot be combined with unlimited: true")
				ok = false
			} else {
				c.warnf(c.pos(p.k), "unit %q is ignored: the limit is unlimited (envoyproxy/ratelimit ignores it too)", u)
			}
		}
		for _, k := range []string{"window", "algorithm", "burst", "failure_mode"} {
			if p, has := fields[k]; has {
				c.errorf(c.pos(p.k), "%s cannot be combined with unlimited: true", k)
				ok = false
			}
		}
		if p, has := fields["requests_per_unit"]; has {
			c.warnf(c.pos(p.k), "requests_per_unit is ignored: the limit is unlimited (envoyproxy/ratelimit ignores it too)")
		}
		out.ok = ok
		return out
	}

	l := &out.limit
	if p, has := fields["algorithm"]; has {
		if s, good := c.str(p.v, "algorithm"); !good {
			ok = false
		} else if a, err := limiter.ParseAlgorithm(s); err != nil {
			fail(p, "%v", err)
		} else {
			l.Limit.Algorithm = a
		}
	}
	if p, has := fields["failure_mode"]; has {
		if s, good := c.str(p.v, "failure_mode"); !good {
			ok = false
		} else if m, err := limiter.ParseFailureMode(s); err != nil {
			fail(p, "%v", err)
		} else {
			l.FailureMode = m
		}
	}
	unitP, hasUnit := fields["unit"]
	windowP, hasWindow := fields["window"]
	switch {
	case hasUnit && hasWindow:
		c.errorf(c.pos(windowP.k), "%s has both unit and window: use one", what)
		ok = false
	case hasUnit:
		if s, good := c.str(unitP.v, "unit"); !good {
			ok = false
		} else if w, known := unitWindow(strings.ToLower(s)); !known {
			fail(unitP, "unknown unit %q (want second, minute, hour, day, week, month or year)", s)
		} else {
			l.Unit = strings.ToLower(s)
			l.Limit.Window = w
		}
	case hasWindow:
		if s, good := c.str(windowP.v, "window"); !good {
			ok = false
		} else if w, err := time.ParseDuration(s); err != nil {
			fail(windowP, "window %q is not a duration (examples: 500ms, 90s, 1h30m)", s)
		} else if w <= 0 {
			fail(windowP, "window must be positive, got %s", s)
		} else if w%time.Millisecond != 0 {
			fail(windowP, "window %s is not a whole number of milliseconds", s)
		} else {
			l.Limit.Window = w
		}
	default:
		c.errorf(c.pos(n), "%s needs a unit (second, minute, hour, day, week, month, year) or a window (e.g. 90s)", what)
		ok = false
	}
	if p, has := fields["requests_per_unit"]; has {
		v, good := c.positive(p.v, "requests_per_unit")
		ok = ok && good
		l.Limit.Requests = v
	} else {
		// envoyproxy/ratelimit reads a missing count as 0, which blocks.
		c.warnf(c.pos(n), "%s has no requests_per_unit: 0, which blocks every request, as in envoyproxy/ratelimit", what)
	}
	if p, has := fields["burst"]; has {
		if l.Limit.Algorithm != limiter.TokenBucket {
			c.errorf(c.pos(p.k), "burst applies only to algorithm token_bucket (this limit uses %s)", l.Limit.Algorithm)
			ok = false
		} else {
			v, good := c.positive(p.v, "burst")
			ok = ok && good
			l.Limit.Burst = v
		}
	}
	if ok {
		if err := Countable(l.Limit); err != nil {
			at := n // a count × the window: the limit as a whole
			one := l.Limit
			one.Window = time.Millisecond // refused even so: the count alone
			if p, has := fields["requests_per_unit"]; has && Countable(one) != nil {
				at = p.v
			}
			c.errorf(c.pos(at), "%v", err)
			ok = false
		}
	}
	if ok && !l.Blocked() {
		if err := l.Limit.Validate(); err != nil { // defence in depth; unreachable
			c.errorf(c.pos(n), "%v", err)
			ok = false
		}
	}
	out.ok = ok
	return out
}

// Countable returns why envoy-rls does not count l, or nil: a sliding log of
// more than MaxSlidingLogRequests (a sorted set of every hit), or a limit
// outside the exact range of the stores (limiter.Limit.ExactRange: a window
// of more than 2^51−1 requests; a token bucket or sliding log whose burst or
// requests × window in ms exceeds MaxRequests). The configuration refuses
// such limits, and a request's limit override, counted with its rule's
// algorithm, is refused alike.
func Countable(l limiter.Limit) error {
	if l.Algorithm == limiter.SlidingLog && l.Requests > MaxSlidingLogRequests {
		return fmt.Errorf("requests_per_unit %d is too large for sliding_log (maximum %d): use sliding_window", l.Requests, MaxSlidingLogRequests)
	}
	return l.ExactRange()
}

// replaces parses a replaces list: [{name: ...}, ...].
func (c *compiler) replaces(n *yaml.Node) ([]replaceRef, bool) {
	if n.Kind != yaml.SequenceNode {
		c.errorf(c.pos(n), "replaces must be a list of {name: ...}, got %s", kindName(n))
		return nil, false
	}
	before := len(c.errs)
	var out []replaceRef
	for _, it := range n.Content {
		it = resolve(it)
		if it.Kind != yaml.MappingNode {
			c.errorf(c.pos(it), "a replaces entry must be a mapping {name: ...}, got %s", kindName(it))
			continue
		}
		var name string
		var has, good bool
		var at *yaml.Node
		for _, p := range c.pairs(it) {
			if p.key != "name" {
				c.unknownKey(p, "replaces entry", "name")
				continue
			}
			has, at = true, p.v
			name, good = c.str(p.v, "name")
		}
		switch {
		case !has:
			c.errorf(c.pos(it), "a replaces entry needs a name")
		case good && name == "":
			c.errorf(c.pos(at), "a replaces entry has an empty name")
		case good:
			out = append(out, replaceRef{name: name, pos: c.pos(at)})
		}
	}
	return out, len(c.errs) == before
}
