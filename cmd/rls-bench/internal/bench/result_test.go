package bench

import (
	"bytes"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestResultsJSONRoundTripAndCeilings(t *testing.T) {
	in := []*Result{
		{Label: "ceiling", Mode: "closed", Callers: 16, RPS: 40000, Ceiling: true, OK: 1},
		{Label: "ceiling64", Mode: "closed", Callers: 64, RPS: 50000, Ceiling: true},
		{Label: "one-key", Mode: "closed", Callers: 16, RPS: 10000, OK: 5, OverLimit: 2, Errors: 1,
			ErrorKinds: map[string]int64{"Unavailable": 1}, CPU: []CPUUse{{Name: "rls", MicrosPerReq: 51.25}}},
		{Label: "one-key64", Mode: "closed", Callers: 64, RPS: 25000},
		{Label: "open", Mode: "open", Callers: 16, Rate: 3000, RPS: 3000},
		// Three descriptors per request: a ceiling of their own at 16
		// callers, none at 64.
		{Label: "ceiling3", Mode: "closed", Callers: 16, Descriptors: 3, RPS: 32000, Ceiling: true},
		{Label: "three", Mode: "closed", Callers: 16, Descriptors: 3, RPS: 16000},
		{Label: "three64", Mode: "closed", Callers: 64, Descriptors: 3, RPS: 20000},
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
	if err := WriteTable(&tbl, out); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimRight(tbl.String(), "\n"), "\n")
	if len(lines) != 1+len(in) {
		t.Fatalf("table has %d lines, want header + %d:\n%s", len(lines), len(in), tbl.String())
	}
	for _, want := range []string{"rls µs/req", "p99.9 ms", "OVER_LIMIT", "(ceiling)", "25%", "51.2", "1 (Unavailable)", "16@3000/s"} {
		if !strings.Contains(tbl.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, tbl.String())
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
	r := newResult(o, m, []time.Duration{time.Second}, []time.Duration{time.Second + 4*time.Millisecond})
	answered := float64(m.ok + m.overLimit)
	if r.Requests != 8 || r.Errors != 4 || r.RPS != answered/2 {
		t.Errorf("requests=%d errors=%d rps=%v, want 8, 4, %v (answers only)", r.Requests, r.Errors, r.RPS, answered/2)
	}
	if len(r.CPU) != 1 || r.CPU[0].MicrosPerReq != 4000/answered || r.CPU[0].Seconds != 0.004 {
		t.Errorf("cpu = %+v, want 4 ms over %v answers", r.CPU, answered)
	}
	if r.Max != 8 || r.P50 < 4 || r.P50 > 4*(1+1.0/subCount) {
		t.Errorf("max=%v p50=%v, want 8 and about 4 (ms)", r.Max, r.P50)
	}
}

// TestNewResultAddsProbesOfOneName: CPU probes that share a name (the
// masters of a Redis Cluster) are reported as one, their times added, in
// the order names first appear.
func TestNewResultAddsProbesOfOneName(t *testing.T) {
	m := measurement{elapsed: time.Second}
	m.ok = 1000
	probes := []CPUProbe{{Name: "redis", PID: 1}, {Name: "rls", PID: 2}, {Name: "redis", PID: 3}, {Name: "redis", PID: 4}}
	o, err := Options{Addr: "x:1", Descriptors: []Template{{}}, CPU: probes}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	before := []time.Duration{time.Second, time.Second, 2 * time.Second, 3 * time.Second}
	after := []time.Duration{time.Second + 10*time.Millisecond, time.Second + 50*time.Millisecond, 2*time.Second + 20*time.Millisecond, 3*time.Second + 30*time.Millisecond}
	r := newResult(o, m, before, after)
	want := []CPUUse{{Name: "redis", Seconds: 0.06, MicrosPerReq: 60}, {Name: "rls", Seconds: 0.05, MicrosPerReq: 50}}
	if len(r.CPU) != len(want) {
		t.Fatalf("cpu = %+v, want %+v", r.CPU, want)
	}
	for i := range want {
		if r.CPU[i].Name != want[i].Name || math.Abs(r.CPU[i].Seconds-want[i].Seconds) > 1e-9 || math.Abs(r.CPU[i].MicrosPerReq-want[i].MicrosPerReq) > 1e-9 {
			t.Errorf("cpu[%d] = %+v, want %+v", i, r.CPU[i], want[i])
		}
	}
}

func TestMedians(t *testing.T) {
	run := func(label string, callers int, rps, p99, cpu float64, ok int64) *Result {
		return &Result{Label: label, Target: "t", Mode: "closed", Callers: callers, RPS: rps, P99: p99, OK: ok,
			CPU: []CPUUse{{Name: "rls", MicrosPerReq: cpu}}}
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
	}
	in[len(in)-1].FullDecode = true
	in[0].Ceiling, in[2].Ceiling, in[4].Ceiling = true, true, true
	for i, p99 := range map[int]float64{1: 0.5, 3: 0.9, 5: 0.7} {
		in[i].Server = &ServerLatency{Requests: in[i].OK, P50: p99 / 2, P90: p99 / 2, P99: p99}
	}
	// A ceiling run whose scrape saw no request has no
	// quantiles: it must not count as a zero latency.
	in[2].Server = &ServerLatency{}
	got := Medians(in)
	if len(got) != 4 {
		t.Fatalf("%d results, want 4 (ceiling, a@16, a@64, a@16 decoded whole): %+v", len(got), got)
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
	if err := WriteTable(&buf, got); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "runs") {
		t.Errorf("the table of medians has no runs column:\n%s", buf.String())
	}
}
