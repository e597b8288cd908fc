package redisbackend

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/envoy-rls/envoy-rls/internal/testenv"
	"github.com/envoy-rls/envoy-rls/pkg/limiter"
	"github.com/envoy-rls/envoy-rls/pkg/limiter/limitertest"
)

// logHits checks that v, a sliding log's members with their scores in rank
// order, is a log envoy-rls writes (lua/sliding_log.lua): members
// "<16-digit start>:<count>", count >= 1, each start the end of the batch
// before, times that never decrease. It returns the hits by time.
func logHits(t testing.TB, v []redis.Z) map[int64]uint64 {
	t.Helper()
	hits := make(map[int64]uint64)
	var end uint64
	for i, z := range v {
		m, _ := z.Member.(string)
		s, c, ok := strings.Cut(m, ":")
		start, err1 := strconv.ParseUint(s, 10, 64)
		count, err2 := strconv.ParseUint(c, 10, 64)
		if !ok || len(s) != 16 || err1 != nil || err2 != nil || count == 0 {
			t.Fatalf("log member %d %q: not <16-digit start>:<count>", i, m)
		}
		if i > 0 && (start != end || z.Score < v[i-1].Score) {
			t.Fatalf("log member %d %q at %v after one ending at %d at %v: want the next start, not an earlier time", i, m, z.Score, end, v[i-1].Score)
		}
		end = start + count
		hits[int64(z.Score)] += count
	}
	return hits
}

// readLog returns the log of the counter of req as logHits does, with its
// members.
func readLog(t testing.TB, c redis.Cmdable, prefix string, req limiter.Request) ([]redis.Z, map[int64]uint64) {
	t.Helper()
	v, err := c.ZRangeWithScores(context.Background(), baseKey(prefix, req), 0, -1).Result()
	if err != nil {
		t.Fatalf("ZRANGE: %v", err)
	}
	return v, logHits(t, v)
}

// TestSlidingLogOneMemberPerRequest: a sliding log stores one member per
// admitted request, whatever its hits (it stored one per hit: a request of
// 10,000 hits wrote 10,000 members and cost Redis 10.6 ms). Requests of
// random hits fill a limit of 10,000; the log then holds as many members as
// requests were admitted, and the hits of each.
func TestSlidingLogOneMemberPerRequest(t *testing.T) {
	r := testenv.RedisServer(t)
	clock := limitertest.NewClock(time.UnixMilli(1_767_225_600_000))
	b := newSingle(t, r, DefaultKeyPrefix, clock.Now)
	c := r.Client()
	lim := limiter.Limit{Algorithm: limiter.SlidingLog, Requests: 10_000, Window: time.Hour}
	res := make([]limiter.Result, 1)
	check := func(req limiter.Request) limiter.Result {
		t.Helper()
		if err := b.Check(context.Background(), []limiter.Request{req}, res); err != nil {
			t.Fatalf("Check: %v", err)
		}
		return res[0]
	}

	whole := limiter.Request{Key: key("whole"), Limit: lim, Hits: 10_000}
	if got := check(whole); !got.Allowed || got.Remaining != 0 {
		t.Fatalf("10,000 hits on an empty log: %+v, want admitted", got)
	}
	if v, hits := readLog(t, c, DefaultKeyPrefix, whole); len(v) != 1 || hits[clock.Millis()] != 10_000 {
		t.Errorf("log after one request of 10,000 hits: %v, want one member", v)
	}

	rng := rand.New(rand.NewPCG(1, 2))
	req := limiter.Request{Key: key("random"), Limit: lim}
	want := make(map[int64]uint64)
	admitted, total := 0, uint64(0)
	for total < lim.Requests {
		clock.Advance(time.Duration(rng.Int64N(3)) * time.Millisecond) // some requests share an instant
		req.Hits = 1 + rng.Uint64N(300)
		got := check(req)
		if got.Allowed != (total+req.Hits <= lim.Requests) {
			t.Fatalf("%d hits after %d: %+v", req.Hits, total, got)
		}
		if !got.Allowed {
			break
		}
		admitted++
		total += req.Hits
		want[clock.Millis()] += req.Hits
	}
	v, hits := readLog(t, c, DefaultKeyPrefix, req)
	if len(v) != admitted {
		t.Errorf("log of %d admitted requests (%d hits) has %d members, want one per request", admitted, total, len(v))
	}
	if fmt.Sprint(hits) != fmt.Sprint(want) {
		t.Errorf("log's hits by time %v, want %v", hits, want)
	}
}

