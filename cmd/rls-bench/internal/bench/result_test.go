package bench

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestResultsJSONRoundTripAndCeilings(t *testing.T) {
	in := []*Result{
		{Label: "ceiling", Mode: "closed", Callers: 16, RPS: 40000, Ceiling: true, OK: 1},
		{Label: "ceiling64", Mode: "closed", Callers: 64, RPS: 50000, Ceiling: true},
		{Label: "one-key", Mode: "closed", Callers: 16, RPS: 10000, OK: 5, OverLimit: 2, Errors: 1,
			ErrorKinds: map[string]int64{"Unavailable": 1}, CPU: []CPUUse{{Name: "rls", MicrosPerReq: 51.25, Wait: &Wait{Seconds: 0.5, MicrosPerReq: 7.25}}}},
		{Label: "one-key64", Mode: "closed", Callers: 64, RPS: 25000, CPU: []CPUUse{{Name: "rls", MicrosPerReq: 40}}}, // no wait
		{Label: "open", Mode: "open", Callers: 16, Rate: 3000, RPS: 3000},
		// Three descriptors per request: a ceiling of their own at 16
		// callers, none at 64.
		{Label: "ceiling3", Mode: "closed", Callers: 16, Descriptors: 3, RPS: 32000, Ceiling: true},
		{Label: "three", Mode: "closed", Callers: 16, Descriptors: 3, RPS: 16000},
		{Label: "three64", Mode: "closed", Callers: 64, Descriptors: 3, RPS: 20000},
		// On TLS: a ceiling of its own at 16 callers (after the plain one,
		// which it must not replace), none at 64.
		{Label: "ceiling-tls", Target: "t", TLS: "tls", Mode: "closed", Callers: 16, RPS: 36000, Ceiling: true},
		{Label: "one-key-tls", Target: "t", TLS: "tls", Mode: "closed", Callers: 16, RPS: 9000},
		{Label: "one-key-tls64", Target: "t", TLS: "mutual", Mode: "closed", Callers: 64, RPS: 9000},
	}
	var buf bytes.Buffer
	if err := WriteJSON(&buf, in); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(buf.String(), "\n"); n != len(in) {
		t.Errorf("JSON has %d lines, want one per result (%d)", n, len(in))
	}
	out, err := ReadJSON(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(in, out) {
		t.Fatalf("round trip changed results:\n in %+v\nout %+v", in, out)
	}
	FillCeilings(out)
	for _, r := range out {
		var want float64
		switch {
		case r.Ceiling || r.Mode == "open": // no ceiling run for open loop at 3000/s
		case r.TLS == "tls":
			want = in[8].RPS
		case r.TLS != "": // not a plain-text ceiling
		case r.Descriptors == 3 && r.Callers == 16:
			want = in[5].RPS
		case r.Descriptors == 3: // not the one-descriptor ceiling
		case r.Callers == 16:
			want = in[0].RPS
		case r.Callers == 64:
			want = in[1].RPS
		}
		if r.CeilingRPS != want || (want > 0 && r.CeilingFraction != r.RPS/want) {
			t.Errorf("%s: ceiling %v fraction %v, want ceiling %v", r.Label, r.CeilingRPS, r.CeilingFraction, want)
		}
	}
	var tbl bytes.Buffer
	if err := WriteTable(&tbl, out, Aligned); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimRight(tbl.String(), "\n"), "\n")
	if len(lines) != 1+len(in) {
		t.Fatalf("table has %d lines, want header + %d:\n%s", len(lines), len(in), tbl.String())
	}
	for _, want := range []string{"rls µs/req  rls wait µs/req\n", "p99.9 ms", "OVER_LIMIT", "(ceiling)", "25%", "51.2", "1 (Unavailable)", "16@3000/s", "t (tls)", "t (mutual)"} {
		if !strings.Contains(tbl.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, tbl.String())
		}
	}
	// The CPU and wait columns, last: a run without a wait shows "-".
	for label, want := range map[string][2]string{"one-key": {"51.2", "7.2"}, "one-key64": {"40.0", "-"}, "ceiling": {"-", "-"}} {
		for _, l := range lines {
			if f := strings.Fields(l); f[0] == label {
				if got := [2]string(f[len(f)-2:]); got != want {
					t.Errorf("%s: cpu and wait cells %q, want %q:\n%s", label, got, want, tbl.String())
				}
			}
		}
	}
}

