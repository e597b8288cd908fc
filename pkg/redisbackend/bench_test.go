package redisbackend

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/envoy-rls/envoy-rls/internal/testenv"
	"github.com/envoy-rls/envoy-rls/pkg/limiter"
	"github.com/redis/go-redis/v9"
)

// benchCheck measures Check against a local redis-server on Redis TIME (the
// production path), with limits high enough that every Check is admitted and
// writes. Each Check is one EVALSHA.
func benchCheck(b *testing.B, reqs []limiter.Request) {
	r := testenv.RedisServer(b)
	be := newSingle(b, r, DefaultKeyPrefix, nil)
	ctx := context.Background()
	res := make([]limiter.Result, len(reqs))
	if err := be.Check(ctx, reqs, res); err != nil { // load the script
		b.Fatalf("Check: %v", err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if err := be.Check(ctx, reqs, res); err != nil {
			b.Fatalf("Check: %v", err)
		}
	}
	b.StopTimer()
	for i, x := range res {
		if !x.Allowed {
			b.Fatalf("request %d denied: %+v", i, x)
		}
	}
}

func benchReq(alg limiter.Algorithm, name string) limiter.Request {
	return limiter.Request{
		Key:   key("bench", name),
		Limit: limiter.Limit{Algorithm: alg, Requests: 1 << 30, Window: time.Hour},
		Hits:  1,
	}
}

func BenchmarkCheck(b *testing.B) {
	b.Run("requests=1", func(b *testing.B) {
		benchCheck(b, []limiter.Request{benchReq(limiter.SlidingWindow, "a")})
	})
	b.Run("requests=3", func(b *testing.B) {
		benchCheck(b, []limiter.Request{
			benchReq(limiter.SlidingWindow, "a"),
			benchReq(limiter.TokenBucket, "b"),
			benchReq(limiter.FixedWindow, "c"),
		})
	})
	for _, alg := range []limiter.Algorithm{limiter.SlidingWindow, limiter.FixedWindow, limiter.TokenBucket, limiter.SlidingLog} {
		b.Run(fmt.Sprintf("algorithm=%v", alg), func(b *testing.B) {
			req := benchReq(alg, "x")
			if alg == limiter.SlidingLog {
				// The log holds every hit of the window: keep it small.
				req.Limit = limiter.Limit{Algorithm: alg, Requests: 10000, Window: time.Second}
				req.Hits = 0
			}
			benchCheck(b, []limiter.Request{req})
		})
	}
}

// BenchmarkCheckCluster measures Check on a 3-master Redis Cluster with three
// requests of distinct keys (so three hash slots, usually on different
// masters), as make bench's three descriptors: one caller at a time, and 16
// parallel callers whose Checks coalesce into per-slot calls sent as one
// pipeline. Time and allocations per Check; the masters' CPU is not
// counted (see BENCH_REDIS=cluster make bench).
//
//	go test -run '^$' -bench CheckCluster -benchmem ./pkg/redisbackend
func BenchmarkCheckCluster(b *testing.B) {
	c := testenv.RedisCluster(b)
	be := newClustered(b, c, DefaultKeyPrefix, nil)
	ctx := context.Background()
	// Requests over 10,000 indexes, built before the clock runs.
	const n = 10_000
	all := make([][]limiter.Request, n)
	for i := range all {
		is := strconv.Itoa(i)
		all[i] = []limiter.Request{
			benchReq(limiter.SlidingWindow, "ip"+is),
			benchReq(limiter.SlidingWindow, "user"+is),
			benchReq(limiter.SlidingWindow, "route"+strconv.Itoa(i%20)),
		}
	}
	reqsOf := func(i int) []limiter.Request { return all[i%n] }
	check := func(b *testing.B, reqs []limiter.Request, res []limiter.Result) {
		if err := be.Check(ctx, reqs, res); err != nil {
			b.Fatalf("Check: %v", err)
		}
		if !res[0].Allowed || !res[1].Allowed || !res[2].Allowed {
			b.Fatalf("denied: %+v", res)
		}
	}
	check(b, reqsOf(0), make([]limiter.Result, 3)) // load the library on the masters
	b.Run("serial", func(b *testing.B) {
		res := make([]limiter.Result, 3)
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			check(b, reqsOf(i), res)
			i++
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.SetParallelism(8)
		var next atomic.Int64
		b.RunParallel(func(pb *testing.PB) {
			res := make([]limiter.Result, 3)
			for pb.Next() {
				check(b, reqsOf(int(next.Add(1))), res)
			}
		})
	})
}

// BenchmarkCheckBackToBack measures Redis's CPU per Check when check calls
// arrive back to back, as a busy server sees them: pipelines of 8 FCALLs,
// each carrying 8 Checks of a mix (checkMixes: 3desc, three sliding windows
// as in make bench; 4limits, make bench's four limits) on indexes drawn from
// 100,000, cycling through 4,096 Checks whose counters exist after the
// warm-up. redis-server never waits for a call, so this is a Check's own
// work, without the wake-ups and cold caches of a server that idles between
// calls (docs/performance.md, "≤ 25 µs of Redis CPU per request"). ns/op is
// per pipeline of 64 Checks.
//
//	go test -run '^$' -bench CheckBackToBack -benchtime 2000x ./pkg/redisbackend
func BenchmarkCheckBackToBack(b *testing.B) {
	for _, name := range []string{"3desc", "4limits"} {
		b.Run(name, func(b *testing.B) { benchBackToBack(b, checkMixes[name]) })
	}
}

func benchBackToBack(b *testing.B, mix func(i int) []limiter.Request) {
	r := testenv.RedisServer(b)
	be := newSingle(b, r, DefaultKeyPrefix, nil)
	const perCall, perPipeline, calls = 8, 8, 512
	cmds := mixCalls(b, be, mix, perCall, calls, 100_000)
	ctx := context.Background()
	c := r.Client()
	send := func(first int) []redis.Cmder {
		pipe := c.Pipeline()
		for p := range perPipeline {
			pipe.Do(ctx, cmds[(first+p)%calls]...)
		}
		done, err := pipe.Exec(ctx)
		if err != nil {
			b.Fatalf("pipeline: %v", err)
		}
		return done
	}
	for i := 0; i < calls; i += perPipeline { // create every counter
		send(i)
	}
	cpu := r.CPU(b)
	i := 0
	for b.Loop() {
		send(i)
		i += perPipeline
	}
	b.ReportMetric(float64((r.CPU(b)-cpu).Microseconds())/float64(b.N*perPipeline*perCall), "redis-cpu-µs/check")
	// The calls decided what they were meant to: every Check admitted (a
	// Check's requests differ from another's in their keys alone).
	groups := slices.Repeat([][]limiter.Request{mix(0)}, perCall)
	for _, cmd := range send(0) {
		v, err := cmd.(*redis.Cmd).Text()
		if err != nil {
			b.Fatalf("call: %v", err)
		}
		for g, gr := range decodeGroups(b, v, groups) {
			if !gr.committed {
				b.Fatalf("Check %d of a call did not consume: %+v", g+1, gr.res)
			}
		}
	}
}

// checkMixes are the Checks that the benchmarks sending check calls by hand
// use, by name: each returns the requests of the Check of index i.
//
//   - 3desc: three sliding windows of a minute (IP, tenant+user and route),
//     make bench's "3 desc";
//   - 4limits: make bench's "4 limits" (testdata/bench/bench4.yaml): the
//     middle descriptor (plan+user) has a token bucket of a second and an
//     hourly sliding window;
//   - log1, log100: one sliding log of 10,000 a minute, and a request of 1
//     or of 100 hits (what a hit costs a log).
var checkMixes = map[string]func(i int) []limiter.Request{
	"3desc": func(i int) []limiter.Request {
		lim := limiter.Limit{Requests: 1 << 30, Window: time.Minute}
		return []limiter.Request{
			{Key: key("bench", "remote_address", "10."+strconv.Itoa(i)), Limit: lim, Hits: 1},
			{Key: key("bench", "tenant", "t"+strconv.Itoa(i%100), "user", "u"+strconv.Itoa(i)), Limit: lim, Hits: 1},
			{Key: key("bench", "route", "/api/r"+strconv.Itoa(i%20)), Limit: lim, Hits: 1},
		}
	},
	"4limits": func(i int) []limiter.Request {
		minute := limiter.Limit{Requests: 1e9, Window: time.Minute}
		burst := limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 1e9, Window: time.Second}
		hourly := limiter.Limit{Requests: 1e9, Window: time.Hour}
		plan := []string{"bench4", "plan", "p" + strconv.Itoa(i%100), "user", "u" + strconv.Itoa(i)}
		return []limiter.Request{
			{Key: key("bench4", "bench4_ip", "remote_address", "10."+strconv.Itoa(i)), Limit: minute, Hits: 1},
			{Key: key(append(plan, "bench4_plan_burst")...), Limit: burst, Hits: 1},
			{Key: key(append(plan, "bench4_plan_hourly")...), Limit: hourly, Hits: 1},
			{Key: key("bench4", "bench4_route", "route", "/api/r"+strconv.Itoa(i%20)), Limit: minute, Hits: 1},
		}
	},
	"log1":   logMix(1),
	"log100": logMix(100),
}

