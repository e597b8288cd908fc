package bench

import (
	"strings"
	"testing"
)

// run is a closed-loop run of label at callers with a rate, a p99, the CPU
// of the probe rls and the steal of the machine.
func run(label string, callers int, rps, p99, rlsCPU, steal float64) *Result {
	return &Result{
		Label: label, Target: "t", Mode: "closed", Callers: callers, Descriptors: 3,
		RPS: rps, P50: p99 / 2, P99: p99,
		CPU:     []CPUUse{{Name: "rls", MicrosPerReq: rlsCPU}},
		Machine: &Machine{StealPct: steal, IdlePct: 100 - steal},
	}
}

func figureOf(t *testing.T, c Comparison, name string) Figure {
	t.Helper()
	for _, f := range c.Figures {
		if f.Name == name {
			return f
		}
	}
	t.Fatalf("%s: no figure %q in %+v", c.Label, name, c.Figures)
	return Figure{}
}

// TestComparePairsRunsInOrder: the i-th run of a load on one side is set
// against the i-th on the other, and each figure is the median of the
// pairs' ratios (not the ratio of the medians, which here differs), with
// the count of pairs in which the compared side did better.
func TestComparePairsRunsInOrder(t *testing.T) {
	noop := run("do-nothing", 16, 1000, 1, 10, 0)
	noop.Ceiling = true
	rs := []*Result{
		noop,
		run("3 desc", 16, 150, 2, 50, 0), run("ratelimit: 3 desc", 16, 100, 4, 100, 1),
		run("4 limits", 16, 90, 3, 60, 0), // envoy-rls only: not compared
		run("ratelimit: 3 desc", 16, 200, 4, 100, 0), run("3 desc", 16, 220, 5, 120, 2),
		run("3 desc", 16, 600, 1, 40, 0), run("ratelimit: 3 desc", 16, 300, 2, 100, 0),
		run("3 desc", 64, 500, 1, 30, 0), run("ratelimit: 3 desc", 64, 250, 3, 90, 0),
	}
	// One run of Redis figures on both sides, one on one side only.
	rs[1].Redis, rs[2].Redis = &RedisUse{ReadsPerReq: 0.3}, &RedisUse{ReadsPerReq: 0.9}
	rs[5].Redis = &RedisUse{ReadsPerReq: 0.8}

	cs, err := Compare(rs, CompareOptions{Base: "ratelimit: "})
	if err != nil {
		t.Fatal(err)
	}
	if len(cs) != 2 || cs[0].Label != "3 desc" || cs[0].Callers != 16 || cs[1].Callers != 64 {
		t.Fatalf("comparisons %+v, want 3 desc at 16 then 64 callers", cs)
	}
	c := cs[0]
	if c.Pairs != 3 || c.Dropped != 0 || c.Unpaired != 0 || c.StealPct != 1 {
		t.Errorf("16 callers: %d pairs, %d dropped, %d unpaired, steal %v; want 3, 0, 0, 1 (the median of each pair's larger steal: 1, 2, 0)",
			c.Pairs, c.Dropped, c.Unpaired, c.StealPct)
	}
	// rps 150/100, 220/200, 600/300: median 1.5 (the medians' ratio: 1.1).
	if f := figureOf(t, c, "rps"); f.Ratio != 1.5 || f.Better != 3 || f.Pairs != 3 {
		t.Errorf("rps %+v, want ratio 1.5, better in 3 of 3", f)
	}
	// p99 2/4, 5/4, 1/2: median 0.5, lower in 2.
	if f := figureOf(t, c, "p99 ms"); f.Ratio != 0.5 || f.Better != 2 || f.Pairs != 3 {
		t.Errorf("p99 %+v, want ratio 0.5, better in 2 of 3", f)
	}
	// rls CPU 50/100, 120/100, 40/100: median 0.5, lower in 2.
	if f := figureOf(t, c, "rls µs/req"); f.Ratio != 0.5 || f.Better != 2 || f.Pairs != 3 {
		t.Errorf("rls CPU %+v, want ratio 0.5, better in 2 of 3", f)
	}
	// Redis measured in both runs of the first pair only.
	if f := figureOf(t, c, "redis reads/req"); f.Pairs != 1 || f.Better != 1 || f.Ratio < 0.333 || f.Ratio > 0.334 {
		t.Errorf("redis reads %+v, want one pair, ratio 0.3/0.9", f)
	}
	if f := figureOf(t, cs[1], "rps"); f.Ratio != 2 || f.Pairs != 1 {
		t.Errorf("64 callers: rps %+v, want 2 over one pair", f)
	}

	var b strings.Builder
	if err := WriteComparisons(&b, cs, CompareOptions{Base: "ratelimit: "}, Aligned); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	// rps, p99 and CPU, Redis, and the 64-caller row's rps.
	for _, want := range []string{`the rows without a prefix ÷ the "ratelimit: " rows`, "1.50× 3/3", "0.50× 2/3", "0.33× 1/1", "2.00× 1/1"} {
		if !strings.Contains(out, want) {
			t.Errorf("the table lacks %q:\n%s", want, out)
		}
	}
	// The 64-caller load measured no Redis: its cell says so.
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "3 desc") && strings.Contains(line, "2.00×") && !strings.Contains(line, " - ") {
			t.Errorf("the 64-caller row shows a Redis figure it never measured: %q", line)
		}
	}
}

