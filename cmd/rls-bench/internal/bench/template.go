package bench

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Template is a parsed descriptor template: the comma-separated key=value
// entries of one request descriptor, where a value may contain the
// placeholders {i} (the request's index) and {i%N} (the index modulo N).
// Example: "tenant=t{i%100},user=u{i}" with index 1234 gives the entries
// tenant=t34 and user=u1234.
//
// Keys and values cannot contain ',' and keys cannot contain '=' or '{'; a '{'
// in a value must start a placeholder. A Template is immutable and safe for
// concurrent use.
type Template struct {
	src     string
	entries []tmplEntry
}

type tmplEntry struct {
	key   string
	parts []tmplPart // concatenated to form the value
}

// tmplPart is a literal (mod == 0) or a placeholder: the index modulo mod
// (mod < 0: the index itself).
type tmplPart struct {
	lit string
	mod int64
}

// ParseTemplate parses a descriptor template such as
// "remote_address=10.0.{i}" or "tenant=t{i%100},user=u{i}".
func ParseTemplate(s string) (Template, error) {
	if strings.TrimSpace(s) == "" {
		return Template{}, errors.New("descriptor template is empty")
	}
	t := Template{src: s}
	for n, raw := range strings.Split(s, ",") {
		key, value, ok := strings.Cut(raw, "=")
		if !ok {
			return Template{}, fmt.Errorf("descriptor template %q: entry %d %q: want key=value", s, n+1, raw)
		}
		if key == "" {
			return Template{}, fmt.Errorf("descriptor template %q: entry %d %q: empty key", s, n+1, raw)
		}
		if strings.ContainsAny(key, "{}") {
			return Template{}, fmt.Errorf("descriptor template %q: entry %d: key %q: placeholders are allowed in values only", s, n+1, key)
		}
		parts, err := parseValue(value)
		if err != nil {
			return Template{}, fmt.Errorf("descriptor template %q: entry %d %q: %w", s, n+1, raw, err)
		}
		t.entries = append(t.entries, tmplEntry{key: key, parts: parts})
	}
	return t, nil
}

func parseValue(v string) ([]tmplPart, error) {
	var parts []tmplPart
	for v != "" {
		open := strings.IndexAny(v, "{}")
		if open < 0 {
			parts = append(parts, tmplPart{lit: v})
			break
		}
		if v[open] == '}' {
			return nil, errors.New("'}' without '{'")
		}
		if open > 0 {
			parts = append(parts, tmplPart{lit: v[:open]})
		}
		end := strings.IndexByte(v[open:], '}')
		if end < 0 {
			return nil, errors.New("'{' without '}'")
		}
		ph := v[open+1 : open+end]
		switch {
		case ph == "i":
			parts = append(parts, tmplPart{mod: -1})
		case strings.HasPrefix(ph, "i%"):
			m, err := strconv.ParseInt(ph[2:], 10, 64)
			if err != nil || m < 1 {
				return nil, fmt.Errorf("placeholder {%s}: want {i%%N} with N a positive integer", ph)
			}
			parts = append(parts, tmplPart{mod: m})
		default:
			return nil, fmt.Errorf("unknown placeholder {%s}: want {i} or {i%%N}", ph)
		}
		v = v[open+end+1:]
	}
	if len(parts) == 0 {
		parts = []tmplPart{{lit: ""}}
	}
	return parts, nil
}

// String returns the template as it was written.
func (t Template) String() string { return t.src }

// Len returns the number of entries of the descriptor.
func (t Template) Len() int { return len(t.entries) }

// Varies reports whether the template contains a placeholder, that is
// whether its expansion depends on the index.
func (t Template) Varies() bool {
	for _, e := range t.entries {
		for _, p := range e.parts {
			if p.mod != 0 {
				return true
			}
		}
	}
	return false
}

// Key returns the key of entry j.
func (t Template) Key(j int) string { return t.entries[j].key }

// AppendValue appends the value of entry j for index i to dst and returns
// the extended buffer.
func (t Template) AppendValue(dst []byte, j int, i int64) []byte {
	for _, p := range t.entries[j].parts {
		switch {
		case p.mod == 0:
			dst = append(dst, p.lit...)
		case p.mod < 0:
			dst = strconv.AppendInt(dst, i, 10)
		default:
			dst = strconv.AppendInt(dst, i%p.mod, 10)
		}
	}
	return dst
}

// Expand returns the entries of the descriptor for index i as key, value
// pairs in template order.
func (t Template) Expand(i int64) [][2]string {
	out := make([][2]string, len(t.entries))
	var buf []byte
	for j, e := range t.entries {
		buf = t.AppendValue(buf[:0], j, i)
		out[j] = [2]string{e.key, string(buf)}
	}
	return out
}