// logMix returns the mix of one sliding log (10,000 a minute) and a request
// of hits.
func logMix(hits uint64) func(i int) []limiter.Request {
	lim := limiter.Limit{Algorithm: limiter.SlidingLog, Requests: 10_000, Window: time.Minute}
	return func(i int) []limiter.Request {
		return []limiter.Request{{Key: key("log", "remote_address", "10."+strconv.Itoa(i)), Limit: lim, Hits: hits}}
	}
}

// mixCalls loads the library into be's server and returns calls check
// calls, as the coalescer sends them: FCALL <fn> <numkeys> <keys> "0 0",
// then per Check its group's text (encodeGroups), the Checks of
// mix on indexes drawn from [0, indexes), perCall Checks per call, in a
// fixed pseudo-random order.
func mixCalls(b *testing.B, be *Backend, mix func(i int) []limiter.Request, perCall, calls, indexes int) [][]any {
	b.Helper()
	first := mix(0)
	if err := be.Check(context.Background(), first, make([]limiter.Result, len(first))); err != nil { // loads the library
		b.Fatal(err)
	}
	if !be.UsesFunctions() {
		b.Fatal("redis-server does not run Functions")
	}
	rng := rand.New(rand.NewPCG(1, 2))
	cmds := make([][]any, calls)
	for c := range cmds {
		groups := make([][]limiter.Request, perCall)
		for g := range groups {
			groups[g] = mix(rng.IntN(indexes))
		}
		keys, argv := encodeGroups(be, groups...)
		cmd := []any{"fcall", be.scripts.checkFn, len(keys)}
		for _, k := range keys {
			cmd = append(cmd, k)
		}
		cmd = append(cmd, "0 0")
		for _, a := range argv {
			cmd = append(cmd, a)
		}
		cmds[c] = cmd
	}
	return cmds
}

