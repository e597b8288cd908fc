package bench

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// CPUProbe names a process whose CPU time is measured around the measured
// phase of a run. PID 0 means the benchmark's own process.
type CPUProbe struct {
	Name string
	PID  int
}

// ParseCPUProbe parses "name=pid" (pid may be "self").
func ParseCPUProbe(s string) (CPUProbe, error) {
	name, pid, ok := strings.Cut(s, "=")
	if !ok || name == "" {
		return CPUProbe{}, fmt.Errorf("cpu probe %q: want name=pid", s)
	}
	if pid == "self" {
		return CPUProbe{Name: name}, nil
	}
	n, err := strconv.Atoi(pid)
	if err != nil || n <= 0 {
		return CPUProbe{}, fmt.Errorf("cpu probe %q: pid must be a positive integer or self", s)
	}
	return CPUProbe{Name: name, PID: n}, nil
}

// procName is a probe's process in /proc: its pid, or "self" for PID 0.
func procName(pid int) string {
	if pid > 0 {
		return strconv.Itoa(pid)
	}
	return "self"
}

// clockTicks is USER_HZ, the unit of utime and stime in /proc/<pid>/stat; the
// Linux kernel exports 100 on every architecture Go supports.
const clockTicks = 100

// procCPU returns the user + system CPU time a process has used so far
// (all its threads), from /proc/<pid>/stat.
func procCPU(pid int) (time.Duration, error) {
	p := procName(pid)
	b, err := os.ReadFile("/proc/" + p + "/stat")
	if err != nil {
		return 0, fmt.Errorf("read cpu time of process %s: %w", p, err)
	}
	// The command name (field 2) is in parentheses and may contain spaces;
	// fields are counted after its closing parenthesis, starting at field 3.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("read cpu time of process %s: malformed /proc stat", p)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("read cpu time of process %s: malformed /proc stat", p)
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64) // field 14
	stime, err2 := strconv.ParseInt(f[12], 10, 64) // field 15
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("read cpu time of process %s: malformed utime/stime", p)
	}
	return time.Duration(utime+stime) * time.Second / clockTicks, nil
}

// reading is what a probe reads of a process at one instant.
type reading struct {
	cpu time.Duration
	// wait is the time each thread, by thread id, has spent runnable but
	// waiting for a CPU so far; nil where the kernel keeps no scheduler
	// statistics.
	wait map[int]time.Duration
}

func readProbes(probes []CPUProbe) ([]reading, error) {
	out := make([]reading, len(probes))
	for i, p := range probes {
		d, err := procCPU(p.PID)
		if err != nil {
			return nil, fmt.Errorf("cpu probe %s: %w", p.Name, err)
		}
		w, err := procWait(p.PID)
		if err != nil {
			return nil, fmt.Errorf("cpu probe %s: %w", p.Name, err)
		}
		out[i] = reading{cpu: d, wait: w}
	}
	return out, nil
}

// procWait returns, by thread id, the time each thread of a process has
// spent on a run queue so far: runnable but not running, whether behind
// another process's threads, its own, or a CPU quota. It is the second
// field of /proc/<pid>/task/<tid>/schedstat, in nanoseconds (summed over
// the threads, since /proc/<pid>/schedstat is the main thread's alone). It
// returns nil, nil where the kernel keeps no such statistics (see
// taskWaits). A thread that exits while it is read is left out.
func procWait(pid int) (map[int]time.Duration, error) {
	p := procName(pid)
	w, err := taskWaits("/proc/" + p)
	if err != nil {
		return nil, fmt.Errorf("read run-queue wait of process %s: %w", p, err)
	}
	return w, nil
}

// taskWaits reads the schedstat of every thread under dir, a process's
// directory in /proc. It returns nil, nil where the kernel keeps no
// scheduler statistics: without CONFIG_SCHED_INFO there is no schedstat
// file, and where it is compiled in but switched off each reads "0 0 0"
// (no live process has run for no time at all).
func taskWaits(dir string) (map[int]time.Duration, error) {
	if _, err := os.Stat(dir + "/schedstat"); err != nil {
		if _, statErr := os.Stat(dir); statErr != nil {
			return nil, statErr // the process is gone
		}
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil // the process is there; its statistics are not
		}
		return nil, err
	}
	tasks, err := os.ReadDir(dir + "/task")
	if err != nil {
		return nil, err
	}
	out := make(map[int]time.Duration, len(tasks))
	ran := false
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue // not a thread
		}
		b, err := os.ReadFile(dir + "/task/" + t.Name() + "/schedstat")
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
			continue // the thread exited meanwhile
		}
		if err != nil {
			return nil, fmt.Errorf("thread %d: %w", tid, err)
		}
		on, wait, err := parseSchedstat(b)
		if err != nil {
			return nil, fmt.Errorf("thread %d: %w", tid, err)
		}
		ran = ran || on > 0
		out[tid] = wait
	}
	if !ran {
		return nil, nil
	}
	return out, nil
}

