package main

import (
	"context"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/envoy-rls/envoy-rls/cmd/rls-bench/internal/bench"
	"github.com/envoy-rls/envoy-rls/internal/testenv"
)

// TestMakeBench runs scripts/bench.sh (what `make bench` runs) end to end,
// with short runs and no warm-up: it builds both binaries, starts
// redis-server, envoy-rls and the do-nothing server, runs every scenario and
// prints the table. It checks the plumbing and the decisions, not the speed:
// every scenario ran at every caller count without an error; the admitted
// ones were all admitted; the hot key admitted at most its limit of 1 a
// minute over the whole run (without a warm-up that admission is counted,
// so a larger limit fails the test); and the envoy-rls rows carry the CPU
// of envoy-rls and Redis and the server's own latency.
//
// envoy-rls runs with --redis.timeout 1s (runBench sets it) in these tests: under
// make test the packages' tests load both cores, and a Redis call that took
// longer than the default 25 ms would be answered by the rule's failure mode,
// whose in-process fallback admits the hot key once more, by design (README,
// Failure semantics). That is speed, not counting: once failed the test with
// 2 OK. With a second to answer, every decision is Redis's.
func TestMakeBench(t *testing.T) {
	var want []row
	for _, c := range []int{2, 8} {
		want = append(want, row{"do-nothing", c}, row{"do-nothing, 3 desc", c})
		for _, l := range []string{"1 key", "100k keys", "3 desc, 100k", "3 desc fixed, 100k", "4 limits, 100k", "hot key (over)"} {
			want = append(want, row{l, c})
		}
	}
	want = append(want, row{"do-nothing, open", 64}, row{"open loop, 3 desc", 64})
	_, _, rs := runBench(t, want, "BENCH_CALLERS=2 8", "BENCH_RATE=1000")

	// Every closed-loop row is reported against the do-nothing server's
	// run with as many descriptors per request and callers.
	ceiling := map[[2]int]float64{}
	for _, r := range rs {
		if r.Ceiling && r.Mode == "closed" {
			ceiling[[2]int{r.Descriptors, r.Callers}] = r.RPS
		}
	}
	bench.FillCeilings(rs)
	for _, r := range rs {
		if r.Ceiling || r.Mode != "closed" {
			continue
		}
		if want := ceiling[[2]int{r.Descriptors, r.Callers}]; want == 0 || r.CeilingRPS != want {
			t.Errorf("%q at %d callers (%d descriptors): ceiling %v, want the do-nothing run of as many descriptors (%v)",
				r.Label, r.Callers, r.Descriptors, r.CeilingRPS, want)
		}
	}
}

// TestMakeBenchCluster: the same on a Redis Cluster of three masters that
// the script creates (BENCH_REDIS=cluster), for three scenarios; "redis
// µs/req" is then the masters' CPU added up.
func TestMakeBenchCluster(t *testing.T) {
	want := []row{{"1 key", 4}, {"3 desc, 100k", 4}, {"hot key (over)", 4}}
	stdout, _, _ := runBench(t, want, "BENCH_REDIS=cluster", "BENCH_SCENARIOS=one-key three-desc hot-key", "BENCH_CALLERS=4")
	checkTransports(t, stdout, "", "cluster", "tcp")
}