func TestParseCPUProbeAndRead(t *testing.T) {
	p, err := ParseCPUProbe("rls=1234")
	if err != nil || p != (CPUProbe{Name: "rls", PID: 1234}) {
		t.Errorf("ParseCPUProbe(rls=1234) = %+v, %v", p, err)
	}
	p, err = ParseCPUProbe("me=self")
	if err != nil || p != (CPUProbe{Name: "me"}) {
		t.Errorf("ParseCPUProbe(me=self) = %+v, %v", p, err)
	}
	for _, bad := range []string{"rls", "=1", "rls=x", "rls=0", "rls=-2"} {
		if _, err := ParseCPUProbe(bad); err == nil {
			t.Errorf("ParseCPUProbe(%q): no error", bad)
		}
	}
	// This process has used some CPU by now; burn a little to be sure the
	// reading moves and never goes backwards.
	before, err := procCPU(0)
	if err != nil {
		t.Fatal(err)
	}
	x := 0
	for i := range 1 << 27 {
		x ^= i * i
	}
	after, err := procCPU(0)
	if err != nil {
		t.Fatal(err)
	}
	if after < before || after == 0 {
		t.Errorf("cpu time went from %v to %v (x=%d)", before, after, x)
	}
	if _, err := procCPU(1 << 30); err == nil {
		t.Errorf("procCPU of a non-existent pid: no error")
	}
}

func TestNewResultCountsAnswersOnly(t *testing.T) {
	var m measurement
	for _, ns := range []int64{1e6, 2e6, 3e6, 4e6, 5e6, 6e6, 7e6, 8e6} {
		m.hist.Record(ns)
	}
	m.ok, m.overLimit = 3, 1
	m.errs = map[string]int64{"Unavailable": 3, "DeadlineExceeded": 1}
	m.elapsed = 2 * time.Second
	o, err := Options{Addr: "x:1", Descriptors: []Template{{}}, CPU: []CPUProbe{{Name: "rls"}}}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	r := newResult(o, m, []reading{{cpu: time.Second}}, []reading{{cpu: time.Second + 4*time.Millisecond}})
	answered := float64(m.ok + m.overLimit)
	if r.Requests != 8 || r.Errors != 4 || r.RPS != answered/2 {
		t.Errorf("requests=%d errors=%d rps=%v, want 8, 4, %v (answers only)", r.Requests, r.Errors, r.RPS, answered/2)
	}
	if len(r.CPU) != 1 || r.CPU[0].MicrosPerReq != 4000/answered || r.CPU[0].Seconds != 0.004 {
		t.Errorf("cpu = %+v, want 4 ms over %v answers", r.CPU, answered)
	}
	if r.CPU[0].Wait != nil {
		t.Errorf("wait = %+v from readings without scheduler statistics, want none", r.CPU[0].Wait)
	}
	if r.Max != 8 || r.P50 < 4 || r.P50 > 4*(1+1.0/subCount) {
		t.Errorf("max=%v p50=%v, want 8 and about 4 (ms)", r.Max, r.P50)
	}
}

