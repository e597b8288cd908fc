package topk

import (
	"sync"
	"sync/atomic"
)

// GroupsOptions configures Groups.
type GroupsOptions struct {
	// Capacity is the number of keys each group's Sketch monitors.
	// Default 64.
	Capacity int
	// MaxGroups bounds the number of groups; hits for a new group beyond
	// it are not counted (Dropped counts them). Default 1024.
	MaxGroups int
}

// Defaults of GroupsOptions.
const (
	DefaultCapacity  = 64
	DefaultMaxGroups = 1024
)

// Groups holds one Sketch per group G, so that memory is bounded by
// MaxGroups × Capacity keys. It is safe for concurrent use.
type Groups[G comparable] struct {
	capacity, maxGroups int
	mu                  sync.RWMutex
	sketches            map[G]*Sketch
	dropped             atomic.Uint64
}

// NewGroups returns an empty Groups.
func NewGroups[G comparable](o GroupsOptions) *Groups[G] {
	if o.Capacity <= 0 {
		o.Capacity = DefaultCapacity
	}
	if o.MaxGroups <= 0 {
		o.MaxGroups = DefaultMaxGroups
	}
	return &Groups[G]{capacity: o.Capacity, maxGroups: o.MaxGroups, sketches: map[G]*Sketch{}}
}

// Sketch returns group's Sketch, creating it if needed; nil when MaxGroups
// groups exist already and group is not one of them.
func (g *Groups[G]) Sketch(group G) *Sketch {
	g.mu.RLock()
	s := g.sketches[group]
	g.mu.RUnlock()
	if s != nil {
		return s
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if s = g.sketches[group]; s != nil {
		return s
	}
	if len(g.sketches) >= g.maxGroups {
		return nil
	}
	s = New(g.capacity)
	g.sketches[group] = s
	return s
}

// AddBytes counts n hits of key in group. When the group cannot be created
// (MaxGroups reached) the hits are added to Dropped instead.
func (g *Groups[G]) AddBytes(group G, key []byte, n uint64) {
	if s := g.Sketch(group); s != nil {
		s.AddBytes(key, n)
		return
	}
	g.dropped.Add(n)
}

// Dropped is the number of hits not counted because MaxGroups was reached.
func (g *Groups[G]) Dropped() uint64 { return g.dropped.Load() }

// Capacity is the number of keys each group monitors.
func (g *Groups[G]) Capacity() int { return g.capacity }

// Each calls f for every group, in no particular order. f must not call
// methods of g that create groups.
func (g *Groups[G]) Each(f func(G, *Sketch)) {
	g.mu.RLock()
	defer g.mu.RUnlock()
	for k, s := range g.sketches {
		f(k, s)
	}
}

// Len is the number of groups.
func (g *Groups[G]) Len() int {
	g.mu.RLock()
	defer g.mu.RUnlock()
	return len(g.sketches)
}

// Reset forgets every group and the dropped count.
func (g *Groups[G]) Reset() {
	g.mu.Lock()
	defer g.mu.Unlock()
	clear(g.sketches)
	g.dropped.Store(0)
}
