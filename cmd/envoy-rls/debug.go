package main

import (
	"cmp"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/envoy-rls/envoy-rls/pkg/descriptors"
	"github.com/envoy-rls/envoy-rls/pkg/rls"
	"github.com/envoy-rls/envoy-rls/pkg/topk"
)

// debugOptions are the flags of the debug tools (/debug/explain, /debug/top).
type debugOptions struct {
	topFullValues bool
	topCapacity   int
}

func (o *debugOptions) register(fs *flag.FlagSet) {
	fs.BoolVar(&o.topFullValues, "debug.top-full-values", false,
		"/debug/top keeps whole descriptor values; by default each value is cut to its first 8 bytes and tagged with a hash of the whole value")
	fs.IntVar(&o.topCapacity, "debug.top-capacity", topk.DefaultCapacity,
		"values /debug/top monitors per rule and limit (Space-Saving counters); memory and accuracy grow with it")
}

// debugTools serves /debug/explain and /debug/top. It is safe for
// concurrent use once setService has been called (before serving).
type debugTools struct {
	fullValues bool
	svc        *rls.Service
	top        *topk.Groups[topGroup]
	now        func() time.Time

	mu    sync.Mutex
	since time.Time // start of the current /debug/top counts
}

// topGroup is one table of /debug/top: the denials of one limit. Every field
// comes from the configuration, so the number of groups is bounded by it.
type topGroup struct {
	domain, rule, limit string
	shadow              bool
}

func newDebugTools(o debugOptions, now func() time.Time) *debugTools {
	if now == nil {
		now = time.Now
	}
	d := &debugTools{
		fullValues: o.topFullValues,
		top:        topk.NewGroups[topGroup](topk.GroupsOptions{Capacity: o.topCapacity}),
		now:        now,
		since:      now(),
	}
	return d
}

// setService gives the tools the Service to explain with.
func (d *debugTools) setService(svc *rls.Service) { d.svc = svc }

// observer returns next extended with rls.DenyObserver, which feeds
// /debug/top.
func (d *debugTools) observer(next rls.Observer) rls.Observer {
	return denyTracker{Observer: next, d: d}
}

// denyTracker is an rls.Observer whose denials also go to /debug/top.
type denyTracker struct {
	rls.Observer
	d *debugTools
}

// ObserveDeny counts the denied descriptor in its limit's sketch.
func (t denyTracker) ObserveDeny(dec rls.Decision, entries []descriptors.Entry) {
	g := topGroup{domain: dec.Domain, rule: dec.Rule, limit: dec.Limit, shadow: dec.Outcome == rls.OutcomeShadowOverLimit}
	var arr [256]byte // on the stack: AddBytes does not keep the slice
	b := arr[:0]
	for i, e := range entries {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, e.Key...)
		b = append(b, '=')
		b = t.d.appendValue(b, e.Value)
	}
	t.d.top.AddBytes(g, b, 1)
}

// redactPrefix is how many bytes of a value /debug/top keeps by default.
const redactPrefix = 8

// appendValue appends v as /debug/top stores it: whole with
// --debug.top-full-values, else its first redactPrefix bytes (cut back to a
// UTF-8 boundary), "~" and the 32-bit FNV-1a hash of the whole value in hex,
// e.g. "Bearer e~9f3c01d2". The hash keeps values with a common prefix
// apart and lets an operator confirm a suspected value; the cut bounds the
// memory per key and keeps long secrets (tokens, ids in paths) out of the
// debug output. It is not anonymisation: a value of up to 8 bytes (an IPv4
// address such as 10.0.0.1) is shown whole.
//
// A value longer than rls.DefaultMaxValueBytes is cut even with
// --debug.top-full-values: the service counts such a value (a client's
// header, up to what Envoy lets through) by its digest, and /debug/top keeps
// its memory per key bounded as well.
func (d *debugTools) appendValue(b []byte, v string) []byte {
	if d.fullValues && len(v) <= rls.DefaultMaxValueBytes {
		return append(b, v...)
	}
	p := v
	if len(p) > redactPrefix {
		p = p[:redactPrefix]
		for len(p) > 0 && !utf8.ValidString(p) {
			p = p[:len(p)-1]
		}
	}
	b = append(b, p...)
	b = append(b, '~')
	h := uint32(2166136261)
	for i := 0; i < len(v); i++ {
		h ^= uint32(v[i])
		h *= 16777619
	}
	const hex = "0123456789abcdef"
	for shift := 28; shift >= 0; shift -= 4 {
		b = append(b, hex[h>>uint(shift)&0xf])
	}
	return b
}

func (d *debugTools) register(mux *http.ServeMux) {
	mux.HandleFunc("GET /debug/explain", d.explain)
	mux.HandleFunc("GET /debug/top", d.getTop)
	mux.HandleFunc("DELETE /debug/top", d.resetTop)
}

const explainUsage = "usage: /debug/explain?domain=D&descriptor=k=v[,k=v...] (or repeated &entry=k=v for values with commas) [&format=text|json]"

