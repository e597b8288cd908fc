package descriptors

import (
	"cmp"
	"slices"
	"strings"
)

// Error is one problem found in a configuration file.
type Error struct {
	Pos Position
	Msg string
}

// Error formats e as "file:line:col: message".
func (e *Error) Error() string { return e.Pos.String() + ": " + e.Msg }

// ErrorList is every problem found while loading a configuration, sorted by
// file, line and column. Load returns it (as an error) when the
// configuration is invalid; use errors.As to inspect the entries.
type ErrorList []*Error

// Error joins the entries, one per line.
func (l ErrorList) Error() string {
	var b strings.Builder
	for i, e := range l {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(e.Error())
	}
	return b.String()
}

// sort orders l by position, keeping the discovery order of equal positions.
func (l ErrorList) sort() {
	slices.SortStableFunc(l, func(a, b *Error) int {
		return cmp.Or(
			cmp.Compare(a.Pos.File, b.Pos.File),
			cmp.Compare(a.Pos.Line, b.Pos.Line),
			cmp.Compare(a.Pos.Column, b.Pos.Column),
		)
	})
}