// TestMakeBenchIncumbent: with BENCH_INCUMBENT=1 the script also builds
// github.com/envoyproxy/ratelimit (once; from the Go module proxy), serves it
// the same limits file, unchanged, on the same Redis, and reports a
// "ratelimit: " row beside every envoy-rls row it can express (the two run
// back to back), then the comparison of envoy-rls with it: the README's
// side-by-side comparison comes from this path. The incumbent's rows are
// checked as envoy-rls's are (all OK, the hot key over its limit, its CPU
// and Redis's), except for the server latency it does not export.
func TestMakeBenchIncumbent(t *testing.T) {
	want := append(besideIncumbent("1 key", "3 desc, 100k", "hot key (over)"), row{"3 desc fixed, 100k", 4}, row{"4 limits, 100k", 4})
	stdout, _, _ := runBench(t, want, "BENCH_INCUMBENT=1", "BENCH_CALLERS=4",
		"BENCH_SCENARIOS=one-key three-desc three-desc-fixed four-limits hot-key")
	if !strings.Contains(stdout, "envoyproxy/ratelimit v") {
		t.Errorf("the table's header does not name the incumbent's version:\n%s", stdout)
	}
	_, cmp, ok := strings.Cut(stdout, `the rows without a prefix ÷ the "ratelimit: " rows`)
	if !ok {
		t.Fatalf("no comparison with the incumbent after the table:\n%s", stdout)
	}
	// Its three scenarios, but not envoy-rls's own two.
	for _, l := range []string{"1 key", "3 desc, 100k", "hot key (over)"} {
		if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(l) + ` +4 `).MatchString(cmp) {
			t.Errorf("the comparison has no row of %q:\n%s", l, cmp)
		}
	}
	if strings.Contains(cmp, "4 limits") || strings.Contains(cmp, "fixed") {
		t.Errorf("the comparison has a row of a scenario the incumbent did not run:\n%s", cmp)
	}
}

// TestMakeBenchUnix: with BENCH_REDIS=unix envoy-rls and the incumbent
// reach the script's redis-server over its Unix socket, and with
// BENCH_GRPC=unix the generator reaches them and the do-nothing server over
// Unix sockets (the script's log names every setting); everything decides
// as on TCP.
func TestMakeBenchUnix(t *testing.T) {
	stdout, stderr, _ := runBench(t, ceilingBesideIncumbent("1 key", "hot key (over)"), "BENCH_REDIS=unix", "BENCH_GRPC=unix",
		"BENCH_INCUMBENT=1", "BENCH_CALLERS=4", "BENCH_SCENARIOS=ceiling one-key hot-key")
	checkTransports(t, stdout, stderr, "unix", "unix",
		`redis \(unix\) --redis.url unix:///`, `REDIS_SOCKET_TYPE=unix REDIS_TYPE=SINGLE REDIS_URL=/`,
		`envoy-rls pid \d+ on unix:/`, `do-nothing pid \d+ on unix:/`, `envoyproxy/ratelimit .* on unix:/\S+ \(GRPC_UDS=/`)
}

// ceilingBesideIncumbent are the rows of the do-nothing server (one and
// three descriptors), then besideIncumbent's, all at 4 callers.
func ceilingBesideIncumbent(labels ...string) []row {
	return append([]row{{"do-nothing", 4}, {"do-nothing, 3 desc", 4}}, besideIncumbent(labels...)...)
}

// besideIncumbent are the rows of each label for envoy-rls and then the
// incumbent, at 4 callers.
func besideIncumbent(labels ...string) []row {
	var want []row
	for _, l := range labels {
		want = append(want, row{l, 4}, row{incumbentPrefix + l, 4})
	}
	return want
}

// checkTransports checks that the table's header names the Redis and gRPC
// transports and that the script's log (stderr) matches every pattern, a
// regular expression whose ^ and $ match at its lines.
func checkTransports(t *testing.T, stdout, stderr, redis, grpc string, patterns ...string) {
	t.Helper()
	if header := "Redis: " + redis + ", gRPC: " + grpc; !strings.Contains(stdout, header) {
		t.Errorf("the table's header does not say %s:\n%s", header, stdout)
	}
	for _, p := range patterns {
		if !regexp.MustCompile(`(?m)` + p).MatchString(stderr) {
			t.Errorf("the script's log does not match %q:\n%s", p, stderr)
		}
	}
}

