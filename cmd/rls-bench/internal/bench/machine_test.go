package bench

import (
	"bytes"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestParseCPULine: the eight counts Machine reads (guest time is inside
// user and nice already), and clear errors for what is not such a line.
func TestParseCPULine(t *testing.T) {
	got, err := parseCPULine("cpu  523947 10 97897 2161570 9237 3 18857 78069 500 7")
	if err != nil {
		t.Fatal(err)
	}
	want := cpuTicks{busy: 523947 + 10 + 97897 + 3 + 18857, idle: 2161570 + 9237, steal: 78069}
	if got != want {
		t.Errorf("parseCPULine = %+v, want %+v", got, want)
	}
	for _, bad := range []string{
		"cpu 1 2 3 4 5 6 7",        // no steal field
		"cpu0 1 2 3 4 5 6 7 8",     // a single CPU's line
		"cpu 1 2 3 x 5 6 7 8",      // not a count
		"cpu 1 2 3 4 5 6 7 -8 9 9", // nor is this
		"",
	} {
		if _, err := parseCPULine(bad); err == nil {
			t.Errorf("parseCPULine(%q): no error", bad)
		}
	}
}

// TestMachineBetween: shares of the ticks that passed, none when none
// passed or a count went back.
func TestMachineBetween(t *testing.T) {
	a := cpuTicks{busy: 100, idle: 300, steal: 50}
	m := machineBetween(a, cpuTicks{busy: 160, idle: 320, steal: 70})
	if m == nil || m.BusyPct != 60 || m.IdlePct != 20 || m.StealPct != 20 {
		t.Errorf("machineBetween = %+v, want busy 60%%, idle 20%%, steal 20%%", m)
	}
	if m := machineBetween(a, a); m != nil {
		t.Errorf("no tick passed: %+v, want nil", m)
	}
	if m := machineBetween(a, cpuTicks{busy: 200, idle: 299, steal: 60}); m != nil {
		t.Errorf("idle went back: %+v, want nil", m)
	}
}

// TestReadCPUTicks reads made-up files, a missing one (no Machine, no
// error) and, on Linux, the kernel's own.
func TestReadCPUTicks(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "stat")
	if err := os.WriteFile(good, []byte("cpu  10 0 5 100 1 0 2 7 0 0\ncpu0 5 0 2 50 0 0 1 3 0 0\nintr 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	got, ok, err := readCPUTicks(good)
	if err != nil || !ok || got != (cpuTicks{busy: 17, idle: 101, steal: 7}) {
		t.Errorf("readCPUTicks = %+v, %v, %v; want busy 17 idle 101 steal 7", got, ok, err)
	}
	if _, ok, err := readCPUTicks(filepath.Join(dir, "none")); ok || err != nil {
		t.Errorf("missing file: ok %v, err %v; want false, nil", ok, err)
	}
	bad := filepath.Join(dir, "bad")
	if err := os.WriteFile(bad, []byte("intr 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := readCPUTicks(bad); err == nil || !strings.Contains(err.Error(), bad) {
		t.Errorf("malformed file: err %v, want one naming %s", err, bad)
	}
	if runtime.GOOS == "linux" {
		if _, ok, err := readCPUTicks(procStatPath); !ok || err != nil {
			t.Errorf("%s: ok %v, err %v", procStatPath, ok, err)
		}
	}
}

// TestMachineInResults: the steal warning's threshold, the table's columns,
// and the median of the runs that measured the machine.
func TestMachineInResults(t *testing.T) {
	r := &Result{Label: "a", Mode: "closed", Callers: 16, RPS: 100, Machine: &Machine{BusyPct: 50, IdlePct: 40.9, StealPct: 9.1}}
	if w := r.StealWarning(); w != "" {
		t.Errorf("steal 9.1%%: warning %q, want none", w)
	}
	r.Machine.StealPct = 41
	if w := r.StealWarning(); !strings.Contains(w, "a: the hypervisor took 41%") {
		t.Errorf("steal 41%%: warning %q", w)
	}
	if w := (&Result{Label: "b"}).StealWarning(); w != "" {
		t.Errorf("no machine figures: warning %q", w)
	}
	without := &Result{Label: "b", Mode: "closed", Callers: 16, RPS: 100}
	var tbl bytes.Buffer
	if err := WriteTable(&tbl, []*Result{r, without}, Aligned); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimRight(tbl.String(), "\n"), "\n")
	if len(lines) != 3 || !strings.HasSuffix(lines[0], "idle %  steal %") ||
		!strings.HasSuffix(lines[1], "41       41") || !strings.HasSuffix(lines[2], "-        -") {
		t.Errorf("table:\n%s", tbl.String())
	}
	tbl.Reset()
	if err := WriteTable(&tbl, []*Result{without}, Aligned); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(tbl.String(), "steal") {
		t.Errorf("a table without machine figures has their columns:\n%s", tbl.String())
	}
	runs := []*Result{
		{Label: "a", Mode: "closed", Callers: 16, Machine: &Machine{BusyPct: 60, IdlePct: 10, StealPct: 30}},
		{Label: "a", Mode: "closed", Callers: 16},
		{Label: "a", Mode: "closed", Callers: 16, Machine: &Machine{BusyPct: 80, IdlePct: 10, StealPct: 10}},
	}
	runs[0].Redis = &RedisUse{Servers: 1, Commands: 10, Reads: 4, CommandsPerReq: 2, ReadsPerReq: 0.75}
	runs[2].Redis = &RedisUse{Servers: 1, Commands: 30, Reads: 6, CommandsPerReq: 4, ReadsPerReq: 0.25}
	m := Medians(runs)
	if len(m) != 1 || m[0].Machine == nil || *m[0].Machine != (Machine{BusyPct: 70, IdlePct: 10, StealPct: 20}) {
		t.Errorf("median machine = %+v, want the median of the two runs that have one", m[0].Machine)
	}
	if want := (RedisUse{Servers: 1, Commands: 40, Reads: 10, CommandsPerReq: 3, ReadsPerReq: 0.5}); m[0].Redis == nil || *m[0].Redis != want {
		t.Errorf("median Redis figures = %+v, want the medians of the two runs that have them and their counts summed (%+v)", m[0].Redis, want)
	}
}
