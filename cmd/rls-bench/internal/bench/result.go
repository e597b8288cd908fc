package bench

import (
	"cmp"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"
	"unicode/utf8"
)

// Result is the outcome of the measured phase of one run. Latencies are in
// milliseconds. It is a plain value; its JSON form is one object per run.
type Result struct {
	Label       string           `json:"label"`
	Target      string           `json:"target"`
	TLS         string           `json:"tls,omitempty"` // "tls", or "mutual" with a client certificate; "" in plain text
	Mode        string           `json:"mode"`          // "closed" or "open"
	Callers     int              `json:"callers"`
	Connections int              `json:"connections"`
	Descriptors int              `json:"descriptors"`               // descriptors per request
	Cardinality int64            `json:"cardinality"`               // distinct indexes
	FullDecode  bool             `json:"full_decode,omitempty"`     // responses decoded whole (Options.FullDecode)
	Rate        float64          `json:"rate,omitempty"`            // open loop: intended requests per second
	Scheduled   int64            `json:"scheduled,omitempty"`       // open loop: requests scheduled
	Requests    int64            `json:"requests"`                  // calls completed (OK + OVER_LIMIT + errors)
	ElapsedS    float64          `json:"elapsed_s"`                 // measured phase, start to last answer
	RPS         float64          `json:"rps"`                       // answers (OK + OVER_LIMIT) per second of ElapsedS; errors do not count
	P50         float64          `json:"p50_ms"`                    //
	P90         float64          `json:"p90_ms"`                    //
	P99         float64          `json:"p99_ms"`                    //
	P999        float64          `json:"p999_ms"`                   //
	Max         float64          `json:"max_ms"`                    //
	Mean        float64          `json:"mean_ms"`                   //
	MaxSendLag  float64          `json:"max_send_lag_ms,omitempty"` // open loop: worst delay from intended to actual send
	OK          int64            `json:"ok"`
	OverLimit   int64            `json:"over_limit"`
	Errors      int64            `json:"errors"`
	ErrorKinds  map[string]int64 `json:"error_kinds,omitempty"` // gRPC code or overall_code → count
	// Ceiling marks a run against a do-nothing server, the reference for
	// CeilingFraction of other runs.
	Ceiling bool `json:"ceiling,omitempty"`
	// CeilingRPS and CeilingFraction (RPS / CeilingRPS) are set when a
	// ceiling run with the same load was made.
	CeilingRPS      float64 `json:"ceiling_rps,omitempty"`
	CeilingFraction float64 `json:"ceiling_fraction,omitempty"`
	// CPU is the CPU time each probed process used per completed request
	// during the measured phase.
	CPU []CPUUse `json:"cpu,omitempty"`
	// Server is the target's own latency over the measured phase, from its
	// histogram (Options.Server); nil when not probed.
	Server *ServerLatency `json:"server,omitempty"`
	// Redis is what the Redis servers of Options.Redis did over the
	// measured phase; nil when none was given (or a counter went back).
	Redis *RedisUse `json:"redis,omitempty"`
	// Machine is how the whole machine's CPU time was spent over the
	// measured phase, the hypervisor's steal included; nil where the kernel
	// does not say (not Linux).
	Machine *Machine `json:"machine,omitempty"`
	// Runs is the number of runs a median result stands for (see Medians);
	// 0 for a single run.
	Runs int `json:"runs,omitempty"`
}

// StealWarnPct is the steal, in percent of the machine's CPU time, from
// which StealWarning warns.
const StealWarnPct = 10

// StealWarning is a sentence for the reader when the hypervisor took
// StealWarnPct or more of the machine's CPU time during the run, else "".
func (r *Result) StealWarning() string {
	if r.Machine == nil || r.Machine.StealPct < StealWarnPct {
		return ""
	}
	return fmt.Sprintf("%s: the hypervisor took %.0f%% of this machine's CPU time during the measured phase (steal): "+
		"compare it only with runs that lost as much", r.Label, r.Machine.StealPct)
}