// BenchmarkCheckUnderCallgrind counts the instructions redis-server spends
// per Check, with scripts/callgrind-check.sh: that script starts
// redis-server under valgrind's callgrind and sets
// ENVOY_RLS_CALLGRIND_REDIS to its address (the benchmark is skipped
// otherwise; plain runs measure nothing here). It sends 200 calls of
// ENVOY_RLS_CALLGRIND_PER_CALL Checks (default 4) of the mix
// ENVOY_RLS_CALLGRIND_MIX (checkMixes, default 3desc) over 1,000 indexes
// once, so that their counters exist, then zeroes callgrind's counts, sends
// the same calls again and has callgrind dump: the dump holds the
// instructions of the second pass alone, which the script divides by its
// Checks. Instruction counts, unlike CPU time, hardly depend on what else
// the machine runs. The mix plainMix sends, instead of calls of check.lua,
// pipelines of the plain commands the incumbent sends for the same Checks
// (plainCalls), a pipeline of ENVOY_RLS_CALLGRIND_PER_CALL requests for a
// call.
func BenchmarkCheckUnderCallgrind(b *testing.B) {
	addr, pid := os.Getenv("ENVOY_RLS_CALLGRIND_REDIS"), os.Getenv("ENVOY_RLS_CALLGRIND_PID")
	if addr == "" || pid == "" {
		b.Skip("run by scripts/callgrind-check.sh, which sets ENVOY_RLS_CALLGRIND_REDIS and ENVOY_RLS_CALLGRIND_PID")
	}
	mixName := cmp.Or(os.Getenv("ENVOY_RLS_CALLGRIND_MIX"), "3desc")
	mix, ok := checkMixes[mixName]
	if !ok && mixName != plainMix {
		b.Fatalf("ENVOY_RLS_CALLGRIND_MIX=%q: want 3desc, 4limits, log1, log100 or %s", mixName, plainMix)
	}
	perCall := 4
	if v := os.Getenv("ENVOY_RLS_CALLGRIND_PER_CALL"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			b.Fatalf("ENVOY_RLS_CALLGRIND_PER_CALL=%q: want a positive integer", v)
		}
		perCall = n
	}
	var batches [][][]any // each sent as one pipeline
	if mixName == plainMix {
		batches = plainCalls(perCall, 200, 1000)
	} else {
		be, err := New(Options{URL: "redis://" + addr, KeyPrefix: DefaultKeyPrefix, Timeout: time.Minute})
		if err != nil {
			b.Fatal(err)
		}
		defer be.Close()
		for _, cmd := range mixCalls(b, be, mix, perCall, 200, 1000) {
			batches = append(batches, [][]any{cmd})
		}
	}
	c := redis.NewClient(&redis.Options{Addr: addr, ReadTimeout: time.Minute})
	defer c.Close()
	ctx := context.Background()
	sendAll := func() {
		for _, batch := range batches {
			// A call of check.lua goes alone, as earlier figures were
			// measured: through a pipeline of one, Redis counted about
			// 1-2% more instructions outside FCALL.
			if len(batch) == 1 {
				if err := c.Do(ctx, batch[0]...).Err(); err != nil {
					b.Fatal(err)
				}
				continue
			}
			p := c.Pipeline()
			for _, cmd := range batch {
				p.Do(ctx, cmd...)
			}
			if _, err := p.Exec(ctx); err != nil {
				b.Fatal(err)
			}
		}
	}
	callgrind := func(arg string) {
		// Only the redis-server under measurement: without a pid,
		// callgrind_control acts on every callgrind process.
		if out, err := exec.Command("callgrind_control", arg, pid).CombinedOutput(); err != nil {
			b.Fatalf("callgrind_control %s: %v\n%s", arg, err, out)
		}
	}
	sendAll() // every counter exists from here on
	for b.Loop() {
		callgrind("-z")
		sendAll()
		callgrind("-d")
	}
	b.ReportMetric(float64(len(batches)*perCall), "checks/dump")
}

