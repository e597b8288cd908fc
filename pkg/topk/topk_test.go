package topk

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
)

// exact is the model: the true count of every key.
type exact map[string]uint64

func (e exact) top(n int) []string {
	keys := make([]string, 0, len(e))
	for k := range e {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int {
		if c := cmp.Compare(e[b], e[a]); c != 0 {
			return c
		}
		return cmp.Compare(a, b)
	})
	return keys[:min(n, len(keys))]
}

// checkBounds asserts the Space-Saving guarantees of s against the model.
func checkBounds(t *testing.T, s *Sketch, model exact) {
	t.Helper()
	var n uint64
	for _, c := range model {
		n += c
	}
	if s.Total() != n {
		t.Fatalf("Total = %d, want %d", s.Total(), n)
	}
	m := uint64(s.Capacity())
	if s.Len() > s.Capacity() {
		t.Fatalf("Len %d > capacity %d", s.Len(), s.Capacity())
	}
	monitored := map[string]bool{}
	for _, it := range s.Top(0) {
		monitored[it.Key] = true
		f := model[it.Key]
		if it.Count < f || it.Count-it.Error > f {
			t.Errorf("%s: count %d error %d does not bound the true count %d", it.Key, it.Count, it.Error, f)
		}
		if it.Error > n/m {
			t.Errorf("%s: error %d > N/m = %d/%d", it.Key, it.Error, n, m)
		}
	}
	for k, f := range model {
		if f > n/m && !monitored[k] {
			t.Errorf("heavy hitter %s (%d > N/m = %d) is not monitored", k, f, n/m)
		}
	}
}

func TestSkewedStreams(t *testing.T) {
	for _, tc := range []struct {
		name     string
		s        float64 // Zipf exponent
		distinct uint64
		capacity int
		weighted bool
	}{
		{"zipf1.1", 1.1, 100000, 100, false},
		{"zipf1.5", 1.5, 10000, 50, false},
		{"zipf1.3-weighted", 1.3, 50000, 64, true},
		{"tiny", 2, 1000, 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(1, uint64(len(tc.name))))
			z := rand.NewZipf(r, tc.s, 1, tc.distinct-1)
			s := New(tc.capacity)
			model := exact{}
			for range 200000 {
				k := fmt.Sprintf("k%d", z.Uint64())
				n := uint64(1)
				if tc.weighted {
					n = 1 + r.Uint64N(5)
				}
				model[k] += n
				if r.IntN(2) == 0 {
					s.Add(k, n)
				} else {
					s.AddBytes([]byte(k), n)
				}
			}
			checkBounds(t, s, model)
			// On a skewed stream the true top 5 are far above N/m and
			// far apart: the sketch ranks them exactly.
			if tc.capacity >= 50 {
				var got []string
				for _, it := range s.Top(5) {
					got = append(got, it.Key)
				}
				if want := model.top(5); !slices.Equal(got, want) {
					t.Errorf("Top(5) = %v, want %v", got, want)
				}
			}
		})
	}
}

// TestBoundedMemory streams a million distinct keys (the worst case: no
// repeats) through a small sketch.
func TestBoundedMemory(t *testing.T) {
	s := New(16)
	model := exact{}
	for i := range 1000000 {
		k := fmt.Sprint(i)
		s.Add(k, 1)
		if i%1000 == 0 {
			model[k]++ // sample of the model; only sizes are checked here
		}
	}
	if len(s.heap) != 16 || len(s.index) != 16 {
		t.Fatalf("heap %d, index %d; want both 16", len(s.heap), len(s.index))
	}
	for _, it := range s.Top(0) {
		// Every key was seen once: the count is all error but one.
		if it.Count-it.Error != 1 {
			t.Errorf("%+v: count − error = %d, want 1", it, it.Count-it.Error)
		}
	}
	if got := s.Total(); got != 1000000 {
		t.Errorf("Total = %d", got)
	}
}

func TestAddMonitoredKeyDoesNotAllocate(t *testing.T) {
	s := New(8)
	key := []byte("client-1")
	s.AddBytes(key, 1)
	if a := testing.AllocsPerRun(1000, func() { s.AddBytes(key, 1) }); a != 0 {
		t.Errorf("AddBytes of a monitored key: %v allocations, want 0", a)
	}
}