// CPUUse is one probed process's CPU time over the measured phase, and that
// time per answered request (OK + OVER_LIMIT: a request that failed, perhaps
// before reaching the server, is not counted). The reading comes from /proc
// in 10 ms ticks, so short runs are coarse.
type CPUUse struct {
	Name         string  `json:"name"`
	Seconds      float64 `json:"seconds"`
	MicrosPerReq float64 `json:"us_per_req"`
	// Wait is the thread-time the process spent runnable but not running
	// (on a run queue), summed over its threads, over the phase and per
	// answered request, like MicrosPerReq. It measures CPU contention: a
	// wait of the thread that serves many requests delays all of them, and
	// waits of threads off the requests' path count too, so it is not a
	// share of each request's latency. It includes waiting behind the
	// process's own threads and a CPU quota's throttling. nil where the
	// kernel keeps no scheduler statistics.
	Wait *Wait `json:"wait,omitempty"`
}

// Wait is a process's run-queue wait (CPUUse.Wait), from the schedstat of
// each of its threads in nanoseconds.
type Wait struct {
	Seconds      float64 `json:"seconds"`
	MicrosPerReq float64 `json:"us_per_req"`
}

// tlsMode is Result.TLS for a client's configuration.
func tlsMode(cfg *tls.Config) string {
	switch {
	case cfg == nil:
		return ""
	case len(cfg.Certificates) > 0 || cfg.GetClientCertificate != nil:
		return "mutual"
	default:
		return "tls"
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func newResult(o Options, m measurement, before, after []reading) *Result {
	r := &Result{
		Label:       o.Label,
		Target:      o.Addr,
		TLS:         tlsMode(o.TLS),
		Mode:        o.Mode(),
		Callers:     o.Concurrency,
		Connections: o.Connections,
		Descriptors: len(o.Descriptors),
		Cardinality: o.Cardinality,
		FullDecode:  o.FullDecode,
		Requests:    int64(m.hist.Count()),
		ElapsedS:    m.elapsed.Seconds(),
		P50:         ms(m.hist.Quantile(0.50)),
		P90:         ms(m.hist.Quantile(0.90)),
		P99:         ms(m.hist.Quantile(0.99)),
		P999:        ms(m.hist.Quantile(0.999)),
		Max:         ms(m.hist.Max()),
		Mean:        ms(m.hist.Mean()),
		OK:          m.ok,
		OverLimit:   m.overLimit,
		ErrorKinds:  m.errs,
	}
	if o.Rate > 0 {
		r.Rate, r.Scheduled, r.MaxSendLag = o.Rate, m.scheduled, ms(m.maxLag)
	}
	for _, v := range m.errs {
		r.Errors += v
	}
	answered := r.OK + r.OverLimit
	if r.ElapsedS > 0 {
		r.RPS = float64(answered) / r.ElapsedS
	}
	// Probes of the same name add up (the masters of a Redis Cluster),
	// reported once, where the name first appears. A name has a wait when
	// every probe of it has.
	var names []string
	used, waited := map[string]time.Duration{}, map[string]time.Duration{}
	noWait := map[string]bool{}
	for i, p := range o.CPU {
		if _, seen := used[p.Name]; !seen {
			names = append(names, p.Name)
		}
		used[p.Name] += after[i].cpu - before[i].cpu
		if before[i].wait == nil || after[i].wait == nil {
			noWait[p.Name] = true
		}
		waited[p.Name] += waitBetween(before[i].wait, after[i].wait)
	}
	perReq := func(d time.Duration) float64 {
		if answered == 0 {
			return 0
		}
		return float64(d.Microseconds()) / float64(answered)
	}
	for _, name := range names {
		u := CPUUse{Name: name, Seconds: used[name].Seconds(), MicrosPerReq: perReq(used[name])}
		if !noWait[name] {
			u.Wait = &Wait{Seconds: waited[name].Seconds(), MicrosPerReq: perReq(waited[name])}
		}
		r.CPU = append(r.CPU, u)
	}
	return r
}

// SetCeiling records the do-nothing server's rate for the same load.
func (r *Result) SetCeiling(ceilingRPS float64) {
	if ceilingRPS <= 0 {
		return
	}
	r.CeilingRPS = ceilingRPS
	r.CeilingFraction = r.RPS / ceilingRPS
}

// ceilingKey identifies "the same load" for matching a run with its ceiling
// run: mode, callers, (open loop) rate and descriptors per request. The
// descriptors count because each costs the generator and the server's gRPC
// stack: a run of three descriptors compared with a one-descriptor ceiling
// would be charged for decoding the two others as if it were rate limiting.
func ceilingKey(r *Result) string {
	return fmt.Sprintf("%s/%d/%g/%d/%s", r.Mode, r.Callers, r.Rate, r.Descriptors, r.TLS)
}

// FillCeilings sets CeilingRPS/CeilingFraction of every non-ceiling result
// that lacks them from the ceiling result with the same mode, callers, rate,
// descriptors per request and TLS (the last such, when there are several);
// a result without one keeps none.
func FillCeilings(rs []*Result) {
	ceil := map[string]float64{}
	for _, r := range rs {
		if r.Ceiling {
			ceil[ceilingKey(r)] = r.RPS
		}
	}
	for _, r := range rs {
		if !r.Ceiling && r.CeilingRPS == 0 {
			r.SetCeiling(ceil[ceilingKey(r)])
		}
	}
}

// Medians combines repeated runs of the same load (label, target, TLS, mode,
// callers, rate, descriptors per request and decoding) into one result each, in the order each load first
// appears: every rate, latency and CPU figure is the median of the runs
// (the mean of the two middle ones for an even count), the counts are
// summed, and Runs is the number of runs. A load run once is kept as it is.
// Ceiling fields are cleared; FillCeilings sets them from the medians.
func Medians(rs []*Result) []*Result {
	type key struct {
		label, target, tls, mode string
		callers, descriptors     int
		rate                     float64
		fullDecode               bool
	}
	var order []key
	groups := map[key][]*Result{}
	for _, r := range rs {
		k := key{r.Label, r.Target, r.TLS, r.Mode, r.Callers, r.Descriptors, r.Rate, r.FullDecode}
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], r)
	}
	out := make([]*Result, 0, len(order))
	for _, k := range order {
		g := groups[k]
		if len(g) == 1 {
			out = append(out, g[0])
			continue
		}
		m := *g[0]
		m.Runs = len(g)
		m.CeilingRPS, m.CeilingFraction = 0, 0
		med := func(f func(*Result) float64) float64 { return medianOf(g, f) }
		m.RPS = med(func(r *Result) float64 { return r.RPS })
		m.ElapsedS = med(func(r *Result) float64 { return r.ElapsedS })
		m.P50 = med(func(r *Result) float64 { return r.P50 })
		m.P90 = med(func(r *Result) float64 { return r.P90 })
		m.P99 = med(func(r *Result) float64 { return r.P99 })
		m.P999 = med(func(r *Result) float64 { return r.P999 })
		m.Max = med(func(r *Result) float64 { return r.Max })
		m.Mean = med(func(r *Result) float64 { return r.Mean })
		m.MaxSendLag = med(func(r *Result) float64 { return r.MaxSendLag })
		m.Requests, m.Scheduled, m.OK, m.OverLimit, m.Errors = 0, 0, 0, 0, 0
		m.ErrorKinds = nil
		for _, r := range g {
			m.Requests += r.Requests
			m.Scheduled += r.Scheduled
			m.OK += r.OK
			m.OverLimit += r.OverLimit
			m.Errors += r.Errors
			m.ErrorKinds = addCounts(m.ErrorKinds, r.ErrorKinds)
		}
		m.CPU = nil
		for _, c := range g[0].CPU {
			var secs, per, wsecs, wper []float64
			for _, r := range g {
				if x := cpuOf(r, c.Name); x != nil {
					secs, per = append(secs, x.Seconds), append(per, x.MicrosPerReq)
					if x.Wait != nil {
						wsecs, wper = append(wsecs, x.Wait.Seconds), append(wper, x.Wait.MicrosPerReq)
					}
				}
			}
			u := CPUUse{Name: c.Name, Seconds: median(secs), MicrosPerReq: median(per)}
			if len(wper) > 0 { // the median of the runs that measured it
				u.Wait = &Wait{Seconds: median(wsecs), MicrosPerReq: median(wper)}
			}
			m.CPU = append(m.CPU, u)
		}
		// The Redis and machine figures: the median of the runs that
		// measured them.
		m.Redis = nil
		if rus := measured(g, func(r *Result) *RedisUse { return r.Redis }); len(rus) > 0 {
			m.Redis = &RedisUse{
				Servers:        rus[0].Servers,
				CommandsPerReq: medianOf(rus, func(x *RedisUse) float64 { return x.CommandsPerReq }),
				ReadsPerReq:    medianOf(rus, func(x *RedisUse) float64 { return x.ReadsPerReq }),
			}
			for _, x := range rus {
				m.Redis.Commands += x.Commands
				m.Redis.Reads += x.Reads
			}
		}
		m.Machine = nil
		if mach := measured(g, func(r *Result) *Machine { return r.Machine }); len(mach) > 0 {
			m.Machine = &Machine{
				BusyPct:  medianOf(mach, func(x *Machine) float64 { return x.BusyPct }),
				IdlePct:  medianOf(mach, func(x *Machine) float64 { return x.IdlePct }),
				StealPct: medianOf(mach, func(x *Machine) float64 { return x.StealPct }),
			}
		}
		// The server's figures: the median of the runs in which it observed
		// requests (a run without any has no quantiles, not zero ones).
		m.Server = nil
		var srv []*ServerLatency
		for _, r := range g {
			if r.Server != nil && r.Server.Requests > 0 {
				srv = append(srv, r.Server)
			}
		}
		if len(srv) > 0 {
			m.Server = &ServerLatency{
				P50: medianOf(srv, func(x *ServerLatency) float64 { return x.P50 }),
				P90: medianOf(srv, func(x *ServerLatency) float64 { return x.P90 }),
				P99: medianOf(srv, func(x *ServerLatency) float64 { return x.P99 }),
			}
			for _, x := range srv {
				m.Server.Requests += x.Requests
			}
		}
		out = append(out, &m)
	}
	return out
}

