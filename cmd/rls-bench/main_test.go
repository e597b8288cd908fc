package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/envoy-rls/envoy-rls/cmd/rls-bench/internal/bench"
	"github.com/envoy-rls/envoy-rls/internal/gcpercent"
)

func TestSelfTestRequestsEndToEnd(t *testing.T) {
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{
		"--self-test", "--requests", "300", "--warmup", "0", "--concurrency", "8",
		"--descriptor", "remote_address=10.0.{i}", "--descriptor", "tenant=t{i%100},user=u{i}",
		"--cardinality", "1000", "--json", "--timeout", "1m",
	}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit code %d, stderr:\n%s", code, errb.String())
	}
	rs, err := bench.ReadJSON(&out)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 1 || !rs[0].Ceiling {
		t.Fatalf("got %d results (%+v), want the single ceiling run", len(rs), rs)
	}
	r := rs[0]
	if r.TLS != "" {
		t.Errorf("a plain-text run recorded TLS %q", r.TLS)
	}
	if r.Requests != 300 || r.OK != 300 || r.Errors != 0 || r.OverLimit != 0 || r.Descriptors != 2 {
		t.Errorf("requests=%d ok=%d over=%d errors=%d descriptors=%d, want 300/300/0/0/2", r.Requests, r.OK, r.OverLimit, r.Errors, r.Descriptors)
	}
}

func TestCeilingThenTargetTable(t *testing.T) {
	target, err := bench.StartNoop("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	ceil, err := bench.StartNoop("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ceil.Close()
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{
		"--addr", target.Addr(), "--ceiling-addr", ceil.Addr(), "--label", "tgt",
		"--requests", "200", "--warmup", "0", "--rate", "4000", "--cpu", "bench=self", "--timeout", "1m",
	}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit code %d, stderr:\n%s", code, errb.String())
	}
	lines := strings.Split(strings.TrimRight(out.String(), "\n"), "\n")
	if len(lines) != 3 {
		t.Fatalf("want header + ceiling + target rows, got:\n%s", out.String())
	}
	for i, want := range []string{"bench µs/req", "tgt ceiling", "tgt"} {
		if !strings.HasPrefix(lines[i], want) && !strings.Contains(lines[i], want) {
			t.Errorf("line %d = %q, want it to contain %q", i, lines[i], want)
		}
	}
	if !strings.Contains(lines[1], ceil.Addr()) || !strings.Contains(lines[2], target.Addr()) {
		t.Errorf("rows name the wrong targets:\n%s", out.String())
	}
	if !strings.Contains(lines[2], "%") || !strings.Contains(lines[2], "16@4000/s") {
		t.Errorf("target row lacks the ceiling fraction or the open-loop rate: %q", lines[2])
	}
}

func TestParseLoad(t *testing.T) {
	cfg, err := parseLoad([]string{"--addr", "h:1", "--descriptor", "a=1", "--descriptor", "b={i}", "--hits", "5",
		"--requests", "10", "--rate", "100", "--cpu", "rls=12", "--ceiling"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	o := cfg.opts
	if o.Addr != "h:1" || len(o.Descriptors) != 2 || o.Hits != 5 || o.Requests != 10 || o.Rate != 100 ||
		len(o.CPU) != 1 || o.CPU[0].PID != 12 || !cfg.selfTest || o.Concurrency != 16 || o.Connections != 4 ||
		o.Warmup != 2*time.Second || o.Domain != "edge" || o.Timeout != time.Second || o.Cardinality != 1 {
		t.Errorf("parsed %+v", cfg)
	}
	cfg, err = parseLoad([]string{"--addr", "h:1", "--server-metrics", "http://127.0.0.1:8080/metrics"}, &bytes.Buffer{})
	if err != nil || cfg.opts.Server == nil || *cfg.opts.Server != (bench.ServerHistogram{URL: "http://127.0.0.1:8080/metrics", Metric: "envoy_rls_request_duration_seconds"}) {
		t.Errorf("--server-metrics: %+v, %v", cfg.opts.Server, err)
	}
	cfg, err = parseLoad([]string{"--addr", "h:1"}, &bytes.Buffer{})
	if err != nil || len(cfg.opts.Descriptors) != 1 || cfg.opts.Descriptors[0].String() != "remote_address=10.0.{i}" {
		t.Errorf("default descriptor: %+v, %v", cfg.opts.Descriptors, err)
	}
	for _, bad := range [][]string{
		{},
		{"--addr", "h:1", "--duration", "1s", "--requests", "3"},
		{"--addr", "h:1", "--descriptor", "nokv"},
		{"--addr", "h:1", "--cardinality", "0"},
		{"--addr", "h:1", "--hits", "4294967296"},
		{"--addr", "h:1", "--cpu", "rls"},
		{"--addr", "h:1", "extra"},
		{"--addr", "h:1", "--server-histogram", "x_seconds"},
		{"--addr", "h:1", "--server-metrics", "127.0.0.1:8080/metrics"},
		{"--addr", "h:1", "--server-metrics", "http://127.0.0.1:8080/metrics", "--server-histogram", ""},
		{"--addr", "h:1", "--gc-percent", "0"},
		{"--addr", "h:1", "--duration", "0s"}, // was run for 10 s
		{"--addr", "h:1", "--duration", "-1s"},
	} {
		if _, err := parseLoad(bad, &bytes.Buffer{}); err == nil {
			t.Errorf("parseLoad(%q): no error", bad)
		}
	}
}

// TestGCPercentFlag: --gc-percent sets this process's GOGC, envoy-rls's
// default when not given, for a load run and for serve-noop, unless the GOGC
// variable is set and the flag is not given; a value below 1 is refused
// with the flag's name.
func TestGCPercentFlag(t *testing.T) {
	orig := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(orig) })
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	load := func(extra ...string) (int, string) {
		var out, errb bytes.Buffer
		args := append([]string{"--self-test", "--requests", "20", "--warmup", "0", "--timeout", "1m"}, extra...)
		return run(context.Background(), args, &out, &errb), errb.String()
	}
	noop := func(extra ...string) (int, string) {
		var out, errb bytes.Buffer
		// A cancelled context: serve-noop applies the flag, listens, and
		// stops at once.
		args := append([]string{"serve-noop", "--addr", "127.0.0.1:0"}, extra...)
		return run(cancelled, args, &out, &errb), errb.String()
	}
	for _, cmd := range []struct {
		name string
		run  func(extra ...string) (int, string)
	}{{"load", load}, {"serve-noop", noop}} {
		t.Run(cmd.name, func(t *testing.T) {
			for _, tc := range []struct {
				args     []string
				gogcVar  string // "": unset
				want     int    // the GOGC in effect afterwards
				wantSaid string
			}{
				{nil, "", gcpercent.Default, "GOGC 400 (from --gc-percent)"},
				{[]string{"--gc-percent", "250"}, "", 250, "GOGC 250 (from --gc-percent)"},
				{nil, "150", 123, "GOGC 150 (from the GOGC variable)"},
				{[]string{"--gc-percent", "250"}, "150", 250, "GOGC 250 (from --gc-percent)"},
			} {
				t.Setenv("GOGC", tc.gogcVar) // restores the variable afterwards
				if tc.gogcVar == "" {
					os.Unsetenv("GOGC")
				}
				// A value the run cannot have set: whether it was left
				// alone shows.
				debug.SetGCPercent(123)
				code, stderr := cmd.run(tc.args...)
				if code != 0 {
					t.Fatalf("%q: exit code %d\n%s", tc.args, code, stderr)
				}
				if got := debug.SetGCPercent(100); got != tc.want || !strings.Contains(stderr, tc.wantSaid) {
					t.Errorf("%q with GOGC=%q: GOGC %d afterwards, want %d; stderr lacks %q:\n%s", tc.args, tc.gogcVar, got, tc.want, tc.wantSaid, stderr)
				}
			}
			code, stderr := cmd.run("--gc-percent", "0")
			if code != 2 || !strings.Contains(stderr, "--gc-percent 0: must be 1 or more") {
				t.Errorf("--gc-percent 0: exit code %d, stderr:\n%s", code, stderr)
			}
		})
	}
}

