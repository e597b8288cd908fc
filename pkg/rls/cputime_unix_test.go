//go:build unix

package rls

import (
	"syscall"
	"time"
)

// processCPU is the CPU time (user + system) the test process has used. The
// benchmarks report it per operation next to ns/op, which on a shared,
// loaded machine measures mostly waiting.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