// measured returns f of each run that has it (not nil).
func measured[T any](rs []*Result, f func(*Result) *T) []*T {
	var out []*T
	for _, r := range rs {
		if x := f(r); x != nil {
			out = append(out, x)
		}
	}
	return out
}

// medianOf is the median of f over xs.
func medianOf[T any](xs []T, f func(T) float64) float64 {
	v := make([]float64, len(xs))
	for i, x := range xs {
		v[i] = f(x)
	}
	return median(v)
}

// addCounts adds the counts of src to dst, which it creates when src has
// any and dst is nil, and returns dst.
func addCounts(dst, src map[string]int64) map[string]int64 {
	for k, n := range src {
		if dst == nil {
			dst = map[string]int64{}
		}
		dst[k] += n
	}
	return dst
}

// median returns the median of v (the mean of the two middle values for an
// even count); 0 for none. It sorts v.
func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	slices.Sort(v)
	n := len(v)
	if n%2 == 1 {
		return v[n/2]
	}
	return (v[n/2-1] + v[n/2]) / 2
}

// WriteJSON writes each result as one JSON object per line.
func WriteJSON(w io.Writer, rs []*Result) error {
	enc := json.NewEncoder(w)
	for _, r := range rs {
		if err := enc.Encode(r); err != nil {
			return fmt.Errorf("write json: %w", err)
		}
	}
	return nil
}