// TestSlidingLogAgainstModel compares a log of many batches with the
// reference (pkg/algorithm through limitertest.Model), at every probe: the
// retry of a denial is the time of the k-th oldest hit, found by a binary
// search over the batches, so denials of every size are probed, with the
// log full and partly expired, and after a clock step back.
func TestSlidingLogAgainstModel(t *testing.T) {
	r := testenv.RedisServer(t)
	clock := limitertest.NewClock(time.UnixMilli(1_767_225_600_000))
	b := newSingle(t, r, DefaultKeyPrefix, clock.Now)
	m := limitertest.NewModel()
	lim := limiter.Limit{Algorithm: limiter.SlidingLog, Requests: 1000, Window: time.Minute}
	rng := rand.New(rand.NewPCG(3, 4))
	k := key("model")
	// check sends a Check of one request on the log per hits, and returns
	// whether the first was admitted.
	check := func(hits ...uint64) bool {
		t.Helper()
		req := make([]limiter.Request, len(hits))
		for i, h := range hits {
			req[i] = limiter.Request{Key: k, Limit: lim, Hits: h}
		}
		res := make([]limiter.Result, len(req))
		if err := b.Check(context.Background(), req, res); err != nil {
			t.Fatalf("Check: %v", err)
		}
		want, _ := m.Check(clock.Millis(), req, false)
		for i := range res {
			if res[i] != want[i] {
				t.Fatalf("hits %v at %d, request %d: %+v, the model %+v", hits, clock.Millis(), i, res[i], want[i])
			}
		}
		return res[0].Allowed
	}
	for round := range 6 {
		// Fill the log with batches of 1 to 12 hits, 0 to 120 ms apart.
		fills, first := 0, clock.Millis()
		for check(1 + rng.Uint64N(12)) {
			fills++
			clock.Advance(time.Duration(rng.Int64N(121)) * time.Millisecond)
		}
		if fills == 0 {
			t.Fatalf("round %d admitted nothing: the log never left the window", round)
		}
		for range 150 {
			check(rng.Uint64N(lim.Requests + 1))
		}
		// The first part of this round's batches leaves the window.
		w := lim.Window.Milliseconds()
		clock.SetMillis(first + w + rng.Int64N((clock.Millis()-first)/2+1))
		if round == 3 {
			// A clock step back after an admission: the next round's
			// hits are logged at the newest time.
			clock.Advance(lim.Window)
			for range 10 {
				check(5)
				clock.Advance(time.Millisecond)
			}
			clock.Advance(-3 * time.Second)
			// A denial whose retry is for hits of its own batch, logged
			// at the newest time: 50 stored, 600 tentative, 500 more.
			if !check(600, 500) {
				t.Fatal("600 hits on 50 of 1000 denied")
			}
		}
	}
	v, _ := readLog(t, r.Client(), DefaultKeyPrefix, limiter.Request{Key: k, Limit: lim})
	if len(v) < 100 {
		t.Errorf("the log holds %d batches; the probes were meant to search many", len(v))
	}
}