func TestTopOrderAndReset(t *testing.T) {
	s := New(4)
	for k, n := range map[string]uint64{"a": 3, "b": 7, "c": 7, "d": 1} {
		s.Add(k, n)
	}
	s.Add("e", 1) // evicts d (count 1): e gets count 2, error 1
	got := s.Top(0)
	want := []Item{{"b", 7, 0}, {"c", 7, 0}, {"a", 3, 0}, {"e", 2, 1}}
	if !slices.Equal(got, want) {
		t.Errorf("Top = %v, want %v", got, want)
	}
	if got := s.Top(2); len(got) != 2 || got[0].Key != "b" {
		t.Errorf("Top(2) = %v", got)
	}
	s.Reset()
	if s.Len() != 0 || s.Total() != 0 || len(s.Top(0)) != 0 {
		t.Errorf("after Reset: len %d total %d", s.Len(), s.Total())
	}
	s.Add("x", 0)
	if s.Len() != 0 {
		t.Error("adding 0 hits monitored a key")
	}
}

// TestConcurrent adds from many goroutines; with room for every key the
// counts are exact. Run with -race.
func TestConcurrent(t *testing.T) {
	const workers, keys, rounds = 8, 20, 2000
	s := New(workers * keys)
	g := NewGroups[string](GroupsOptions{Capacity: keys, MaxGroups: workers})
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var buf []byte
			for i := range rounds {
				buf = fmt.Appendf(buf[:0], "w%d-k%d", w, i%keys)
				s.AddBytes(buf, 1)
				g.AddBytes(fmt.Sprint("g", i%workers), buf[:2], 1)
				if i%100 == 0 {
					_ = s.Top(3)
					g.Each(func(string, *Sketch) {})
				}
			}
		}()
	}
	wg.Wait()
	if s.Total() != workers*rounds {
		t.Fatalf("Total = %d", s.Total())
	}
	for _, it := range s.Top(0) {
		if it.Count != rounds/keys || it.Error != 0 {
			t.Errorf("%+v, want count %d error 0", it, rounds/keys)
		}
	}
	var total uint64
	g.Each(func(_ string, s *Sketch) { total += s.Total() })
	if total != workers*rounds || g.Dropped() != 0 {
		t.Errorf("groups total %d dropped %d, want %d and 0", total, g.Dropped(), workers*rounds)
	}
}

func TestGroupsBound(t *testing.T) {
	type rule struct{ domain, name string }
	g := NewGroups[rule](GroupsOptions{Capacity: 2, MaxGroups: 2})
	g.AddBytes(rule{"d", "a"}, []byte("x"), 1)
	g.AddBytes(rule{"d", "b"}, []byte("x"), 2)
	g.AddBytes(rule{"d", "c"}, []byte("x"), 3) // a third group: dropped
	g.AddBytes(rule{"d", "a"}, []byte("y"), 1)
	if g.Len() != 2 || g.Dropped() != 3 {
		t.Errorf("Len %d Dropped %d, want 2 and 3", g.Len(), g.Dropped())
	}
	if s := g.Sketch(rule{"d", "a"}); s == nil || s.Total() != 2 {
		t.Errorf("group a: %v", s)
	}
	if g.Sketch(rule{"d", "z"}) != nil {
		t.Error("Sketch created a group beyond MaxGroups")
	}
	g.Reset()
	if g.Len() != 0 || g.Dropped() != 0 {
		t.Errorf("after Reset: Len %d Dropped %d", g.Len(), g.Dropped())
	}
	d := NewGroups[string](GroupsOptions{})
	if d.Capacity() != DefaultCapacity || d.maxGroups != DefaultMaxGroups {
		t.Errorf("defaults: %d %d", d.Capacity(), d.maxGroups)
	}
}

func BenchmarkAddBytesSkewed(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 2))
	z := rand.NewZipf(r, 1.2, 1, 1<<20)
	keys := make([][]byte, 4096)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "%d", z.Uint64())
	}
	s := New(64)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		s.AddBytes(keys[i%len(keys)], 1)
	}
}
