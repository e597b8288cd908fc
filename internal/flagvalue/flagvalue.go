// Package flagvalue holds the flag.Value types this module's commands share.
package flagvalue

import "strings"

// List is a list flag: each value is split at commas (blanks around an
// item trimmed, empty items dropped), and repeated flags add up, so that
// --x a,b --x c is [a b c] and no value given is silently dropped.
type List []string

// String returns the items joined by commas.
func (l *List) String() string { return strings.Join(*l, ",") }

// Set appends the items of s.
func (l *List) Set(s string) error {
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			*l = append(*l, p)
		}
	}
	return nil
}
