//go:build !unix

package rls

import "time"

// processCPU is unknown on this platform; the benchmarks then report 0.
func processCPU() time.Duration { return 0 }