// TestNewResultAddsProbesOfOneName: CPU probes that share a name (the
// masters of a Redis Cluster) are reported as one, their times and waits
// added, in the order names first appear; a name has a wait only when each
// of its probes has one.
func TestNewResultAddsProbesOfOneName(t *testing.T) {
	m := measurement{elapsed: time.Second}
	m.ok = 1000
	probes := []CPUProbe{{Name: "redis", PID: 1}, {Name: "rls", PID: 2}, {Name: "redis", PID: 3}, {Name: "redis", PID: 4}, {Name: "bench"}, {Name: "bench", PID: 5}}
	o, err := Options{Addr: "x:1", Descriptors: []Template{{}}, CPU: probes}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	ms := time.Millisecond
	at := func(cpu time.Duration, wait map[int]time.Duration) reading { return reading{cpu: cpu, wait: wait} }
	before := []reading{
		at(time.Second, map[int]time.Duration{1: 1 * ms, 11: 2 * ms}),
		at(time.Second, map[int]time.Duration{2: 0}),
		at(2*time.Second, map[int]time.Duration{3: 4 * ms}),
		at(3*time.Second, map[int]time.Duration{4: 0}),
		at(0, map[int]time.Duration{6: 0}),
		at(0, nil), // a process without scheduler statistics
	}
	after := []reading{
		at(time.Second+10*ms, map[int]time.Duration{1: 2 * ms, 11: 3 * ms}),
		at(time.Second+50*ms, map[int]time.Duration{2: 9 * ms}),
		at(2*time.Second+20*ms, map[int]time.Duration{3: 5 * ms, 13: 4 * ms}), // 13 started meanwhile
		at(3*time.Second+30*ms, map[int]time.Duration{4: 1 * ms}),
		at(ms, map[int]time.Duration{6: ms}),
		at(ms, nil),
	}
	r := newResult(o, m, before, after)
	want := []CPUUse{
		{Name: "redis", Seconds: 0.06, MicrosPerReq: 60, Wait: &Wait{Seconds: 0.008, MicrosPerReq: 8}},
		{Name: "rls", Seconds: 0.05, MicrosPerReq: 50, Wait: &Wait{Seconds: 0.009, MicrosPerReq: 9}},
		{Name: "bench", Seconds: 0.002, MicrosPerReq: 2},
	}
	if len(r.CPU) != len(want) {
		t.Fatalf("cpu = %+v, want %+v", r.CPU, want)
	}
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-9 }
	for i, w := range want {
		g := r.CPU[i]
		if g.Name != w.Name || !near(g.Seconds, w.Seconds) || !near(g.MicrosPerReq, w.MicrosPerReq) {
			t.Errorf("cpu[%d] = %+v, want %+v", i, g, w)
		}
		if (g.Wait == nil) != (w.Wait == nil) || g.Wait != nil && (!near(g.Wait.Seconds, w.Wait.Seconds) || !near(g.Wait.MicrosPerReq, w.Wait.MicrosPerReq)) {
			t.Errorf("cpu[%d] %s: wait %+v, want %+v", i, g.Name, g.Wait, w.Wait)
		}
	}
}

// TestWaitBetween: what each thread's total grew; a thread new at the
// second reading, or under a reused id (its total lower), counts whole; a
// thread gone by then counts nothing.
func TestWaitBetween(t *testing.T) {
	before := map[int]time.Duration{1: 10, 2: 20, 3: 50, 9: 1000}
	after := map[int]time.Duration{1: 15, 2: 20, 3: 7, 4: 3}
	if got, want := waitBetween(before, after), time.Duration(5+0+7+3); got != want {
		t.Errorf("waitBetween = %v, want %v", got, want)
	}
	if got := waitBetween(nil, nil); got != 0 {
		t.Errorf("waitBetween of nothing = %v", got)
	}
}

func TestParseSchedstat(t *testing.T) {
	for _, line := range []string{"855704 822385 14\n", "855704 822385 14 99"} { // a later kernel may add fields
		if on, w, err := parseSchedstat([]byte(line)); err != nil || on != 855704 || w != 822385 {
			t.Errorf("parseSchedstat(%q) = %v, %v, %v; want 855704ns, 822385ns", line, on, w, err)
		}
	}
	for _, bad := range []string{"", "1 2", "1 x 3", "1 -2 3", "y 2 3"} {
		if _, _, err := parseSchedstat([]byte(bad)); err == nil {
			t.Errorf("parseSchedstat(%q): no error", bad)
		}
	}
}

