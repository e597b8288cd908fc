package bench

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
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

// clockTicks is USER_HZ, the unit of utime and stime in /proc/<pid>/stat; the
// Linux kernel exports 100 on every architecture Go supports.
const clockTicks = 100

// procCPU returns the user + system CPU time a process has used so far
// (all its threads), from /proc/<pid>/stat.
func procCPU(pid int) (time.Duration, error) {
	p := "self"
	if pid > 0 {
		p = strconv.Itoa(pid)
	}
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

func readCPU(probes []CPUProbe) ([]time.Duration, error) {
	out := make([]time.Duration, len(probes))
	for i, p := range probes {
		d, err := procCPU(p.PID)
		if err != nil {
			return nil, fmt.Errorf("cpu probe %s: %w", p.Name, err)
		}
		out[i] = d
	}
	return out, nil
}