// TestMakeBenchTLS: BENCH_REDIS=tls runs envoy-rls and the incumbent on a
// Redis reached over TLS: both are given its TLS port (not its plain one,
// which the script's readiness probe uses) and the CA the script made. The
// script waits for envoy-rls's /readyz, which pings Redis, and the incumbent
// stops at start when its PING fails, so neither runs unless it speaks TLS
// there.
func TestMakeBenchTLS(t *testing.T) {
	stdout, stderr, _ := runBench(t, besideIncumbent("1 key", "3 desc, 100k"), "BENCH_REDIS=tls", "BENCH_INCUMBENT=1", "BENCH_CALLERS=4",
		"BENCH_SCENARIOS=one-key three-desc")
	ports := regexp.MustCompile(`redis: plain TCP on (\d+) \(the readiness probe's\), TLS on (\d+)`).FindStringSubmatch(stderr)
	if ports == nil || ports[1] == ports[2] {
		t.Fatalf("the script's log does not name Redis's plain and TLS ports:\n%s", stderr)
	}
	checkTransports(t, stdout, stderr, "tls", "tcp",
		`redis \(tls\) --redis.url rediss://127\.0\.0\.1:`+ports[2]+` --redis.tls.ca /\S+/tls/ca\.pem`,
		`REDIS_SOCKET_TYPE=tcp REDIS_TYPE=SINGLE REDIS_URL=127\.0\.0\.1:`+ports[2]+` REDIS_TLS=true REDIS_TLS_CACERT=/\S+/tls/ca\.pem`)
}

// TestMakeBenchGRPCTLS: with BENCH_GRPC=tls the generator calls envoy-rls,
// the do-nothing server and the incumbent over TLS, trusting only the CA
// the script made, whose certificate each of them presents (the script's
// log names their settings); with BENCH_REDIS=tls Redis too is reached over
// TLS with the same certificate. A server in plain text would fail every
// run of a generator speaking TLS (and the other way round), so the rows,
// without an error, show both ends speaking it.
func TestMakeBenchGRPCTLS(t *testing.T) {
	stdout, stderr, _ := runBench(t, ceilingBesideIncumbent("1 key", "hot key (over)"), "BENCH_GRPC=tls", "BENCH_REDIS=tls",
		"BENCH_INCUMBENT=1", "BENCH_CALLERS=4", "BENCH_SCENARIOS=ceiling one-key hot-key")
	const cert, key = `/\S+/tls/server\.pem`, `/\S+/tls/server\.key`
	checkTransports(t, stdout, stderr, "tls", "tls",
		`rls-bench --tls\.ca /\S+/tls/ca\.pem`,
		`envoy-rls pid \d+ on 127\.0\.0\.1:\d+ with --grpc\.tls\.cert `+cert+` --grpc\.tls\.key `+key+` \(`,
		`do-nothing pid \d+ on 127\.0\.0\.1:\d+ with --tls\.cert `+cert+` --tls\.key `+key+`$`,
		`envoyproxy/ratelimit .* on 127\.0\.0\.1:(\d+) \(GRPC_HOST=127\.0\.0\.1 GRPC_PORT=\d+ GRPC_SERVER_USE_TLS=true GRPC_SERVER_TLS_CERT=`+cert+` GRPC_SERVER_TLS_KEY=`+key+`,`,
		`redis \(tls\) --redis\.url rediss://127\.0\.0\.1:\d+ --redis\.tls\.ca /\S+/tls/ca\.pem`,
		`REDIS_TLS=true REDIS_TLS_CACERT=/\S+/tls/ca\.pem`)
}

// incumbentPrefix starts the label of an envoyproxy/ratelimit row, bPrefix
// that of the second envoy-rls (BENCH_B_ARGS).
const incumbentPrefix, bPrefix = "ratelimit: ", "B: "

