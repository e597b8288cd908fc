package main

import "testing"

// TestServeDebugTools runs the debug tools' end-to-end checks against a
// real serve(): /debug/explain, /debug/top and `envoy-rls top`.
func TestServeDebugTools(t *testing.T) {
	dir := writeDebugConfig(t)
	r := startServe(t, serveOptions{configDir: dir, debug: debugOptions{topCapacity: 8}})
	tg := debugTarget{client: r.client, debug: r.addrs.Debug}
	testExplainEndToEnd(t, tg, dir)
	testTopEndToEnd(t, tg, 8, false)
}