// ReadJSON reads results written by WriteJSON (one object per line, or any
// sequence of JSON objects).
func ReadJSON(rd io.Reader) ([]*Result, error) {
	dec := json.NewDecoder(rd)
	var rs []*Result
	for dec.More() {
		r := &Result{}
		if err := dec.Decode(r); err != nil {
			return rs, fmt.Errorf("read json result %d: %w", len(rs)+1, err)
		}
		rs = append(rs, r)
	}
	return rs, nil
}

// Layout is how WriteTable and WriteComparisons lay a table out.
type Layout int

const (
	// Aligned pads the columns with spaces, for a terminal.
	Aligned Layout = iota
	// Markdown writes a GitHub-flavoured Markdown table, for a README or a
	// note: the figures exactly as Aligned shows them.
	Markdown
)

// render lays rows (the first the header) out; the first `left` columns
// hold names, the others numbers.
func (l Layout) render(rows [][]string, left int) string {
	if l == Markdown {
		return markdownRows(rows, left)
	}
	return alignRows(rows, left)
}

// WriteTable writes the results as a table laid out as l: one row per run, the
// server's own p50 and p99 when any result has them, one "<name> µs/req"
// column per CPU probe name seen in any result, then one "<name> wait
// µs/req" column (run-queue wait) per name that any result has a wait of,
// Redis's commands and read events per request when any result has them,
// the machine's idle and steal shares when any result has them, and the
// fraction of the ceiling when known. Latencies are in milliseconds.
func WriteTable(w io.Writer, rs []*Result, l Layout) error {
	var cpuNames, waitNames []string
	for _, r := range rs {
		for _, c := range r.CPU {
			if !slices.Contains(cpuNames, c.Name) {
				cpuNames = append(cpuNames, c.Name)
			}
		}
	}
	for _, n := range cpuNames {
		for _, r := range rs {
			if c := cpuOf(r, n); c != nil && c.Wait != nil {
				waitNames = append(waitNames, n)
				break
			}
		}
	}
	runs, server, redisUse, machine := false, false, false, false
	for _, r := range rs {
		runs = runs || r.Runs > 1
		server = server || r.Server != nil
		redisUse = redisUse || r.Redis != nil
		machine = machine || r.Machine != nil
	}
	head := []string{"label", "target", "callers", "rps", "p50 ms", "p90 ms", "p99 ms", "p99.9 ms", "max ms", "OK", "OVER_LIMIT", "errors", "ceiling"}
	if runs {
		head = slices.Insert(head, 3, "runs")
	}
	if server {
		head = append(head, "server p50 ms", "server p99 ms")
	}
	for _, n := range cpuNames {
		head = append(head, n+" µs/req")
	}
	for _, n := range waitNames {
		head = append(head, n+" wait µs/req")
	}
	if redisUse {
		head = append(head, "redis cmds/req", "redis reads/req")
	}
	if machine {
		head = append(head, "idle %", "steal %")
	}
	rows := [][]string{head}
	for _, r := range rs {
		callers := fmt.Sprint(r.Callers)
		if r.Mode == "open" {
			callers = fmt.Sprintf("%d@%g/s", r.Callers, r.Rate)
		}
		ceiling := "-"
		switch {
		case r.Ceiling:
			ceiling = "(ceiling)"
		case r.CeilingRPS > 0:
			ceiling = fmt.Sprintf("%.0f%%", 100*r.CeilingFraction)
		}
		target := r.Target
		if r.TLS != "" {
			target += " (" + r.TLS + ")"
		}
		row := []string{
			r.Label, target, callers, fmt.Sprintf("%.0f", r.RPS),
			lat(r.P50), lat(r.P90), lat(r.P99), lat(r.P999), lat(r.Max),
			fmt.Sprint(r.OK), fmt.Sprint(r.OverLimit), errCell(r), ceiling,
		}
		if runs {
			row = slices.Insert(row, 3, fmt.Sprint(max(r.Runs, 1)))
		}
		if server {
			if r.Server != nil && r.Server.Requests > 0 {
				row = append(row, lat(r.Server.P50), lat(r.Server.P99))
			} else {
				row = append(row, "-", "-")
			}
		}
		for _, n := range cpuNames {
			cell := "-"
			if c := cpuOf(r, n); c != nil {
				cell = fmt.Sprintf("%.1f", c.MicrosPerReq)
			}
			row = append(row, cell)
		}
		for _, n := range waitNames {
			cell := "-"
			if c := cpuOf(r, n); c != nil && c.Wait != nil {
				cell = fmt.Sprintf("%.1f", c.Wait.MicrosPerReq)
			}
			row = append(row, cell)
		}
		if redisUse {
			if r.Redis != nil {
				row = append(row, fmt.Sprintf("%.2f", r.Redis.CommandsPerReq), fmt.Sprintf("%.2f", r.Redis.ReadsPerReq))
			} else {
				row = append(row, "-", "-")
			}
		}
		if machine {
			if r.Machine != nil {
				row = append(row, fmt.Sprintf("%.0f", r.Machine.IdlePct), fmt.Sprintf("%.0f", r.Machine.StealPct))
			} else {
				row = append(row, "-", "-")
			}
		}
		rows = append(rows, row)
	}
	if _, err := io.WriteString(w, l.render(rows, 2)); err != nil {
		return fmt.Errorf("write table: %w", err)
	}
	return nil
}