// TestMakeBenchB: with BENCH_B_REV and BENCH_B_ARGS the script builds a
// second envoy-rls from that revision (HEAD here: git archive, then go
// build), starts it with those flags on the same Redis and runs every
// envoy-rls scenario against both ("B: " rows, checked as envoy-rls's),
// back to back, the one that goes first turning every round; after the
// table it prints the comparison of B with the first, a pair of runs per
// round.
func TestMakeBenchB(t *testing.T) {
	var want []row
	for _, l := range []string{"1 key", "4 limits, 100k", "hot key (over)"} {
		want = append(want, row{l, 4}, row{bPrefix + l, 4})
	}
	stdout, stderr, rs := runBench(t, want, "BENCH_B_REV=HEAD", "BENCH_B_ARGS=--redis.senders 1", "BENCH_REPEAT=2", "BENCH_MAX_STEAL=0",
		"BENCH_CALLERS=4", "BENCH_SCENARIOS=one-key four-limits hot-key")
	if !regexp.MustCompile(`(?m)^bench: building envoy-rls B at HEAD \([0-9a-f]{40}\)$`).MatchString(stderr) ||
		!regexp.MustCompile(`(?m)envoy-rls B \(at HEAD [0-9a-f]{40}, --redis\.senders 1\) pid \d+ on 127\.0\.0\.1:\d+`).MatchString(stderr) {
		t.Errorf("the script's log does not say it built B at HEAD and started it with B's flags:\n%s", stderr)
	}
	// Each scenario's first run in round 1 is envoy-rls's, in round 2 B's.
	first := map[string][]string{} // scenario → the prefix of its first run in each round
	last := ""
	for _, r := range rs {
		scenario, server := r.Label, ""
		if rest, ok := strings.CutPrefix(r.Label, bPrefix); ok {
			scenario, server = rest, bPrefix
		}
		if scenario != last {
			first[scenario] = append(first[scenario], server)
		}
		last = scenario
	}
	for _, l := range []string{"1 key", "4 limits, 100k", "hot key (over)"} {
		if got := first[l]; !slices.Equal(got, []string{"", bPrefix}) {
			t.Errorf("%q: the first run of each round was that of %q, want envoy-rls's then B's", l, got)
		}
	}
	_, cmp, ok := strings.Cut(stdout, `the "B: " rows ÷ the rows without a prefix`)
	if !ok {
		t.Fatalf("no comparison after the table:\n%s", stdout)
	}
	for _, l := range []string{"1 key", "4 limits, 100k", "hot key (over)"} {
		if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(l) + ` +4 +2 +\d+\.\d\d× [0-2]/2 `).MatchString(cmp) {
			t.Errorf("the comparison has no row of %q at 4 callers over 2 pairs:\n%s", l, cmp)
		}
	}
}

// TestMakeBenchRetrySteal: with BENCH_RETRY_STEAL a scenario's runs of a
// round are made again while one of them lost that share of the machine to
// steal, and only the calmest attempt's results are kept. At 0 every attempt
// is noisy enough (steal >= 0), so with BENCH_RETRIES=1 each group runs
// twice: the log says so, every row still has one result (runBench), and
// the attempt the log says it kept is the one whose noisiest run lost least,
// which is what the kept results carry (the log rounds to 0.1%).
func TestMakeBenchRetrySteal(t *testing.T) {
	want := []row{{"do-nothing", 4}, {"do-nothing, 3 desc", 4}, {"1 key", 4}}
	_, stderr, rs := runBench(t, want, "BENCH_RETRY_STEAL=0", "BENCH_RETRIES=1", "BENCH_CALLERS=4",
		"BENCH_SCENARIOS=ceiling one-key")
	again := regexp.MustCompile(`round 1: a run lost ([0-9]+\.[0-9])% to steal \(BENCH_RETRY_STEAL=0\): again, attempt 2 of 2`)
	kept := regexp.MustCompile(`round 1: kept attempt ([12]) of 2, whose noisiest run lost ([0-9]+\.[0-9])% to steal`)
	firsts, keeps := again.FindAllStringSubmatch(stderr, -1), kept.FindAllStringSubmatch(stderr, -1)
	if len(firsts) != len(want) || len(keeps) != len(want) {
		t.Fatalf("%d retries and %d kept attempts logged, want %d of each (one a scenario):\n%s", len(firsts), len(keeps), len(want), stderr)
	}
	for i, k := range want {
		if n := strings.Count(stderr, "run 1/1: "+k.label+"\n"); n != 2 {
			t.Errorf("%q ran %d times, want 2 (an attempt and a retry)", k.label, n)
		}
		// The groups run in want's order, one run each.
		first, err := strconv.ParseFloat(firsts[i][1], 64)
		if err != nil {
			t.Fatal(err)
		}
		least, err := strconv.ParseFloat(keeps[i][2], 64)
		if err != nil {
			t.Fatal(err)
		}
		if least > first || (keeps[i][1] == "1" && least != first) {
			t.Errorf("%q: kept attempt %s at %v%% steal, the first lost %v%%: not the calmest", k.label, keeps[i][1], least, first)
		}
		var r *bench.Result
		for _, x := range rs {
			if x.Label == k.label {
				r = x
			}
		}
		if r == nil || r.Machine == nil {
			t.Fatalf("%q: no result with the machine's figures", k.label)
		}
		if math.Abs(r.Machine.StealPct-least) > 0.05 {
			t.Errorf("%q: the kept result lost %v%% to steal, the log says %v%%", k.label, r.Machine.StealPct, least)
		}
	}
}