// TestTaskWaits reads made-up /proc trees: the threads' waits by id, a
// thread that exited (no schedstat) and an entry that is not a thread left
// out; no statistics (no schedstat file, or all zeros) is nil without an
// error; a malformed line is an error that names the thread.
func TestTaskWaits(t *testing.T) {
	proc := func(process string, threads map[string]string) string {
		dir := t.TempDir()
		write := func(name, text string) {
			if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if process != "" {
			write("schedstat", process)
		}
		for tid, line := range threads {
			if line == "" { // exited: its directory, no file
				if err := os.MkdirAll(filepath.Join(dir, "task", tid), 0o755); err != nil {
					t.Fatal(err)
				}
				continue
			}
			write(filepath.Join("task", tid, "schedstat"), line)
		}
		return dir
	}
	got, err := taskWaits(proc("5 1 1\n", map[string]string{"100": "5 1 1\n", "101": "7 30 2\n", "102": "", "x": "9 9 9\n"}))
	if err != nil || !reflect.DeepEqual(got, map[int]time.Duration{100: 1, 101: 30}) {
		t.Errorf("taskWaits = %v, %v; want map[100:1ns 101:30ns]", got, err)
	}
	for name, dir := range map[string]string{
		"no schedstat": proc("", map[string]string{"100": "5 1 1\n"}),
		"all zeros":    proc("0 0 0\n", map[string]string{"100": "0 0 0\n", "101": "0 0 0\n"}),
	} {
		if got, err := taskWaits(dir); got != nil || err != nil {
			t.Errorf("%s: taskWaits = %v, %v; want nil, nil (no statistics)", name, got, err)
		}
	}
	if _, err := taskWaits(proc("5 1 1\n", map[string]string{"100": "5 1 1\n", "101": "7 x 2\n"})); err == nil || !strings.Contains(err.Error(), "thread 101") {
		t.Errorf("a malformed thread line: error %v, want one naming thread 101", err)
	}
	if _, err := taskWaits(filepath.Join(t.TempDir(), "gone")); err == nil {
		t.Errorf("taskWaits of a process that is gone: no error")
	}
	if _, err := procWait(1 << 30); err == nil {
		t.Errorf("procWait of a non-existent pid: no error")
	}
}

// TestProcWaitGrowsUnderContention: with twice as many busy threads as
// CPUs, this process's threads wait on run queues about as long as they
// run, and procWait sees it. It compares two of the kernel's counters,
// whose ratio the thread count sets, not a duration with a bound. Where the
// kernel keeps no scheduler statistics the test fails: the wait figures
// would be missing on this machine.
func TestProcWaitGrowsUnderContention(t *testing.T) {
	before, err := procWait(0)
	if err != nil {
		t.Fatal(err)
	}
	if before == nil {
		t.Fatal("procWait(self): no scheduler statistics (/proc/self/schedstat missing; a kernel built without CONFIG_SCHED_INFO)")
	}
	if _, ok := before[os.Getpid()]; !ok {
		t.Fatalf("procWait(self) = %v: lacks the main thread %d", before, os.Getpid())
	}
	// Twice as many threads running Go code as CPUs, spinning until they
	// have used 200 ms of CPU per CPU (many timeslices each).
	n := 2 * runtime.NumCPU()
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(n))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			for x := 0; ; x++ {
				if x%1024 == 0 {
					select {
					case <-stop:
						return
					default:
					}
				}
			}
		})
	}
	defer func() { close(stop); wg.Wait() }()
	cpu0, err := procCPU(0)
	if err != nil {
		t.Fatal(err)
	}
	var used time.Duration
	for used < time.Duration(runtime.NumCPU())*200*time.Millisecond {
		cpu, err := procCPU(0)
		if err != nil {
			t.Fatal(err)
		}
		used = cpu - cpu0
		runtime.Gosched()
	}
	after, err := procWait(0)
	if err != nil {
		t.Fatal(err)
	}
	// Each thread runs about half the time and waits the other half; a
	// fifth of the CPU used is a margin for the runtime's own threads that
	// do not spin, and is far above what a misread field (a count, or
	// microseconds for nanoseconds) would give.
	w := waitBetween(before, after)
	t.Logf("%d spinning threads on %d CPUs: %v of CPU, %v of run-queue wait", n, runtime.NumCPU(), used, w)
	if w < used/5 {
		t.Errorf("%d spinning threads on %d CPUs used %v of CPU and waited %v on run queues, want at least %v", n, runtime.NumCPU(), used, w, used/5)
	}
}