func TestReportCombinesCeilings(t *testing.T) {
	in := `{"label":"noop16","target":"a","mode":"closed","callers":16,"rps":1000,"ceiling":true}
{"label":"one-key","target":"b","mode":"closed","callers":16,"rps":250,"cpu":[{"name":"rls","seconds":1,"us_per_req":40}]}
`
	var out, errb bytes.Buffer
	if code := report(nil, strings.NewReader(in), &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if !strings.Contains(out.String(), "25%") || !strings.Contains(out.String(), "rls µs/req") {
		t.Errorf("report lacks the ceiling fraction or the cpu column:\n%s", out.String())
	}
}

// TestReportCompare: --compare prints the table and then the comparison of
// the two sides' runs; the flags that only go with it, --compare with
// --json and a comparison of nothing are refused.
func TestReportCompare(t *testing.T) {
	in := `{"label":"3 desc","target":"a","mode":"closed","callers":16,"rps":300,"p99_ms":2,"cpu":[{"name":"rls","us_per_req":50}]}
{"label":"ratelimit: 3 desc","target":"b","mode":"closed","callers":16,"rps":200,"p99_ms":4,"cpu":[{"name":"rls","us_per_req":100}]}
{"label":"ratelimit: 3 desc","target":"b","mode":"closed","callers":16,"rps":200,"p99_ms":4,"cpu":[{"name":"rls","us_per_req":100}]}
{"label":"3 desc","target":"a","mode":"closed","callers":16,"rps":100,"p99_ms":5,"cpu":[{"name":"rls","us_per_req":50}]}
`
	var out, errb bytes.Buffer
	if code := report([]string{"--median", "--compare", "ratelimit: "}, strings.NewReader(in), &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	// The medians table (rps 200 for each side), then the ratios: rps
	// 300/200 and 100/200, better in one pair; CPU half in both.
	table, cmp, ok := strings.Cut(out.String(), "\n\n")
	if !ok || !strings.Contains(table, "ratelimit: 3 desc") || !strings.Contains(cmp, `the rows without a prefix ÷ the "ratelimit: " rows`) ||
		!strings.Contains(cmp, "1.00× 1/2") || !strings.Contains(cmp, "0.50× 2/2") {
		t.Errorf("report --compare printed:\n%s", out.String())
	}
	for _, args := range [][]string{
		{"--to", "B: "},
		{"--max-steal", "10"},
		{"--compare", "ratelimit: ", "--json"},
		{"--compare", "ratelimit: ", "--max-steal", "101"},
	} {
		errb.Reset()
		if code := report(args, strings.NewReader(in), io.Discard, &errb); code != 2 || errb.Len() == 0 {
			t.Errorf("report %q: exit %d, stderr %q; want 2 and a reason", args, code, errb.String())
		}
	}
	errb.Reset()
	if code := report([]string{"--compare", "B: "}, strings.NewReader(in), io.Discard, &errb); code != 1 ||
		!strings.Contains(errb.String(), "no load was measured on both sides") {
		t.Errorf("report --compare with no such runs: exit %d, stderr %q; want 1 and why", code, errb.String())
	}
}