// plainMix names the mix of BenchmarkCheckUnderCallgrind that sends the
// incumbent's commands instead of check.lua (see plainCalls).
const plainMix = "plain3desc"

// plainCalls returns calls pipelines of perCall requests each, the Checks
// of the mix 3desc on indexes drawn from [0, indexes) in mixCalls' order, as
// envoyproxy/ratelimit sends them in fixed windows of a minute: INCRBY and
// EXPIRE per descriptor, on keys "<domain>_<key>_<value>_..._<window
// start>". It counts denied requests too and decides in the client, so it
// is a floor for what a request of three descriptors can cost Redis, not a
// rate limiter of envoy-rls's semantics.
func plainCalls(perCall, calls, indexes int) [][][]any {
	rng := rand.New(rand.NewPCG(1, 2))
	window := strconv.FormatInt(time.Now().Unix()/60*60, 10)
	batches := make([][][]any, calls)
	for c := range batches {
		for range perCall {
			i := rng.IntN(indexes)
			for _, k := range []string{
				"bench_remote_address_10." + strconv.Itoa(i) + "_" + window,
				"bench_tenant_t" + strconv.Itoa(i%100) + "_user_u" + strconv.Itoa(i) + "_" + window,
				"bench_route_/api/r" + strconv.Itoa(i%20) + "_" + window,
			} {
				batches[c] = append(batches[c], []any{"incrby", k, 1}, []any{"expire", k, 60})
			}
		}
	}
	return batches
}