// explain serves /debug/explain: the rule a descriptor matches and its
// counters' state, without counting (rls.Service.Explain).
func (d *debugTools) explain(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	entries, err := parseExplainEntries(q["descriptor"], q["entry"])
	if err != nil {
		http.Error(w, err.Error()+"\n"+explainUsage, http.StatusBadRequest)
		return
	}
	if f := q.Get("format"); f != "" && f != "text" && f != "json" {
		http.Error(w, fmt.Sprintf("format %q: want text or json (the default)\n%s", f, explainUsage), http.StatusBadRequest)
		return
	}
	if d.svc == nil {
		http.Error(w, "explain: no service", http.StatusServiceUnavailable)
		return
	}
	ex, err := d.svc.Explain(r.Context(), q.Get("domain"), entries)
	if err != nil {
		code := http.StatusInternalServerError
		switch status.Code(err) {
		case codes.InvalidArgument:
			code = http.StatusBadRequest
		case codes.Unavailable:
			code = http.StatusServiceUnavailable
		case codes.DeadlineExceeded, codes.Canceled:
			code = http.StatusGatewayTimeout
		}
		msg := err.Error()
		if s, ok := status.FromError(err); ok {
			msg = s.Message()
		}
		http.Error(w, "explain: "+msg+"\n"+explainUsage, code)
		return
	}
	if q.Get("format") == "text" {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_ = rls.FormatExplanation(w, ex)
		return
	}
	writeJSON(w, ex)
}

// parseExplainEntries reads descriptor=k=v,k=v (one parameter) or repeated
// entry=k=v parameters, not both.
func parseExplainEntries(descs, entries []string) ([]descriptors.Entry, error) {
	var kvs []string
	switch {
	case len(descs) > 0 && len(entries) > 0:
		return nil, fmt.Errorf("give descriptor or entry parameters, not both")
	case len(descs) > 1:
		return nil, fmt.Errorf("one descriptor at a time (got %d)", len(descs))
	case len(descs) == 1:
		kvs = strings.Split(descs[0], ",")
	default:
		kvs = entries
	}
	if len(kvs) == 0 {
		return nil, fmt.Errorf("no descriptor given")
	}
	out := make([]descriptors.Entry, 0, len(kvs))
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("descriptor entry %q: want key=value", kv)
		}
		out = append(out, descriptors.Entry{Key: k, Value: v})
	}
	return out, nil
}

// topReport is the JSON of /debug/top.
type topReport struct {
	// Since is when counting started (the start, or the last reset).
	Since time.Time `json:"since"`
	// FullValues: values are whole (--debug.top-full-values), else cut
	// and hashed (see appendValue).
	FullValues bool `json:"full_values"`
	// Capacity is the number of values monitored per limit.
	Capacity int `json:"capacity"`
	// Dropped counts denials not tracked because too many limits were.
	Dropped uint64     `json:"dropped"`
	Limits  []topLimit `json:"limits"`
}

// topLimit is the heaviest denied values of one limit.
type topLimit struct {
	Domain string `json:"domain"`
	Rule   string `json:"rule"`
	Limit  string `json:"limit"`
	// Outcome is over_limit, or shadow_over_limit for a shadow limit.
	Outcome string `json:"outcome"`
	// Denied is every denial of the limit since Since (N).
	Denied uint64 `json:"denied"`
	// Monitored is the number of distinct values held (≤ Capacity).
	Monitored int `json:"monitored"`
	// ErrorBound is N / Capacity: no count is more than this above the
	// truth, and every value denied more often than this is listed in the
	// full table (Space-Saving's guarantee).
	ErrorBound uint64 `json:"error_bound"`
	// Top lists the n values with the largest counts; each count is an
	// upper bound, count − error a lower bound of the true denials.
	Top []topk.Item `json:"top"`
}

// getTop serves /debug/top[?n=10][&domain=D][&rule=R].
func (d *debugTools) getTop(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	n := 10
	if s := q.Get("n"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 {
			http.Error(w, "n: want a positive integer", http.StatusBadRequest)
			return
		}
		n = v
	}
	domain, rule := q.Get("domain"), q.Get("rule")
	d.mu.Lock()
	rep := topReport{Since: d.since, FullValues: d.fullValues, Capacity: d.top.Capacity(), Limits: []topLimit{}}
	d.mu.Unlock()
	d.top.Each(func(g topGroup, s *topk.Sketch) {
		if (domain != "" && g.domain != domain) || (rule != "" && g.rule != rule) {
			return
		}
		outcome := rls.OutcomeOverLimit
		if g.shadow {
			outcome = rls.OutcomeShadowOverLimit
		}
		total := s.Total()
		rep.Limits = append(rep.Limits, topLimit{
			Domain: g.domain, Rule: g.rule, Limit: g.limit, Outcome: outcome.String(),
			Denied: total, Monitored: s.Len(), ErrorBound: total / uint64(s.Capacity()), Top: s.Top(n),
		})
	})
	rep.Dropped = d.top.Dropped()
	slices.SortFunc(rep.Limits, func(a, b topLimit) int {
		if c := cmp.Compare(b.Denied, a.Denied); c != 0 {
			return c
		}
		return cmp.Or(cmp.Compare(a.Domain, b.Domain), cmp.Compare(a.Rule, b.Rule),
			cmp.Compare(a.Limit, b.Limit), cmp.Compare(a.Outcome, b.Outcome))
	})
	writeJSON(w, rep)
}

// resetTop serves DELETE /debug/top: forget every count and start again.
func (d *debugTools) resetTop(w http.ResponseWriter, r *http.Request) {
	d.mu.Lock()
	d.top.Reset()
	d.since = d.now()
	d.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

func writeJSON(w http.ResponseWriter, v any) {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(append(b, '\n'))
}