// parseSchedstat returns the first two fields of a schedstat line: "<ns on
// a CPU> <ns waiting on a run queue> <timeslices run>" (a later kernel may
// add fields).
func parseSchedstat(b []byte) (on, wait time.Duration, err error) {
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return 0, 0, fmt.Errorf("malformed schedstat %q: want 3 fields", b)
	}
	var ns [2]int64
	for i := range ns {
		ns[i], err = strconv.ParseInt(f[i], 10, 64)
		if err != nil || ns[i] < 0 {
			return 0, 0, fmt.Errorf("malformed schedstat %q: field %d is not a count of nanoseconds", b, i+1)
		}
	}
	return time.Duration(ns[0]), time.Duration(ns[1]), nil
}

// waitBetween is the run-queue wait of a process between two readings: by
// thread, what its total grew, and the whole total of a thread that did not
// exist at the first (a total that shrank can only be a new thread under a
// reused id). A thread that exited in between is not counted for the part it
// waited after the first reading. The kernel adds a wait to the total when
// the thread gets a CPU, so a wait in progress at a reading counts at the
// next one: at most a timeslice per thread either way.
func waitBetween(before, after map[int]time.Duration) time.Duration {
	var d time.Duration
	for tid, a := range after {
		if b, ok := before[tid]; ok && b <= a {
			d += a - b
		} else {
			d += a
		}
	}
	return d
}

// Machine is how the whole machine's CPU time was spent over the measured
// phase, in percent of all of it (every CPU), from the "cpu" line of
// /proc/stat. Steal is the time the hypervisor ran something else while a
// virtual CPU of this machine had work: on a shared VM it is what makes two
// runs of the same code differ, and a run it took much from is not
// comparable with a quieter one. Idle (with I/O wait) says whether the
// processes left CPU unused; Busy is the rest (user, nice, system, IRQ).
type Machine struct {
	BusyPct  float64 `json:"busy_pct"`
	IdlePct  float64 `json:"idle_pct"`
	StealPct float64 `json:"steal_pct"`
}

// procStatPath is the kernel's CPU accounting, read for Machine.
const procStatPath = "/proc/stat"

// cpuTicks are the fields of /proc/stat's "cpu" line that Machine reads, in
// USER_HZ ticks.
type cpuTicks struct{ busy, idle, steal uint64 }

// readCPUTicks reads the "cpu" line of the file at path; ok is false where
// there is no such file (not Linux), so that a run there reports no Machine.
func readCPUTicks(path string) (t cpuTicks, ok bool, err error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return cpuTicks{}, false, nil
	}
	if err != nil {
		return cpuTicks{}, false, fmt.Errorf("read machine cpu time: %w", err)
	}
	line, _, _ := bytes.Cut(b, []byte("\n"))
	t, err = parseCPULine(string(line))
	if err != nil {
		return cpuTicks{}, false, fmt.Errorf("read machine cpu time: %s: %w", path, err)
	}
	return t, true, nil
}

// parseCPULine parses "cpu user nice system idle iowait irq softirq steal
// [guest guest_nice]". guest and guest_nice are already counted in user
// and nice, so they are not added again. A kernel before 2.6.11 wrote no
// steal field; the line needs all eight.
func parseCPULine(line string) (cpuTicks, error) {
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return cpuTicks{}, fmt.Errorf("first line %q: want \"cpu\" and 8 or more counts", line)
	}
	var n [8]uint64
	for i := range n {
		v, err := strconv.ParseUint(f[i+1], 10, 64)
		if err != nil {
			return cpuTicks{}, fmt.Errorf("first line %q: field %d is not a count", line, i+2)
		}
		n[i] = v
	}
	return cpuTicks{busy: n[0] + n[1] + n[2] + n[5] + n[6], idle: n[3] + n[4], steal: n[7]}, nil
}

// machineBetween is Machine over the interval between two readings; nil
// when no tick passed (a phase shorter than a tick says nothing) or a count
// went back.
func machineBetween(a, b cpuTicks) *Machine {
	if b.busy < a.busy || b.idle < a.idle || b.steal < a.steal {
		return nil
	}
	busy, idle, steal := b.busy-a.busy, b.idle-a.idle, b.steal-a.steal
	all := float64(busy + idle + steal)
	if all == 0 {
		return nil
	}
	return &Machine{BusyPct: 100 * float64(busy) / all, IdlePct: 100 * float64(idle) / all, StealPct: 100 * float64(steal) / all}
}