// TestCompareStealUnpairedAndPrefixes: pairs with too much steal are left
// out and counted; runs without a counterpart are counted; a run over TLS
// is no pair of one in plain text; an empty Base is
// the unprefixed runs, set against a prefixed second server's, and the
// prefixed runs of a third server are no load of either side.
func TestCompareStealUnpairedAndPrefixes(t *testing.T) {
	rs := []*Result{
		run("1 key", 16, 100, 1, 50, 0), run("B: 1 key", 16, 110, 1, 45, 0), run("ratelimit: 1 key", 16, 60, 2, 120, 0),
		run("B: 1 key", 16, 300, 1, 10, 25), run("1 key", 16, 100, 1, 50, 0), // the pair's B run lost 25% to steal
		run("1 key", 16, 100, 1, 50, 3), run("B: 1 key", 16, 90, 1, 55, 0),
		run("1 key", 16, 100, 1, 50, 0),   // a fourth run of A without its B
		run("B: 1 key", 16, 500, 1, 5, 0), // over TLS, below: another load
	}
	rs[len(rs)-1].TLS = "tls"
	cs, err := Compare(rs, CompareOptions{Base: "", Other: "B: ", MaxSteal: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(cs) != 1 {
		t.Fatalf("comparisons %+v, want one (1 key)", cs)
	}
	c := cs[0]
	if c.Label != "1 key" || c.Pairs != 2 || c.Dropped != 1 || c.Unpaired != 1 || c.StealPct != 1.5 {
		t.Errorf("%+v: want 1 key, 2 pairs, 1 dropped, 1 unpaired, steal 1.5 (median of 0 and 3)", c)
	}
	if f := figureOf(t, c, "rps"); f.Ratio != 1 || f.Better != 1 || f.Pairs != 2 {
		t.Errorf("rps %+v, want the median of 1.1 and 0.9 and better in 1 of 2", f)
	}
	var b strings.Builder
	if err := WriteComparisons(&b, cs, CompareOptions{Base: "", Other: "B: ", MaxSteal: 10}, Aligned); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`the "B: " rows ÷ the rows without a prefix`, "2 (1 left out, 1 unpaired)", "10% or more"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("the table lacks %q:\n%s", want, b.String())
		}
	}

	// Without the steal bound every pair counts.
	cs, err = Compare(rs, CompareOptions{Base: "", Other: "B: "})
	if err != nil || len(cs) != 1 || cs[0].Pairs != 3 || cs[0].Dropped != 0 {
		t.Errorf("without MaxSteal: %+v, %v; want 3 pairs", cs, err)
	}
	if _, err := Compare(rs, CompareOptions{Base: "B: ", Other: "B: "}); err == nil {
		t.Error("Compare with the same prefix on both sides: no error")
	}
	if cs, err := Compare(rs, CompareOptions{Base: "x: "}); err != nil || len(cs) != 0 {
		t.Errorf("no run has the prefix x: %+v, %v; want no comparison", cs, err)
	}
}

// TestMarkdownLayout: a Markdown table holds the same cells as the aligned
// one, row for row (a header, the rule, then the rows), names aligned left
// and numbers right, with a "|" in a cell escaped; the comparison's
// sentence becomes a paragraph before its table.
func TestMarkdownLayout(t *testing.T) {
	rs := []*Result{
		run("1 key", 16, 100, 1, 50, 0), run("ratelimit: 1 key", 16, 60, 2, 120, 1),
		run("a|b", 64, 70, 3, 40, 2),
	}
	cells := func(line string) []string {
		return strings.Split(strings.TrimSpace(line), "  ")
	}
	var aligned, md strings.Builder
	if err := WriteTable(&aligned, rs, Aligned); err != nil {
		t.Fatal(err)
	}
	if err := WriteTable(&md, rs, Markdown); err != nil {
		t.Fatal(err)
	}
	al := strings.Split(strings.TrimSuffix(aligned.String(), "\n"), "\n")
	ml := strings.Split(strings.TrimSuffix(md.String(), "\n"), "\n")
	if len(ml) != len(al)+1 {
		t.Fatalf("%d Markdown lines for %d aligned ones:\n%s\n%s", len(ml), len(al), md.String(), aligned.String())
	}
	for i, line := range ml {
		if !strings.HasPrefix(line, "| ") || !strings.HasSuffix(line, " |") {
			t.Errorf("Markdown line %d is not a table row: %q", i, line)
			continue
		}
		got := strings.Split(strings.ReplaceAll(line[2:len(line)-2], `\|`, "\x00"), " | ")
		for j := range got {
			got[j] = strings.ReplaceAll(got[j], "\x00", "|")
		}
		if i == 1 {
			if got[0] != "---" || got[1] != "---" || got[2] != "---:" || got[len(got)-1] != "---:" {
				t.Errorf("the rule %q: want the two name columns left, the numbers right", line)
			}
			continue
		}
		var want []string
		for _, c := range cells(al[max(i-1, 0)]) {
			if c = strings.TrimSpace(c); c != "" {
				want = append(want, c)
			}
		}
		if strings.Join(got, "\x01") != strings.Join(want, "\x01") {
			t.Errorf("Markdown row %d %q, want the aligned row's cells %q", i, got, want)
		}
	}
	if !strings.Contains(md.String(), `| a\|b |`) {
		t.Errorf("the label a|b is not escaped:\n%s", md.String())
	}

	cs, err := Compare(rs, CompareOptions{Base: "ratelimit: "})
	if err != nil {
		t.Fatal(err)
	}
	md.Reset()
	if err := WriteComparisons(&md, cs, CompareOptions{Base: "ratelimit: "}, Markdown); err != nil {
		t.Fatal(err)
	}
	head, table, ok := strings.Cut(md.String(), "\n\n")
	if !ok || strings.Contains(head, "\n") || !strings.HasSuffix(head, ":") ||
		!strings.HasPrefix(table, "| load | callers | pairs | rps |") || !strings.Contains(table, "| 1 key | 16 | 1 | 1.67× 1/1 |") {
		t.Errorf("the Markdown comparison:\n%s", md.String())
	}
}