// TestSlidingLogRenumbers: a key whose running total would pass its
// maximum (10^15 hits without once being idle for a window) is renumbered
// from 0, keeping its live hits and their times; the batches that left the
// window are trimmed first.
func TestSlidingLogRenumbers(t *testing.T) {
	r := testenv.RedisServer(t)
	now := int64(1_767_225_600_000)
	b := newSingle(t, r, DefaultKeyPrefix, func() time.Time { return time.UnixMilli(now) })
	c := r.Client()
	ctx := context.Background()
	req := limiter.Request{Key: key("renumber"), Limit: limiter.Limit{Algorithm: limiter.SlidingLog, Requests: 100, Window: time.Minute}, Hits: 1}
	k := baseKey(DefaultKeyPrefix, req)
	const top = 999_999_999_999_900 // 10^15 − 100
	if err := c.ZAdd(ctx, k,
		redis.Z{Score: float64(now - 60_000), Member: fmt.Sprintf("%016d:%d", top-50, 50)}, // left the window
		redis.Z{Score: float64(now - 30_000), Member: fmt.Sprintf("%016d:%d", top, 40)},
		redis.Z{Score: float64(now - 10_000), Member: fmt.Sprintf("%016d:%d", top+40, 55)},
	).Err(); err != nil {
		t.Fatalf("ZADD: %v", err)
	}
	req.Hits = 5
	res := make([]limiter.Result, 1)
	if err := b.Check(ctx, []limiter.Request{req}, res); err != nil {
		t.Fatal(err)
	}
	if !res[0].Allowed || res[0].Remaining != 0 {
		t.Errorf("5 hits on 95 of 100: %+v, want admitted, 0 remaining", res[0])
	}
	v, hits := readLog(t, c, DefaultKeyPrefix, req)
	want := map[int64]uint64{now - 30_000: 40, now - 10_000: 55, now: 5}
	if fmt.Sprint(hits) != fmt.Sprint(want) || v[0].Member != "0000000000000000:40" {
		t.Errorf("log after the renumbering: %v, want %v from 0", v, want)
	}
	req.Hits = 1
	if err := b.Check(ctx, []limiter.Request{req}, res); err != nil || res[0].Allowed || res[0].RetryAfter != 30*time.Second {
		t.Errorf("a hit over the limit: %+v, %v; want denied until the oldest batch leaves, in 30s", res[0], err)
	}
}

// TestSlidingLogRefundAmongLaterBatches: a refund (a Cluster Check whose
// other slot vetoed) takes back its hits even when later requests have
// logged batches after its own: the log then holds exactly the hits
// before and after X's, still numbered without gap, and admits exactly the
// rest of the limit. Run on a single node: the refund script is the Cluster's, run on
// the counter X's check wrote.
func TestSlidingLogRefundAmongLaterBatches(t *testing.T) {
	r := testenv.RedisServer(t)
	clock := limitertest.NewClock(time.UnixMilli(1_767_225_600_000))
	ctx := context.Background()
	lim := limiter.Limit{Algorithm: limiter.SlidingLog, Requests: 20, Window: time.Minute}
	for _, c := range []struct {
		name string
		d    int64 // ms from X's check to the others'
	}{
		{"later batches at a later time", 7},
		{"later batches at the same time", 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			prefix := t.Name() + ":"
			b := newSingle(t, r, prefix, clock.Now)
			start := clock.Millis()
			earlier := []limiter.Request{{Key: key("x"), Limit: lim, Hits: 1}}
			clock.SetMillis(start - 10)
			if err := b.Check(ctx, earlier, make([]limiter.Result, 1)); err != nil {
				t.Fatalf("a batch before X: %v", err)
			}
			clock.SetMillis(start)
			reqs := []limiter.Request{{Key: key("x"), Limit: lim, Hits: 4}}
			x, results := admitSlotCall(t, b, reqs)
			clock.SetMillis(start + c.d)
			for _, h := range []uint64{2, 3} {
				y := []limiter.Request{{Key: key("x"), Limit: lim, Hits: h}}
				if err := b.Check(ctx, y, make([]limiter.Result, 1)); err != nil {
					t.Fatalf("Y: %v", err)
				}
			}
			if err := b.refundSlot(ctx, reqs, x, results); err != nil {
				t.Fatalf("refund: %v", err)
			}
			_, hits := readLog(t, r.Client(), prefix, reqs[0])
			if want := map[int64]uint64{start - 10: 1, start + c.d: 5}; fmt.Sprint(hits) != fmt.Sprint(want) {
				t.Errorf("log after X's refund: %v, want %v (the hits before and after X's)", hits, want)
			}
			one := limiter.Request{Key: key("x"), Limit: lim, Hits: 1}
			if got := admitAll(t, []*Backend{b}, one, 4); got != 14 {
				t.Errorf("after the refund %d more hits admitted, want 14", got)
			}
		})
	}
}

