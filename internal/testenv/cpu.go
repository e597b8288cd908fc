package testenv

import (
	"syscall"
	"testing"
	"time"
)

// ProcessCPU returns the CPU time (user plus system, every thread) the test
// process has used so far, for benchmarks that report CPU per operation next
// to ns/op, which on a shared, loaded machine measures mostly waiting. It
// fails the test when the kernel does not answer.
func ProcessCPU(t testing.TB) time.Duration {
	t.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatalf("testenv: getrusage: %v", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
