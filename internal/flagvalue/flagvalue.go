// Package flagvalue holds the flag.Value types this module's commands share.
package flagvalue

import (
	"errors"
	"strings"
)

// List is a list flag: each value is split at commas (blanks around an
// item trimmed, empty items dropped), and repeated flags add up, so that
// --x a,b --x c is [a b c]. A value with no item at all ("", " , ") is an
// error, not nothing: an unset shell variable given as the value of
// --grpc.tls.client-san would otherwise leave mutual TLS without its
// client names, open to any certificate of the CA.
type List []string

// String returns the items joined by commas.
func (l *List) String() string { return strings.Join(*l, ",") }

// Set appends the items of s.
func (l *List) Set(s string) error {
	n := len(*l)
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			*l = append(*l, p)
		}
	}
	if len(*l) == n {
		return errors.New("no value: want one or more, comma-separated")
	}
	return nil
}