// BenchmarkBaseKey measures the key derivation (SHA-256 of the identity).
func BenchmarkBaseKey(b *testing.B) {
	r := limiter.Request{Key: key("edge", "rule", "user", "bob", "path", "/pay"), Limit: limiter.Limit{Requests: 1, Window: time.Second}}
	buf := make([]byte, 0, 64)
	b.ReportAllocs()
	for b.Loop() {
		buf = appendBaseKey(buf[:0], DefaultKeyPrefix, &r)
	}
}

// BenchmarkMemoryPerKey reports Redis memory per counter (redis-B/key: the
// growth of INFO memory used_memory divided by the number of counters,
// dictionary and expiry overhead included) after each operation wrote one
// new counter: one hit on a fresh key, or for sliding_window/active one hit
// in each of two consecutive windows (a counter in steady use, which is
// still one key), and for sliding_window/busy three (the second and third
// hits of a window rewrite the count in place, which changes how Redis
// stores the value, not its size). Run it with many keys, e.g.
//
//	go test -run '^$' -bench MemoryPerKey -benchtime 100000x ./pkg/redisbackend
func BenchmarkMemoryPerKey(b *testing.B) {
	r := testenv.RedisServer(b)
	c := r.Client()
	ctx := context.Background()
	used := func() int64 { return r.InfoInt(b, "memory", "used_memory") }
	cases := []struct {
		name    string
		alg     limiter.Algorithm
		windows int
		checks  int // in each window
	}{
		{"sliding_window", limiter.SlidingWindow, 1, 1},
		{"sliding_window/active", limiter.SlidingWindow, 2, 1},
		{"sliding_window/busy", limiter.SlidingWindow, 2, 3}, // rewritten in place (SETRANGE)
		{"fixed_window", limiter.FixedWindow, 1, 1},
		{"token_bucket", limiter.TokenBucket, 1, 1},
		{"sliding_log", limiter.SlidingLog, 1, 1},
	}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			if err := c.FlushAll(ctx).Err(); err != nil {
				b.Fatal(err)
			}
			ms := int64(1_767_225_600_137)
			be := newSingle(b, r, DefaultKeyPrefix, func() time.Time { return time.UnixMilli(ms) })
			l := limiter.Limit{Algorithm: tc.alg, Requests: 100, Window: time.Minute}
			res := make([]limiter.Result, 1)
			// Load the script before measuring.
			if err := be.Check(ctx, []limiter.Request{{Key: "warm-up", Limit: l}}, res); err != nil {
				b.Fatal(err)
			}
			before := used()
			i := 0
			for b.Loop() {
				q := []limiter.Request{{Key: key("edge", "per_ip", "remote_address", "10.0.0."+strconv.Itoa(i)), Limit: l, Hits: 1}}
				for w := range tc.windows {
					ms += int64(w) * l.Window.Milliseconds()
					for range tc.checks {
						if err := be.Check(ctx, q, res); err != nil {
							b.Fatal(err)
						}
					}
					ms -= int64(w) * l.Window.Milliseconds()
				}
				i++
			}
			b.ReportMetric(float64(used()-before)/float64(b.N), "redis-B/key")
		})
	}
}