// TestSlidingLogRefundEdges: the refund of X's 4 hits, admitted at T on a
// limit of 10 a second, in the cases where its batch is not simply among
// others (single node, the Cluster's refund script):
//   - it arrives after X's batch left the window and Y filled the limit:
//     it must take none of Y's hits (it took 4, and 14 were admitted);
//   - X's batch was the key's first, and a later batch remains: the key
//     keeps its expiry (emptying the set on the way dropped it, and the
//     key lived for ever);
//   - the clock had stepped back behind the log's newest batch, so X's
//     batch was logged there: nothing is taken (the hits stay counted, an
//     under-admission for a window at most).
func TestSlidingLogRefundEdges(t *testing.T) {
	r := testenv.RedisServer(t)
	const T = int64(1_767_225_600_000)
	lim := limiter.Limit{Algorithm: limiter.SlidingLog, Requests: 10, Window: time.Second}
	ctx := context.Background()
	type env struct {
		b      *Backend
		clock  *limitertest.Clock
		prefix string
	}
	check := func(t *testing.T, e env, hits uint64) {
		t.Helper()
		res := make([]limiter.Result, 1)
		if err := e.b.Check(ctx, []limiter.Request{{Key: key("x"), Limit: lim, Hits: hits}}, res); err != nil || !res[0].Allowed {
			t.Fatalf("%d hits at %d: %+v, %v; want admitted", hits, e.clock.Millis(), res[0], err)
		}
	}
	for _, c := range []struct {
		name  string
		setup func(t *testing.T, e env) // before X, clock at T
		after func(t *testing.T, e env) // between X and its refund
		want  map[int64]uint64          // the log's hits after the refund
		more  int64                     // hits admitted after it at the clock's time
	}{
		{"after X's batch left the window", nil,
			func(t *testing.T, e env) { e.clock.SetMillis(T + 1000); check(t, e, 10) },
			map[int64]uint64{T + 1000: 10}, 0},
		{"X's batch the key's first", nil,
			func(t *testing.T, e env) { e.clock.SetMillis(T + 3); check(t, e, 2) },
			map[int64]uint64{T + 3: 2}, 8},
		{"after a clock step back",
			func(t *testing.T, e env) { e.clock.SetMillis(T + 500); check(t, e, 1); e.clock.SetMillis(T) },
			nil,
			map[int64]uint64{T + 500: 5}, 5},
	} {
		t.Run(c.name, func(t *testing.T) {
			clock := limitertest.NewClock(time.UnixMilli(T))
			e := env{clock: clock, prefix: t.Name() + ":"}
			e.b = newSingle(t, r, e.prefix, clock.Now)
			if c.setup != nil {
				c.setup(t, e)
			}
			reqs := []limiter.Request{{Key: key("x"), Limit: lim, Hits: 4}}
			x, results := admitSlotCall(t, e.b, reqs) // X's, at the clock's time
			if c.after != nil {
				c.after(t, e)
			}
			if err := e.b.refundSlot(ctx, reqs, x, results); err != nil {
				t.Fatalf("refund: %v", err)
			}
			rc := r.Client()
			if _, hits := readLog(t, rc, e.prefix, reqs[0]); fmt.Sprint(hits) != fmt.Sprint(c.want) {
				t.Errorf("log after X's refund: %v, want %v", hits, c.want)
			}
			if ttl, err := rc.PTTL(ctx, baseKey(e.prefix, reqs[0])).Result(); err != nil || ttl <= 0 {
				t.Errorf("PTTL after X's refund: %v, %v; want an expiry", ttl, err)
			}
			one := limiter.Request{Key: key("x"), Limit: lim, Hits: 1}
			if got := admitAll(t, []*Backend{e.b}, one, 4); got != c.more {
				t.Errorf("after the refund %d more hits admitted, want %d", got, c.more)
			}
		})
	}
}

