// Package bench is the engine of rls-bench: it drives load against any Envoy
// RateLimitService v3 gRPC server (envoy-rls, envoyproxy/ratelimit, or the
// do-nothing server in this package) and summarises what came back.
//
// The parts:
//
//   - Template expands a descriptor template such as
//     "tenant=t{i%100},user=u{i}" into the entries of one request
//     descriptor for a request index i.
//   - Histogram is a log-linear latency histogram (HDR-style, relative error
//     below 1/256) that each caller goroutine owns alone and that is merged
//     once at the end, so recording takes no lock.
//   - Run executes one run (warm-up, then the measured phase) in closed-loop
//     mode (a fixed number of callers, each sending its next request when the
//     previous answer arrives) or open-loop mode (requests scheduled at fixed
//     intended times, latency measured from the intended time, so a stalled
//     server cannot hide its stall: no coordinated omission).
//   - NoopServer is a RateLimitService that answers OK at once: the ceiling
//     a gRPC server can reach on this machine, for comparison.
//   - Result, WriteTable and the JSON form report a run; Medians combines
//     repeated runs, and Compare sets the runs of two servers (or two
//     settings) made back to back against each other, pair by pair
//     (WriteComparisons). Both tables are laid out Aligned or as Markdown.
//
// Run and the NoopServer own every goroutine they start: Run returns only
// after all its callers have stopped, and NoopServer.Close stops the server.
package bench
