// Package topk finds the heaviest keys of an unbounded stream in bounded
// memory, with the Space-Saving algorithm of Metwally, Agrawal and El Abbadi
// ("Efficient Computation of Frequent and Top-k Elements in Data Streams",
// ICDT 2005).
//
// A Sketch of capacity m monitors at most m keys. Over a stream of N hits it
// guarantees, for every monitored key with reported Count c and Error e,
// that the key's true number of hits f satisfies c−e ≤ f ≤ c, and that
// e ≤ N/m; every key with f > N/m is monitored. Memory is O(m) whatever the
// number of distinct keys, and one update costs O(log m).
//
// Groups holds one Sketch per group name (envoy-rls uses one per
// domain and rule), with a bound on the number of groups.
package topk
