package bench

import (
	"fmt"
	"io"
	"slices"
	"strings"
)

// CompareOptions says which runs Compare sets against which: those whose
// label starts with Base against those whose label starts with Other, for
// the same load (the rest of the label, mode, TLS, callers, rate,
// descriptors per request and decoding). An empty prefix is the runs whose label has no
// prefix: Base "ratelimit: " and Other "" set envoy-rls against the
// incumbent in make bench's results, Base "" and Other "B: " the second
// envoy-rls (BENCH_B_ARGS) against the first.
type CompareOptions struct {
	Base, Other string
	// MaxSteal, when above 0, leaves out the pairs in which either run
	// lost MaxSteal percent or more of the machine's CPU time to the
	// hypervisor (Machine.StealPct): such a run measures the neighbours as
	// much as the server.
	MaxSteal float64
}

// Comparison is one load measured on both sides: the i-th run of the Base
// side is paired with the i-th run of the Other side (make bench runs them
// back to back in every round, so the two runs of a pair saw the same
// machine), and every figure is the median over the pairs of Other's
// value divided by Base's. Ratios of pairs are steadier than a ratio of
// medians on a machine whose speed drifts from round to round.
type Comparison struct {
	Label    string // the load's label without the prefix
	Mode     string
	Callers  int
	Rate     float64 // open loop: the intended rate
	Pairs    int     // pairs compared
	Dropped  int     // pairs left out for steal (CompareOptions.MaxSteal)
	Unpaired int     // runs of one side without a counterpart on the other
	Figures  []Figure
	// StealPct is the median over the pairs compared of the larger steal
	// of the two runs; -1 when no run measured it.
	StealPct float64
}

// Figure is one figure of a Comparison.
type Figure struct {
	Name string // as the table's column: "rps", "p99 ms", "rls µs/req", ...
	// Ratio is the median over the pairs of Other's value ÷ Base's.
	Ratio float64
	// Pairs counts the pairs in which both runs measured the figure (above
	// 0), Better those in which Other did better: a higher rate, a lower
	// latency, less CPU time or fewer round trips per request.
	Pairs, Better int
}

// figure is how Compare reads one figure from a run: ok false when the
// run did not measure it.
type figure struct {
	name           string
	higherIsBetter bool
	get            func(*Result) (float64, bool)
}

// Compare pairs the runs of each load on the two sides of o (ceiling runs
// left out) and returns one Comparison per load measured on both, in the
// order the loads first appear on the Base side.
func Compare(rs []*Result, o CompareOptions) ([]Comparison, error) {
	if o.Base == o.Other {
		return nil, fmt.Errorf("compare: both sides have the prefix %q", o.Base)
	}
	type loadKey struct {
		label, mode, tls     string
		callers, descriptors int
		rate                 float64
		fullDecode           bool
	}
	key := func(r *Result, rest string) loadKey {
		return loadKey{rest, r.Mode, r.TLS, r.Callers, r.Descriptors, r.Rate, r.FullDecode}
	}
	var order []loadKey
	base, other := map[loadKey][]*Result{}, map[loadKey][]*Result{}
	for _, r := range rs {
		if r.Ceiling {
			continue
		}
		if rest, ok := strings.CutPrefix(r.Label, o.Base); ok {
			k := key(r, rest)
			if base[k] == nil {
				order = append(order, k)
			}
			base[k] = append(base[k], r)
		}
		if rest, ok := strings.CutPrefix(r.Label, o.Other); ok {
			k := key(r, rest)
			other[k] = append(other[k], r)
		}
	}
	var out []Comparison
	for _, k := range order {
		b, x := base[k], other[k]
		if len(x) == 0 {
			continue // a load of one side only (the do-nothing server's, envoy-rls's own scenarios)
		}
		n := min(len(b), len(x))
		c := Comparison{Label: k.label, Mode: k.mode, Callers: k.callers, Rate: k.rate, Unpaired: len(b) + len(x) - 2*n, StealPct: -1}
		var all, pairs [][2]*Result
		var steals []float64
		for i := range n {
			all = append(all, [2]*Result{b[i], x[i]})
			stolen, measured := pairSteal(b[i], x[i])
			if o.MaxSteal > 0 && stolen >= o.MaxSteal {
				c.Dropped++
				continue
			}
			pairs = append(pairs, [2]*Result{b[i], x[i]})
			if measured {
				steals = append(steals, stolen)
			}
		}
		c.Pairs = len(pairs)
		if len(steals) > 0 {
			c.StealPct = median(steals)
		}
		// The figures of every pair, those left out included, so that a
		// load whose pairs were all left out still lists them (as "-").
		for _, f := range comparedFigures(all) {
			var ratios []float64
			better := 0
			for _, p := range pairs {
				vb, okb := f.get(p[0])
				vx, okx := f.get(p[1])
				if !okb || !okx || vb <= 0 || vx <= 0 {
					continue
				}
				ratios = append(ratios, vx/vb)
				if (f.higherIsBetter && vx > vb) || (!f.higherIsBetter && vx < vb) {
					better++
				}
			}
			c.Figures = append(c.Figures, Figure{Name: f.name, Ratio: median(ratios), Pairs: len(ratios), Better: better})
		}
		out = append(out, c)
	}
	return out, nil
}