// row is a scenario at a number of callers.
type row struct {
	label   string
	callers int
}

// runBench runs scripts/bench.sh with runs of 0.3 s, no warm-up, one round
// and env, checks that it reported exactly the rows of want and checks each
// (see TestMakeBench). It returns the script's standard output and the
// the script's standard error (its log) and the results it wrote.
func runBench(t *testing.T, want []row, env ...string) (stdoutText, stderrText string, results []*bench.Result) {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "results.jsonl")
	// Long enough for BENCH_INCUMBENT=1 to build the incumbent on a fresh
	// machine.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := benchCommand(ctx, root)
	cmd.Env = append(os.Environ(),
		"BENCH_RLS_ARGS=--redis.timeout 1s", // see TestMakeBench
		"BENCH_DURATION=300ms", "BENCH_WARMUP=0s", "BENCH_REPEAT=1", "BENCH_OUT="+out,
		"TMPDIR="+t.TempDir(),
	)
	cmd.Env = append(cmd.Env, env...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("scripts/bench.sh: %v\nstderr:\n%s\nstdout:\n%s", err, stderr.String(), stdout.String())
	}

	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rs, err := bench.ReadJSON(f)
	if err != nil {
		t.Fatal(err)
	}
	// Every row once a round (BENCH_REPEAT=1 unless env says otherwise).
	rounds := 1
	for _, e := range env {
		if v, ok := strings.CutPrefix(e, "BENCH_REPEAT="); ok {
			if rounds, err = strconv.Atoi(v); err != nil {
				t.Fatal(err)
			}
		}
	}
	byRow := map[row][]*bench.Result{}
	for _, r := range rs {
		k := row{r.Label, r.Callers}
		byRow[k] = append(byRow[k], r)
	}
	if len(rs) != rounds*len(want) {
		t.Errorf("%d results, want %d (%v, %d rounds)", len(rs), rounds*len(want), want, rounds)
	}

	// The Redis servers whose INFO stats each row reads.
	masters := 1
	if slices.Contains(env, "BENCH_REDIS=cluster") {
		masters = 3
	}
	// The hot key's admissions and denials, by server (envoy-rls: "").
	hotOK, hotOver := map[string]int64{}, map[string]int64{}
	var runs []row // a row of want per run of it
	for _, k := range want {
		if n := len(byRow[k]); n != rounds {
			t.Errorf("%q at %d callers: %d results, want one a round (%d)", k.label, k.callers, n, rounds)
		}
		for range byRow[k] {
			runs = append(runs, k)
		}
	}
	seen := map[row]int{}
	for _, k := range runs {
		r := byRow[k][seen[k]]
		seen[k]++
		if r.Requests == 0 || r.Errors != 0 {
			t.Errorf("%q at %d callers: %d requests, %d errors (%v)", k.label, k.callers, r.Requests, r.Errors, r.ErrorKinds)
		}
		if !strings.Contains(stdout.String(), k.label) {
			t.Errorf("the table does not show %q:\n%s", k.label, stdout.String())
		}
		isNoop := strings.HasPrefix(k.label, "do-nothing")
		if isNoop != r.Ceiling && r.Mode == "closed" {
			t.Errorf("%q at %d callers: ceiling=%v", k.label, k.callers, r.Ceiling)
		}
		server, scenario := "", k.label
		for _, prefix := range []string{incumbentPrefix, bPrefix} {
			if rest, ok := strings.CutPrefix(k.label, prefix); ok {
				server, scenario = prefix, rest
			}
		}
		if scenario == "hot key (over)" {
			if u := r.Redis; u == nil || u.Servers != masters {
				t.Errorf("%q at %d callers: Redis figures %+v, want those of %d servers", k.label, k.callers, u, masters)
			}
			hotOK[server] += r.OK
			hotOver[server] += r.OverLimit
			continue
		}
		if r.OK != r.Requests {
			t.Errorf("%q at %d callers: %d of %d OK, want all (the bench limits are huge)", k.label, k.callers, r.OK, r.Requests)
		}
		// A closed loop keeps the cores busy; an open loop of 0.3 s at
		// BENCH_RATE can fall between the kernel's 10 ms ticks (it once
		// read 0% busy), so there the shares need only add up.
		if m := r.Machine; m == nil || (m.BusyPct <= 0 && r.Mode == "closed") || m.BusyPct < 0 || m.StealPct < 0 ||
			math.Abs(m.BusyPct+m.IdlePct+m.StealPct-100) > 1e-6 {
			t.Errorf("%q at %d callers: machine CPU %+v, want shares of /proc/stat's ticks that add up to 100%%, some busy in a closed loop", k.label, k.callers, m)
		}
		if isNoop {
			continue
		}
		cpu := map[string]int{}
		for _, c := range r.CPU {
			cpu[c.Name]++
			if c.Wait == nil {
				t.Errorf("%q at %d callers: no run-queue wait of %s (does this kernel keep scheduler statistics, /proc/<pid>/schedstat?)", k.label, k.callers, c.Name)
			}
		}
		// These rows go to Redis (the hot key's, above, is decided in
		// envoy-rls's deny cache and the incumbent's local cache). On one
		// Redis envoy-rls makes at most one round trip per request:
		// coalescing only makes it fewer. The runs have no warm-up, so
		// connections that envoy-rls opens during one add the round trips
		// of their handshake (go-redis: HELLO, then CLIENT SETINFO),
		// setupReads at most.
		const setupReads = 16
		if u := r.Redis; u == nil || u.Servers != masters || u.ReadsPerReq <= 0 || u.CommandsPerReq <= 0 {
			t.Errorf("%q at %d callers: Redis figures %+v, want commands and reads of %d servers", k.label, k.callers, u, masters)
		} else if answered := r.OK + r.OverLimit; server != incumbentPrefix && masters == 1 && u.Reads > answered+setupReads {
			t.Errorf("%q at %d callers: %d Redis round trips (read events) for %d requests, want at most one each (and %d of connection set-up)",
				k.label, k.callers, u.Reads, answered, setupReads)
		}
		if cpu["rls"] != 1 || cpu["redis"] != 1 || cpu["bench"] != 1 || len(cpu) != 3 {
			t.Errorf("%q at %d callers: CPU of %v, want bench, rls and redis once each", k.label, k.callers, r.CPU)
		}
		if server != incumbentPrefix && (r.Server == nil || r.Server.Requests == 0) {
			t.Errorf("%q at %d callers: no server latency (%+v)", k.label, k.callers, r.Server)
		}
	}
	for server, over := range hotOver {
		// envoy-rls's sliding window admits 1 in any minute. The
		// incumbent's fixed window admits 1 per minute of the clock, so a
		// run that crosses a minute boundary may see 2.
		limit := int64(1)
		if server == incumbentPrefix {
			limit = 2
		}
		if ok := hotOK[server]; ok > limit || over == 0 {
			t.Errorf("%shot key: %d OK and %d OVER_LIMIT over the run, want at most %d OK (its limit of 1 a minute) and some OVER_LIMIT",
				server, ok, over, limit)
		}
	}
	return stdout.String(), stderr.String(), rs
}

