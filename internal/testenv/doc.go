// Package testenv starts and stops real servers for tests: a single
// redis-server, a three-master Redis Cluster, a Sentinel-managed master with a
// replica, and locates the pinned Envoy binary.
//
// Every server listens on a free loopback port (127.0.0.1 only), is polled
// until it answers (bounded by a deadline, never a fixed sleep), and is
// stopped with t.Cleanup: the process is killed and waited for, clients are
// closed and temporary directories are removed. A server's log is printed with
// t.Log when the test fails.
//
// A missing binary fails the test (t.Fatalf, never t.Skip) with a hint to run
// `make test`, which installs redis-server, redis-sentinel, redis-tools and
// Envoy.
//
// The helpers take a testing.TB and call its Fatalf on failure, so the methods
// that can fail (Start, Stop, Kill, Pause, Resume, ...) must be called from the
// goroutine running the test. Methods of the returned handles are otherwise
// safe for concurrent use.
package testenv
