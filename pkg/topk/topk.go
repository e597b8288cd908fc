package topk

import (
	"cmp"
	"slices"
	"sync"
)

// Item is one monitored key.
type Item struct {
	Key string `json:"key"`
	// Count is the estimated number of hits: never below the true count,
	// at most Error above it.
	Count uint64 `json:"count"`
	// Error bounds the overestimate: the true count is at least
	// Count − Error. It is the count of the key this one evicted.
	Error uint64 `json:"error"`
}

// Sketch is a Space-Saving summary of capacity m. It is safe for
// concurrent use; every method takes one mutex.
type Sketch struct {
	mu    sync.Mutex
	m     int
	total uint64
	heap  []*counter // a min-heap on count
	index map[string]*counter
}

type counter struct {
	key   string
	count uint64
	err   uint64
	pos   int // index in heap
}

// New returns a Sketch that monitors at most capacity keys (at least 1).
func New(capacity int) *Sketch {
	capacity = max(1, capacity)
	return &Sketch{
		m:     capacity,
		heap:  make([]*counter, 0, capacity),
		index: make(map[string]*counter, capacity),
	}
}

// Capacity is the most keys s monitors.
func (s *Sketch) Capacity() int { return s.m }

// Add counts n hits of key. It allocates only when key is not monitored.
func (s *Sketch) Add(key string, n uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.add(key, nil, n)
}

// AddBytes is Add for a key held in a byte slice, which it does not retain.
// It allocates only when the key is not monitored.
func (s *Sketch) AddBytes(key []byte, n uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.add("", key, n)
}

// add counts n hits of key (or of keyBytes when key is ""). s.mu is held.
func (s *Sketch) add(key string, keyBytes []byte, n uint64) {
	if n == 0 {
		return
	}
	s.total += n
	var c *counter
	if keyBytes != nil {
		c = s.index[string(keyBytes)] // no allocation for a map lookup
	} else {
		c = s.index[key]
	}
	if c != nil {
		c.count += n
		s.down(c.pos)
		return
	}
	if keyBytes != nil {
		key = string(keyBytes)
	}
	if len(s.heap) < s.m {
		c = &counter{key: key, count: n, pos: len(s.heap)}
		s.heap = append(s.heap, c)
		s.index[key] = c
		s.up(c.pos)
		return
	}
	// Full: the new key takes over the least counter, inheriting its count
	// as the error bound.
	c = s.heap[0]
	delete(s.index, c.key)
	c.key, c.err = key, c.count
	c.count += n
	s.index[key] = c
	s.down(0)
}

// Total is the number of hits counted so far (N).
func (s *Sketch) Total() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.total
}

// Len is the number of keys monitored (at most Capacity).
func (s *Sketch) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.heap)
}

// Top returns up to n monitored keys, the largest Count first (ties: the
// smaller Error, then the key). n ≤ 0 means every monitored key.
func (s *Sketch) Top(n int) []Item {
	s.mu.Lock()
	items := make([]Item, len(s.heap))
	for i, c := range s.heap {
		items[i] = Item{Key: c.key, Count: c.count, Error: c.err}
	}
	s.mu.Unlock()
	slices.SortFunc(items, func(a, b Item) int {
		if c := cmp.Compare(b.Count, a.Count); c != 0 {
			return c
		}
		if c := cmp.Compare(a.Error, b.Error); c != 0 {
			return c
		}
		return cmp.Compare(a.Key, b.Key)
	})
	if n > 0 && n < len(items) {
		items = items[:n]
	}
	return items
}

// Reset forgets every key and the total.
func (s *Sketch) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.heap)
	s.heap = s.heap[:0]
	clear(s.index)
	s.total = 0
}

func (s *Sketch) swap(i, j int) {
	h := s.heap
	h[i], h[j] = h[j], h[i]
	h[i].pos, h[j].pos = i, j
}

func (s *Sketch) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if s.heap[p].count <= s.heap[i].count {
			return
		}
		s.swap(i, p)
		i = p
	}
}

func (s *Sketch) down(i int) {
	n := len(s.heap)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		m := l
		if r := l + 1; r < n && s.heap[r].count < s.heap[l].count {
			m = r
		}
		if s.heap[i].count <= s.heap[m].count {
			return
		}
		s.swap(i, m)
		i = m
	}
}