// cpuOf returns r's CPU figures of the probe name, or nil.
func cpuOf(r *Result, name string) *CPUUse {
	for i := range r.CPU {
		if r.CPU[i].Name == name {
			return &r.CPU[i]
		}
	}
	return nil
}

// alignRows lays rows out in columns separated by two spaces: the first
// `left` columns (names) aligned left, the others (numbers) aligned right.
func alignRows(rows [][]string, left int) string {
	var width []int
	for _, row := range rows {
		for i, cell := range row {
			if i >= len(width) {
				width = append(width, 0)
			}
			width[i] = max(width[i], utf8.RuneCountInString(cell))
		}
	}
	var b strings.Builder
	for _, row := range rows {
		for i, cell := range row {
			pad := strings.Repeat(" ", width[i]-utf8.RuneCountInString(cell))
			if i > 0 {
				b.WriteString("  ")
			}
			if i < left {
				b.WriteString(cell)
				if i < len(row)-1 {
					b.WriteString(pad)
				}
			} else {
				b.WriteString(pad + cell)
			}
		}
		b.WriteByte('\n')
	}
	return b.String()
}

// markdownRows lays rows out as a Markdown table whose first row is the
// header: the first `left` columns (names) aligned left, the others
// (numbers) right; a "|" in a cell is escaped.
func markdownRows(rows [][]string, left int) string {
	var b strings.Builder
	line := func(cells []string) {
		b.WriteString("|")
		for _, c := range cells {
			b.WriteString(" " + strings.ReplaceAll(c, "|", `\|`) + " |")
		}
		b.WriteByte('\n')
	}
	for i, row := range rows {
		line(row)
		if i == 0 {
			rule := make([]string, len(row))
			for j := range rule {
				rule[j] = "---:"
				if j < left {
					rule[j] = "---"
				}
			}
			line(rule)
		}
	}
	return b.String()
}

func lat(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.3f", v)
	}
}

// errCell shows the error count and, when there are errors, the most
// frequent kind.
func errCell(r *Result) string {
	if r.Errors == 0 {
		return "0"
	}
	kinds := slices.SortedFunc(maps.Keys(r.ErrorKinds), func(a, b string) int {
		return cmp.Or(cmp.Compare(r.ErrorKinds[b], r.ErrorKinds[a]), cmp.Compare(a, b))
	})
	if len(kinds) == 0 {
		return fmt.Sprint(r.Errors)
	}
	return fmt.Sprintf("%d (%s)", r.Errors, kinds[0])
}