func TestMedians(t *testing.T) {
	run := func(label string, callers int, rps, p99, cpu float64, ok int64) *Result {
		return &Result{Label: label, Target: "t", Mode: "closed", Callers: callers, RPS: rps, P99: p99, OK: ok,
			CPU: []CPUUse{{Name: "rls", MicrosPerReq: cpu, Wait: &Wait{MicrosPerReq: cpu / 10}}}}
	}
	in := []*Result{
		run("ceiling", 16, 20000, 1, 30, 100),
		run("a", 16, 9000, 5, 80, 10),
		run("ceiling", 16, 22000, 3, 32, 100),
		run("a", 16, 7000, 9, 90, 20),
		run("ceiling", 16, 21000, 2, 31, 100),
		run("a", 16, 8000, 7, 100, 30),
		run("a", 64, 12000, 20, 50, 1), // another load, run once
		run("a", 16, 9500, 4, 70, 5),   // the same load decoded whole
		run("a", 16, 6000, 8, 95, 5),   // the same load on TLS
	}
	in[7].FullDecode = true
	in[8].TLS = "tls"
	in[0].Ceiling, in[2].Ceiling, in[4].Ceiling = true, true, true
	// A ceiling run without scheduler statistics: the wait's median is
	// that of the two runs that have one, not a zero among them.
	in[2].CPU[0].Wait = nil
	for i, p99 := range map[int]float64{1: 0.5, 3: 0.9, 5: 0.7} {
		in[i].Server = &ServerLatency{Requests: in[i].OK, P50: p99 / 2, P90: p99 / 2, P99: p99}
	}
	// A ceiling run whose scrape saw no request has no
	// quantiles: it must not count as a zero latency.
	in[2].Server = &ServerLatency{}
	got := Medians(in)
	if len(got) != 5 {
		t.Fatalf("%d results, want 5 (ceiling, a@16, a@64, a@16 decoded whole, a@16 on TLS): %+v", len(got), got)
	}
	if onTLS := got[4]; onTLS.TLS != "tls" || onTLS.Runs != 0 || onTLS.RPS != 6000 {
		t.Errorf("runs on TLS were mixed with the plain-text ones: %+v", onTLS)
	}
	c, a, once := got[0], got[1], got[2]
	if full := got[3]; !full.FullDecode || full.Runs != 0 || full.RPS != 9500 || a.FullDecode {
		t.Errorf("runs decoded whole were mixed with the others: %+v and %+v", a, full)
	}
	if c.Label != "ceiling" || !c.Ceiling || c.Runs != 3 || c.RPS != 21000 || c.P99 != 2 || c.OK != 300 {
		t.Errorf("ceiling median = %+v", c)
	}
	if a.Label != "a" || a.Runs != 3 || a.RPS != 8000 || a.P99 != 7 || a.OK != 60 || a.CPU[0].MicrosPerReq != 90 {
		t.Errorf("a median = %+v", a)
	}
	if w := a.CPU[0].Wait; w == nil || w.MicrosPerReq != 9 {
		t.Errorf("a's median wait = %+v, want 9 µs/req", w)
	}
	if w := c.CPU[0].Wait; w == nil || math.Abs(w.MicrosPerReq-3.05) > 1e-9 {
		t.Errorf("ceiling's median wait = %+v, want 3.05 µs/req (of 3.0 and 3.1, the runs that have one)", w)
	}
	if a.Server == nil || a.Server.P99 != 0.7 || a.Server.P50 != 0.35 || a.Server.Requests != 60 || c.Server != nil {
		t.Errorf("server latency medians: a %+v, ceiling %+v; want a's p99 0.7, p50 0.35 over 60 requests, none for the ceiling", a.Server, c.Server)
	}
	if once != in[6] {
		t.Errorf("a load run once changed: %+v", once)
	}
	FillCeilings(got)
	if a.CeilingFraction != 8000.0/21000 {
		t.Errorf("ceiling fraction of the medians = %v, want %v", a.CeilingFraction, 8000.0/21000)
	}
	if in[1].RPS != 9000 || in[1].Runs != 0 {
		t.Errorf("Medians modified its input: %+v", in[1])
	}
	if m := median([]float64{4, 1, 3, 2}); m != 2.5 {
		t.Errorf("median of an even count = %v, want 2.5", m)
	}
	var buf bytes.Buffer
	if err := WriteTable(&buf, got, Aligned); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "runs") {
		t.Errorf("the table of medians has no runs column:\n%s", buf.String())
	}
}

// TestMediansKeepDescriptorCountsApart: runs that differ only in
// descriptors per request are two loads (FillCeilings and Compare keep them
// apart too), though the default labels are the same for both: the
// do-nothing server measured with one and with three descriptors made one
// row of medians across both once (a review's finding).
func TestMediansKeepDescriptorCountsApart(t *testing.T) {
	run := func(desc int, rps float64) *Result {
		return &Result{Label: "ceiling", Target: "t", Mode: "closed", Callers: 16, Descriptors: desc, RPS: rps, Ceiling: true}
	}
	got := Medians([]*Result{run(1, 20000), run(3, 10000), run(1, 21000), run(3, 11000)})
	if len(got) != 2 || got[0].Descriptors != 1 || got[0].RPS != 20500 || got[1].Descriptors != 3 || got[1].RPS != 10500 {
		for _, r := range got {
			t.Logf("row: %d descriptors, %d runs, %v/s", r.Descriptors, r.Runs, r.RPS)
		}
		t.Errorf("Medians gave %d rows, want one of 20500/s for 1 descriptor and one of 10500/s for 3", len(got))
	}
}