// BenchmarkSlidingLogHits measures a sliding log's cost by the hits of a
// request: each operation is one Check of hits on a fresh log (a limit of
// 10,000 an hour), with Redis's CPU and memory per Check. A log stores one
// member per admitted request, so neither should grow with the hits (with
// one member per hit, 10,000 hits cost Redis 10.6 ms). Keep -benchtime
// small: every operation leaves a key. denied/requests=10000 is a denial
// whose Retry-After is searched among 10,000 logged requests.
//
//	go test -run '^$' -bench SlidingLogHits -benchtime 300x ./pkg/redisbackend
func BenchmarkSlidingLogHits(b *testing.B) {
	r := testenv.RedisServer(b)
	c := r.Client()
	ctx := context.Background()
	for _, hits := range []uint64{1, 100, 1000, 10_000} {
		b.Run(fmt.Sprintf("hits=%d", hits), func(b *testing.B) {
			if err := c.FlushAll(ctx).Err(); err != nil {
				b.Fatal(err)
			}
			be := newSingle(b, r, DefaultKeyPrefix, nil)
			l := limiter.Limit{Algorithm: limiter.SlidingLog, Requests: 10_000, Window: time.Hour}
			res := make([]limiter.Result, 1)
			if err := be.Check(ctx, []limiter.Request{{Key: "warm-up", Limit: l}}, res); err != nil {
				b.Fatal(err)
			}
			before, cpu := r.InfoInt(b, "memory", "used_memory"), r.CPU(b)
			i := 0
			for b.Loop() {
				q := []limiter.Request{{Key: key("log", strconv.Itoa(i)), Limit: l, Hits: hits}}
				if err := be.Check(ctx, q, res); err != nil || !res[0].Allowed {
					b.Fatalf("Check of %d hits on a fresh log: %+v, %v", hits, res[0], err)
				}
				i++
			}
			b.ReportMetric(float64((r.CPU(b)-cpu).Microseconds())/float64(b.N), "redis-cpu-µs/check")
			b.ReportMetric(float64(r.InfoInt(b, "memory", "used_memory")-before)/float64(b.N), "redis-B/key")
		})
	}
	// A denial on a full log of 10,000 one-hit requests whose Retry-After
	// is the 5,000th oldest hit's time: the search among the requests.
	b.Run("denied/requests=10000", func(b *testing.B) {
		if err := c.FlushAll(ctx).Err(); err != nil {
			b.Fatal(err)
		}
		be := newSingle(b, r, DefaultKeyPrefix, nil)
		l := limiter.Limit{Algorithm: limiter.SlidingLog, Requests: 10_000, Window: time.Hour}
		q := []limiter.Request{{Key: key("full"), Limit: l, Hits: 1}}
		res := make([]limiter.Result, 1)
		for range l.Requests {
			if err := be.Check(ctx, q, res); err != nil || !res[0].Allowed {
				b.Fatalf("filling the log: %+v, %v", res[0], err)
			}
		}
		q[0].Hits = 5_000
		cpu := r.CPU(b)
		for b.Loop() {
			if err := be.Check(ctx, q, res); err != nil || res[0].Allowed || res[0].RetryAfter <= 0 {
				b.Fatalf("5,000 hits on a full log: %+v, %v; want a denial with a Retry-After", res[0], err)
			}
		}
		b.ReportMetric(float64((r.CPU(b)-cpu).Microseconds())/float64(b.N), "redis-cpu-µs/check")
	})
}