// TestSlidingLogForeignMiddleMember: a member envoy-rls does not write
// between live batches is not read to count (the newest and the oldest
// live batch are), but a denial's search may land on it: the retry is
// then the newest batch's time + W, later than the answer, never earlier,
// and the call does not fail. A renumbering that meets it replaces the log.
func TestSlidingLogForeignMiddleMember(t *testing.T) {
	r := testenv.RedisServer(t)
	now := int64(1_767_225_600_000)
	b := newSingle(t, r, DefaultKeyPrefix, func() time.Time { return time.UnixMilli(now) })
	c := r.Client()
	ctx := context.Background()
	res := make([]limiter.Result, 1)
	batch := func(agoMs int64, start, n uint64) redis.Z {
		return redis.Z{Score: float64(now - agoMs), Member: fmt.Sprintf("%016d:%d", start, n)}
	}
	foreign := func(agoMs int64) redis.Z { return redis.Z{Score: float64(now - agoMs), Member: "x"} }
	for _, tc := range []struct {
		name        string
		limit, hits uint64
		log         []redis.Z
		check       func(t *testing.T, res limiter.Result, log []redis.Z)
	}{
		// A full log of 10 hits; k = 10 + 5 − 10 = 5, the first probe
		// lands on x. The 5th hit is in the batch of 20 s ago (retry 40 s);
		// the fallback is the newest batch's, 10 s ago: 50 s.
		{"a denial's search", 10, 5, []redis.Z{batch(40_000, 0, 4), foreign(30_000), batch(20_000, 4, 3), batch(10_000, 7, 3)},
			func(t *testing.T, res limiter.Result, _ []redis.Z) {
				if res.Allowed || res.RetryAfter != 50*time.Second {
					t.Errorf("5 hits on a full log: %+v, want denied until the newest batch leaves, 50s", res)
				}
			}},
		// One more than the log holds: the hit is admitted, and the total
		// passes its maximum.
		{"a renumbering", 11, 1, []redis.Z{batch(30_000, 999_999_999_999_990, 4), foreign(20_000), batch(10_000, 999_999_999_999_994, 6)},
			func(t *testing.T, _ limiter.Result, v []redis.Z) {
				if log, want := logHits(t, v), map[int64]uint64{now: 1}; fmt.Sprint(log) != fmt.Sprint(want) {
					t.Errorf("log after the renumbering met the foreign member: %v, want %v (replaced)", log, want)
				}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := limiter.Request{Key: key(tc.name), Limit: limiter.Limit{Algorithm: limiter.SlidingLog, Requests: tc.limit, Window: time.Minute}, Hits: tc.hits}
			if err := c.ZAdd(ctx, baseKey(DefaultKeyPrefix, req), tc.log...).Err(); err != nil {
				t.Fatalf("ZADD: %v", err)
			}
			if err := b.Check(ctx, []limiter.Request{req}, res); err != nil {
				t.Fatalf("Check: %v", err)
			}
			v, err := c.ZRangeWithScores(ctx, baseKey(DefaultKeyPrefix, req), 0, -1).Result()
			if err != nil {
				t.Fatalf("ZRANGE: %v", err)
			}
			tc.check(t, res[0], v)
		})
	}
}

// TestSlidingLogCommandsPerAdmission counts what an admission costs Redis:
// on a fresh key one ZADD and one PEXPIRE, nothing to trim; on a live log
// also one ZREMRANGEBYSCORE; on a log whose batches all left, one DEL of the
// dead members instead.
func TestSlidingLogCommandsPerAdmission(t *testing.T) {
	r := testenv.RedisServer(t)
	clock := limitertest.NewClock(time.UnixMilli(1_767_225_600_000))
	b := newSingle(t, r, DefaultKeyPrefix, clock.Now)
	lim := limiter.Limit{Algorithm: limiter.SlidingLog, Requests: 100, Window: time.Minute}
	const n = 20
	res := make([]limiter.Result, 1)
	round := func(name string, want map[string]int64) {
		t.Helper()
		if err := r.Client().ConfigResetStat(context.Background()).Err(); err != nil {
			t.Fatal(err)
		}
		for i := range n {
			req := []limiter.Request{{Key: key("cmds", strconv.Itoa(i)), Limit: lim, Hits: 1}}
			if err := b.Check(context.Background(), req, res); err != nil || !res[0].Allowed {
				t.Fatalf("%s: Check %d: %+v, %v; want admitted", name, i, res[0], err)
			}
		}
		stats := r.CommandCalls(t)
		for _, cmd := range []string{"zadd", "pexpire", "zremrangebyscore", "del"} {
			if stats[cmd] != want[cmd] {
				t.Errorf("%s: %d %s for %d admissions, want %d", name, stats[cmd], cmd, n, want[cmd])
			}
		}
	}
	round("fresh keys", map[string]int64{"zadd": n, "pexpire": n})
	clock.Advance(time.Second)
	round("live logs", map[string]int64{"zadd": n, "pexpire": n, "zremrangebyscore": n})
	clock.Advance(time.Minute)
	round("logs that all left", map[string]int64{"zadd": n, "pexpire": n, "del": n})
}