// pairSteal is the larger steal of the two runs, and whether either
// measured it.
func pairSteal(a, b *Result) (float64, bool) {
	stolen, measured := 0.0, false
	for _, r := range []*Result{a, b} {
		if r.Machine != nil {
			stolen, measured = max(stolen, r.Machine.StealPct), true
		}
	}
	return stolen, measured
}

// comparedFigures are the figures Compare reads: the rate, the generator's
// p50 and p99, each CPU probe's time per request (in the order the probes
// first appear in the pairs) and Redis's round trips per request.
func comparedFigures(pairs [][2]*Result) []figure {
	fs := []figure{
		{"rps", true, func(r *Result) (float64, bool) { return r.RPS, true }},
		{"p50 ms", false, func(r *Result) (float64, bool) { return r.P50, true }},
		{"p99 ms", false, func(r *Result) (float64, bool) { return r.P99, true }},
	}
	var probes []string
	for _, p := range pairs {
		for _, r := range p {
			for _, c := range r.CPU {
				if !slices.Contains(probes, c.Name) {
					probes = append(probes, c.Name)
				}
			}
		}
	}
	for _, name := range probes {
		fs = append(fs, figure{name + " µs/req", false, func(r *Result) (float64, bool) {
			if c := cpuOf(r, name); c != nil {
				return c.MicrosPerReq, true
			}
			return 0, false
		}})
	}
	fs = append(fs, figure{"redis reads/req", false, func(r *Result) (float64, bool) {
		if r.Redis == nil {
			return 0, false
		}
		return r.Redis.ReadsPerReq, true
	}})
	return fs
}

// WriteComparisons writes cs as a table laid out as l, headed by a sentence
// that names the two sides of o (a paragraph of its own in Markdown). Each
// figure's cell is the median ratio and, after it, in how many of the
// pairs that measured it Other did better ("1.52× 5/5"); "-" where no pair
// measured it. It writes nothing for no comparisons.
func WriteComparisons(w io.Writer, cs []Comparison, o CompareOptions, l Layout) error {
	if len(cs) == 0 {
		return nil
	}
	side := func(p string) string {
		if p == "" {
			return "the rows without a prefix"
		}
		return fmt.Sprintf("the %q rows", p)
	}
	head := fmt.Sprintf("%s ÷ %s: for runs paired in the order they were run, the median of the ratios,\n"+
		"then in how many pairs the first did better (a higher rate; less latency, CPU or round trips per request)",
		side(o.Other), side(o.Base))
	if o.MaxSteal > 0 {
		head += fmt.Sprintf(";\npairs in which the hypervisor took %g%% or more of the machine's CPU time (steal) are left out", o.MaxSteal)
	}
	// The figures' names, in the order they first appear.
	var names []string
	for _, c := range cs {
		for _, f := range c.Figures {
			if !slices.Contains(names, f.Name) {
				names = append(names, f.Name)
			}
		}
	}
	rows := [][]string{append(append([]string{"load", "callers", "pairs"}, names...), "steal %")}
	for _, c := range cs {
		callers := fmt.Sprint(c.Callers)
		if c.Mode == "open" {
			callers = fmt.Sprintf("%d@%g/s", c.Callers, c.Rate)
		}
		pairs := fmt.Sprint(c.Pairs)
		var notes []string
		if c.Dropped > 0 {
			notes = append(notes, fmt.Sprintf("%d left out", c.Dropped))
		}
		if c.Unpaired > 0 {
			notes = append(notes, fmt.Sprintf("%d unpaired", c.Unpaired))
		}
		if len(notes) > 0 {
			pairs += " (" + strings.Join(notes, ", ") + ")"
		}
		row := []string{c.Label, callers, pairs}
		for _, name := range names {
			cell := "-"
			for _, f := range c.Figures {
				if f.Name == name && f.Pairs > 0 {
					cell = fmt.Sprintf("%.2f× %d/%d", f.Ratio, f.Better, f.Pairs)
				}
			}
			row = append(row, cell)
		}
		steal := "-"
		if c.StealPct >= 0 {
			steal = fmt.Sprintf("%.0f", c.StealPct)
		}
		rows = append(rows, append(row, steal))
	}
	if l == Markdown {
		head = strings.ReplaceAll(head, "\n", " ") + ":\n"
	}
	if _, err := fmt.Fprintf(w, "%s\n%s", head, l.render(rows, 1)); err != nil {
		return fmt.Errorf("write comparison: %w", err)
	}
	return nil
}