// benchCommand runs scripts/bench.sh in root. At ctx's end the script gets
// SIGTERM, so that its cleanup stops the servers it started and removes its
// folder (SIGKILL, exec's default, left them all running), and 30 s to do
// it.
func benchCommand(ctx context.Context, root string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(root, "scripts", "bench.sh"))
	cmd.Dir = root
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 30 * time.Second
	return cmd
}

// TestMakeBenchRefusals: settings the script cannot honour stop it before
// any run, with a message that names the setting.
func TestMakeBenchRefusals(t *testing.T) {
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		env  []string
		want string
	}{
		{[]string{"BENCH_MAX_STEAL=ten"}, "BENCH_MAX_STEAL=ten: want a percentage from 0 to 100"},
		{[]string{"BENCH_MAX_STEAL=100.5"}, "BENCH_MAX_STEAL=100.5: want a percentage"},
		{[]string{"BENCH_RETRY_STEAL=ten"}, "BENCH_RETRY_STEAL=ten: want a percentage from 0 to 100, or nothing"},
		{[]string{"BENCH_RETRIES=-1"}, "BENCH_RETRIES=-1: want a number of attempts from 0 to 99"},
		{[]string{"BENCH_B_ARGS=--redis.senders 1", "BENCH_SCENARIOS=ceiling"}, `BENCH_SCENARIOS="ceiling" has no scenario that runs envoy-rls`},
		{[]string{"BENCH_B_REV=no-such-revision", "BENCH_SCENARIOS=one-key"}, "BENCH_B_REV=no-such-revision: not a commit of this repository"},
		// These ran nothing and exited 0, ran closed loops under open-loop
		// labels, ran 10 s, or failed only after every run (a review's
		// findings).
		{[]string{"BENCH_REPEAT=abc"}, "BENCH_REPEAT=abc: want a number of rounds, 1 or more"},
		{[]string{"BENCH_REPEAT=0"}, "BENCH_REPEAT=0: want a number of rounds"},
		{[]string{"BENCH_RATE=0"}, "BENCH_RATE=0: want a positive rate per second"},
		{[]string{"BENCH_DURATION=0s"}, "BENCH_DURATION=0s: want a positive duration"},
		{[]string{"BENCH_DURATION=-1s"}, "BENCH_DURATION=-1s: want a positive duration"},
		{[]string{"BENCH_WARMUP=soon"}, "BENCH_WARMUP=soon: want a duration"},
		{[]string{"BENCH_CALLERS=2 sixteen"}, "BENCH_CALLERS=2 sixteen: want numbers of callers"},
		{[]string{"BENCH_OPEN_CALLERS=0"}, "BENCH_OPEN_CALLERS=0: want a number of callers"},
		{[]string{"BENCH_CONNECTIONS=0"}, "BENCH_CONNECTIONS=0: want a number of connections"},
		{[]string{"BENCH_SCENARIOS= "}, "BENCH_SCENARIOS= : want one or more of"},
		{[]string{"BENCH_OUT=/nonexistent/dir/r.jsonl"}, "BENCH_OUT=/nonexistent/dir/r.jsonl: want a file that can be written"},
		{[]string{"BENCH_INCUMBENT=1", "BENCH_SCENARIOS=three-desc-fixed four-limits"}, "has no scenario the incumbent can run"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		cmd := benchCommand(ctx, root)
		cmd.Env = append(append(os.Environ(), "TMPDIR="+t.TempDir()), tc.env...)
		out, err := cmd.CombinedOutput()
		cancel()
		if err == nil || !strings.Contains(string(out), tc.want) || strings.Contains(string(out), "bench: run ") {
			t.Errorf("%q: err %v, output:\n%s\nwant a failure before any run saying %q", tc.env, err, out, tc.want)
		}
	}
}
